"""Where the time of one decode goes, kernel by kernel: one call under torch.profiler, its device activities
summed by (shortened) name, and each one's seconds per outer label-looping iteration.

On CUDA the activities are the kernels and copies (device time); on CPU, where no kernel runs, the
operators (self CPU time), so the same code path can be tested without a GPU. Kernels launched by CUDA
graph replays appear in the profiler's trace on recent CUDA (CUPTI reports each kernel node of a
replayed graph); the iterations of a conditional WHILE node after its first do not (pytorch/kineto#1062),
which is why the decoding bench profiles its partial-graph mode, where the host runs the loop and
replays one graph per stage. A profile that comes back empty on CUDA says so (``empty``) instead of
failing.
"""

from __future__ import annotations

import re
from typing import Any

from benchmarks.profiling import top_kernels

NAME_CHARS = 96  # a shortened kernel name is at most this long (the rest becomes "...")


def short_kernel_name(name: str, limit: int = NAME_CHARS) -> str:
    """A kernel's name without "void ", its parameter list and C++ namespaces, at most ``limit`` characters:
    "void at::native::f<4, at::native::Fill<float> >(int)" -> "f<4, Fill<float> >". A name with a space
    before its first parenthesis ("Memcpy DtoH (Device -> Pinned)") keeps its parentheses."""
    text = re.sub(r"\s+", " ", name.replace("(anonymous namespace)::", "")).strip().removeprefix("void ")
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0 and ch == " ":
            break  # not a C++ signature
        elif depth == 0 and ch == "(" and i > 0:
            text = text[:i]
            break
    text = re.sub(r"\b(?:[A-Za-z_]\w*::)+", "", text).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def kernel_breakdown(events, device_type: str, outer_iterations: int | None) -> dict[str, Any]:
    """The profiler's averages (``prof.key_averages()``) of one decode -> its activities by total time: on
    "cuda" the CUDA kernels and copies by device time, else the CPU operators by self CPU time. Each entry:
    ``name`` (:func:`short_kernel_name`; activities whose short names agree are summed), ``calls``,
    ``seconds`` (total), ``share`` (of the total of all entries) and, when ``outer_iterations`` > 0,
    ``seconds_per_outer_iteration`` and ``calls_per_outer_iteration`` (the decode's totals over its outer
    iterations: per-decode work such as loading the inputs is spread over them too). ``empty`` says why
    there is no entry."""
    found = top_kernels(events, device_type, top=None)["top"]
    merged: dict[str, list] = {}
    for entry in found:
        slot = merged.setdefault(short_kernel_name(entry["name"]), [0, 0.0])
        slot[0] += entry["calls"]
        slot[1] += entry["self_s"]
    total = sum(seconds for _, seconds in merged.values())
    per = outer_iterations if outer_iterations else None
    kernels = [{"name": name, "calls": calls, "seconds": seconds, "share": seconds / total,
                "seconds_per_outer_iteration": None if per is None else seconds / per,
                "calls_per_outer_iteration": None if per is None else calls / per}
               for name, (calls, seconds) in sorted(merged.items(), key=lambda item: -item[1][1])]
    calls = sum(k["calls"] for k in kernels)
    out = {"activities": ("CUDA kernels and copies, device time" if device_type == "cuda"
                          else "CPU operators, self CPU time"),
           "outer_iterations": outer_iterations, "total_s": total, "calls": calls,
           "seconds_per_outer_iteration": None if per is None else total / per,
           "calls_per_outer_iteration": None if per is None else calls / per, "kernels": kernels}
    if not kernels:
        out["empty"] = (f"the profiler recorded no {out['activities'].split(',')[0]} in this decode"
                        + (" (kernels replayed from CUDA graphs not traced by this CUDA / CUPTI?)"
                           if device_type == "cuda" else ""))
    return out
