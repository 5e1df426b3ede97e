"""Plots for the bucketing notebook; each returns a matplotlib Figure."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from workbench.bucketing.estimate import Bins2D, estimate_2d_bins, estimate_duration_bins
from workbench.bucketing.padding import padding_comparison
from workbench.palette import BOUNDARY_COLOUR, FIT_COLOUR, colour
from workbench.panel import Slider, widget_panel


def duration_histogram(durations, bins_1d, *, title: str = "Durations and 1D bins") -> plt.Figure:
    """Histogram of durations (seconds) with a vertical line at each bucket's upper bound."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.hist(durations, bins=120, color=FIT_COLOUR, alpha=0.8)
    for b in bins_1d:
        ax.axvline(b, color=BOUNDARY_COLOUR, lw=0.8, alpha=0.8)
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
                               edgecolor=BOUNDARY_COLOUR, lw=0.7))
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
        ax.hist(tps[~out], bins=50, color=FIT_COLOUR)
        if out.any():
            ax.hist(tps[out], bins=20, color=BOUNDARY_COLOUR, label=f"{int(out.sum())} outliers")
            ax.legend(fontsize=7)
        ax.axvline(g.max_tps, color=BOUNDARY_COLOUR, ls="--", lw=1)
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
    """Padded input and output shares per setup (rows of ``padding_comparison``): one colour per setup,
    input frames solid, output tokens hatched."""
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    x = np.arange(len(comparison))
    colours = [colour(_setup_name(name)) for name in comparison.index]
    ax.bar(x - 0.2, comparison["padded_input_share"] * 100, 0.4, color=colours, label="input frames")
    ax.bar(x + 0.2, comparison["padded_output_share"].fillna(0) * 100, 0.4, color=colours, hatch="//",
           edgecolor="white", label="output tokens")
    ax.set_xticks(x, [_setup_name(name) for name in comparison.index])
    ax.set(ylabel="padded share (%)", title=title, ylim=(0, 100))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def _setup_name(name: str) -> str:
    return "no bucketing" if name == "none" else name


PADDING_COLUMNS = {"unfit": "left out", "padded_input_share": "padded input (%)",
                   "padded_output_share": "padded output tokens (%)", "max_duration_s": "max duration (s)",
                   "max_tokens": "max tokens"}


def styled_padding(comparison: pd.DataFrame, caption: str):
    """:func:`padding_comparison` for display: shares in %, human headers, one row per setup."""
    table = comparison.rename(index=_setup_name, columns=PADDING_COLUMNS).rename_axis(None)
    for column in ("padded input (%)", "padded output tokens (%)"):
        table[column] = table[column] * 100
    return table.style.format({"utterances": "{:,}", "left out": "{:,}", "padded input (%)": "{:.1f}",
                               "padded output tokens (%)": "{:.1f}"}, na_rep="").set_caption(caption)


def styled_bucket_padding(per_bucket: pd.DataFrame, *, top: int = 12):
    """The first ``top`` buckets of :func:`padding_waste` (shortest first), shares in %; the caption says
    how many of how many."""
    rows = per_bucket.drop(index="all", errors="ignore")
    shown = rows.head(top).rename(columns=PADDING_COLUMNS).rename_axis("bucket")
    for column in ("padded input (%)", "padded output tokens (%)"):
        shown[column] = shown[column] * 100
    caption = f"the {len(shown)} shortest of {len(rows)} buckets" if len(shown) < len(rows) else f"all {len(rows)} buckets"
    return shown.style.format({"max duration (s)": "{:.2f}", "max tokens": "{:.0f}", "utterances": "{:,}",
                               "hours": "{:.1f}", "padded input (%)": "{:.1f}",
                               "padded output tokens (%)": "{:.1f}"}, na_rep="").set_caption(caption)


UNFIT_REASONS = {"too_long": "longer than the last bucket", "tps_over_limit": "over the TPS limit",
                 "too_many_tokens": "more tokens than any bucket"}


def styled_unfit(examples: pd.DataFrame, total: int):
    """The example rows of ``unfit_table`` for display; the caption says how many of how many."""
    table = examples.rename(columns={"duration_s": "duration (s)", "num_tokens": "tokens",
                                     "tokens_per_s": "tokens per second"})
    table["reason"] = table["reason"].map(lambda r: UNFIT_REASONS.get(r, r))
    return table.style.format({"duration (s)": "{:.2f}", "tokens per second": "{:.1f}"}).hide(axis="index") \
        .set_caption(f"{len(table)} of {total:,} left out")


