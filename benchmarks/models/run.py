"""GPU benchmark of the reference models: training-step time, peak memory, MFU and GPU busy share, plus the
RNN-T loss check.

    python3 -m benchmarks.models --kernels --out benchmarks/results

Measures, on one GPU, for large-rnnt, large-tdt, large-aed and xl-aed at three fixed worst-case bucket
shapes (batch x seconds x tokens) in bf16 autocast and fp32: the median of 5 training steps (forward +
loss + backward, after 2 warm-ups; gradients zeroed between steps, no optimizer step) and the peak
allocated memory. Then, in bf16 only, at profile shapes: two buckets (``--profile-buckets``, default the
first and the last) of the 2D profile an OOMptimizer record holds for the model, with the batch sizes it
found (``--profile-shapes``, default the committed oomptimizer.json and oomptimizer_aed.json; a model in
none of the default records is named in the output and gets no profile rows; a record given explicitly
must hold every model asked for). Per row: MFU (FLOPs of one forward+backward from
torch.utils.flop_counter, counted once per model and shape, / step time / the bf16 matmul rate measured
at the start of the run) and, on CUDA, the GPU busy share (summed device time of the kernels of one
profiled step / the median step time). Ratios compare bf16 with fp32 on the same model and shape. Then it
checks our pure-PyTorch RNN-T loss against torchaudio.functional.rnnt_loss (loss and gradients on the
same logits) and times both. Writes <out>/models.json (``record.py`` owns its fields). Exits non-zero
when a loss is not finite, the torchaudio comparison disagrees or fails, or a step fails for any reason
other than running out of memory (the other steps still run and the JSON is still written, with the
error under "failures").

    python3 -m benchmarks.models --smoke --out /tmp/smoke    # seconds, CPU when there is no CUDA

--kernels: also one profiled training step per model (torch.profiler, after a warm-up step; CUDA kernels on
a GPU, CPU operators on the CPU smoke path) at KERNEL_SHAPE in bf16: the top kernels by self device time
and their share of the step's total, under "kernels" in the record.

--compile: the encoder blocks compiled with torch.compile (workbench.models.compile_encoder_layers; each
shape's warm-up step compiles); with --name models_compile the record sits beside the eager one.

--depthwise auto|torch|triton (default auto, build_model's default: the Triton kernels on CUDA, torch's
convolutions elsewhere); triton: the subsampling's depthwise convolutions run by the Triton kernels
(workbench.models.depthwise_triton; build_model(name, depthwise="triton")). The record's params say which
ran. The FLOPs behind MFU are always
counted on the torch convolutions (the same sums), so MFU compares with the default record; with --name
models_depthwise the record sits beside the others. On the CPU smoke path the kernels need Triton's
interpreter (TRITON_INTERPRET=1).

--time-depthwise auto|torch|triton (default auto: the kernels of workbench.models.time_conv_triton on CUDA): the
same for the conformer convolution modules' depthwise convolution over time; torch: nn.Conv1d, e.g. with --name
models_time_torch (the stage models-time-torch of scripts/gpu_run.sh, the reference for the default's rows).

--smoke: tiny-rnnt and tiny-aed at two small shapes, 2 timed steps after 1 warm-up, and a small loss
comparison (when torchaudio is installed). Without CUDA the steps run on the CPU: times are CPU wall
clock, peak memory and GPU busy are not measured (null), and MFU is against the CPU's fp32 matmul rate.
The committed records hold no tiny model, so a smoke run has profile rows only from a record given with
--profile-shapes. The JSON is marked "smoke": true and goes only to --out (required).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.mfu import busy_share, matmul_flops_per_second, step_flops, utilization
from workbench.records import models as record
from benchmarks.profiling import TOP_KERNELS, profile_call, top_kernels
from benchmarks.harness import bench_device, check_smoke_out, cpu_smoke_torch, cuda_missing, report_failures, write_result
from workbench.records.results import RESULTS_DIR
from workbench.timing import timer_for
from workbench.memory.oom import is_oom_error, release_memory
from workbench.models import build_model, compile_encoder_layers, count_parameters, rnnt_loss
from workbench.models.config import DEFAULT_DEPTHWISE, DEFAULT_TIME_DEPTHWISE, DEPTHWISE
from workbench.models.encoder import depthwise_backend, depthwise_unavailable_reason
from workbench.models.model import DTYPES

MODELS = ["large-rnnt", "large-tdt", "xl-aed", "large-aed"]  # the MFU targets' models first
SHAPES = [(32, 5.0, 40), (16, 15.0, 120), (8, 30.0, 240)]  # (batch, seconds, tokens): worst case of a bucket
SMOKE_MODELS = ["tiny-rnnt", "tiny-aed"]
SMOKE_SHAPES = [(2, 1.0, 8), (1, 2.0, 16)]
LOSS_SHAPE = (8, 120, 40, 1024)  # (batch, frames, labels, vocab) of the loss comparison
SMOKE_LOSS_SHAPE = (2, 12, 5, 16)
KERNEL_SHAPE = (16, 15.0, 120)  # (batch, seconds, tokens) of the profiled step
SMOKE_KERNEL_SHAPE = (2, 1.0, 8)
REPEAT, WARMUP = 5, 2  # timed steps and warm-up steps per row
SMOKE_REPEAT, SMOKE_WARMUP = 2, 1
PROFILE_RECORDS = (RESULTS_DIR / "oomptimizer.json", RESULTS_DIR / "oomptimizer_aed.json")
PROFILE_BUCKETS = (0, -1)  # bucket indices of a profile measured: its shortest and its longest bucket
# A model that no OOMptimizer record holds takes the profile shapes of a model that fits the same batches or
# fewer: large-tdt has large-rnnt's encoder and predictor and a joint 5 duration outputs wider.
STAND_INS = {"large-tdt": "large-rnnt"}
ROW_KERNELS = TOP_KERNELS  # kernels kept on each profile-sized row (all that profiled_step keeps)
PROFILE_DTYPE = "bf16"  # the dtype the OOMptimizer's profiles are searched in


def note_failure(row: dict, error: Exception, failures: list[str], what: str) -> None:
    """An OOM marks the row ("oom": True); any other error is the row's "error" and a failure."""
    if is_oom_error(error):
        row["oom"] = True
    else:
        row["error"] = f"{type(error).__name__}: {error}"
        failures.append(f"{what}: {row['error']}")


