"""GPU benchmark of the reference models: training-step time and peak memory, plus the RNN-T loss check.

    python3 -m workbench.bench.models --out benchmarks/results

Measures, on one GPU, for large-rnnt, large-tdt, large-aed and xl-aed at three worst-case bucket shapes
(batch x seconds x tokens) in bf16 autocast and fp32: the median of 3 training steps (forward + loss +
backward, after 1 warm-up; gradients zeroed between steps, no optimizer step) and the peak allocated
memory. Ratios compare bf16 with fp32 on the same model and shape. Then it checks our pure-PyTorch RNN-T
loss against torchaudio.functional.rnnt_loss (loss and gradients on the same logits) and times both.
Writes <out>/models.json (``record.py`` owns its fields). Exits non-zero when a loss is not finite,
the torchaudio comparison disagrees or fails, or a step fails for any reason other than running out of
memory (the other steps still run and the JSON is still written, with the error under "failures").

    python3 -m workbench.bench.models --smoke --out /tmp/smoke    # seconds, CPU when there is no CUDA

--kernels: also one profiled training step per model (torch.profiler, after a warm-up step; CUDA kernels on
a GPU, CPU operators on the CPU smoke path) at KERNEL_SHAPE in bf16: the top kernels by self device time
and their share of the step's total, under "kernels" in the record.

--compile: the encoder blocks compiled with torch.compile (workbench.models.compile_encoder_layers; each
shape's warm-up step compiles); with --name models_compile the record sits beside the eager one.

--smoke: tiny-rnnt and tiny-aed at two small shapes, 2 timed steps, and a small loss comparison (when
torchaudio is installed). Without CUDA the steps run on the CPU: times are CPU wall clock and peak
memory is not measured (null). The JSON is marked "smoke": true and goes only to --out (required).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from workbench.bench.models import record
from workbench.bench.results import (bench_device, check_smoke_out, cpu_smoke_torch, cuda_missing, report_failures,
                                     timer_for, write_result)
from workbench.memory.oom import is_oom_error, release_memory
from workbench.models import build_model, compile_encoder_layers, count_parameters, rnnt_loss
from workbench.models.model import DTYPES
from workbench.units import GiB

MODELS = ["large-rnnt", "large-tdt", "large-aed", "xl-aed"]
SHAPES = [(32, 5.0, 40), (16, 15.0, 120), (8, 30.0, 240)]  # (batch, seconds, tokens): worst case of a bucket
SMOKE_MODELS = ["tiny-rnnt", "tiny-aed"]
SMOKE_SHAPES = [(2, 1.0, 8), (1, 2.0, 16)]
LOSS_SHAPE = (8, 120, 40, 1024)  # (batch, frames, labels, vocab) of the loss comparison
SMOKE_LOSS_SHAPE = (2, 12, 5, 16)
KERNEL_SHAPE = (16, 15.0, 120)  # (batch, seconds, tokens) of the profiled step
SMOKE_KERNEL_SHAPE = (2, 1.0, 8)
TOP_KERNELS = 12  # kernels kept per model


def note_failure(row: dict, error: Exception, failures: list[str], what: str) -> None:
    """An OOM marks the row ("oom": True); any other error is the row's "error" and a failure."""
    if is_oom_error(error):
        row["oom"] = True
    else:
        row["error"] = f"{type(error).__name__}: {error}"
        failures.append(f"{what}: {row['error']}")


def top_kernels(events, device_type: str, top: int = TOP_KERNELS) -> dict:
    """The profiler's averages (``prof.key_averages()``) -> {"total_s", "top": [{"name", "self_s", "share",
    "calls"}]}: on "cuda" the CUDA kernels (and copies) by self device time, else the CPU operators by
    self CPU time; share is of the summed self time of all of them."""
    if device_type == "cuda":
        rows = [(e.key, e.self_device_time_total, e.count) for e in events
                if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0]
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in events if e.self_cpu_time_total > 0]
    total_us = sum(t for _, t, _ in rows)
    rows.sort(key=lambda r: -r[1])
    return {"total_s": total_us / 1e6,
            "top": [{"name": key, "self_s": t / 1e6, "share": t / total_us, "calls": int(count)}
                    for key, t, count in rows[:top]]}


def profile_step(model, name: str, shape, failures: list[str], *, device: torch.device,
                 dtype_name: str = "bf16") -> dict:
    """One profiled training step of ``model`` at ``shape`` after a warm-up step: :func:`top_kernels`
    plus the shape, or {"error"} / {"oom": True} when the step fails."""
    batch_size, seconds, tokens = shape
    out = {"dtype": dtype_name, "batch_size": batch_size, "duration_s": seconds, "num_tokens": tokens,
           "device": device.type}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        batch = model.make_batch(batch_size, seconds, tokens, device)
        model.training_step(batch, dtype=DTYPES[dtype_name])  # warm-up: kernels compiled, algorithms picked
        model.zero_grad(set_to_none=True)
        with torch.profiler.profile(activities=activities) as prof:
            model.training_step(batch, dtype=DTYPES[dtype_name])
            if device.type == "cuda":
                torch.cuda.synchronize()
        out.update(top_kernels(prof.key_averages(), device.type))
    except Exception as e:  # noqa: BLE001
        note_failure(out, e, failures, f"{name} kernel profile")
    model.zero_grad(set_to_none=True)
    batch = None  # noqa: F841
    release_memory()
    return out


