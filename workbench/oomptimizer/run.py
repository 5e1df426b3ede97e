"""From bins and a model to a profile: buckets, GPU search, merge, metadata, and the soak that validates it."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import random
import time
from typing import Callable

import torch
from tqdm.auto import tqdm

from workbench.bucketing.profile import BucketProfile
from workbench.memory.allocator import current_allocator_settings
from workbench.memory.oom import is_oom_error, release_memory
from workbench.memory.settings import expandable_segments_setting, parse_settings
from workbench.models.model import encoder_layers_compiled
from workbench.oomptimizer.merge import merge_equal_buckets
from workbench.oomptimizer.probe import TrainingStepProbe
from workbench.oomptimizer.search import PlannedPeaks, SearchResult, search_batch_sizes
from workbench.units import GiB

DEFAULT_TOKENS_PER_SECOND = 10.0  # token bound of a 1D bucket when the profile has no max_tps
log = logging.getLogger(__name__)


def profile_buckets(profile: BucketProfile) -> list[tuple[float, float]]:
    """(max duration s, max tokens) per bucket: 2D bins as they are; 1D bins take tokens from max_tps."""
    if profile.is_2d:
        return [(float(d), float(u)) for d, u in profile.bucket_duration_bins]
    tps = profile.max_tps
    out = []
    for i, d in enumerate(profile.bucket_duration_bins):
        rate = tps[i] if isinstance(tps, list) else (tps or DEFAULT_TOKENS_PER_SECOND)
        out.append((float(d), float(math.ceil(float(d) * float(rate)))))
    return out


def gpu_metadata(model_name: str, dtype: torch.dtype, memory_fraction: float, **extra) -> dict:
    """What the batch sizes were measured for: model, dtype, GPU, memory, fraction, torch, date."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"model": model_name, "dtype": str(dtype).replace("torch.", ""), "gpu": props.name,
            "gpu_memory_bytes": int(props.total_memory), "memory_fraction": float(memory_fraction),
            "torch": str(torch.__version__),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **extra}


def expandable_segments_warning(settings: str) -> str | None:
    """One line when the allocator settings a search runs under (``""``: torch's defaults) leave expandable
    segments off: training with dynamic batch shapes runs with them on, so the sizes would be measured
    under other settings than training's."""
    if expandable_segments_setting(parse_settings(settings)):
        return None
    return (f"oomptimize: the CUDA allocator runs without expandable segments (settings {settings!r}); training "
            "turns them on for dynamic batch shapes, so search under the settings training will use "
            "(PYTORCH_ALLOC_CONF=expandable_segments:True)")


def oomptimize(model: torch.nn.Module, model_name: str, bins: BucketProfile, *, strategy: str = "predictive",
               dtype: torch.dtype = torch.bfloat16, memory_fraction: float = 0.9, ddp: bool = False,
               rel_gap: float = 0.05, start_batch_size: int = 32, merge: bool = True,
               on_probe: Callable | None = None, on_bucket: Callable | None = None,
               prior: PlannedPeaks | None = None) -> tuple[BucketProfile, SearchResult]:
    """Search per-bucket batch sizes for ``model`` (already on the GPU) over the buckets of ``bins``.

    Returns the filled profile (merged buckets when ``merge``) and the search trace; the profile records the
    CUDA allocator settings the search ran under (one warning line when expandable segments are off).
    ``prior``: a plan's peaks for these buckets (``plan.planned_peaks``), where the search starts. Raises
    RuntimeError when the probes leave memory allocated behind.
    """
    allocator_settings = current_allocator_settings() or ""
    warning = expandable_segments_warning(allocator_settings)
    if warning:
        log.warning(warning)
    world = torch.distributed.get_world_size() if torch.distributed.is_available() and \
        torch.distributed.is_initialized() else 1
    probe = TrainingStepProbe(model, dtype=dtype, memory_fraction=memory_fraction,
                              ddp_gradient_buckets=ddp or world > 1)
    buckets = profile_buckets(bins)
    compiled = encoder_layers_compiled(model)
    if compiled:  # compile before the first probe, not in it
        probe.warm_up(buckets[0])
    result = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, rel_gap=rel_gap,
                                start_batch_size=start_batch_size, strategy=strategy, on_probe=on_probe,
                                on_bucket=on_bucket, prior=prior)
    release_memory()
    leftover = torch.cuda.memory_allocated() - probe.baseline_bytes
    if leftover != 0:
        raise RuntimeError(f"probes left {leftover} bytes allocated (baseline {probe.baseline_bytes})")
    meta = gpu_metadata(model_name, dtype, memory_fraction, strategy=strategy, ddp=bool(ddp or world > 1),
                        joint_chunk_size=int(getattr(getattr(model, "config", None), "joint_chunk_size", 0)),
                        joint_loss=str(getattr(getattr(model, "config", None), "joint_loss", "materialized")),
                        compile=compiled,
                        world_size=world, probes=result.num_probes, search_seconds=round(result.seconds, 2),
                        budget_bytes=int(probe.budget_bytes), unmerged_buckets=len(buckets),
                        started_from_plan=prior is not None)
    return profile_with_batch_sizes(bins, result, meta, allocator_settings, merge=merge), result


