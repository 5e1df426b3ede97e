"""Figures and tables for the OOMptimizer notebook: batch size per bucket, probe traces, strategies side by side.

Each function takes a SearchResult or the same figures read back from a committed JSON
(``batch_sizes``, ``trace`` = [[bucket, batch_size, peak_bytes | None, predicted_bytes | None], ...]).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from workbench.palette import BUDGET_COLOUR, FIT_COLOUR, OOM_COLOUR, SERIES_COLOURS, colour
from workbench.units import GiB


def seconds_text(duration: float) -> str:
    """A bucket's duration bound for a label: "40 s", "3.3 s" (two figures, no more)."""
    return f"{duration:.1f} s" if duration < 10 else f"{duration:.0f} s"


def bucket_label(bucket) -> str:
    """A (duration s, tokens) bucket for a label: "40 s / 145 tok"; a 1D bucket (no tokens): "40 s"."""
    return seconds_text(float(bucket[0])) + (f" / {float(bucket[1]):.0f} tok" if float(bucket[1]) else "")


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
    ax.bar(range(len(order)), [batch_sizes[i] for i in order], color=FIT_COLOUR)
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([bucket_label(buckets[i]) for i in order], rotation=90, fontsize=7)
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
        ax2.set_yticklabels([seconds_text(d) for d in durations], fontsize=7)
        ax2.set_xticks(range(grid.shape[1]))
        ax2.set_xlabel("sub-bucket (tokens ascending)")
        ax2.set_title("batch size (2D)")
        fig.colorbar(im, ax=ax2, label="log10 batch size")
    fig.tight_layout()
    return fig


def _plain_log_ticks(axis) -> None:
    """Label a log axis in plain numbers (10, 20, 50, 100), not powers of ten; minor ticks at 2, 3 and 5
    times a power of ten only, so the labels do not crowd."""
    from matplotlib.ticker import FuncFormatter

    def minor(value, _):
        lead = f"{value:.0e}"[0]
        return f"{value:g}" if lead in "235" else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def plot_probe_trace(result, buckets, budget_bytes: float | None = None, max_buckets: int = 8,
                     title: str = "probes: peak memory vs batch size"):
    """Per bucket (at most ``max_buckets``, the longest; the title says how many of how many): successful
    probes (dots, joined in probe order), OOMs (red x at the budget line), the model's expected peak before
    each probe (hollow), and the chosen size (star); the legend sits right of the axes."""
    trace = _trace(result)
    sizes = _sizes(result)
    shown = sorted({t[0] for t in trace}, key=lambda i: -buckets[i][0])[:max_buckets]
    fig, ax = plt.subplots(figsize=(9, 5))
    top = budget_bytes or max((t[2] or 0) for t in trace)
    for k, i in enumerate(shown):
        c = SERIES_COLOURS[k % len(SERIES_COLOURS)]
        mine = [t for t in trace if t[0] == i]
        fits = [(t[1], t[2]) for t in mine if t[2] is not None]
        ooms = [t[1] for t in mine if t[2] is None]
        if fits:
            xs, ys = zip(*sorted(fits))
            ax.plot(xs, np.array(ys) / GiB, "o-", color=c, ms=4,
                    label=f"{bucket_label(buckets[i])}: {sizes[i]} ({len(mine)} probes)")
        for x in ooms:
            ax.plot([x], [top / GiB], "x", color=OOM_COLOUR, ms=8, mew=2)
        for t in mine:
            if t[3] is not None:
                ax.plot([t[1]], [t[3] / GiB], "o", mfc="none", color=c, ms=7, alpha=0.6)
        chosen = [y for x, y in fits if x == sizes[i]]
        if chosen:
            ax.plot([sizes[i]], [chosen[0] / GiB], "*", color=c, ms=14)
    if budget_bytes:
        ax.axhline(budget_bytes / GiB, color=BUDGET_COLOUR, ls="--", lw=1, label="budget")
    if any(t[2] is None for t in trace if t[0] in shown):
        ax.plot([], [], "x", color=OOM_COLOUR, ms=8, mew=2, label="OOM (on the budget line)")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("batch size")
    ax.set_ylabel("peak memory (GiB)")
    probed = len({t[0] for t in trace})
    ax.set_title(f"{title} ({len(shown)} of {probed} buckets, the longest)" if len(shown) < probed else title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    return fig


def plot_strategy_comparison(results: dict, title: str = "predictive vs bisect", buckets=None):
    """Probes per bucket for each strategy (bars per bucket, labelled by duration and tokens when
    ``buckets`` is given) and the totals with their OOMs; each search in its palette colour, legends
    right of the axes."""
    names = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(names)
    colours = [colour(name.split(",")[0], fallback=k) for k, name in enumerate(names)]
    for k, name in enumerate(names):
        trace = _trace(results[name])
        n_buckets = len(_sizes(results[name]))
        counts = np.bincount([t[0] for t in trace], minlength=n_buckets)
        ax1.bar(np.arange(n_buckets) + (k - (len(names) - 1) / 2) * width, counts, width, color=colours[k],
                label=f"{name}: {counts.mean():.1f} per bucket")
    n_buckets = len(_sizes(results[names[0]]))
    below = -0.15  # the legend's top, under the tick labels
    if buckets is not None and len(buckets) == n_buckets:
        ax1.set_xticks(range(n_buckets))
        ax1.set_xticklabels([bucket_label(b) for b in buckets], rotation=90 if n_buckets > 8 else 0, fontsize=7)
        below = -0.32 if n_buckets > 8 else -0.12
    else:
        ax1.set_xlabel("bucket")
    ax1.set_ylabel("probes")
    ax1.set_title(title)
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, below), ncol=len(names), frameon=False)
    totals = [len(_trace(results[n])) for n in names]
    ooms = [sum(t[2] is None for t in _trace(results[n])) for n in names]
    ax2.bar(names, totals, color=colours)
    ax2.bar(names, ooms, color=OOM_COLOUR, label="of which OOM")
    ax2.set_ylabel("probes")
    ax2.set_title("total probes")
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.15), frameon=False)
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
                             "bench, rerun python3 -m benchmarks.oomptimizer")
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


