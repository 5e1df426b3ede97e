"""GPU benchmark of the transducer losses: ours (Triton) against torchaudio, TDT against RNN-T, the chunked joint.

    python3 -m benchmarks.losses --out benchmarks/results

In one run on one GPU, forward + backward (the gradient w.r.t. the logits), vocabulary 1024, full lengths:
1. ours vs torchaudio.functional.rnnt_loss on fp32 logits at B=16, T=188, U=120 and B=64, T=70, U=69:
   time (CUDA events, warm-up, median and spread), peak memory above the inputs, and whether losses and
   gradients agree; ours also on bf16 logits;
2. our TDT loss (durations 0-4) on the same shapes;
3. our RNN-T loss with one lattice node per program of its per-node kernels against its default tile of
   nodes (and 2, 4, 8 nodes), timed in turn on the same logits: fp32 at B=16, T=188, U=120 and bf16 at
   B=24, T=500, U=499 (40 s of large-rnnt frames);
4. large-rnnt training steps (bf16, B=64 of 15 s, 120 tokens) with the joint whole, in chunks, and fused with
   the loss (the logits never built: ``joint_loss="fused"``);
5. the joint and loss alone (:mod:`benchmarks.losses.joint`): logits then our loss, fused, and logits then
   torchaudio's loss in fp32, on large-rnnt's encoder and predictor outputs at B=64 of 15 s (120 tokens) and
   B=24 of 40 s (320 tokens, past 2**31 logits: no torchaudio); each with its kernels and the least time its
   output-layer GEMMs can take (3 over every node, fused 4) at that layer's rate measured beside it;
6. B=128, T=188, U=120 (2.98e9 logits, past 2**31): ours here, then torchaudio last, in a subprocess
   (its illegal memory access would poison this process's CUDA context).
Writes <out>/losses.json; exits 1 when ours fails or disagrees with torchaudio (targets are reported, not
enforced).

    python3 -m benchmarks.losses --smoke --out /tmp/smoke   # seconds; CPU stand-ins without CUDA
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

from workbench.records.losses import Agreement, ChunkedStep, LossesRecord, LossRun, table
from benchmarks.losses.worker import compare_rows, loss_function, loss_inputs, measure
from benchmarks.profiling import profile_call, top_kernels
from benchmarks.harness import Run, bench_device, bench_parser, cpu_smoke_torch, start
from workbench.records.results import REPO_ROOT
from workbench.timing import summarize, timer_for

VOCAB = 1024
COMPARE_SHAPES = [[16, 188, 120, VOCAB], [64, 70, 69, VOCAB]]  # [B, T, U, V]
LARGE_SHAPE = [128, 188, 120, VOCAB]
CHUNKED_STEP = ("large-rnnt", 64, 15.0, 120)  # model, batch, seconds, tokens
# (joint_loss, joint_chunk_size) of each training step: the joint whole, in chunks, and fused with the loss
STEP_SETTINGS = [("materialized", 0), ("materialized", 16), ("materialized", 8), ("fused", 0)]
ROWS_SHAPES = [([16, 188, 120, VOCAB], torch.float32), ([24, 500, 499, VOCAB], torch.bfloat16)]
SMOKE_COMPARE_SHAPES = [[2, 6, 3, 8], [3, 4, 2, 8]]
SMOKE_ROWS_SHAPES = [([2, 6, 3, 8], torch.float32), ([3, 5, 4, 8], torch.bfloat16)]
SMOKE_LARGE_SHAPE = [2, 5, 3, 8]
SMOKE_CHUNKED_STEP = ("tiny-rnnt", 4, 1.0, 8)
SMOKE_STEP_SETTINGS = [("materialized", 0), ("materialized", 2), ("fused", 0)]
JOINT_SHAPES = [("large-rnnt", 64, 15.0, 120), ("large-rnnt", 24, 40.0, 320)]  # model, batch, seconds, tokens
SMOKE_JOINT_SHAPES = [("tiny-rnnt", 3, 1.0, 6)]
PARTS = ("compare", "tdt", "rows", "chunked", "joint", "large")


def compare_with_torchaudio(record: LossesRecord, shape: list[int], device, repeat: int) -> None:
    """Ours and torchaudio on the same fp32 logits: agreement, then each timed; ours on bf16 too."""
    inputs = loss_inputs("ours-rnnt", shape, device)
    record.runs.append(measure("ours-rnnt", shape, device, repeat=repeat, inputs=inputs))
    record.runs.append(measure("ours-rnnt", shape, device, dtype=torch.bfloat16, repeat=repeat))
    theirs = measure("torchaudio-rnnt", shape, device, repeat=repeat, inputs=inputs)
    record.runs.append(theirs)
    if theirs.error is None:
        record.agreements.append(agreement(shape, inputs))
        if not record.agreements[-1].agree:
            record.failures.append(f"ours vs torchaudio at {shape} disagree: {record.agreements[-1]}")


def agreement(shape: list[int], inputs) -> Agreement:
    """Per-utterance losses and gradients of ours and torchaudio's on the same fp32 logits, each also
    against our float64 reference: ours agrees when its gradient is as close to float64 as torchaudio's
    (or within 1e-3; gradients are probability differences in [-1, 1], and fp32 posteriors at
    |log P| ~ 1e3 carry ~1e-4 error)."""
    from workbench.models.losses import rnnt_loss_reference

    logits, *rest = inputs
    results = []
    for impl in ("ours-rnnt", "torchaudio-rnnt"):
        loss = loss_function(impl, shape[3])(logits, *rest, reduction="none")
        results.append((loss.detach(), torch.autograd.grad(loss.sum(), logits)[0]))
    (ours, our_grad), (theirs, their_grad) = results
    exact_logits = logits.detach().double().requires_grad_()
    exact = rnnt_loss_reference(exact_logits, *rest, blank=shape[3], reduction="none")
    exact_grad = torch.autograd.grad(exact.sum(), exact_logits)[0]
    rel = float(((ours - theirs).abs() / theirs.abs().clamp_min(1e-6)).max())
    our_error = float((our_grad.double() - exact_grad).abs().max())
    their_error = float((their_grad.double() - exact_grad).abs().max())
    del exact_logits, exact_grad
    return Agreement(shape=shape, max_rel_loss_diff=rel, max_abs_grad_diff=float((our_grad - their_grad).abs().max()),
                     our_grad_error_vs_fp64=our_error, their_grad_error_vs_fp64=their_error,
                     agree=rel < 1e-4 and our_error <= max(their_error, 1e-3))


def chunked_steps(record: LossesRecord, step_shape, settings, device, *, smoke: bool) -> None:
    """Training steps of one transducer model on one batch, for each (joint_loss, joint_chunk_size) of
    ``settings`` (chunk size 0: the whole batch)."""
    from workbench.memory.oom import is_oom_error, release_memory
    from workbench.models import build_model

    name, batch_size, seconds, tokens = step_shape
    dtype_name, dtype = ("float32", torch.float32) if smoke else ("bfloat16", torch.bfloat16)
    with device:
        model = build_model(name)
    batch = model.make_batch(batch_size, seconds, tokens, device)
    for joint_loss, chunk in settings:
        step = ChunkedStep(model=name, batch_size=batch_size, duration_s=seconds, num_tokens=tokens,
                           dtype=dtype_name, joint_chunk_size=chunk, joint_loss=joint_loss)
        model.config.joint_chunk_size, model.config.joint_loss = chunk, joint_loss
        losses = []

        def train_step():
            model.zero_grad(set_to_none=True)
            losses.append(model.training_step(batch, dtype=dtype))

        try:
            release_memory()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            step.step_s = timer_for(device)(train_step, repeat=2 if smoke else 3, warmup=1)
            step.host_s = host_seconds(train_step, device, repeat=2 if smoke else 3)
            step.peak_bytes = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
            step.loss = float(losses[-1])
            step.kernels = top_kernels(profile_call(train_step, device)[1], device.type, top=8)
            print(f"{name} {joint_loss} joint_chunk_size={chunk} top kernels: " + "; ".join(
                f"{k['name'][:60]} {k['share']:.0%}" for k in step.kernels["top"]), flush=True)
        except Exception as e:  # noqa: BLE001 - an OOM is a figure; anything else a failure
            step.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            if not is_oom_error(e):
                record.failures.append(f"{name} {joint_loss} joint_chunk_size={chunk}: {step.error}")
        record.chunked.append(step)
    model.zero_grad(set_to_none=True)
    model = batch = None  # free the GPU memory before the next part
    release_memory()


def host_seconds(fn, device, repeat: int) -> dict[str, float]:
    """Wall seconds until ``fn`` returns, the device idle before each call: the host's time to launch one
    step. Near the step's time, the step is host-bound (the GPU waits for launches, or a call waits for the
    GPU)."""
    samples = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return summarize(samples)


def torchaudio_in_subprocess(shape: list[int], repeat: int) -> LossRun:
    """worker.py for torchaudio on ``shape`` in a fresh process; a crash becomes the run's error."""
    command = [sys.executable, "-m", "benchmarks.losses.worker", "--impl", "torchaudio-rnnt", "--shape",
               *map(str, shape), "--repeat", str(repeat)]
    run = LossRun(impl="torchaudio-rnnt", shape=shape, dtype="float32", backend="torchaudio",
                  logit_elements=shape[0] * shape[1] * (shape[2] + 1) * (shape[3] + 1), in_subprocess=True)
    try:
        proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        run.error = "worker timed out after 120 s"
        return run
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return LossRun(**json.loads(lines[-1]))
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    run.error = f"worker exited with {proc.returncode}: {tail[:200]}"
    return run


