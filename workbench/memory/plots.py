"""Plots and tables of memory telemetry: live frames from MemoryRecorder or the committed allocator.json.

Every function takes ``series``: config name -> per-step columns (lists or a DataFrame) with at least
``time_s``, ``allocated_bytes``, ``reserved_bytes``, ``device_allocs`` (bytes, counts, seconds), and
returns a matplotlib Figure or a pandas DataFrame.
"""

from __future__ import annotations

from typing import Any, Mapping

GIB = 1024 ** 3


def _columns(data: Any) -> Mapping[str, list]:
    if hasattr(data, "to_dict"):
        return {k: list(v) for k, v in data.to_dict(orient="list").items()}
    return data


def plot_memory_curves(series: Mapping[str, Any], *, warmup_steps: int | None = None, title: str | None = None):
    """Peak allocated within each step (solid; allocated at its end when peaks are absent) and reserved at
    its end (dashed), GiB, one colour per config."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    for i, (name, data) in enumerate(series.items()):
        cols, colour = _columns(data), f"C{i}"
        used = "peak_allocated_bytes" if "peak_allocated_bytes" in cols else "allocated_bytes"
        steps = range(len(cols[used]))
        ax.plot(steps, [b / GIB for b in cols[used]], color=colour, lw=1.2,
                label=f"{name} {used.replace('_bytes', '').replace('_', ' ')}")
        ax.plot(steps, [b / GIB for b in cols["reserved_bytes"]], color=colour, lw=1.2, ls="--",
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


def plot_device_allocs(series: Mapping[str, Any], *, warmup_steps: int | None = None):
    """Device allocations (cudaMalloc or segment maps) per step, one panel per config."""
    import matplotlib.pyplot as plt

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
    fig.suptitle("Device allocations per step")
    fig.tight_layout()
    return fig


def step_time_table(figures: Mapping[str, Any]):
    """One row per config from allocator.json's figures (or one headroom block of them): median step ms
    with spread (over steps for a one-round record, over per-round medians for a record of rounds), rounds,
    time ratio against static shapes, device allocs/frees per step, retries, OOMs, peak reserved GiB."""
    import pandas as pd

    ratios = figures.get("time_ratio_vs_static_plain", {})
    rows = []
    for name, f in figures.items():
        if not isinstance(f, dict) or "step_time_s" not in f:
            continue
        st = f["step_time_s"]
        rows.append({"config": name, "median ms": st["median"] * 1e3, "p25 ms": st["p25"] * 1e3,
                     "p75 ms": st["p75"] * 1e3, "rounds": f.get("rounds", 1), "time vs static": ratios.get(name),
                     "device allocs/step": f["device_allocs_per_step"],
                     "device frees/step": f["device_frees_per_step"], "retries": f["alloc_retries"],
                     "OOMs": f["ooms"], "peak reserved GiB": f["peak_reserved_bytes"] / GIB})
    return pd.DataFrame(rows).set_index("config").round(3) if rows else pd.DataFrame()


def allocator_blocks(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The headroom blocks of an allocator.json record: headroom label -> dict with ``figures`` (config ->
    summary, ratios), ``series`` (config -> per-step columns of one run), ``warmup_steps``,
    ``memory_limit_bytes`` and ``rounds``."""
    params, figures = record["params"], record["figures"]
    if "headrooms" not in figures:
        raise ValueError("allocator record: no 'headrooms' in figures (a record from before the rounds "
                         "protocol; rerun python3 -m workbench.bench.allocator)")
    return {label: dict(figures=block, series=params["series"][label], warmup_steps=params["warmup_steps"],
                        memory_limit_bytes=block["memory_limit_bytes"], rounds=figures["rounds_run"])
            for label, block in figures["headrooms"].items()}


def paired_ratio_table(figures: Mapping[str, Any]):
    """One row per ratio of a block's ``paired_time_ratios`` (time of the same steps, numerator over
    denominator, computed within each round): median, min, max over rounds and the per-round values."""
    import pandas as pd

    rows = [{"ratio": name, "median": r["median"], "min": r["min"], "max": r["max"], "rounds": r["n"],
             "per round": ", ".join(f"{v:.3f}" for v in r["rounds"])}
            for name, r in figures.get("paired_time_ratios", {}).items()]
    return pd.DataFrame(rows).set_index("ratio").round(3) if rows else pd.DataFrame()


def allocation_events_table(figures: Mapping[str, Any]):
    """The steps after warm-up that touched device memory, every config of a headroom: round, allocator block,
    pass, step, repeat (a repeated-shape step), shape, the shape before it, allocations, frees, retries, MiB
    allocated and the reason."""
    import pandas as pd

    rows = []
    for name, f in figures.items():
        if not isinstance(f, dict):
            continue
        for e in f.get("allocation_events", []):
            rows.append({"config": name, "round": e.get("round"), "block": e.get("block"), "pass": e.get("pass_"),
                         "step": e.get("index"), "repeat": e.get("repeat"),
                         "shape": tuple(e["shape"]), "previous shape": tuple(e["previous_shape"] or ()),
                         "allocs": e["device_allocs"], "frees": e["device_frees"], "retries": e["alloc_retries"],
                         "MiB": round(e["device_alloc_bytes"] / 2**20), "reason": e["reason"]})
    return pd.DataFrame(rows)