class ProfileShapeError(ValueError):
    """An OOMptimizer record that cannot give profile shapes: one line naming the file and what is wrong."""


class ModelNotInRecord(ProfileShapeError):
    """The record holds no profile for the model asked for."""


def oomptimizer_parts(figures: dict) -> list[dict]:
    """The searches an OOMptimizer record's figures hold: each part (the figures themselves in a DDP record,
    else ``figures["rnnt"]``, ``figures["aed"]``) that has a ``model``, its ``buckets`` and the profile's
    ``predictive`` batch sizes (a part that was skipped has none)."""
    candidates = [figures, *(v for v in figures.values() if isinstance(v, dict))]
    return [p for p in candidates if "model" in p and "buckets" in p
            and isinstance(p.get("predictive"), dict) and "batch_sizes" in p["predictive"]]


def read_profile_shapes(path, model: str, buckets=PROFILE_BUCKETS) -> list[dict]:
    """The shapes of ``buckets`` (indices into the record's bucket list, negative from the end) of the 2D
    profile that the OOMptimizer record at ``path`` holds for ``model``: [{"batch_size" (the profile's),
    "duration_s" and "num_tokens" (the bucket's worst case), "bucket_index", "record" (the file's name)}],
    one per distinct bucket. Raises :class:`ModelNotInRecord` when the record has no profile of the model,
    :class:`ProfileShapeError` when the file is unreadable, malformed or too short for an index."""
    path = Path(path)
    try:
        figures = json.loads(path.read_text())["figures"]
        parts = oomptimizer_parts(figures)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProfileShapeError(f"--profile-shapes {path}: not a readable OOMptimizer record "
                                f"({type(e).__name__}: {e})") from None
    part = next((p for p in parts if p["model"] == model), None)
    if part is None:
        held = ", ".join(sorted({p["model"] for p in parts})) or "none"
        raise ModelNotInRecord(f"--profile-shapes {path}: no OOMptimizer profile of model {model!r} (it holds: {held})")
    bounds, sizes = part["buckets"], part["predictive"]["batch_sizes"]
    if len(bounds) != len(sizes) or not bounds:
        raise ProfileShapeError(f"--profile-shapes {path}: {model}: {len(bounds)} buckets but {len(sizes)} batch "
                                f"sizes in predictive.batch_sizes")
    shapes, seen = [], set()
    for index in buckets:
        if not -len(bounds) <= index < len(bounds):
            raise ProfileShapeError(f"--profile-buckets {index}: {path.name} has {len(bounds)} buckets for {model}")
        i = index % len(bounds)
        if i not in seen:
            seen.add(i)
            seconds, tokens = bounds[i]
            shapes.append({"batch_size": int(sizes[i]), "duration_s": float(seconds), "num_tokens": int(round(tokens)),
                           "bucket_index": i, "record": path.name})
    return shapes


