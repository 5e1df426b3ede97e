"""torch.profiler for the benches: one call profiled, and its activities ranked by self time.

On CUDA the activities ranked are the kernels and copies (self device time); on CPU, where no kernel runs,
the operators (self CPU time), so the same code path runs in CPU tests.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

TOP_KERNELS = 12  # activities :func:`top_kernels` keeps unless told otherwise


def profile_call(call: Callable[[], Any], device: torch.device) -> tuple[Any, Any, float]:
    """Run ``call()`` once under torch.profiler (CPU and, on CUDA, CUDA activities; the device synchronized
    before and inside): (its result, ``prof.key_averages()``, wall seconds of it all: the call, the
    profiler's start, stop and processing of the trace)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        result = call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    averages = prof.key_averages()
    return result, averages, time.perf_counter() - start


def top_kernels(events, device_type: str, top: int | None = TOP_KERNELS) -> dict:
    """The profiler's averages (``prof.key_averages()``) -> {"total_s", "top": [{"name", "self_s", "share",
    "calls"}]}, largest first: on "cuda" the CUDA kernels (and copies) by self device time, else the CPU
    operators by self CPU time; activities with no self time are left out. ``total_s`` and each ``share``
    are of the summed self time of all of them, ``top`` keeps the first ``top`` (None: all)."""
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
