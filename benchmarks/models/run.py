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
same logits) and times both. Writes <out>/models.json (workbench/records/models.py reads its fields). Exits non-zero
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

--joint-loss materialized|fused (default materialized): the transducers' joint and loss with the logits
built, or fused (workbench.models.fused_joint_loss; build_model(name, joint_loss="fused")), e.g. with --name
models_fused. The FLOPs behind MFU are counted on the materialized step either way (model FLOPs: the fused
path's recomputed logits in the backward are not counted), so MFU compares with the default record.

--budget-s: no model starts after this many wall seconds (one that does not is a failure; 0, the default:
no limit).

--smoke: tiny-rnnt and tiny-aed at two small shapes, 2 timed steps after 1 warm-up, and a small loss
comparison (when torchaudio is installed). Without CUDA the steps run on the CPU: times are CPU wall
clock, peak memory and GPU busy are not measured (null), and MFU is against the CPU's fp32 matmul rate.
The committed records hold no tiny model, so a smoke run has profile rows only from a record given with
--profile-shapes. The JSON is marked "smoke": true and goes only to --out (required).
"""

from __future__ import annotations

import sys

import torch

from benchmarks.harness import Run, bench_device, bench_parser, cpu_smoke_torch, cuda_missing, start
from benchmarks.mfu import matmul_flops_per_second
from benchmarks.models.loss_check import LOSS_SHAPE, torchaudio_check
from benchmarks.models.rows import REPEAT, WARMUP, bf16_vs_fp32, measure_model
from benchmarks.models.shapes import (PROFILE_BUCKETS, PROFILE_DTYPE, PROFILE_RECORDS, ProfileShapeError,
                                      profile_shapes_for)
from workbench.models.config import (DEFAULT_DEPTHWISE, DEFAULT_JOINT_LOSS, DEFAULT_TIME_DEPTHWISE, DEPTHWISE,
                                     JOINT_LOSSES, check_joint_loss, reference_head)
from workbench.models.encoder import depthwise_backend, depthwise_unavailable_reason
from workbench.records import models as record

MODELS = ["large-rnnt", "large-tdt", "xl-aed", "large-aed"]  # the MFU targets' models first
SHAPES = [(32, 5.0, 40), (16, 15.0, 120), (8, 30.0, 240)]  # (batch, seconds, tokens): worst case of a bucket
SMOKE_MODELS = ["tiny-rnnt", "tiny-aed"]
SMOKE_SHAPES = [(2, 1.0, 8), (1, 2.0, 16)]
SMOKE_LOSS_SHAPE = (2, 12, 5, 16)  # (batch, frames, labels, vocab)
KERNEL_SHAPE = (16, 15.0, 120)  # (batch, seconds, tokens) of the profiled step
SMOKE_KERNEL_SHAPE = (2, 1.0, 8)
SMOKE_REPEAT, SMOKE_WARMUP = 2, 1  # timed and warm-up steps per row in a smoke run


def parser():
    """The harness's options (``--out`` required) and the bench's own."""
    out = bench_parser(__doc__, out_required=True)
    out.add_argument("--models", nargs="*", default=None, help=f"model names (default: {MODELS}; "
                     f"with --smoke {SMOKE_MODELS})")
    out.add_argument("--kernels", action="store_true", help="also profile one training step per model: "
                     "the top kernels by self device time (CPU operators on the CPU smoke path)")
    out.add_argument("--compile", action="store_true", help="torch.compile the encoder blocks first")
    out.add_argument("--depthwise", choices=DEPTHWISE, default=DEFAULT_DEPTHWISE, help="what runs the subsampling's "
                     "depthwise convolutions (default auto: the Triton kernels on CUDA, torch's elsewhere; "
                     "torch: cuDNN's, e.g. with --name models_cudnn_depthwise)")
    out.add_argument("--time-depthwise", choices=DEPTHWISE, default=DEFAULT_TIME_DEPTHWISE, help="what runs the "
                     "convolution modules' depthwise convolutions over time (default auto: the kernels of "
                     "workbench/models/time_conv_triton.py on CUDA; torch: nn.Conv1d, e.g. with --name "
                     "models_time_torch)")
    out.add_argument("--joint-loss", choices=JOINT_LOSSES, default=DEFAULT_JOINT_LOSS, help="the transducers' joint "
                     "and loss: materialized (the logits built) or fused (never built), e.g. with --name "
                     "models_fused; MFU counts the materialized step's FLOPs either way")
    out.add_argument("--name", default=record.NAME, help="record name: <out>/<name>.json (default models; "
                     "e.g. models_compile with --compile)")
    out.add_argument("--profile-shapes", nargs="+", default=None, metavar="PATH",
                     help="OOMptimizer records whose 2D profiles give the profile-sized rows (the first that "
                     "holds a model; each model asked for must be in one) (default: the committed "
                     f"{', '.join(p.name for p in PROFILE_RECORDS)}; a model in neither is skipped)")
    out.add_argument("--profile-buckets", nargs="+", type=int, default=list(PROFILE_BUCKETS), metavar="INDEX",
                     help=f"bucket indices of each profile measured, negative from the end "
                     f"(default: {' '.join(map(str, PROFILE_BUCKETS))})")
    out.add_argument("--only-profile-shapes", action="store_true", help="measure the profile-sized rows only "
                     "(where the MFU targets are judged), not the fixed shapes")
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse and check the options (every record problem before anything runs), then :func:`measure`."""
    options = parser()
    run = start(options, argv, name=record.NAME, what="", needs_cuda=False)
    args = run.args
    run.name, run.smoke_note = args.name, ""  # a smoke run's "what" says so itself
    args.models = args.models or (SMOKE_MODELS if args.smoke else MODELS)
    try:
        profile, missing = profile_shapes_for(args.models, args.profile_shapes or PROFILE_RECORDS,
                                              args.profile_buckets, strict=args.profile_shapes is not None)
    except ProfileShapeError as e:
        options.error(str(e))
    if args.only_profile_shapes:  # a model without profile shapes would have no row
        args.models = [m for m in args.models if m in profile]
        if not args.models:
            options.error("--only-profile-shapes: no model asked for has profile shapes")
    for name in args.models:
        try:
            check_joint_loss(args.joint_loss, reference_head(name), name, option="--joint-loss",
                             model_option="--models")
        except ValueError as e:
            options.error(str(e))
    if cuda_missing(args.smoke):
        return 2
    device = bench_device()
    for option, which in (("depthwise", "subsampling"), ("time_depthwise", "time")):
        problem = getattr(args, option) == "triton" and depthwise_unavailable_reason(device, which=which)
        if problem:
            print(f"--{option.replace('_', '-')} triton: {problem}", file=sys.stderr)
            return 2
    with cpu_smoke_torch(args.smoke and device.type == "cpu"):
        return measure(run, device, profile, missing)


def describe(run: Run, device: torch.device, depthwise: str, time_depthwise: str) -> str:
    """The record's "what": which models, settings and machine; a smoke run begins with "SMOKE RUN"."""
    what = ("training-step time, peak memory, MFU and GPU busy share of the reference models (bf16 vs fp32 at "
            "fixed shapes, bf16 at OOMptimizer profile shapes"
            + (", encoder blocks compiled with torch.compile" if run.args.compile else "")
            + (", subsampling's depthwise convolutions by Triton kernels" if depthwise == "triton" else "")
            + (", convolution modules' depthwise convolutions by Triton kernels" if time_depthwise == "triton" else "")
            + (", the transducers' joint and loss fused (logits never built)" if run.args.joint_loss == "fused" else "")
            + "), and our RNN-T loss against torchaudio's")
    if run.smoke:
        what = (f"SMOKE RUN on {device.type} (tiny models, small shapes"
                + (", CPU wall-clock times, peak memory and GPU busy not measured, MFU against the CPU's "
                   "fp32 matmul rate" if device.type == "cpu" else "")
                + f"; not a measurement): {what}")
    return what


def settings(run: Run, device: torch.device) -> dict:
    """The record's params: what ran (the backends build_model picked, never "auto") with which settings."""
    args, smoke = run.args, run.smoke
    shapes = [] if args.only_profile_shapes else SMOKE_SHAPES if smoke else SHAPES
    repeat, warmup = (SMOKE_REPEAT, SMOKE_WARMUP) if smoke else (REPEAT, WARMUP)
    return {"models": args.models, "shapes": shapes, "timed_steps": repeat, "warmup_steps": warmup,
            "device": str(device), "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "smoke": smoke, "kernel_shape": (SMOKE_KERNEL_SHAPE if smoke else KERNEL_SHAPE) if args.kernels else None,
            "compile": bool(args.compile), "depthwise": depthwise_backend(args.depthwise, device),
            "time_depthwise": depthwise_backend(args.time_depthwise, device, which="time"),
            "joint_loss": args.joint_loss, "profile_records": [str(p) for p in (args.profile_shapes or PROFILE_RECORDS)],
            "profile_buckets": args.profile_buckets, "profile_dtype": PROFILE_DTYPE}


def measure(run: Run, device: torch.device, profile: dict, missing: dict) -> int:
    """The loss check, the matmul rate, then each model's rows (``profile``: its profile shapes, ``missing``:
    why a model has none); models.json is saved after each model. Returns the exit code: a failed check
    counts in a smoke run too (finite losses, ours against torchaudio)."""
    params = run.params = settings(run, device)
    run.what = describe(run, device, params["depthwise"], params["time_depthwise"])
    loss_check = torchaudio_check(run.failures, device=device, shape=SMOKE_LOSS_SHAPE if run.smoke else LOSS_SHAPE,
                                  repeat=2 if run.smoke else 5)
    print(f"torchaudio check: {loss_check}", flush=True)
    matmul = matmul_flops_per_second(smoke=device.type == "cpu")
    print(f"matmul rate: {matmul['flops_per_s'] / 1e12:.4g} TFLOP/s ({matmul['dtype']}, n={matmul['n']})", flush=True)
    fig = run.figures
    fig.update({"smoke": run.smoke, "complete": False, "steps": [], "bf16_vs_fp32": [], "parameters": {},
                **({"kernels": {}} if params["kernel_shape"] else {}), "matmul": matmul,
                "gpu_busy_note": None if device.type == "cuda" else f"GPU busy not measured on {device.type} (no "
                "device kernels): gpu_busy and kernel_s are null",
                "profile_shapes": {"shapes": profile, "skipped": missing}, "rnnt_loss_vs_torchaudio": loss_check,
                "bench_wall_s": run.seconds()})
    for name, why in missing.items():
        print(f"{name}: {why}: no profile-sized rows", flush=True)
    for name in params["models"]:
        if run.wants(name):
            with run.part(name):
                measure_one(run, name, device, profile.get(name, ()))
    fig["complete"] = True
    fig["bench_wall_s"] = run.seconds()
    print("\n".join(record.table_lines(fig)))
    if fig.get("kernels"):
        print("\n".join(record.kernel_table_lines(fig["kernels"])))
    return run.finish(enforce_smoke=True)


def measure_one(run: Run, name: str, device: torch.device, profile_shapes) -> None:
    """One model's rows (:func:`measure_model`) into the record; its parameter count stays None when it
    fails to build."""
    fig, params = run.figures, run.params
    fig["parameters"][name] = None
    fig["parameters"][name], rows, kernels = measure_model(
        name, params["shapes"], run.failures, device=device, repeat=params["timed_steps"],
        warmup=params["warmup_steps"], kernel_shape=params["kernel_shape"], compile=params["compile"],
        depthwise=params["depthwise"], time_depthwise=params["time_depthwise"], joint_loss=params["joint_loss"],
        profile_shapes=profile_shapes, flops_per_s=fig["matmul"]["flops_per_s"])
    fig["steps"].extend(rows)
    fig["bf16_vs_fp32"] = bf16_vs_fp32(fig["steps"])
    fig["bench_wall_s"] = run.seconds()
    if kernels is not None:
        fig["kernels"][name] = kernels


if __name__ == "__main__":
    sys.exit(main())
