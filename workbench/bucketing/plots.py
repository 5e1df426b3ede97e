"""Plots for the bucketing notebook; each returns a matplotlib Figure."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from workbench.bucketing.estimate import Bins2D, estimate_2d_bins, estimate_duration_bins
from workbench.bucketing.padding import padding_comparison
from workbench.panel import Slider, widget_panel


def duration_histogram(durations, bins_1d, *, title: str = "Durations and 1D bins") -> plt.Figure:
    """Histogram of durations (seconds) with a vertical line at each bucket's upper bound."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.hist(durations, bins=120, color="#4C72B0", alpha=0.8)
    for b in bins_1d:
        ax.axvline(b, color="#C44E52", lw=0.8, alpha=0.8)
    ax.set(xlabel="duration (s)", ylabel="utterances", title=f"{title} ({len(bins_1d)} buckets)")
    fig.tight_layout()
    return fig


def tokens_vs_duration(durations, num_tokens, est: Bins2D, *, title: str = "Tokens vs duration, 2D bins") -> plt.Figure:
    """Hexbin of (duration, tokens) with each 2D bin drawn as the rectangle it covers. The token axis ends a
    little above the largest bin, so the bins fill the plot; the title counts the utterances above it (the
    outliers the TPS filter left out)."""
    fig, ax = plt.subplots(figsize=(9, 5))
    top = 1.15 * max(tok for _, tok in est.bins)
    tokens = np.asarray(num_tokens)
    above = int((tokens > top).sum())
    shown = tokens <= top
    hb = ax.hexbin(np.asarray(durations)[shown], tokens[shown], gridsize=80, bins="log", cmap="viridis", mincnt=1)
    fig.colorbar(hb, ax=ax, label="utterances (log)")
    prev_dur, prev_tok, group_dur = 0.0, 0, None
    for dur, tok in est.bins:
        if dur != group_dur:  # new duration group: tokens start at 0 again
            prev_dur = group_dur if group_dur is not None else 0.0
            group_dur, prev_tok = dur, 0
        ax.add_patch(Rectangle((prev_dur, prev_tok), dur - prev_dur, tok - prev_tok, fill=False,
                               edgecolor="#C44E52", lw=0.7))
        prev_tok = tok
    ax.set_ylim(0, top)
    note = f"; {above:,} utterances above the axis" if above else ""
    ax.set(xlabel="duration (s)", ylabel="output tokens", title=f"{title} ({len(est.bins)} bins{note})")
    fig.tight_layout()
    return fig


def tps_histograms(durations, num_tokens, est: Bins2D, *, max_panels: int = 12) -> plt.Figure:
    """Tokens-per-second histogram of each duration group (at most ``max_panels``, evenly spaced; the title
    says how many of how many), its limit, and the outliers it removes."""
    dur_s = np.asarray(durations, dtype=np.float64)[est.order]
    tok_s = np.asarray(num_tokens)[est.order]
    groups = est.groups
    total = len(groups)
    if total > max_panels:  # show evenly spaced groups
        groups = [groups[i] for i in np.linspace(0, total - 1, max_panels).round().astype(int)]
    cols = min(4, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        tps = tok_s[g.start:g.stop] / dur_s[g.start:g.stop]
        out = tps > g.max_tps
        ax.hist(tps[~out], bins=50, color="#4C72B0")
        if out.any():
            ax.hist(tps[out], bins=20, color="#C44E52", label=f"{int(out.sum())} outliers")
            ax.legend(fontsize=7)
        ax.axvline(g.max_tps, color="#C44E52", ls="--", lw=1)
        ax.set_title(f"<= {g.max_duration:.1f} s: max {g.max_tps:.1f} tok/s", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.supxlabel("tokens per second", fontsize=9)
    shown = f"{len(groups)} of {total} duration groups, evenly spaced" if len(groups) < total else f"all {total} duration groups"
    fig.suptitle(f"Tokens per second per duration group ({shown})", fontsize=10)
    fig.tight_layout()
    return fig


def padding_bars(comparison: pd.DataFrame, *, title: str = "Padding waste") -> plt.Figure:
    """Grouped bars of padded input and output shares per setup (rows of ``padding_comparison``)."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(len(comparison))
    ax.bar(x - 0.2, comparison["padded_input_share"] * 100, 0.4, label="input frames")
    ax.bar(x + 0.2, comparison["padded_output_share"].fillna(0) * 100, 0.4, label="output tokens")
    ax.set_xticks(x, comparison.index)
    ax.set(ylabel="padded share (%)", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def interactive_panel(durations, num_tokens, *, num_buckets: int = 30, num_subbuckets: int = 2,
                      tps_threshold: float = 4.0):
    """An ipywidgets panel (bucket count, sub-buckets, TPS threshold) that redraws the 2D bins and the
    padding table; None with a printed note when ipywidgets is not installed."""
    def draw(buckets: int, subs: int, tps_z: float):
        est = estimate_2d_bins(durations, num_tokens, buckets, subs, tps_threshold=tps_z)
        tokens_vs_duration(durations, num_tokens, est)
        return padding_comparison(durations, num_tokens, {
            "none": None, "1D": estimate_duration_bins(durations, buckets), "2D": (est.bins, est.max_tps)})

    return widget_panel(draw, buckets=Slider(num_buckets, 2, 80), subs=Slider(num_subbuckets, 1, 6),
                        tps_z=Slider(tps_threshold, 0.5, 8.0, 0.5))
