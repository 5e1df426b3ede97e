"""The OOMptimizer bench's searches: the model and its probe, one search's figures, true maxima, their checks."""

from __future__ import annotations

import importlib
import time

import torch

from benchmarks.harness import bench_device
from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe
from workbench.memory.oom import release_memory
from workbench.models import build_model
from workbench.models.config import check_joint_loss
from workbench.oomptimizer.probe import TrainingStepProbe
from workbench.oomptimizer.search import search_batch_sizes
from workbench.timing import summarize

DTYPE = torch.bfloat16  # every probe's training step
SMOKE_BUDGET_BYTES = 64 << 20  # modeled activation budget above the weights in --smoke on a CPU, bytes
MAX_PROBES_PER_BUCKET = 3  # a predictive search that needs more has predicted badly


def build(name: str, joint_chunk_size: int = 0, joint_loss: str = "materialized") -> torch.nn.Module:
    """A workbench model by name (built on the device, so an xl model is never initialized on the host),
    or ``module:Factory`` for any model with the same contract; ``joint_chunk_size`` (transducers):
    utterances per joint + loss chunk, 0 for the whole batch at once; ``joint_loss`` (reference transducers):
    "materialized" or "fused" (the joint's logits never built)."""
    if ":" in name:  # not a reference model: the joint and loss are the model's own (build_model checks ours)
        check_joint_loss(joint_loss, None, name, option="joint_loss", model_option="model")
        module, attr = name.split(":")
        model = getattr(importlib.import_module(module), attr)().to(bench_device())
        if joint_chunk_size:
            model.config.joint_chunk_size = joint_chunk_size
        return model
    with bench_device():
        return build_model(name, joint_chunk_size=joint_chunk_size, joint_loss=joint_loss)


def make_probe(model, args, *, ddp_gradient_buckets: bool = False):
    """The real GPU probe, or (smoke run without CUDA) the CPU stand-in with a modeled peak."""
    if torch.cuda.is_available():  # without CUDA, start() has refused unless --smoke
        return TrainingStepProbe(model, dtype=DTYPE, memory_fraction=args.memory_fraction,
                                 ddp_gradient_buckets=ddp_gradient_buckets)
    weights = 4 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return ModeledMemoryProbe(model, dtype=DTYPE, budget_bytes=weights + SMOKE_BUDGET_BYTES,
                              ddp_gradient_buckets=ddp_gradient_buckets)


def allocated_bytes() -> int | None:
    """Allocated device bytes, or None on a CPU (nothing to measure)."""
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else None


def run_search(probe, buckets, strategy: str, max_batch_size: int, *, stop_at: float | None = None,
               only: range | None = None) -> dict:
    """One search's figures (their fields: the record module's docstring). ``stop_at`` (a
    ``time.perf_counter()`` value, seconds): no new bucket starts after it; the buckets not searched get
    batch size None and ``stopped`` says so. ``only``: search just these bucket indices (the others get
    None); sizes and trace keep the full list's indices."""
    only = range(len(buckets)) if only is None else only
    release_memory()
    before = allocated_bytes()
    stop = None if stop_at is None else (lambda: time.perf_counter() >= stop_at)
    result = search_batch_sizes([buckets[i] for i in only], probe, budget_bytes=probe.budget_bytes,
                                strategy=strategy, max_batch_size=max_batch_size, stop=stop)
    release_memory()
    after = allocated_bytes()
    batch_sizes: list[int | None] = [None] * len(buckets)
    for j, b in enumerate(result.batch_sizes):
        batch_sizes[only[j]] = b
    fitted = {(only[p.bucket_index], p.batch_size) for p in result.probes if not p.oom}
    searched = [(i, b) for i, b in enumerate(batch_sizes) if b is not None]
    out = {"batch_sizes": batch_sizes, "probes": result.num_probes, "ooms": result.num_ooms,
           "probes_per_bucket": round(result.probes_per_bucket, 3), "seconds": round(result.seconds, 2),
           "all_returned_probed": all(ib in fitted for ib in searched),
           "leftover_bytes": None if before is None else after - before,  # None: not measurable (CPU)
           "probe_seconds": summarize([p.seconds for p in result.probes]),
           "trace": [[only[p.bucket_index], p.batch_size, p.peak_bytes, p.predicted_bytes] for p in result.probes]}
    if result.not_searched:
        out["stopped"] = f"time limit: {result.num_searched} of {len(only)} buckets searched"
    return out


def true_maxima(probe, buckets, indices, start_sizes, max_batch_size: int) -> dict[int, int]:
    """Bisection to a gap of 1 from each bucket's predictive size: the true maximum, by bucket index."""
    out = {}
    for i in indices:
        r = search_batch_sizes([buckets[i]], probe, strategy="bisect", rel_gap=1e-9,
                               start_batch_size=start_sizes[i], max_batch_size=max_batch_size)
        out[i] = r.batch_sizes[0]
    return out


def too_many_probes(label: str, result: dict) -> list[str]:
    """The failure of a predictive search that took more than MAX_PROBES_PER_BUCKET probes per bucket; none
    for a search stopped early (a prefix of buckets: its first bucket costs more than the average)."""
    if result["probes_per_bucket"] <= MAX_PROBES_PER_BUCKET or "stopped" in result:
        return []
    return [f"{label} predictive: {result['probes_per_bucket']:.2f} probes per bucket > {MAX_PROBES_PER_BUCKET}"]


def search_failures(label: str, result: dict) -> list[str]:
    """A search's failures: a returned size not probed, bytes left allocated."""
    failures = []
    if not result["all_returned_probed"]:
        failures.append(f"{label}: a returned batch size was not probed successfully")
    if result["leftover_bytes"] not in (0, None):
        failures.append(f"{label}: {result['leftover_bytes']} bytes left allocated after search")
    return failures


def smoke_what(args, what: str) -> str:
    """``what`` of the record; a smoke run says first what it stood in for."""
    if not args.smoke:
        return what
    if torch.cuda.is_available():
        return f"SMOKE RUN (tiny models, few short buckets, batch sizes <= {args.max_batch_size}): {what}"
    return ("SMOKE RUN on a CPU, nothing measured: the real make_batch + training_step + AdamW step ran, but "
            "peaks come from a memory model (4 x parameter bytes + 256 bytes per batch element, budget "
            f"{SMOKE_BUDGET_BYTES >> 20} MiB above that; ModeledMemoryProbe), leftover bytes are not "
            f"measurable, DDP over gloo: {what}")


def in_budget(run, margin_s: float = 0.0) -> bool:
    """True while ``margin_s`` seconds remain of ``--budget-s`` (0: no limit)."""
    budget = run.args.budget_s
    return not budget or run.seconds() < budget - margin_s
