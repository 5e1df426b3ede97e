"""The rows of the models bench: per model, shape and dtype, the median training-step time, the peak memory,
MFU and GPU busy share; one profiled step per model; fp32 / bf16 ratios."""

from __future__ import annotations

import torch

from benchmarks.mfu import busy_share, step_flops, utilization
from benchmarks.models.shapes import row_shapes
from benchmarks.profiling import TOP_KERNELS, profile_call, top_kernels
from workbench.memory.oom import is_oom_error, release_memory
from workbench.models import build_model, compile_encoder_layers, count_parameters
from workbench.models.config import DEFAULT_DEPTHWISE, DEFAULT_JOINT_LOSS, DEFAULT_TIME_DEPTHWISE
from workbench.models.model import DTYPES
from workbench.records import models as record
from workbench.timing import timer_for

REPEAT, WARMUP = 5, 2  # timed steps and warm-up steps per row
ROW_KERNELS = TOP_KERNELS  # kernels kept on each profile-sized row (all that profiled_step keeps)


def note_failure(row: dict, error: Exception, failures: list[str], what: str) -> None:
    """An OOM marks the row ("oom": True); any other error is the row's "error" and a failure."""
    if is_oom_error(error):
        row["oom"] = True
    else:
        row["error"] = f"{type(error).__name__}: {error}"
        failures.append(f"{what}: {row['error']}")


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
    except Exception as e:  # noqa: BLE001 - the profile records its error; the rows stay
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
    except Exception as e:  # noqa: BLE001 - the row keeps flops None; the failure is recorded
        if not is_oom_error(e):
            failures.append(f"{name} B={shape['batch_size']} {shape['duration_s']:g}s: FLOP count failed: "
                            f"{type(e).__name__}: {e}")
        else:  # e.g. a shape that fits only with the joint and loss fused: the count runs the logits built
            print(f"  {name} B={shape['batch_size']} {shape['duration_s']:g}s: the FLOP count's step (logits "
                  "built) ran out of memory: no MFU", flush=True)
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


def build(name: str, device: torch.device, *, compile: bool = False, depthwise: str = DEFAULT_DEPTHWISE,
          time_depthwise: str = DEFAULT_TIME_DEPTHWISE, joint_loss: str = DEFAULT_JOINT_LOSS):
    """The model ``name`` built on ``device`` (an xl model is never initialized on the host); ``compile``: its
    encoder blocks compiled; ``depthwise``, ``time_depthwise``, ``joint_loss``: build_model's options."""
    with device:
        model = build_model(name, depthwise=depthwise, time_depthwise=time_depthwise, joint_loss=joint_loss)
    if compile:
        compile_encoder_layers(model)
    return model


def time_row(model, row: dict, failures: list[str], *, device: torch.device, repeat: int, warmup: int) -> dict | None:
    """Fill ``row`` (a shape and a dtype) with the median of ``repeat`` training steps after ``warmup`` ones
    (``step_s``), ``peak_bytes`` (None off a GPU), the last ``loss`` and ``audio_s_per_s`` (audio seconds per
    wall second); a loss that is not finite is a failure. Returns :func:`profiled_step` of the same batch on
    CUDA, else None."""
    dtype, on_cuda = DTYPES[row["dtype"]], device.type == "cuda"
    batch_size, seconds = row["batch_size"], row["duration_s"]
    losses = []
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    batch = model.make_batch(batch_size, seconds, row["num_tokens"], device)

    def step():
        model.zero_grad(set_to_none=True)
        losses.append(model.training_step(batch, dtype=dtype))

    row["step_s"] = timer_for(device)(step, repeat=repeat, warmup=warmup)
    row["peak_bytes"] = torch.cuda.max_memory_allocated() if on_cuda else None
    row["loss"] = float(losses[-1])
    row["audio_s_per_s"] = batch_size * seconds / row["step_s"]["median"]
    if not all(torch.isfinite(x).item() for x in losses):
        failures.append(f"{row['model']} {row['dtype']} B={batch_size} {seconds}s: loss not finite "
                        f"{[float(x) for x in losses]}")
    return profiled_step(model, batch, dtype, device) if on_cuda else None


def measure_row(model, row: dict, flops: float | None, failures: list[str], *, device: torch.device, repeat: int,
                warmup: int, flops_per_s: float | None) -> dict:
    """:func:`time_row` and :func:`add_utilization` of ``row``; a profile-sized row on CUDA also keeps its
    step's ``top_kernels`` (``ROW_KERNELS`` of them). A step that fails marks the row (:func:`note_failure`)."""
    try:
        profiled = time_row(model, row, failures, device=device, repeat=repeat, warmup=warmup)
        add_utilization(row, flops, flops_per_s, None if profiled is None else profiled["total_s"])
        if profiled is not None and row["shape_source"] == "profile":  # where MFU is judged
            row["top_kernels"] = profiled["top"][:ROW_KERNELS]
    except Exception as e:  # noqa: BLE001 - the row records its error; the other rows still run
        note_failure(row, e, failures, f"{row['model']} {row['dtype']} B={row['batch_size']} {row['duration_s']}s")
    model.zero_grad(set_to_none=True)
    release_memory()
    return row


def measure_model(name: str, shapes, failures: list[str], *, device: torch.device, repeat: int = REPEAT,
                  warmup: int = WARMUP, kernel_shape=None, compile: bool = False,
                  depthwise: str = DEFAULT_DEPTHWISE, time_depthwise: str = DEFAULT_TIME_DEPTHWISE,
                  joint_loss: str = DEFAULT_JOINT_LOSS, profile_shapes=(),
                  flops_per_s: float | None = None) -> tuple[int, list[dict], dict | None]:
    """(parameter count, rows, kernel profile) of model ``name``: a row of step time, peak memory (None off a
    GPU), MFU against ``flops_per_s`` and GPU busy share (None off a GPU) per fixed shape and dtype and per
    profile shape (bf16), and with ``kernel_shape`` the :func:`profile_step` of one bf16 step there (else None).
    ``compile``, ``depthwise``, ``time_depthwise``, ``joint_loss``: see :func:`build`, whose errors propagate. A
    step that fails for a reason other than memory is a failure (its row has "error"); the other rows still run."""
    model = build(name, device, compile=compile, depthwise=depthwise, time_depthwise=time_depthwise,
                  joint_loss=joint_loss)
    params, rows = count_parameters(model), []
    for shape, dtype_names in row_shapes(shapes, profile_shapes):
        flops = count_flops(model, name, shape, failures, device=device)
        for dtype_name in dtype_names:
            row = measure_row(model, {"model": name, **shape, "dtype": dtype_name}, flops, failures, device=device,
                              repeat=repeat, warmup=warmup, flops_per_s=flops_per_s)
            rows.append(row)
            print(f"  {record.row_line(row)}", flush=True)
            for line in record.row_kernel_lines(row):
                print(f"    {line}", flush=True)
    kernels = None if kernel_shape is None else profile_step(model, name, kernel_shape, failures, device=device)
    model = None  # noqa: F841 - free the weights before the next model is built
    release_memory()
    return params, rows, kernels


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

