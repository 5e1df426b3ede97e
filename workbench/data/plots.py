"""Plots of a corpus at a glance: durations, tokens against duration, tokens per second."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from workbench.data.arrays import CutArrays
from workbench.palette import BOUNDARY_COLOUR, FIT_COLOUR


QUANTILES = {"min": 0.0, "1 %": 0.01, "25 %": 0.25, "median": 0.5, "75 %": 0.75, "99 %": 0.99, "max": 1.0}


def corpus_table(arrays: CutArrays) -> pd.DataFrame:
    """Quantiles of duration (s), output tokens and tokens per second, one row per quantity."""
    cols = {"duration (s)": arrays.durations}
    if arrays.num_tokens is not None:
        cols["output tokens"] = arrays.num_tokens
        cols["tokens per second"] = arrays.tokens_per_second
    return pd.DataFrame({name: np.quantile(v, list(QUANTILES.values())) for name, v in cols.items()},
                        index=list(QUANTILES)).T


def styled_corpus_table(arrays: CutArrays):
    """:func:`corpus_table` for display: seconds and rates to 0.1, token counts whole."""
    table = corpus_table(arrays)
    return table.style.format("{:.1f}").format("{:.0f}", subset=(["output tokens"], slice(None))) \
        if "output tokens" in table.index else table.style.format("{:.1f}")


def quantiles_meaning(arrays: CutArrays) -> str:
    """What the spread of durations means for batching, from the corpus's quantiles."""
    median, p99, longest = np.quantile(arrays.durations, [0.5, 0.99, 1.0])
    return (f"Half the utterances are shorter than {median:.1f} s and the longest 1 % run from {p99:.1f} s to "
            f"{longest:.1f} s: with one batch size, set by the longest, a batch of median-length utterances "
            f"would fill about {median / longest * 100:.0f} % of the memory budgeted for it; buckets avoid that.")


def distribution_meaning(arrays: CutArrays, *, fast_tps: float = 10.0) -> str:
    """What the tokens-per-second tail means: the share of transcripts too long for their audio."""
    if arrays.num_tokens is None:
        return "Without token counts only durations can be bucketed; 2D bins need custom.num_tokens or a tokenizer."
    tps = arrays.tokens_per_second
    fast = float(np.mean(tps > fast_tps))
    return (f"Most utterances speak near the median of {float(np.median(tps)):.1f} tokens per second; "
            f"{fast * 100:.1f} % exceed {fast_tps:g}: transcripts long for their audio, which would set the token "
            f"bounds of 2D buckets unless a tokens-per-second filter (notebook 01) leaves them out.")


def corpus_source_line(arrays: CutArrays) -> str:
    """Where the corpus came from and how large it is, in one line."""
    return f"{arrays.source}: {len(arrays):,} utterances, {arrays.durations.sum() / 3600:,.1f} h of audio."


def corpus_overview(arrays: CutArrays, *, bins: int = 80) -> plt.Figure:
    """Duration histogram (hours per bin), tokens vs duration (hexbin) and tokens-per-second histogram."""
    has_tokens = arrays.num_tokens is not None
    fig, axes = plt.subplots(1, 3 if has_tokens else 1, figsize=(15 if has_tokens else 6, 4), squeeze=False)
    ax = axes[0, 0]
    ax.hist(arrays.durations, bins=bins, weights=arrays.durations / 3600, color=FIT_COLOUR)
    ax.set(xlabel="duration (s)", ylabel="hours of audio", title=f"{len(arrays):,} cuts, "
           f"{arrays.durations.sum() / 3600:,.1f} h")
    if has_tokens:
        ax = axes[0, 1]
        hb = ax.hexbin(arrays.durations, arrays.num_tokens, gridsize=60, bins="log", mincnt=1, cmap="viridis")
        fig.colorbar(hb, ax=ax, label="cuts (log)")
        ax.set(xlabel="duration (s)", ylabel="output tokens", title="tokens vs duration")
        ax = axes[0, 2]
        tps = arrays.tokens_per_second
        ax.hist(tps, bins=bins, range=(0, np.quantile(tps, 0.999)), color=FIT_COLOUR)
        ax.axvline(np.median(tps), color=BOUNDARY_COLOUR, ls="--", label=f"median {np.median(tps):.1f}")
        ax.set(xlabel="tokens per second", ylabel="cuts", title="speaking rate", yscale="log")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def corpus_finding(arrays: CutArrays) -> str:
    """One sentence on a corpus: size, hours, duration range and median, median tokens per second."""
    d = arrays.durations
    line = (f"{len(d):,} utterances, {d.sum() / 3600:.1f} h, {d.min():.1f}-{d.max():.1f} s long "
            f"(median {float(np.median(d)):.1f} s)")
    if arrays.num_tokens is not None:
        line += f", a median of {float(np.median(arrays.tokens_per_second)):.1f} output tokens per second"
    return line + "."
