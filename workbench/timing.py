"""Timing with spread: wall clock on the host, CUDA events on a GPU; medians with min, max and quartiles."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

def timer_for(device) -> Callable[..., dict[str, float]]:
    """:func:`time_cuda` (events) for a CUDA device, :func:`time_cpu` (wall clock) otherwise."""
    return time_cuda if str(device).startswith("cuda") else time_cpu


def summarize(samples: list[float]) -> dict[str, float]:
    """Median with spread (min, max, IQR, count) of repeated measurements, in their own unit."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("summarize() needs at least one sample")
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0], xs[0], xs[0]]
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "p25": q[0], "p75": q[2],
            "n": len(xs)}


# Hand-timed rather than torch.utils.benchmark.Timer: its blocked_autorange reports means over blocks of
# calls, which hides the spread of single calls. On a function that sleeps 1 or 3 ms at random (this CPU),
# 40 calls here gave min-max 1.07-3.14 ms; blocked_autorange gave blocks of 10 with min-max 1.49-2.51 ms.
# Timer.timeit(1) per call keeps the spread but costs 5.1 us per sample against 0.19 us for perf_counter.
def time_cpu(fn: Callable[[], Any], *, repeat: int = 5, warmup: int = 1) -> dict[str, float]:
    """Wall-clock seconds of ``fn()`` on the host: warm-up runs, then ``repeat`` timed runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summarize(samples)


def time_cuda(fn: Callable[[], Any], *, repeat: int = 20, warmup: int = 3) -> dict[str, float]:
    """Seconds of ``fn()`` on the current CUDA device, timed with events after a synchronize."""
    import torch  # here: reading records (reporting, summary) needs no torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    return summarize(samples)