def profile_shapes_for(models, paths, buckets=PROFILE_BUCKETS, *, strict: bool) -> tuple[dict, dict]:
    """({model: shapes} from the first record in ``paths`` that holds it, {model: why it has none}).
    ``strict``: a model that no record holds raises :class:`ModelNotInRecord` (records given explicitly);
    otherwise it is only named in the second dict, unless its ``STAND_INS`` model was found: then it takes that
    model's shapes, each marked "stand_in". Any other problem with a record always raises."""
    found, missing = {}, {}
    for model in models:
        shapes, why = _first_profile_shapes(model, paths, buckets)
        if shapes is not None:
            found[model] = shapes
        elif strict and why is not None:
            raise why
        else:
            missing[model] = f"in no OOMptimizer record ({', '.join(Path(p).name for p in paths) or 'none given'})"
    for model, other in STAND_INS.items():
        if model in missing:
            shapes = found.get(other) or _first_profile_shapes(other, paths, buckets)[0]
            if shapes:
                found[model] = [{**shape, "stand_in": other} for shape in shapes]
                missing.pop(model)
    return found, missing


def _first_profile_shapes(model: str, paths, buckets) -> tuple[list[dict] | None, ModelNotInRecord | None]:
    """(``read_profile_shapes`` of the first record in ``paths`` that holds ``model``, None), else (None, the
    last record's refusal; None when no path was given)."""
    why = None
    for path in paths:
        try:
            return read_profile_shapes(path, model, buckets), None
        except ModelNotInRecord as e:
            why = e
    return None, why


def profiled_step(model, batch, dtype: torch.dtype, device: torch.device) -> dict:
    """:func:`top_kernels` of one training step of ``model`` (warm: run a step before) under torch.profiler."""
    model.zero_grad(set_to_none=True)
    _, events, _ = profile_call(lambda: model.training_step(batch, dtype=dtype), device)
    model.zero_grad(set_to_none=True)
    return top_kernels(events, device.type, TOP_KERNELS)


def profile_step(model, name: str, shape, failures: list[str], *, device: torch.device,
                 dtype_name: str = "bf16") -> dict:
    """One profiled training step of ``model`` at ``shape`` after a warm-up step: :func:`top_kernels`
    plus the shape, or {"error"} / {"oom": True} when the step fails."""
    batch_size, seconds, tokens = shape
    out = {"dtype": dtype_name, "batch_size": batch_size, "duration_s": seconds, "num_tokens": tokens,
           "device": device.type}
    try:
        batch = model.make_batch(batch_size, seconds, tokens, device)
        model.training_step(batch, dtype=DTYPES[dtype_name])  # warm-up: kernels compiled, algorithms picked
        out.update(profiled_step(model, batch, DTYPES[dtype_name], device))
    except Exception as e:  # noqa: BLE001
        note_failure(out, e, failures, f"{name} kernel profile")
    model.zero_grad(set_to_none=True)
    batch = None  # noqa: F841
    release_memory()
    return out