def compare_part(record: LossesRecord, args, device) -> None:
    """1. ours vs torchaudio on each compare shape."""
    for shape in _pick(args, SMOKE_COMPARE_SHAPES, COMPARE_SHAPES):
        compare_with_torchaudio(record, shape, device, _repeat(args))


def tdt_part(record: LossesRecord, args, device) -> None:
    """2. our TDT loss on the compare shapes (and our RNN-T there when the compare part did not run)."""
    for shape in _pick(args, SMOKE_COMPARE_SHAPES, COMPARE_SHAPES):
        if "compare" not in args.parts:
            record.runs.append(measure("ours-rnnt", shape, device, repeat=_repeat(args)))
        record.runs.append(measure("ours-tdt", shape, device, repeat=_repeat(args)))


def rows_part(record: LossesRecord, args, device) -> None:
    """3. one lattice node per program against tiles of nodes."""
    for shape, dtype in _pick(args, SMOKE_ROWS_SHAPES, ROWS_SHAPES):
        record.rows.append(compare_rows(shape, device, dtype=dtype, repeat=_repeat(args)))
        _release()


def chunked_part(record: LossesRecord, args, device) -> None:
    """4. training steps with the joint whole, in chunks and fused with the loss."""
    chunked_steps(record, _pick(args, SMOKE_CHUNKED_STEP, CHUNKED_STEP), _pick(args, SMOKE_STEP_SETTINGS, STEP_SETTINGS),
                  device, smoke=args.smoke)


