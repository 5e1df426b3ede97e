"""Plots of memory telemetry: per-step columns from MemoryRecorder, live or as kept in a bench record.

Every function takes ``series``: config name -> per-step columns (lists or a DataFrame) with at least
``time_s``, ``allocated_bytes``, ``reserved_bytes``, ``device_allocs`` (bytes, counts, seconds), and
returns a matplotlib Figure. A config whose name says "expandable" or "plain" takes that allocator setting's
colour (``workbench.palette``); any other takes a series colour by position.
"""

from __future__ import annotations

from typing import Any, Mapping

import matplotlib.pyplot as plt

from workbench.palette import OOM_COLOUR, SERIES_COLOURS, colour
from workbench.units import GiB

WARMUP_COLOUR = "#8c8c8c"  # the line between warm-up and measured steps: a marker, not a series


def _columns(data: Any) -> Mapping[str, list]:
    if hasattr(data, "to_dict"):
        return {k: list(v) for k, v in data.to_dict(orient="list").items()}
    return data


def config_colour(name: str, position: int) -> str:
    """The allocator setting's colour for a config named with "expandable" or "plain"; else a series colour."""
    lowered = name.lower()
    for setting in ("expandable", "plain"):
        if setting in lowered:
            return colour(setting)
    return SERIES_COLOURS[position % len(SERIES_COLOURS)]


def _warmup_line(ax, warmup_steps: int | None) -> None:
    if warmup_steps:
        ax.axvline(warmup_steps - 0.5, color=WARMUP_COLOUR, lw=0.8, ls=":")


def plot_memory_curves(series: Mapping[str, Any], *, warmup_steps: int | None = None, title: str | None = None):
    """Peak allocated within each step (solid; allocated at its end when peaks are absent) and reserved at
    its end (dashed), GiB, one colour per config; the legend sits below the axes. Where configs share a
    curve (the same shapes), the first is drawn wider so both stay visible."""
    fig, ax = plt.subplots(figsize=(10, 3.8))
    for i, (name, data) in enumerate(series.items()):
        cols, c = _columns(data), config_colour(name, i)
        used = "peak_allocated_bytes" if "peak_allocated_bytes" in cols else "allocated_bytes"
        steps = range(len(cols[used]))
        width = max(0.9, 2.4 - 1.2 * i)
        ax.plot(steps, [b / GiB for b in cols[used]], color=c, lw=width,
                label=f"{name}: {used.replace('_bytes', '').replace('_', ' ')}")
        ax.plot(steps, [b / GiB for b in cols["reserved_bytes"]], color=c, lw=width, ls="--",
                label=f"{name}: reserved")
    _warmup_line(ax, warmup_steps)
    if warmup_steps:
        ax.text(warmup_steps, ax.get_ylim()[1], " measured steps →", va="top", fontsize=8, color=WARMUP_COLOUR)
    ax.set_xlabel("step (warm-up, then measured)" if warmup_steps else "step")
    ax.set_ylabel("GiB")
    ax.set_title(title or "Memory per step")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def plot_device_allocs(series: Mapping[str, Any], *, warmup_steps: int | None = None,
                       title: str = "Device allocations per step"):
    """Device allocations (cudaMalloc or segment maps) per step, one panel per config; steps that hit an
    allocator retry are marked in the OOM colour above their bar."""
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 1.5 * len(series) + 0.8), sharex=True, squeeze=False)
    for ax, (i, (name, data)) in zip(axes[:, 0], enumerate(series.items())):
        cols = _columns(data)
        counts = cols["device_allocs"]
        ax.bar(range(len(counts)), counts, color=config_colour(name, i), width=0.8)
        ax.set_yscale("symlog", linthresh=1)  # the first steps allocate hundreds, later ones a few or none
        retried = [s for s, r in enumerate(cols.get("alloc_retries", [])) if r]
        if retried:
            ax.scatter(retried, [max(counts) * 1.5] * len(retried), marker="v", s=14, color=OOM_COLOUR,
                       label="allocator retry", zorder=3)
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        _warmup_line(ax, warmup_steps)
        ax.set_ylabel("allocations", fontsize=8)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("step (warm-up, then measured)" if warmup_steps else "step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