def count_flops(model, name: str, shape: dict, failures: list[str], *, device: torch.device) -> float | None:
    """FLOPs of one bf16 forward+backward at ``shape`` (fp32 on the CPU; :func:`step_flops`), or None when
    the counted step runs out of memory or fails (a failure)."""
    try:
        return step_flops(model, shape["batch_size"], shape["duration_s"], shape["num_tokens"],
                          smoke=device.type == "cpu")
    except Exception as e:  # noqa: BLE001
        if not is_oom_error(e):
            failures.append(f"{name} B={shape['batch_size']} {shape['duration_s']:g}s: FLOP count failed: "
                            f"{type(e).__name__}: {e}")
        return None
    finally:
        model.zero_grad(set_to_none=True)
        release_memory()


def add_utilization(row: dict, flops: float | None, flops_per_s: float | None, kernel_s: float | None) -> None:
    """Put ``flops``, ``mfu`` and ``gpu_busy`` (each None when not measured) into a timed ``row``."""
    median = row["step_s"]["median"]
    row["flops"] = flops
    row["mfu"] = None if flops is None or not flops_per_s else utilization(flops, median, flops_per_s)
    row["kernel_s"] = kernel_s
    row["gpu_busy"] = None if kernel_s is None else busy_share(kernel_s, median)


def row_shapes(shapes, profile_shapes) -> list[tuple[dict, list[str]]]:
    """(shape, dtypes) to measure: each fixed (batch, seconds, tokens) in every dtype, each profile shape in
    the profile's dtype; a shape dict carries "shape_source" ("fixed" or "profile") and a profile's
    "profile_bucket" ({"record", "index"}, and "model" when the shape is another model's, see ``STAND_INS``)."""
    out = [({"batch_size": b, "duration_s": s, "num_tokens": u, "shape_source": "fixed"}, list(DTYPES))
           for b, s, u in shapes]
    out += [({"batch_size": p["batch_size"], "duration_s": p["duration_s"], "num_tokens": p["num_tokens"],
              "shape_source": "profile", "profile_bucket": {"record": p["record"], "index": p["bucket_index"],
                                                           **({"model": p["stand_in"]} if "stand_in" in p else {})}},
             [PROFILE_DTYPE]) for p in profile_shapes]
    return out


