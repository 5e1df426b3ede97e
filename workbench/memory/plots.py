"""Plots of memory telemetry: per-step columns from MemoryRecorder, live or as kept in a bench record.

Every function takes ``series``: config name -> per-step columns (lists or a DataFrame) with at least
``time_s``, ``allocated_bytes``, ``reserved_bytes``, ``device_allocs`` (bytes, counts, seconds), and
returns a matplotlib Figure.
"""

from __future__ import annotations

from typing import Any, Mapping

import matplotlib.pyplot as plt

from workbench.units import GiB


def _columns(data: Any) -> Mapping[str, list]:
    if hasattr(data, "to_dict"):
        return {k: list(v) for k, v in data.to_dict(orient="list").items()}
    return data


def plot_memory_curves(series: Mapping[str, Any], *, warmup_steps: int | None = None, title: str | None = None):
    """Peak allocated within each step (solid; allocated at its end when peaks are absent) and reserved at
    its end (dashed), GiB, one colour per config."""
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, data) in enumerate(series.items()):
        cols, colour = _columns(data), f"C{i}"
        used = "peak_allocated_bytes" if "peak_allocated_bytes" in cols else "allocated_bytes"
        steps = range(len(cols[used]))
        ax.plot(steps, [b / GiB for b in cols[used]], color=colour, lw=1.2,
                label=f"{name} {used.replace('_bytes', '').replace('_', ' ')}")
        ax.plot(steps, [b / GiB for b in cols["reserved_bytes"]], color=colour, lw=1.2, ls="--",
                label=f"{name} reserved")
    if warmup_steps:
        ax.axvline(warmup_steps - 0.5, color="grey", lw=0.8)
        ax.text(warmup_steps, ax.get_ylim()[1], " measured", va="top", fontsize=8, color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("GiB")
    ax.set_title(title or "Memory per step")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def plot_device_allocs(series: Mapping[str, Any], *, warmup_steps: int | None = None,
                       title: str = "Device allocations per step"):
    """Device allocations (cudaMalloc or segment maps) per step, one panel per config."""
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 1.6 * len(series) + 0.6), sharex=True, squeeze=False)
    for ax, (i, (name, data)) in zip(axes[:, 0], enumerate(series.items())):
        counts = _columns(data)["device_allocs"]
        ax.bar(range(len(counts)), counts, color=f"C{i}", width=0.8)
        ax.set_yscale("symlog", linthresh=1)  # the first steps allocate hundreds, later ones a few or none
        if warmup_steps:
            ax.axvline(warmup_steps - 0.5, color="grey", lw=0.8)
        ax.set_ylabel("allocs", fontsize=8)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
