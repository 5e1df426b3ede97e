"""One loss implementation on one shape, timed and measured; run in its own process for a risky case.

    python3 -m benchmarks.losses.worker --impl torchaudio-rnnt --shape 128 188 120 1024 --repeat 3

prints one JSON line, a :class:`record.LossRun`. torchaudio's kernel can fail with an illegal memory access
past 2**31 logit elements, which leaves the CUDA context unusable: in a subprocess only this run is lost.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
from typing import Callable

import torch

from benchmarks.losses.cost import kernel_work
from workbench.records.losses import LossRun, RowsComparison
from benchmarks.harness import bench_device
from workbench.timing import summarize, timer_for

IMPLS = ("ours-rnnt", "ours-tdt", "torchaudio-rnnt")
TDT_DURATIONS = (0, 1, 2, 3, 4)


def loss_inputs(impl: str, shape: list[int], device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Worst-case inputs of a bucket: logits [B, T, U + 1, classes] (requires grad), targets [B, U] int32, and
    full lengths (int32, as torchaudio takes them)."""
    batch, frames, labels, vocab = shape
    classes = vocab + 1 + (len(TDT_DURATIONS) if impl == "ours-tdt" else 0)
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(batch, frames, labels + 1, classes, generator=gen, device=device, dtype=dtype)
    targets = torch.randint(0, vocab, (batch, labels), generator=gen, device=device, dtype=torch.int32)
    lengths = (torch.full((batch,), frames, device=device, dtype=torch.int32),
               torch.full((batch,), labels, device=device, dtype=torch.int32))
    return logits.requires_grad_(), targets, *lengths


def loss_function(impl: str, vocab: int) -> Callable[..., torch.Tensor]:
    """(logits, targets, logit_lengths, target_lengths, reduction) -> loss, for ``impl`` (blank = vocab)."""
    if impl == "ours-rnnt":
        from workbench.models.losses import rnnt_loss

        return lambda x, y, xl, yl, reduction="sum": rnnt_loss(x, y, xl, yl, blank=vocab, reduction=reduction)
    if impl == "ours-tdt":
        from workbench.models.losses import tdt_loss

        return lambda x, y, xl, yl, reduction="sum": tdt_loss(x, y, xl, yl, blank=vocab, durations=TDT_DURATIONS,
                                                              reduction=reduction)
    if impl == "torchaudio-rnnt":
        import torchaudio.functional as taf

        return lambda x, y, xl, yl, reduction="sum": taf.rnnt_loss(x, y, xl, yl, blank=vocab, reduction=reduction)
    raise ValueError(f"--impl: expected one of {IMPLS}, got {impl!r}")


def backend_line(impl: str, logits: torch.Tensor) -> str:
    if impl.startswith("ours"):
        from workbench.models.losses import loss_backend

        return loss_backend(logits)[1]
    return "torchaudio"


def peak_above_inputs(fn: Callable[[], object], device: torch.device) -> int | None:
    """Bytes allocated at the peak of ``fn()`` above what was allocated before it (None off a GPU)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def profiled_kernels(fn: Callable[[], object]) -> dict:
    """The CUDA kernels of one ``fn()`` by device time (:func:`benchmarks.profiling.top_kernels`' dict)."""
    from benchmarks.profiling import profile_call, top_kernels

    _, events, _ = profile_call(fn, torch.device("cuda", torch.cuda.current_device()))
    return top_kernels(events, "cuda")


def measure(impl: str, shape: list[int], device: torch.device, *, dtype: torch.dtype = torch.float32,
            repeat: int, warmup: int = 1, inputs=None) -> LossRun:
    """Time and peak memory of forward + backward (gradient w.r.t. the logits); an exception becomes
    the run's ``error`` (the figures stay None)."""
    batch, frames, labels, vocab = shape
    classes = vocab + 1 + (len(TDT_DURATIONS) if impl == "ours-tdt" else 0)
    run = LossRun(impl=impl, shape=list(shape), dtype=str(dtype).removeprefix("torch."), backend="?",
                  logit_elements=batch * frames * (labels + 1) * classes)
    if impl.startswith("ours"):
        num_durations = len(TDT_DURATIONS) if impl == "ours-tdt" else 0
        run.kernel_work = [dataclasses.asdict(w) for w in kernel_work(
            list(shape), num_durations, torch.finfo(dtype).bits // 8, TDT_DURATIONS if num_durations else None)]
    try:
        inputs = inputs or loss_inputs(impl, shape, device, dtype)
        fn = loss_function(impl, vocab)
        run.backend = backend_line(impl, inputs[0])

        def step():
            loss = fn(*inputs)
            torch.autograd.grad(loss, inputs[0])
            return loss.detach()

        run.loss_sum = float(step())
        run.peak_above_inputs_bytes = peak_above_inputs(step, device)
        run.time_s = timer_for(device)(step, repeat=repeat, warmup=warmup)
        if device.type == "cuda" and impl.startswith("ours"):
            run.kernels = profiled_kernels(step)
    except Exception as e:  # noqa: BLE001 - recorded, e.g. torchaudio past 2**31 elements
        run.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return run


ROWS_SWEEP = (1, 2, 4, 8)  # nodes per program that compare_rows times besides the default


def compare_rows(shape: list[int], device: torch.device, *, dtype: torch.dtype = torch.float32, repeat: int,
                 warmup: int = 1, sweep: tuple[int, ...] = ROWS_SWEEP) -> RowsComparison:
    """Our RNN-T loss's forward + backward on one set of logits with the default tile of nodes per program
    of the per-node kernels and with each count in ``sweep`` (1 among them), in turn, each call timed on
    its own (the order reverses every round); an exception becomes the comparison's ``error``."""
    from workbench.models import losses_triton

    vocab = shape[3]
    comparison = RowsComparison(shape=list(shape), dtype=str(dtype).removeprefix("torch."), backend="?",
                                default_rows=losses_triton.node_rows(vocab + 1))
    settings = {rows: functools.partial(losses_triton.rows_per_program, rows) for rows in (1, *sweep)}
    settings[comparison.default_rows] = contextlib.nullcontext  # the default as the loss picks it
    samples: dict[int, list[float]] = {rows: [] for rows in settings}
    try:
        inputs = loss_inputs("ours-rnnt", shape, device, dtype)
        fn = loss_function("ours-rnnt", vocab)
        comparison.backend = backend_line("ours-rnnt", inputs[0])

        def step():
            torch.autograd.grad(fn(*inputs), inputs[0])

        timer = timer_for(device)
        for i in range(warmup + repeat):
            for rows in list(settings)[::1 if i % 2 == 0 else -1]:
                with settings[rows]():
                    seconds = timer(step, repeat=1, warmup=0)["median"]
                if i >= warmup:
                    samples[rows].append(seconds)
        comparison.one_row_s = summarize(samples[1])
        comparison.default_rows_s = summarize(samples[comparison.default_rows])
        comparison.default_over_one_row = comparison.default_rows_s["median"] / comparison.one_row_s["median"]
        comparison.by_rows_s = {str(rows): summarize(samples[rows]) for rows in sorted(samples)}
    except Exception as e:  # noqa: BLE001 - recorded, e.g. out of memory at the long shape
        comparison.error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return comparison


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True, choices=IMPLS)
    parser.add_argument("--shape", required=True, type=int, nargs=4, metavar=("B", "T", "U", "V"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    run = measure(args.impl, args.shape, bench_device(), repeat=args.repeat)
    run.in_subprocess = True
    print(json.dumps(dataclasses.asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
