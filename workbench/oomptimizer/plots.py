"""Figures and tables for the OOMptimizer notebook: batch size per bucket, probe traces, strategies side by side.

Each function takes a SearchResult or the same figures read back from a committed JSON
(``batch_sizes``, ``trace`` = [[bucket, batch_size, peak_bytes | None, predicted_bytes | None], ...]).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from workbench.units import GiB


def _trace(result) -> list[tuple[int, int, float | None, float | None]]:
    if isinstance(result, dict):
        return [(int(t[0]), int(t[1]), t[2], t[3]) for t in result["trace"]]
    return [(p.bucket_index, p.batch_size, p.peak_bytes, p.predicted_bytes) for p in result.probes]


def _sizes(result) -> list[int]:
    return list(result["batch_sizes"] if isinstance(result, dict) else result.batch_sizes)


def plot_batch_sizes(buckets, batch_sizes, title: str = "batch size per bucket"):
    """Bars per bucket (1D view) and, for 2D buckets, a heat map: duration group x sub-bucket."""
    durations = sorted({float(b[0]) for b in buckets})
    groups = {d: [(float(b[1]), bs) for b, bs in zip(buckets, batch_sizes) if float(b[0]) == d] for d in durations}
    is_2d = max(len(v) for v in groups.values()) > 1
    fig, axes = plt.subplots(1, 2 if is_2d else 1, figsize=(13 if is_2d else 8, 4), squeeze=False)
    ax = axes[0, 0]
    order = sorted(range(len(buckets)), key=lambda i: (buckets[i][0], buckets[i][1]))
    ax.bar(range(len(order)), [batch_sizes[i] for i in order], color="tab:blue")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([f"{buckets[i][0]:.3g}s/{buckets[i][1]:g}" for i in order], rotation=90, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("batch size")
    ax.set_title(title)
    if is_2d:
        width = max(len(v) for v in groups.values())
        grid = np.full((len(durations), width), np.nan)
        for r, d in enumerate(durations):
            for c, (_, bs) in enumerate(sorted(groups[d])):
                grid[r, c] = bs
        ax2 = axes[0, 1]
        im = ax2.imshow(np.log10(grid), aspect="auto", cmap="viridis", origin="lower")
        for r in range(grid.shape[0]):
            for c in range(grid.shape[1]):
                if not np.isnan(grid[r, c]):
                    ax2.text(c, r, f"{int(grid[r, c])}", ha="center", va="center", fontsize=7, color="w")
        ax2.set_yticks(range(len(durations)))
        ax2.set_yticklabels([f"{d:.3g} s" for d in durations], fontsize=7)
        ax2.set_xticks(range(grid.shape[1]))
        ax2.set_xlabel("sub-bucket (tokens ascending)")
        ax2.set_title("batch size (2D)")
        fig.colorbar(im, ax=ax2, label="log10 batch size")
    fig.tight_layout()
    return fig


def plot_probe_trace(result, buckets, budget_bytes: float | None = None, max_buckets: int = 8,
                     title: str = "probes: peak memory vs batch size"):
    """Per bucket (at most ``max_buckets``, the longest; the title says how many of how many): successful
    probes (dots, joined in probe order), OOMs (x at the budget line), the model's expected peak before
    each probe (hollow), and the chosen size (star)."""
    trace = _trace(result)
    sizes = _sizes(result)
    shown = sorted({t[0] for t in trace}, key=lambda i: -buckets[i][0])[:max_buckets]
    fig, ax = plt.subplots(figsize=(9, 5))
    top = budget_bytes or max((t[2] or 0) for t in trace)
    colors = plt.cm.tab10(np.linspace(0, 1, 10))
    for k, i in enumerate(shown):
        c = colors[k % 10]
        mine = [t for t in trace if t[0] == i]
        fits = [(t[1], t[2]) for t in mine if t[2] is not None]
        ooms = [t[1] for t in mine if t[2] is None]
        if fits:
            xs, ys = zip(*sorted(fits))
            ax.plot(xs, np.array(ys) / GiB, "o-", color=c, ms=4,
                    label=f"{buckets[i][0]:g} s / {buckets[i][1]:g} tok: {sizes[i]} ({len(mine)} probes)")
        for x in ooms:
            ax.plot([x], [top / GiB], "x", color=c, ms=8, mew=2)
        for t in mine:
            if t[3] is not None:
                ax.plot([t[1]], [t[3] / GiB], "o", mfc="none", color=c, ms=7, alpha=0.6)
        chosen = [y for x, y in fits if x == sizes[i]]
        if chosen:
            ax.plot([sizes[i]], [chosen[0] / GiB], "*", color=c, ms=14)
    if budget_bytes:
        ax.axhline(budget_bytes / GiB, color="k", ls="--", lw=1, label="budget (x = OOM)")
    ax.set_xscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory (GiB)")
    probed = len({t[0] for t in trace})
    ax.set_title(f"{title} ({len(shown)} of {probed} buckets, the longest)" if len(shown) < probed else title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_strategy_comparison(results: dict, title: str = "predictive vs bisect"):
    """Probes per bucket for each strategy (bars per bucket) and the totals with OOMs."""
    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        trace = _trace(results[name])
        n_buckets = len(_sizes(results[name]))
        counts = np.bincount([t[0] for t in trace], minlength=n_buckets)
        ax1.bar(np.arange(n_buckets) + k * width, counts, width, label=f"{name}: {counts.mean():.2f} / bucket")
    ax1.set_xlabel("bucket")
    ax1.set_ylabel("probes")
    ax1.set_title(title)
    ax1.legend()
    totals = [len(_trace(results[n])) for n in names]
    ooms = [sum(t[2] is None for t in _trace(results[n])) for n in names]
    ax2.bar(names, totals, color="tab:blue", label="probes")
    ax2.bar(names, ooms, color="tab:red", label="of which OOM")
    ax2.set_title("total probes")
    ax2.legend()
    fig.tight_layout()
    return fig


def strategy_table(results: dict, true_max=None):
    """One row per entry of ``results`` (name -> SearchResult or committed figures): buckets, probes,
    probes per bucket, OOMs, seconds where recorded, and with ``true_max`` (one per bucket) how far the
    worst bucket's batch size is below its true maximum, in per cent."""
    import pandas as pd

    rows = []
    for name, result in results.items():
        if isinstance(result, dict) and "trace" not in result:
            raise ValueError(f"strategy_table: {name!r} has no 'trace' (probes per bucket); a record from an older "
                             "bench, rerun python3 -m workbench.bench.oomptimizer")
        sizes, trace = _sizes(result), _trace(result)
        if true_max is not None and len(true_max) != len(sizes):
            raise ValueError(f"strategy_table: {len(true_max)} true maxima for {len(sizes)} buckets of {name!r}")
        row = {"search": name, "buckets": len(sizes), "probes": len(trace), "probes/bucket": len(trace) / len(sizes),
               "OOMs": sum(t[2] is None for t in trace)}
        if isinstance(result, dict) and "seconds" in result:
            row["seconds"] = result["seconds"]
        if true_max is not None:
            row["worst % below true max"] = 100 * max((t - b) / t for t, b in zip(true_max, sizes))
        rows.append(row)
    return pd.DataFrame(rows).set_index("search").round(3)