def measure_model(name: str, shapes, failures: list[str], *, device: torch.device, repeat: int = REPEAT,
                  warmup: int = WARMUP, kernel_shape=None, compile: bool = False,
                  depthwise: str = DEFAULT_DEPTHWISE, time_depthwise: str = DEFAULT_TIME_DEPTHWISE, profile_shapes=(),
                  flops_per_s: float | None = None) -> tuple[int | None, list[dict], dict | None]:
    """Rows of step time, peak memory (None off a GPU), MFU against ``flops_per_s`` and GPU busy share
    (None off a GPU) per fixed shape and dtype and per profile shape (bf16), and with ``kernel_shape``
    the :func:`profile_step` of one bf16 step there (else None); ``compile``: the encoder blocks compiled
    first; ``depthwise``, ``time_depthwise``: what runs the subsampling's and the convolution modules'
    depthwise convolutions (build_model's options). A
    step that fails for a reason other than memory is a failure (its row has "error"); the other rows
    still run."""
    try:
        with device:  # built on the device: an xl model is never initialized on the host
            model = build_model(name, depthwise=depthwise, time_depthwise=time_depthwise)
        if compile:
            compile_encoder_layers(model)
    except Exception as e:  # noqa: BLE001 - one broken model must not lose the others' rows
        failures.append(f"{name}: build failed: {type(e).__name__}: {e}")
        return None, [], None
    params = count_parameters(model)
    rows = []
    on_cuda = device.type == "cuda"
    for shape, dtype_names in row_shapes(shapes, profile_shapes):
        batch_size, seconds, tokens = shape["batch_size"], shape["duration_s"], shape["num_tokens"]
        flops = count_flops(model, name, shape, failures, device=device)
        for dtype_name in dtype_names:
            dtype = DTYPES[dtype_name]
            row = {"model": name, **shape, "dtype": dtype_name}
            losses = []
            batch = None

            def step():
                model.zero_grad(set_to_none=True)
                losses.append(model.training_step(batch, dtype=dtype))

            try:
                if on_cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                batch = model.make_batch(batch_size, seconds, tokens, device)
                row["step_s"] = timer_for(device)(step, repeat=repeat, warmup=warmup)
                row["peak_bytes"] = torch.cuda.max_memory_allocated() if on_cuda else None
                row["loss"] = float(losses[-1])
                row["audio_s_per_s"] = batch_size * seconds / row["step_s"]["median"]
                if not all(torch.isfinite(x).item() for x in losses):
                    failures.append(f"{name} {dtype_name} B={batch_size} {seconds}s: loss not finite "
                                    f"{[float(x) for x in losses]}")
                profiled = profiled_step(model, batch, dtype, device) if on_cuda else None
                add_utilization(row, flops, flops_per_s, None if profiled is None else profiled["total_s"])
                if profiled is not None and shape["shape_source"] == "profile":  # where MFU is judged
                    row["top_kernels"] = profiled["top"][:ROW_KERNELS]
            except Exception as e:  # noqa: BLE001
                note_failure(row, e, failures, f"{name} {dtype_name} B={batch_size} {seconds}s")
            model.zero_grad(set_to_none=True)
            losses.clear()
            batch = None  # noqa: F841 - drop the batch before the next shape
            release_memory()
            rows.append(row)
            print(f"  {record.row_line(row)}", flush=True)
            for line in record.row_kernel_lines(row):
                print(f"    {line}", flush=True)
    kernels = None if kernel_shape is None else profile_step(model, name, kernel_shape, failures, device=device)
    model = None  # noqa: F841 - free the weights before the next model is built
    release_memory()
    return params, rows, kernels


