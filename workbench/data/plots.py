"""Plots of a corpus at a glance: durations, tokens against duration, tokens per second."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from workbench.data.arrays import CutArrays


def corpus_table(arrays: CutArrays) -> pd.DataFrame:
    """Quantiles of duration (s), tokens and tokens per second, one row per quantity."""
    cols = {"duration_s": arrays.durations}
    if arrays.num_tokens is not None:
        cols["tokens"] = arrays.num_tokens
        cols["tokens_per_s"] = arrays.tokens_per_second
    qs = [0.0, 0.01, 0.25, 0.5, 0.75, 0.99, 1.0]
    return pd.DataFrame({name: np.quantile(v, qs) for name, v in cols.items()},
                        index=[f"p{int(q * 100)}" for q in qs]).T.round(2)


def corpus_overview(arrays: CutArrays, *, bins: int = 80) -> plt.Figure:
    """Duration histogram (hours per bin), tokens vs duration (hexbin) and tokens-per-second histogram."""
    has_tokens = arrays.num_tokens is not None
    fig, axes = plt.subplots(1, 3 if has_tokens else 1, figsize=(15 if has_tokens else 6, 4), squeeze=False)
    ax = axes[0, 0]
    ax.hist(arrays.durations, bins=bins, weights=arrays.durations / 3600, color="tab:blue")
    ax.set(xlabel="duration (s)", ylabel="hours of audio", title=f"{len(arrays):,} cuts, "
           f"{arrays.durations.sum() / 3600:,.1f} h")
    if has_tokens:
        ax = axes[0, 1]
        hb = ax.hexbin(arrays.durations, arrays.num_tokens, gridsize=60, bins="log", mincnt=1, cmap="viridis")
        fig.colorbar(hb, ax=ax, label="cuts (log)")
        ax.set(xlabel="duration (s)", ylabel="output tokens", title="tokens vs duration")
        ax = axes[0, 2]
        tps = arrays.tokens_per_second
        ax.hist(tps, bins=bins, range=(0, np.quantile(tps, 0.999)), color="tab:orange")
        ax.axvline(np.median(tps), color="k", ls="--", label=f"median {np.median(tps):.2f}")
        ax.set(xlabel="tokens per second", ylabel="cuts", title="speaking rate", yscale="log")
        ax.legend()
    fig.tight_layout()
    return fig


def corpus_finding(arrays: CutArrays) -> str:
    """One sentence on a corpus: size, hours, duration range and median, median tokens per second."""
    d = arrays.durations
    line = (f"{len(d):,} utterances, {d.sum() / 3600:.1f} h, {d.min():.1f}-{d.max():.1f} s long "
            f"(median {float(np.median(d)):.1f} s)")
    if arrays.num_tokens is not None:
        line += f", a median of {float(np.median(arrays.num_tokens / d)):.1f} output tokens per second"
    return line + "."