def joint_part(record: LossesRecord, args, device) -> None:
    """5. the joint and loss alone: materialized, fused and torchaudio's on the same inputs."""
    from benchmarks.losses.joint import joint_loss_runs

    dtype = torch.float32 if args.smoke else torch.bfloat16
    for name, batch_size, seconds, tokens in _pick(args, SMOKE_JOINT_SHAPES, JOINT_SHAPES):
        runs = joint_loss_runs(name, batch_size, seconds, tokens, device, dtype=dtype, repeat=min(_repeat(args), 5))
        record.joint += runs
        record.failures += [f"joint + loss {r.impl} B={r.batch_size} {r.duration_s:g} s: {r.error}" for r in runs
                            if r.error and r.impl != "torchaudio" and "out of memory" not in r.error.lower()]


def large_part(record: LossesRecord, args, device) -> None:
    """6. past 2**31 logits: ours here, torchaudio last in a subprocess."""
    large = _pick(args, SMOKE_LARGE_SHAPE, LARGE_SHAPE)
    record.runs.append(measure("ours-rnnt", large, device, repeat=min(_repeat(args), 3)))
    _release()
    record.runs.append(torchaudio_in_subprocess(large, repeat=min(_repeat(args), 3)))


MEASURE_PART = {"compare": compare_part, "tdt": tdt_part, "rows": rows_part, "chunked": chunked_part,
                "joint": joint_part, "large": large_part}  # in the order they run: torchaudio's risky case last


