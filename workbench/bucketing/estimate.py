"""Bin estimators: 1D duration bins (lhotse's rule, vectorized) and 2D (duration, tokens) bins.

Boundary convention (the one lhotse's sampler applies with ``bisect_left``): a bucket holds the
utterances whose duration is greater than the previous bucket's bound and less than or equal to its
own (upper bound inclusive). The last bound is the longest duration in the corpus.

During estimation the utterance at which a boundary is placed starts the next group; its value becomes
the previous group's bound, exactly as ``lhotse.dataset.sampling.dynamic_bucketing.estimate_duration_buckets``
places it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def check_durations(durations, name: str = "durations") -> np.ndarray:
    """float64 copy of ``durations`` or ValueError naming what is wrong and how many."""
    arr = np.asarray(durations, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: need at least one utterance")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{name} has {int(bad.sum())} NaN or infinite values (first at index "
                         f"{int(np.argmax(bad))})")
    nonpos = arr <= 0
    if nonpos.any():
        raise ValueError(f"{name} has {int(nonpos.sum())} zero or negative values (first at index "
                         f"{int(np.argmax(nonpos))}: {arr[np.argmax(nonpos)]!r})")
    return arr


def check_num_tokens(num_tokens, num_utterances: int, name: str = "num_tokens") -> np.ndarray:
    """int64 copy of ``num_tokens`` (same length as the durations, >= 0, whole numbers) or ValueError."""
    arr = np.asarray(num_tokens)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.shape[0] != num_utterances:
        raise ValueError(f"{name} has {arr.shape[0]} entries but durations has {num_utterances}: "
                         f"they must have equal length")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ValueError(f"{name} has {int(bad.sum())} NaN or infinite values")
        frac = arr != np.round(arr)
        if frac.any():
            raise ValueError(f"{name} has {int(frac.sum())} non-integer values")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    neg = arr < 0
    if neg.any():
        raise ValueError(f"{name} has {int(neg.sum())} negative values (first at index {int(np.argmax(neg))})")
    return arr


def _check_count(value, name: str, num_utterances: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_utterances is not None and value > num_utterances:
        raise ValueError(f"{name}={value} is more than the {num_utterances} utterances given")
    return int(value)


def running_total_boundaries(sorted_values: np.ndarray, num_parts: int) -> np.ndarray:
    """Indices (into ``sorted_values``) where lhotse's running-total rule places a boundary.

    Walk the ascending values keeping a running total that restarts at each boundary; before adding a
    value, if the total so far is strictly greater than ``sum / num_parts``, that value's index is a
    boundary and the total restarts from it. The total is accumulated left to right in float64 (or
    exactly, for integers), so the result matches a plain Python loop bit for bit.
    """
    n = sorted_values.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    size_per_part = sorted_values.sum() / num_parts
    approx = np.cumsum(sorted_values, dtype=np.float64)  # only to guess window sizes
    out: list[int] = []
    start = 0
    while start < n:
        before = approx[start - 1] if start > 0 else 0.0
        guess = int(np.searchsorted(approx, before + size_per_part, side="right")) - start + 1
        width = max(guess + 64, 256)
        while True:
            stop = min(n, start + width)
            totals = np.cumsum(sorted_values[start:stop])  # sequential, exact like the Python loop
            over = np.flatnonzero(totals > size_per_part)
            if over.size or stop == n:
                break
            width *= 2
        if not over.size:
            break
        boundary = start + int(over[0]) + 1  # the value after the total went over starts the next part
        if boundary >= n:
            break
        out.append(boundary)
        start = boundary
    return np.asarray(out, dtype=np.int64)


def estimate_duration_bins(durations, num_buckets: int, *, equal_count: bool = False) -> list[float]:
    """Duration bins in seconds: lhotse's ``estimate_duration_buckets`` boundaries, then the maximum.

    Default (equal total duration per bucket): sort the durations; walk them keeping a running total
    (reset at each boundary); when the total before a duration exceeds ``sum / num_buckets`` that
    duration becomes a boundary (and starts the next bucket). Repeated boundaries are kept as lhotse
    gives them. ``equal_count=True`` instead puts (nearly) the same number of utterances in each
    bucket: boundaries are the sorted durations at indices ``i * n // num_buckets``, i = 1..num_buckets-1.

    Returns at most ``num_buckets`` ascending upper bounds (inclusive); the last is ``max(durations)``.
    """
    sizes = np.sort(check_durations(durations))
    num_buckets = _check_count(num_buckets, "num_buckets", sizes.shape[0])
    if equal_count:
        idx = (np.arange(1, num_buckets, dtype=np.int64) * sizes.shape[0]) // num_buckets
    else:
        idx = running_total_boundaries(sizes, num_buckets)
    return [float(v) for v in sizes[idx]] + [float(sizes[-1])]


@dataclass
class DurationGroup:
    """One duration group of a 2D estimate (after merging groups with equal bounds)."""

    max_duration: float  # seconds, inclusive upper bound of the group
    start: int  # first index in the (duration, tokens)-sorted order
    stop: int  # one past the last index in that order
    num_merged: int  # how many duration groups with this bound were merged
    num_subbuckets: int  # num_merged * num_subbuckets
    tps_mean: float  # tokens per second over the group
    tps_std: float  # population standard deviation (ddof=0)
    max_tps: float  # largest kept tokens-per-second value
    num_outliers: int  # utterances whose TPS z-score exceeded the threshold


@dataclass
class Bins2D:
    """2D bins: ``bins[i] = (max_duration_s, max_tokens)``, both upper bounds inclusive; ``max_tps[i]`` is
    the tokens-per-second limit of bin i (the same for every bin of one duration group)."""

    bins: list[tuple[float, int]]
    max_tps: list[float]
    groups: list[DurationGroup] = field(default_factory=list)
    order: np.ndarray | None = field(default=None, repr=False)  # sort permutation by (duration, tokens)

    @property
    def num_buckets(self) -> int:
        return len(self.bins)


def estimate_2d_bins(durations, num_tokens, num_buckets: int, num_subbuckets: int, *,
                     tps_threshold: float = 4.0) -> Bins2D:
    """2D (duration, tokens) bins with a tokens-per-second limit per duration group.

    Sort by (duration, tokens); split with the 1D duration rule (the utterance at a boundary starts the
    next group; the last group's bound is the maximum duration); merge groups whose bounds are equal (k
    merged groups get k * num_subbuckets sub-buckets). In each group keep the utterances whose TPS
    z-score (one-sided, population std) is <= ``tps_threshold`` (all when the std is 0); the group's
    ``max_tps`` is the largest kept TPS. Over the group's kept token counts, sorted, place sub-bucket
    boundaries with the same running-total rule; the group's last bin is its largest kept token count.
    """
    dur = check_durations(durations)
    tok = check_num_tokens(num_tokens, dur.shape[0])
    num_buckets = _check_count(num_buckets, "num_buckets", dur.shape[0])
    num_subbuckets = _check_count(num_subbuckets, "num_subbuckets")
    tps_threshold = float(tps_threshold)
    if tps_threshold != tps_threshold:
        raise ValueError("tps_threshold is NaN")

    order = np.lexsort((tok, dur))
    dur_s, tok_s = dur[order], tok[order]
    cuts_at = running_total_boundaries(dur_s, num_buckets)
    starts = np.concatenate([[0], cuts_at]).astype(np.int64)
    stops = np.concatenate([cuts_at, [dur_s.shape[0]]]).astype(np.int64)
    bounds = np.concatenate([dur_s[cuts_at], [dur_s[-1]]])

    bins: list[tuple[float, int]] = []
    max_tps: list[float] = []
    groups: list[DurationGroup] = []
    i = 0
    while i < len(bounds):
        j = i
        while j + 1 < len(bounds) and bounds[j + 1] == bounds[i]:
            j += 1
        start, stop, k = int(starts[i]), int(stops[j]), j - i + 1
        bound = float(bounds[i])
        tps = tok_s[start:stop] / dur_s[start:stop]
        mean, std = float(np.mean(tps)), float(np.std(tps))
        if std > 0:
            keep = (tps - mean) / std <= tps_threshold
        else:
            keep = np.ones(tps.shape[0], dtype=bool)
        group_max_tps = float(tps[keep].max())
        kept_tokens = np.sort(tok_s[start:stop][keep])
        sub = k * num_subbuckets
        for b in running_total_boundaries(kept_tokens, sub):
            bins.append((bound, int(kept_tokens[b])))
            max_tps.append(group_max_tps)
        bins.append((bound, int(kept_tokens[-1])))
        max_tps.append(group_max_tps)
        groups.append(DurationGroup(max_duration=bound, start=start, stop=stop, num_merged=k,
                                    num_subbuckets=sub, tps_mean=mean, tps_std=std,
                                    max_tps=group_max_tps, num_outliers=int((~keep).sum())))
        i = j + 1
    return Bins2D(bins=bins, max_tps=max_tps, groups=groups, order=order)
