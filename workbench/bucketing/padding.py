"""Padding waste: the share of padded input frames and padded output tokens a set of bins leaves.

An utterance is padded to a length set by its bucket. With ``batch_size=None`` that length is the
bucket's bound (what memory is budgeted for: the longest duration and, in 2D, the token bound; 1D bins
bound no tokens, so the bucket's longest token count is used). With ``batch_size=B`` it is the
expected maximum of B utterances drawn at random from the bucket (what a real batch pads to). Input
frames are proportional to seconds, so the input share is computed on durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.bucketing.estimate import check_durations, check_num_tokens
from workbench.bucketing.fit import REASONS, make_fitter


def expected_batch_max(sorted_values: np.ndarray, batch_size: int) -> float:
    """E[max of ``batch_size`` draws with replacement] from the empirical distribution of the values."""
    n = sorted_values.shape[0]
    cdf = np.arange(1, n + 1, dtype=np.float64) / n
    weights = cdf ** batch_size - (cdf - 1.0 / n).clip(min=0.0) ** batch_size
    return float(np.dot(weights, sorted_values))


def _expected_max_per_bucket(bucket: np.ndarray, values: np.ndarray, counts: np.ndarray,
                             batch_size: int) -> np.ndarray:
    order = np.lexsort((values, bucket))
    starts = np.concatenate([[0], np.cumsum(counts)])
    sorted_values = values[order]
    return np.array([expected_batch_max(sorted_values[starts[b]:starts[b + 1]], batch_size) if counts[b] else 0.0
                     for b in range(len(counts))])


def padding_waste(durations, num_tokens=None, bins=None, *, max_tps=None, batch_size: int | None = None,
                  strict_2d: bool = True) -> pd.DataFrame:
    """One row per bucket plus an ``all`` row: utterances, hours, padded_input_share, padded_output_share.

    ``bins=None`` is no bucketing (one bucket bounded by the corpus maximum). Shares are in [0, 1):
    padded / (real + padded). Utterances that fit no bucket are left out and counted in
    ``table.attrs["unfit"]`` (a dict reason -> count).
    """
    dur = check_durations(durations)
    tok = None if num_tokens is None else check_num_tokens(num_tokens, dur.shape[0])
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if bins is None:
        bins = [(float(dur.max()), int(tok.max()))] if tok is not None else [float(dur.max())]
        max_tps = None
    fitter = make_fitter(bins, max_tps, strict_2d=strict_2d)
    idx, reason = fitter.assign(dur, tok if (fitter.needs_tokens or tok is not None) else None)
    nb = fitter.num_buckets
    fits = idx >= 0
    b_idx, d_fit = idx[fits], dur[fits]
    counts = np.bincount(b_idx, minlength=nb)
    real_in = np.bincount(b_idx, weights=d_fit, minlength=nb)
    if batch_size is None:
        target_in = fitter.max_durations.astype(np.float64)
    else:
        target_in = _expected_max_per_bucket(b_idx, d_fit, counts, batch_size)
    pad_in = target_in * counts - real_in
    if tok is not None:
        t_fit = tok[fits].astype(np.float64)
        real_out = np.bincount(b_idx, weights=t_fit, minlength=nb)
        if batch_size is not None:
            target_out = _expected_max_per_bucket(b_idx, t_fit, counts, batch_size)
        elif fitter.is_2d:
            target_out = fitter.max_tokens.astype(np.float64)
        else:
            target_out = np.zeros(nb)
            np.maximum.at(target_out, b_idx, t_fit)
        pad_out = target_out * counts - real_out
    rows = []
    tot = {"real_in": float(real_in.sum()), "pad_in": float(pad_in.sum()), "real_out": 0.0, "pad_out": 0.0}
    for b in range(nb):
        row = {"bucket": b, "max_duration_s": float(fitter.max_durations[b]),
               "max_tokens": int(fitter.max_tokens[b]) if fitter.is_2d else None,
               "utterances": int(counts[b]), "hours": float(real_in[b] / 3600.0),
               "padded_input_share": float(pad_in[b] / (real_in[b] + pad_in[b])) if counts[b] else np.nan,
               "padded_output_share": np.nan}
        if tok is not None and counts[b]:
            denom = real_out[b] + pad_out[b]
            row["padded_output_share"] = float(pad_out[b] / denom) if denom > 0 else 0.0
        rows.append(row)
    if tok is not None:
        tot["real_out"], tot["pad_out"] = float(real_out.sum()), float(pad_out.sum())
    all_in = tot["real_in"] + tot["pad_in"]
    all_out = tot["real_out"] + tot["pad_out"]
    rows.append({"bucket": "all", "max_duration_s": float(fitter.max_durations[-1]),
                 "max_tokens": int(fitter.max_tokens.max()) if fitter.is_2d else None,
                 "utterances": int(counts.sum()), "hours": float(tot["real_in"] / 3600.0),
                 "padded_input_share": tot["pad_in"] / all_in if all_in > 0 else np.nan,
                 "padded_output_share": (tot["pad_out"] / all_out if all_out > 0 else
                                         (0.0 if tok is not None else np.nan))})
    table = pd.DataFrame(rows).set_index("bucket")
    table.attrs["unfit"] = {name: int((reason == code).sum()) for code, name in REASONS.items()}
    return table


def padding_comparison(durations, num_tokens=None, setups: dict | None = None, *,
                       batch_size: int | None = None) -> pd.DataFrame:
    """Overall padding for several setups, one row each: ``setups`` maps a name to ``None`` (no
    bucketing), bins, or ``(bins, max_tps)``. Columns: buckets, utterances, unfit, padded shares."""
    setups = setups if setups is not None else {"none": None}
    rows = []
    for name, setup in setups.items():
        bins, tps = (setup if isinstance(setup, tuple) and len(setup) == 2 and isinstance(setup[0], list)
                     else (setup, None))
        table = padding_waste(durations, num_tokens, bins, max_tps=tps, batch_size=batch_size)
        overall = table.loc["all"]
        rows.append({"setup": name, "buckets": len(table) - 1, "utterances": int(overall["utterances"]),
                     "unfit": sum(table.attrs["unfit"].values()),
                     "padded_input_share": overall["padded_input_share"],
                     "padded_output_share": overall["padded_output_share"]})
    return pd.DataFrame(rows).set_index("setup")


def padding_finding(comparison: pd.DataFrame) -> str:
    """One sentence from :func:`padding_comparison`: the padded shares per setup, and what was left out."""
    def shares(column: str) -> str:
        return ", ".join(f"{100 * row[column]:.0f} % {'no bucketing' if name == 'none' else name}"
                         for name, row in comparison.iterrows())

    line = (f"Padded share of the output tokens: {shares('padded_output_share')}; of the input audio: "
            f"{shares('padded_input_share')}")
    unfit = {name: int(row["unfit"]) for name, row in comparison.iterrows() if row["unfit"]}
    if unfit:
        line += "; left out (TPS outliers and unfit): " + ", ".join(f"{n} by {k}" for k, n in unfit.items())
    return line + "."