def profile_with_batch_sizes(bins: BucketProfile, result: SearchResult, metadata: dict, allocator_settings: str,
                             *, merge: bool = True) -> BucketProfile:
    """``bins`` with the batch sizes a search found (neighbours with equal sizes merged when ``merge``) and
    ``metadata`` added to the bins' own."""
    bin_list, batch_sizes, tps = list(bins.bucket_duration_bins), result.profile_batch_sizes(), bins.max_tps
    if merge:
        per_bucket_tps = tps if isinstance(tps, list) else None
        bin_list, batch_sizes, merged_tps = merge_equal_buckets(bin_list, batch_sizes, per_bucket_tps)
        tps = merged_tps if per_bucket_tps is not None else tps
    return BucketProfile(bin_list, batch_sizes, tps, {**bins.metadata, **metadata}, allocator_settings)


def soak_batch(model: torch.nn.Module, buckets: list[tuple[float, float]], i: int, batch_size: int,
               device: torch.device) -> dict[str, torch.Tensor]:
    """A batch of bucket ``i`` with varied lengths: every ``*_lens`` tensor of the worst-case batch is
    scaled per utterance by one fraction, 1 for the first utterance (which keeps the bucket's bound) and
    otherwise between the previous bucket's bound (half this one's for the first bucket) and this one's.
    A length stays >= 1 unless the bound is 0."""
    d, u = buckets[i]
    low = buckets[i - 1][0] if i > 0 and buckets[i - 1][0] < d else d * 0.5
    batch = model.make_batch(batch_size, d, int(u), device)
    frac = torch.empty(batch_size).uniform_(low / d, 1.0)
    frac[0] = 1.0
    for key in [k for k in batch if k.endswith("_lens")]:
        lens = batch[key]
        floor = 1 if int(lens.min()) >= 1 else 0
        batch[key] = (lens.float() * frac.to(lens.device)).long().clamp(min=floor)
    return batch


def soak_report(steps: int, seconds: float, device: torch.device, memory_fraction: float,
                search_memory_fraction: float | None) -> dict:
    """The soak's counts, and on a GPU its peaks (bytes) against training's limit and the search's budget."""
    report = {"steps": steps, "ooms": 0, "seconds": seconds,
              "memory_fraction": memory_fraction, "search_memory_fraction": search_memory_fraction,
              "peak_reserved_bytes": None, "peak_allocated_bytes": None, "budget_bytes": None,
              "peak_over_search_budget": None, "peak_allocated_over_search_budget": None}
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        report.update(peak_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
                      peak_allocated_bytes=int(torch.cuda.max_memory_allocated(device)),
                      budget_bytes=int(memory_fraction * total))
        if search_memory_fraction:
            report["peak_over_search_budget"] = report["peak_reserved_bytes"] / (search_memory_fraction * total)
            report["peak_allocated_over_search_budget"] = \
                report["peak_allocated_bytes"] / (search_memory_fraction * total)
    return report