STRATEGY_COLUMNS = {"probes/bucket": "probes per bucket", "seconds": "search time (s)",
                    "worst % below true max": "worst bucket below its true max (%)"}


def styled_strategy_table(results: dict, true_max=None):
    """:func:`strategy_table` for display: human column names with units, probes per bucket to one decimal,
    seconds whole, the shortfall to one decimal of a per cent, no index."""
    table = strategy_table(results, true_max).reset_index().rename(columns=STRATEGY_COLUMNS)
    formats = {"probes per bucket": "{:.1f}", "search time (s)": "{:.0f}", "worst bucket below its true max (%)": "{:.1f}"}
    return (table.style.format({k: v for k, v in formats.items() if k in table}, na_rep="")
            .set_properties(subset=["search"], **{"text-align": "left"}).hide(axis="index"))


def draw_synthetic_search(kind: str, known: bool, gap: float, groups: int, subs: int, *, budget_gib: float,
                          seed: int = 0):
    """Both strategies on a synthetic GPU of ``budget_gib`` GiB (memory model ``kind``; the budget given to
    the search when ``known``; ``gap`` the relative gap at which a bucket stops) over ``groups`` duration
    groups of ``subs`` token sub-buckets: draws their batch sizes and the predictive search's probe trace,
    returns the strategy table against the true maxima (what the notebook's exploration panel shows)."""
    from workbench.oomptimizer.synthetic import SyntheticMemory, compare_strategies, demo_buckets

    memory = SyntheticMemory(kind=kind, budget_bytes=budget_gib * GiB, seed=seed)
    buckets = demo_buckets(groups, subs)
    results = compare_strategies(memory, buckets, rel_gap=gap, budget_known=known)
    plot_strategy_comparison(results, buckets=buckets)
    plot_probe_trace(results["predictive"], buckets, memory.budget_bytes)
    return styled_strategy_table(results, true_max=[memory.true_max(b) for b in buckets])


def _per_bucket(result) -> float:
    return len(_trace(result)) / len(_sizes(result))


def _ooms(result) -> int:
    return sum(t[2] is None for t in _trace(result))


def _oom_text(n: int) -> str:
    return {0: "no OOM", 1: "1 OOM"}.get(n, f"{n} OOMs")


def _worst_below(result, true_max) -> float:
    return 100 * max((t - b) / t for t, b in zip(true_max, _sizes(result)) if t and b is not None)