def bins_1d_meaning(durations, bins_1d) -> str:
    """What the 1D bounds say: equal audio per bucket puts most bounds where most utterances are."""
    durations = np.asarray(durations, dtype=np.float64)
    median = float(np.median(durations))
    below = sum(1 for b in bins_1d if b <= median)
    return (f"{len(bins_1d)} buckets of about {durations.sum() / 3600 / len(bins_1d):.1f} h of audio each: "
            f"{below} of them end below the median duration ({median:.1f} s), and the last spans "
            f"{bins_1d[-2] if len(bins_1d) > 1 else 0:.1f}-{bins_1d[-1]:.1f} s, so each bucket's worst case is "
            f"close to its typical utterance.")


def bins_2d_meaning(est: Bins2D) -> str:
    """What splitting by tokens adds: the spread of token bounds inside one duration group."""
    groups: dict[float, list[int]] = {}
    for duration, tokens in est.bins:
        groups.setdefault(duration, []).append(tokens)
    duration, tokens = max(groups.items(), key=lambda g: max(g[1]) / max(min(g[1]), 1))
    return (f"{len(est.bins)} buckets in {len(groups)} duration groups. Inside one group the token bounds "
            f"differ by up to {max(tokens) / max(min(tokens), 1):.1f}x (<= {duration:.1f} s: {min(tokens)} to "
            f"{max(tokens)} tokens), a spread that a duration bound alone budgets at its maximum.")


def tps_meaning(durations, num_tokens, est: Bins2D) -> str:
    """What the tokens-per-second filter removes, from the groups' limits."""
    dur_s = np.asarray(durations, dtype=np.float64)[est.order]
    tok_s = np.asarray(num_tokens)[est.order]
    removed = sum(int((tok_s[g.start:g.stop] / dur_s[g.start:g.stop] > g.max_tps).sum()) for g in est.groups)
    limits = [g.max_tps for g in est.groups]
    return (f"The filter removes {removed:,} utterances ({removed / len(dur_s) * 100:.1f} %) faster than their "
            f"group's limit ({min(limits):.1f}-{max(limits):.1f} tokens per second); kept in, they would set the "
            f"token bounds of the 2D buckets.")


def padding_meaning(comparison: pd.DataFrame) -> str:
    """What the padding table means for memory: where 2D saves over 1D."""
    rows = {name: row for name, row in comparison.iterrows()}
    if "2D" not in rows:
        one = rows.get("1D")
        return (f"1D bins leave {one['padded_input_share'] * 100:.0f} % of the input frames padding, against "
                f"{rows['none']['padded_input_share'] * 100:.0f} % without bucketing." if one is not None else "")
    one, two = rows["1D"], rows["2D"]
    out_1d, out_2d = one["padded_output_share"] * 100, two["padded_output_share"] * 100
    in_1d, in_2d = one["padded_input_share"] * 100, two["padded_input_share"] * 100
    verb = "cut" if round(out_2d) < round(out_1d) else "leave" if round(out_2d) == round(out_1d) else "raise"
    return (f"Against 1D bins, 2D bins {verb} the padded share of the output tokens from {out_1d:.0f} % to "
            f"{out_2d:.0f} %, with {in_2d:.0f} % of the input frames padding against {in_1d:.0f} %"
            + (": memory budgeted for tokens that do not exist goes to more utterances per batch." if verb == "cut"
               else "."))


def unfit_meaning(counts: dict, total: int) -> str:
    """What the sampler would skip, by reason, as a share of the corpus."""
    skipped = sum(counts.values())
    if not skipped:
        return "Every utterance fits a bucket: the sampler skips none."
    reasons = ", ".join(f"{n:,} {UNFIT_REASONS.get(reason, reason)}" for reason, n in counts.items() if n)
    return (f"The sampler would skip {skipped:,} of {total:,} utterances ({skipped / total * 100:.1f} %): {reasons}; "
            f"it counts them in sampler.unfit_report instead of training on them.")


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