def measure_model(name: str, shapes, failures: list[str], *, device: torch.device, repeat: int = 3,
                  warmup: int = 1, kernel_shape=None, compile: bool = False
                  ) -> tuple[int | None, list[dict], dict | None]:
    """Rows of step time and peak memory (None off a GPU) per shape and dtype, and with ``kernel_shape``
    the :func:`profile_step` of one bf16 step there (else None); ``compile``: the encoder blocks
    compiled first. A step that fails for a reason other than memory is a failure (its row has "error");
    the other rows still run."""
    try:
        with device:  # built on the device: an xl model is never initialized on the host
            model = build_model(name)
        if compile:
            compile_encoder_layers(model)
    except Exception as e:  # noqa: BLE001 - one broken model must not lose the others' rows
        failures.append(f"{name}: build failed: {type(e).__name__}: {e}")
        return None, [], None
    params = count_parameters(model)
    rows = []
    on_cuda = device.type == "cuda"
    for batch_size, seconds, tokens in shapes:
        for dtype_name, dtype in DTYPES.items():
            row = {"model": name, "batch_size": batch_size, "duration_s": seconds, "num_tokens": tokens,
                   "dtype": dtype_name}
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
            except Exception as e:  # noqa: BLE001
                note_failure(row, e, failures, f"{name} {dtype_name} B={batch_size} {seconds}s")
            model.zero_grad(set_to_none=True)
            losses.clear()
            batch = None  # noqa: F841 - drop the batch before the next shape
            release_memory()
            rows.append(row)
            ms = row.get("step_s", {}).get("median", float("nan")) * 1e3
            peak = "-" if row.get("peak_bytes") is None else f"{row['peak_bytes'] / GiB:.1f} GiB"
            flag = " OOM" if row.get("oom") else (" ERROR" if row.get("error") else "")
            print(f"  {name} {dtype_name} B={batch_size} {seconds:g}s U={tokens}: {ms:.1f} ms, {peak}{flag}",
                  flush=True)
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
    """fp32 / bf16 ratios of step time and peak memory (None off a GPU) per model and shape."""
    ratios = []
    for bf16 in (r for r in rows if r["dtype"] == "bf16" and "step_s" in r):
        match = [r for r in rows if r["dtype"] == "fp32" and "step_s" in r and r["model"] == bf16["model"]
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
    parser.add_argument("--name", default=record.NAME, help="record name: <out>/<name>.json (default models; "
                        "e.g. models_compile with --compile)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, small shapes, seconds (CPU without "
                        "CUDA); never into benchmarks/results")
    args = parser.parse_args(argv)
    if args.smoke:
        check_smoke_out(parser, args.out)
    if cuda_missing(args.smoke):
        return 2
    device = bench_device()
    with cpu_smoke_torch(args.smoke and device.type == "cpu"):
        return run(args, device)


def run(args, device: torch.device) -> int:
    """The measurements of :func:`main`'s parsed ``args`` on ``device``; writes models.json, returns the exit code."""
    models = args.models or (SMOKE_MODELS if args.smoke else MODELS)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    repeat = 2 if args.smoke else 3
    started = time.perf_counter()
    failures: list[str] = []
    loss_check = torchaudio_check(failures, device=device, shape=SMOKE_LOSS_SHAPE if args.smoke else LOSS_SHAPE,
                                  repeat=2 if args.smoke else 5)
    print(f"torchaudio check: {loss_check}", flush=True)
    params, rows, kernels = {}, [], {}
    kernel_shape = None
    if getattr(args, "kernels", False):
        kernel_shape = SMOKE_KERNEL_SHAPE if args.smoke else KERNEL_SHAPE
    compiled = bool(getattr(args, "compile", False))
    what = ("training-step time and peak memory of the reference models (bf16 vs fp32"
            + (", encoder blocks compiled with torch.compile" if compiled else "")
            + "), and our RNN-T loss against torchaudio's")
    if args.smoke:
        what = (f"SMOKE RUN on {device.type} (tiny models, small shapes"
                + (", CPU wall-clock times, peak memory not measured" if device.type == "cpu" else "")
                + f"; not a measurement): {what}")

    def save(complete: bool):
        """Rewritten after every model, so a stage timeout keeps the models measured so far."""
        return write_result(getattr(args, "name", record.NAME), what=what,
                            figures={"smoke": bool(args.smoke), "complete": complete, "steps": rows,
                                     "bf16_vs_fp32": bf16_vs_fp32(rows), "parameters": params,
                                     **({"kernels": kernels} if kernel_shape else {}),
                                     "rnnt_loss_vs_torchaudio": loss_check, "failures": failures,
                                     "bench_wall_s": time.perf_counter() - started},
                            params={"models": models, "shapes": shapes, "timed_steps": repeat, "warmup_steps": 1,
                                    "device": str(device), "float32_matmul_precision":
                                    torch.get_float32_matmul_precision(), "smoke": bool(args.smoke),
                                    "kernel_shape": kernel_shape, "compile": compiled},
                            out_dir=args.out)

    for name in models:
        params[name], model_rows, model_kernels = measure_model(name, shapes, failures, device=device,
                                                                repeat=repeat, kernel_shape=kernel_shape,
                                                                compile=compiled)
        rows.extend(model_rows)
        if model_kernels is not None:
            kernels[name] = model_kernels
        save(complete=False)
    ratios = bf16_vs_fp32(rows)
    path = save(complete=True)
    total_s = time.perf_counter() - started
    print(f"\nwrote {path} in {total_s:.0f} s")
    print("\n".join(record.table_lines({"steps": rows, "bf16_vs_fp32": ratios, "parameters": params,
                                        "rnnt_loss_vs_torchaudio": loss_check})))
    if kernels:
        print("\n".join(record.kernel_table_lines(kernels)))
    return report_failures(failures)  # a smoke run's checks (finite losses, loss vs torchaudio) hold too


if __name__ == "__main__":
    sys.exit(main())