def meaning_of_search(results: dict, true_max=None, fast: str = "predictive", slow: str = "bisect") -> str:
    """What the predictive search against bisection means, in a sentence: probes per bucket and OOMs of
    each, and with ``true_max`` (one per bucket) how far below it each search's worst bucket stayed."""
    f, s = results[fast], results[slow]
    line = (f"The predictive search needed {_per_bucket(f):.1f} probes per bucket against bisection's "
            f"{_per_bucket(s):.1f}, with {_oom_text(_ooms(f))} against {_ooms(s)}")
    if true_max is None:
        return line + "."
    worst_f, worst_s = _worst_below(f, true_max), _worst_below(s, true_max)
    if worst_f < 0.05:
        return line + f"; it found every bucket's true maximum, where bisection's worst bucket is {worst_s:.1f} % below it."
    return line + f"; its worst bucket is {worst_f:.1f} % below the true maximum (bisection's {worst_s:.1f} %)."


def meaning_of_batch_sizes(buckets, batch_sizes, merged: int | None = None) -> str:
    """What a batch-size profile means, in a sentence: the range from the shortest to the longest bucket
    and the ratio, and with ``merged`` how many buckets merging equal neighbours leaves."""
    pairs = sorted(((float(b[0]), float(b[1])), bs) for b, bs in zip(buckets, batch_sizes) if bs)
    (short, first), (long, last) = pairs[0], pairs[-1]
    line = (f"Batch size falls from {first} at the shortest bucket ({bucket_label(short)}) to {last} at the "
            f"longest ({bucket_label(long)}), {first / last:.0f}x fewer utterances per step")
    if merged is None:
        return line + "."
    if merged == len(buckets):
        return line + f"; no two sub-buckets came out equal, so all {merged} buckets stay."
    return line + f"; merging equal sub-buckets leaves {merged} of {len(buckets)} buckets."


def prediction_errors(result) -> list[float]:
    """Per probe that fitted and had a prediction: |predicted - measured| / measured peak."""
    return [abs(t[3] - t[2]) / t[2] for t in _trace(result) if t[2] and t[3] is not None]


def meaning_of_trace(result, name: str = "predictive search") -> str:
    """What a probe trace means, in a sentence: probes, OOMs, and how close the memory model's expected
    peak came to the measured one (median over the probes that had a prediction)."""
    trace, errors = _trace(result), prediction_errors(result)
    line = f"The {name} made {len(trace)} probes, {_ooms(result)} of them out of memory"
    if not errors:
        return line + "; no probe that fitted had a prediction to check."
    return (line + f"; where it predicted a probe's peak before running it, the median miss was "
            f"{_percent_text(float(np.median(errors)))} of the measured peak (worst {_percent_text(max(errors))}).")


def _percent_text(share: float) -> str:
    return "under 0.1 %" if share < 0.0005 else f"{100 * share:.1f} %"


def plan_table(plans: dict):
    """Planned batch size per bucket (rows) and GPU (columns), from ``{gpu: profile}`` of one set of bins."""
    import pandas as pd

    from workbench.oomptimizer.run import profile_buckets

    first = next(iter(plans.values()))
    rows = [bucket_label(bucket) for bucket in profile_buckets(first)]
    table = pd.DataFrame({gpu: profile.bucket_batch_size for gpu, profile in plans.items()}, index=rows)
    table.index.name = "bucket (longest utterance)"
    return table


def meaning_of_plans(plans: dict) -> str:
    """What plans for several GPUs mean, in a sentence: the longest bucket's batch size on the smallest and
    the largest GPU, their ratio against the ratio of memories, and the traced steps it took."""
    by_memory = sorted(plans.items(), key=lambda item: item[1].metadata["gpu_memory_bytes"])
    (small, low), (large, high) = by_memory[0], by_memory[-1]
    a, b = low.bucket_batch_size[-1], high.bucket_batch_size[-1]
    memory_ratio = high.metadata["gpu_memory_bytes"] / low.metadata["gpu_memory_bytes"]
    probes = sum(p.metadata["probes"] for p in plans.values())
    return (f"With no GPU at hand, the longest bucket plans {a} utterances per step on {small} and {b} on {large}: "
            f"{b / a:.1f}x the batch for {memory_ratio:.1f}x the memory (weights, gradients and optimizer state take "
            f"the same bytes on both). {probes} traced steps made the {len(plans)} plans; an OOMptimizer run on "
            "the GPU itself measures what the trace cannot see (workspaces, fragmentation).")