def torchaudio_check(failures: list[str], *, device: torch.device, shape=LOSS_SHAPE, repeat: int = 5) -> dict:
    """Our rnnt_loss vs torchaudio's on the same random logits: values, gradients, time. Ours always runs
    (its loss and gradient must be finite); the comparison needs torchaudio."""
    batch, frames, labels, vocab = shape
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch, frames, labels + 1, vocab + 1, generator=gen, device=device) * 2).requires_grad_()
    targets = torch.randint(0, vocab, (batch, labels), generator=gen, device=device, dtype=torch.int32)
    logit_lengths = torch.randint(frames // 2, frames + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    logit_lengths[0] = frames
    target_lengths = torch.randint(1, labels + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    target_lengths[0] = labels
    out = {"ran": False, "shape": [batch, frames, labels + 1, vocab + 1], "device": str(device)}

    def ours():
        loss = rnnt_loss(logits, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
        return loss, torch.autograd.grad(loss.sum(), logits)[0]

    try:
        our_loss, our_grad = ours()
    except Exception as e:  # noqa: BLE001
        failures.append(f"our rnnt_loss failed: {type(e).__name__}: {e}")
        return {**out, "reason": f"our rnnt_loss failed: {e}"}
    out["losses_ours"] = our_loss.tolist()
    if not (torch.isfinite(our_loss).all() and torch.isfinite(our_grad).all()):
        failures.append("our rnnt_loss: loss or gradient not finite")
    try:  # optional dependency: torchaudio is on the GPU machines, not in pyproject.toml
        import torchaudio.functional as taf

        reference = taf.rnnt_loss
    except (ImportError, AttributeError, OSError) as e:
        print(f"!! torchaudio rnnt_loss unavailable ({e}): the comparison did NOT run", flush=True)
        return {**out, "reason": f"torchaudio rnnt_loss unavailable: {e}"}

    def theirs():
        loss = reference(logits, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
        return loss, torch.autograd.grad(loss.sum(), logits)[0]

    try:
        their_loss, their_grad = theirs()
    except Exception as e:  # noqa: BLE001 - a torchaudio build problem must not lose the model rows
        failures.append(f"torchaudio rnnt_loss failed: {type(e).__name__}: {e}")
        return {**out, "reason": f"torchaudio rnnt_loss failed: {e}"}
    loss_diff = float((our_loss - their_loss).abs().max())
    rel_loss_diff = float(((our_loss - their_loss).abs() / their_loss.abs()).max())
    grad_diff = float((our_grad - their_grad).abs().max())
    # Gradients are probability differences in [-1, 1]; fp32 posteriors exp(alpha + beta - L) at a
    # log-likelihood L near 1e3 carry about L * 2**-23 ~ 1e-4 relative error: 1e-3 absolute is fp32 noise
    # (models.json records the measured max_abs_grad_diff), a wrong lattice term is off by 1e-2 or more.
    ok = rel_loss_diff < 1e-4 and grad_diff < 1e-3
    if not ok:
        failures.append(f"rnnt_loss vs torchaudio: rel loss diff {rel_loss_diff:.2e}, grad diff {grad_diff:.2e}")
    ours_time = timer_for(device)(ours, repeat=repeat, warmup=1)
    theirs_time = timer_for(device)(theirs, repeat=repeat, warmup=1)
    return {**out, "ran": True, "agree": ok,
            "max_abs_loss_diff": loss_diff, "max_rel_loss_diff": rel_loss_diff, "max_abs_grad_diff": grad_diff,
            "losses_torchaudio": their_loss.tolist(), "ours_s": ours_time, "torchaudio_s": theirs_time,
            "ours_over_torchaudio_time": ours_time["median"] / theirs_time["median"]}


def bf16_vs_fp32(rows: list[dict]) -> list[dict]:
    """fp32 / bf16 ratios of step time and peak memory (None off a GPU) per model and fixed shape."""
    ratios = []
    fixed = [r for r in rows if r["shape_source"] == "fixed"]
    for bf16 in (r for r in fixed if r["dtype"] == "bf16" and "step_s" in r):
        match = [r for r in fixed if r["dtype"] == "fp32" and "step_s" in r and r["model"] == bf16["model"]
                 and r["batch_size"] == bf16["batch_size"] and r["duration_s"] == bf16["duration_s"]]
        if match:
            fp32 = match[0]
            ratios.append({"model": bf16["model"], "batch_size": bf16["batch_size"], "duration_s": bf16["duration_s"],
                           "fp32_over_bf16_time": fp32["step_s"]["median"] / bf16["step_s"]["median"],
                           "fp32_over_bf16_peak_memory": None if fp32["peak_bytes"] is None
                           else fp32["peak_bytes"] / bf16["peak_bytes"]})
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for models.json")
    parser.add_argument("--models", nargs="*", default=None, help=f"model names (default: {MODELS}; "
                        f"with --smoke {SMOKE_MODELS})")
    parser.add_argument("--kernels", action="store_true", help="also profile one training step per model: "
                        "the top kernels by self device time (CPU operators on the CPU smoke path)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the encoder blocks first")
    parser.add_argument("--depthwise", choices=DEPTHWISE, default=DEFAULT_DEPTHWISE, help="what runs the subsampling's "
                        "depthwise convolutions (default auto: the Triton kernels on CUDA, torch's elsewhere; "
                        "torch: cuDNN's, e.g. with --name models_cudnn_depthwise)")
    parser.add_argument("--time-depthwise", choices=DEPTHWISE, default=DEFAULT_TIME_DEPTHWISE, help="what runs the "
                        "convolution modules' depthwise convolutions over time (default auto: the kernels of "
                        "workbench/models/time_conv_triton.py on CUDA; torch: nn.Conv1d, e.g. with --name "
                        "models_time_torch)")
    parser.add_argument("--name", default=record.NAME, help="record name: <out>/<name>.json (default models; "
                        "e.g. models_compile with --compile)")
    parser.add_argument("--profile-shapes", nargs="+", default=None, metavar="PATH",
                        help="OOMptimizer records whose 2D profiles give the profile-sized rows (the first that "
                        "holds a model; each model asked for must be in one) (default: the committed "
                        f"{', '.join(p.name for p in PROFILE_RECORDS)}; a model in neither is skipped)")
    parser.add_argument("--profile-buckets", nargs="+", type=int, default=list(PROFILE_BUCKETS), metavar="INDEX",
                        help=f"bucket indices of each profile measured, negative from the end "
                        f"(default: {' '.join(map(str, PROFILE_BUCKETS))})")
    parser.add_argument("--only-profile-shapes", action="store_true", help="measure the profile-sized rows only "
                        "(where the MFU targets are judged), not the fixed shapes")
    parser.add_argument("--smoke", action="store_true", help="tiny models, small shapes, seconds (CPU without "
                        "CUDA); never into benchmarks/results")
    args = parser.parse_args(argv)
    if args.smoke:
        check_smoke_out(parser, args.out)
    args.models = args.models or (SMOKE_MODELS if args.smoke else MODELS)
    try:  # every record problem before anything runs or is written
        args.profile, args.profile_missing = profile_shapes_for(
            args.models, args.profile_shapes or PROFILE_RECORDS, args.profile_buckets,
            strict=args.profile_shapes is not None)
    except ProfileShapeError as e:
        parser.error(str(e))
    if args.only_profile_shapes:  # a model without profile shapes would have no row
        args.models = [m for m in args.models if m in args.profile]
        if not args.models:
            parser.error("--only-profile-shapes: no model asked for has profile shapes")
    if cuda_missing(args.smoke):
        return 2
    device = bench_device()
    with cpu_smoke_torch(args.smoke and device.type == "cpu"):
        return run(args, device)


def run(args, device: torch.device) -> int:
    """The measurements of :func:`main`'s parsed ``args`` (with ``profile`` and ``profile_missing`` from
    :func:`profile_shapes_for`) on ``device``; writes models.json, returns the exit code."""
    models = args.models
    for option, which in (("depthwise", "subsampling"), ("time_depthwise", "time")):
        if getattr(args, option, None) == "triton":
            problem = depthwise_unavailable_reason(device, which=which)
            if problem:
                print(f"--{option.replace('_', '-')} triton: {problem}", file=sys.stderr)
                return 2
    shapes = [] if getattr(args, "only_profile_shapes", False) else SMOKE_SHAPES if args.smoke else SHAPES
    repeat, warmup = (SMOKE_REPEAT, SMOKE_WARMUP) if args.smoke else (REPEAT, WARMUP)
    started = time.perf_counter()
    failures: list[str] = []
    loss_check = torchaudio_check(failures, device=device, shape=SMOKE_LOSS_SHAPE if args.smoke else LOSS_SHAPE,
                                  repeat=2 if args.smoke else 5)
    print(f"torchaudio check: {loss_check}", flush=True)
    matmul = matmul_flops_per_second(smoke=device.type == "cpu")
    print(f"matmul rate: {matmul['flops_per_s'] / 1e12:.4g} TFLOP/s ({matmul['dtype']}, n={matmul['n']})", flush=True)
    for name, why in args.profile_missing.items():
        print(f"{name}: {why}: no profile-sized rows", flush=True)
    params, rows, kernels = {}, [], {}
    kernel_shape = None
    if getattr(args, "kernels", False):
        kernel_shape = SMOKE_KERNEL_SHAPE if args.smoke else KERNEL_SHAPE
    compiled = bool(getattr(args, "compile", False))
    depthwise = depthwise_backend(getattr(args, "depthwise", DEFAULT_DEPTHWISE), device)  # what runs, as recorded
    time_depthwise = depthwise_backend(getattr(args, "time_depthwise", DEFAULT_TIME_DEPTHWISE), device, which="time")
    what = ("training-step time, peak memory, MFU and GPU busy share of the reference models (bf16 vs fp32 at "
            "fixed shapes, bf16 at OOMptimizer profile shapes"
            + (", encoder blocks compiled with torch.compile" if compiled else "")
            + (", subsampling's depthwise convolutions by Triton kernels" if depthwise == "triton" else "")
            + (", convolution modules' depthwise convolutions by Triton kernels" if time_depthwise == "triton" else "")
            + "), and our RNN-T loss against torchaudio's")
    if args.smoke:
        what = (f"SMOKE RUN on {device.type} (tiny models, small shapes"
                + (", CPU wall-clock times, peak memory and GPU busy not measured, MFU against the CPU's "
                   "fp32 matmul rate" if device.type == "cpu" else "")
                + f"; not a measurement): {what}")
    busy_note = (None if device.type == "cuda" else
                 f"GPU busy not measured on {device.type} (no device kernels): gpu_busy and kernel_s are null")

    def save(complete: bool):
        """Rewritten after every model, so a stage timeout keeps the models measured so far."""
        return write_result(getattr(args, "name", record.NAME), what=what,
                            figures={"smoke": bool(args.smoke), "complete": complete, "steps": rows,
                                     "bf16_vs_fp32": bf16_vs_fp32(rows), "parameters": params,
                                     **({"kernels": kernels} if kernel_shape else {}),
                                     "matmul": matmul, "gpu_busy_note": busy_note,
                                     "profile_shapes": {"shapes": args.profile, "skipped": args.profile_missing},
                                     "rnnt_loss_vs_torchaudio": loss_check, "failures": failures,
                                     "bench_wall_s": time.perf_counter() - started},
                            params={"models": models, "shapes": shapes, "timed_steps": repeat,
                                    "warmup_steps": warmup, "device": str(device), "float32_matmul_precision":
                                    torch.get_float32_matmul_precision(), "smoke": bool(args.smoke),
                                    "kernel_shape": kernel_shape, "compile": compiled, "depthwise": depthwise,
                                    "time_depthwise": time_depthwise,
                                    "profile_records": [str(p) for p in (args.profile_shapes or PROFILE_RECORDS)],
                                    "profile_buckets": args.profile_buckets, "profile_dtype": PROFILE_DTYPE},
                            out_dir=args.out)

    for name in models:
        params[name], model_rows, model_kernels = measure_model(
            name, shapes, failures, device=device, repeat=repeat, warmup=warmup, kernel_shape=kernel_shape,
            compile=compiled, depthwise=depthwise, time_depthwise=time_depthwise,
            profile_shapes=args.profile.get(name, ()),
            flops_per_s=matmul["flops_per_s"])
        rows.extend(model_rows)
        if model_kernels is not None:
            kernels[name] = model_kernels
        save(complete=False)
    ratios = bf16_vs_fp32(rows)
    path = save(complete=True)
    total_s = time.perf_counter() - started
    print(f"\nwrote {path} in {total_s:.0f} s")
    print("\n".join(record.table_lines({"steps": rows, "bf16_vs_fp32": ratios, "parameters": params,
                                        "rnnt_loss_vs_torchaudio": loss_check,
                                        "profile_shapes": {"skipped": args.profile_missing}})))
    if kernels:
        print("\n".join(record.kernel_table_lines(kernels)))
    return report_failures(failures)  # a smoke run's checks (finite losses, loss vs torchaudio) hold too


if __name__ == "__main__":
    sys.exit(main())