def _pick(args, smoke_value, value):
    return smoke_value if args.smoke else value


def _repeat(args) -> int:
    return 2 if args.smoke else args.repeat


def _release() -> None:
    from workbench.memory.oom import release_memory

    release_memory()


def _refresh(run: Run, record: LossesRecord) -> None:
    """The run's figures: the record as it stands."""
    record.wall_seconds = run.seconds()
    run.figures = record.to_figures()


def _add_run_errors(record: LossesRecord) -> None:
    """Each of our runs that raised is a failure (torchaudio's are figures)."""
    record.failures += [f"{r.impl} {r.dtype} at {r.shape}: {r.error}" for r in record.runs
                        if r.impl.startswith("ours") and r.error]
    record.failures += [f"ours-rnnt rows per program {c.dtype} at {c.shape}: {c.error}" for c in record.rows
                        if c.error]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, parts=PARTS)
    parser.add_argument("--repeat", type=int, default=10, help="timed repeats per loss run")
    parser.add_argument("--name", default="losses", help="the record: <out>/<name>.json, losses or losses_<suffix> "
                        "(default losses)")
    what = ("transducer losses: ours (Triton) vs torchaudio rnnt_loss, TDT vs RNN-T, one node per program vs "
            "tiles of nodes, chunked joint in a training step")
    run = start(parser, argv, name="losses", what=what)
    args, device = run.args, bench_device()
    if args.name != "losses" and not args.name.startswith("losses_"):
        parser.error(f"--name: must be losses or losses_<suffix>, got {args.name!r}")
    run.name = args.name
    if args.smoke and device.type != "cuda":
        run.what = "SMOKE RUN (CPU, pure-PyTorch loss; no figure is a GPU measurement): " + what
    run.params = {"vocab": VOCAB, "compare_shapes": _pick(args, SMOKE_COMPARE_SHAPES, COMPARE_SHAPES),
                  "large_shape": _pick(args, SMOKE_LARGE_SHAPE, LARGE_SHAPE),
                  "rows_shapes": [[shape, str(dtype).removeprefix("torch.")]
                                  for shape, dtype in _pick(args, SMOKE_ROWS_SHAPES, ROWS_SHAPES)],
                  "chunked_step": _pick(args, SMOKE_CHUNKED_STEP, CHUNKED_STEP),
                  "step_settings": _pick(args, SMOKE_STEP_SETTINGS, STEP_SETTINGS),
                  "joint_shapes": _pick(args, SMOKE_JOINT_SHAPES, JOINT_SHAPES)}
    record = LossesRecord(smoke=args.smoke, failures=run.failures)  # one list: the parts' and the record's
    with cpu_smoke_torch(args.smoke and device.type == "cpu"):
        for part, measure_part in MEASURE_PART.items():
            if run.wants(part):
                with run.part(part):
                    measure_part(record, args, device)
                    _refresh(run, record)
    _add_run_errors(record)
    _refresh(run, record)
    print(table(run.figures))
    print(f"targets: {run.figures['targets']}", flush=True)
    return run.finish()