def soak(model: torch.nn.Module, profile: BucketProfile, *, dtype: torch.dtype = torch.bfloat16,
         memory_fraction: float = 1.0, search_memory_fraction: float | None = None, steps_per_bucket: int = 3,
         seed: int = 0, progress: bool = True) -> dict:
    """Train ``steps_per_bucket`` steps per bucket at the profile's batch sizes, in shuffled bucket order
    like training, with lengths varied inside each bucket (:func:`soak_batch`). One persistent optimizer,
    as in training. Raises RuntimeError on any OOM; returns :func:`soak_report`.

    ``memory_fraction`` is the limit training runs under (the whole device unless training sets one);
    ``search_memory_fraction`` the lower one the search ran under: the difference is the headroom for what
    training adds to a probe (a long-lived optimizer, shuffled shapes, library workspaces), and the report
    says how much of it the soak used (``peak_allocated_over_search_budget``). On a CPU (smoke runs) the
    steps run the same way, with no limit to set and no peak to read (None)."""
    if profile.bucket_batch_size is None:
        raise ValueError("profile: field 'bucket_batch_size' is missing; run the search first")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction: must be in (0, 1], got {memory_fraction}")
    if search_memory_fraction is not None and not 0 < search_memory_fraction <= memory_fraction:
        raise ValueError(f"search_memory_fraction: must be in (0, memory_fraction={memory_fraction}], "
                         f"got {search_memory_fraction}")
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(memory_fraction, device)
        torch.cuda.reset_peak_memory_stats(device)
    buckets = profile_buckets(profile)
    order = [i for i in range(len(buckets)) for _ in range(steps_per_bucket)]
    random.Random(seed).shuffle(order)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    t0 = time.perf_counter()
    try:
        for step, i in enumerate(tqdm(order, desc="soak", disable=not progress)):
            bs = profile.bucket_batch_size[i]
            batch = soak_batch(model, buckets, i, bs, device)
            try:
                model.training_step(batch, dtype=dtype)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            except Exception as e:  # noqa: BLE001
                if is_oom_error(e):
                    d, u = buckets[i]
                    raise RuntimeError(f"soak: OOM at step {step}, bucket {i} ({d:g} s, {u:g} tokens), "
                                       f"batch size {bs}: {str(e).splitlines()[0]}") from None
                raise
            del batch
    finally:
        del optimizer
        model.zero_grad(set_to_none=True)
        release_memory()
    return soak_report(len(order), time.perf_counter() - t0, device, memory_fraction, search_memory_fraction)


def describe_soak(report: dict) -> str:
    """One line for a soak report (from ``soak`` or a benchmark JSON): steps, OOMs, peaks against limits.

    Peak allocated is what the steps needed; peak reserved also counts blocks the caching allocator
    kept, which grows to whatever limit it is given, so it says little about need under a loose limit.
    """
    if "error" in report:
        return f"soak failed: {report['error']}"
    line = f"soak: {report['steps']} steps, {report['ooms']} OOMs in {report['seconds']:.0f} s"
    if report.get("peak_allocated_bytes") is None:
        return line + " (no GPU: peaks not measured)"
    total = report["budget_bytes"] / report["memory_fraction"]
    line += (f"; peak allocated {report['peak_allocated_bytes'] / GiB:.1f} GiB, reserved "
             f"{report['peak_reserved_bytes'] / GiB:.1f} GiB of {total / GiB:.1f} GiB "
             f"(limit {report['memory_fraction']:.0%} of the device)")
    if report.get("search_memory_fraction"):
        search_budget = report["search_memory_fraction"] * total
        line += (f"; allocated / search budget ({report['search_memory_fraction']:.0%}) = "
                 f"{report['peak_allocated_bytes'] / search_budget:.3f}")
    return line
