"""Bin estimators: 1D duration bins (lhotse's rule, vectorized) and 2D (duration, tokens) bins.

Boundary convention (the one lhotse's sampler applies with ``bisect_left``): a bucket holds the
utterances whose duration is greater than the previous bucket's bound and less than or equal to its
own (upper bound inclusive). The last bound is the longest duration in the corpus.

The 1D bounds are placed exactly as ``lhotse.dataset.sampling.dynamic_bucketing.estimate_duration_buckets``
places them: the value of the utterance at which the running total goes over becomes a bound. The 2D
estimate then groups the utterances by those bounds with the sampler's own inclusive rule, so the
utterance at a bound, and every utterance tied with it, is estimated in the group it is sampled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.data.manifest import MAX_TOKENS


def check_durations(durations, name: str = "durations") -> np.ndarray:
    """float64 copy of ``durations`` or ValueError naming what is wrong and how many."""
    try:
        arr = np.asarray(durations, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be numbers of seconds ({e})") from None
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
        huge = np.abs(arr) >= MAX_TOKENS
        if huge.any():
            raise ValueError(f"{name} has {int(huge.sum())} values at or past 2^63 (first at index "
                             f"{int(np.argmax(huge))}: {arr[np.argmax(huge)]!r}), more than int64 holds")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    neg = arr < 0
    if neg.any():
        raise ValueError(f"{name} has {int(neg.sum())} negative values (first at index {int(np.argmax(neg))})")
    return arr


def overflowing_tps(durations: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
    """Indices of the utterances whose tokens per second overflow float64 (a duration too short for its
    tokens, e.g. 1e-320 s): no TPS limit or z-score can be computed with them."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.flatnonzero(~np.isfinite(num_tokens / durations))


def check_count(value, name: str, num_utterances: int | None = None) -> int:
    """``value`` as an int >= 1 (and <= ``num_utterances`` when given) or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if num_utterances is not None and value > num_utterances:
        raise ValueError(f"{name}={value} is more than the {num_utterances} utterances given")
    return int(value)


def check_tps_threshold(value, name: str = "tps_threshold") -> float:
    """``value`` as a float > 0 (a one-sided z-score; inf keeps everything) or ValueError naming ``name``.

    0 would keep only the utterances at or below their group's mean (about half of them), and a
    negative value can keep none, so neither is a threshold.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not value > 0:
        raise ValueError(f"{name} must be a number > 0 (a tokens-per-second z-score), got {value!r}")
    return float(value)


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
    num_buckets = check_count(num_buckets, "num_buckets", sizes.shape[0])
    if equal_count:
        idx = (np.arange(1, num_buckets, dtype=np.int64) * sizes.shape[0]) // num_buckets
    else:
        idx = running_total_boundaries(sizes, num_buckets)
    return [float(v) for v in sizes[idx]] + [float(sizes[-1])]


@dataclass
class DurationGroup:
    """One duration group of a 2D estimate: the utterances with previous bound < duration <= max_duration."""

    max_duration: float  # seconds, inclusive upper bound of the group
    start: int  # first index in the (duration, tokens)-sorted order
    stop: int  # one past the last index in that order
    num_merged: int  # how many 1D bounds equal max_duration (k): the group gets k * num_subbuckets
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
    outliers: np.ndarray | None = field(default=None, repr=False)  # [N] bool, input order: TPS outliers

    @property
    def num_buckets(self) -> int:
        return len(self.bins)


def estimate_2d_bins(durations, num_tokens, num_buckets: int, num_subbuckets: int, *,
                     tps_threshold: float = 4.0) -> Bins2D:
    """2D (duration, tokens) bins with a tokens-per-second limit per duration group.

    Sort by (duration, tokens). The duration bounds are the 1D bins (:func:`estimate_duration_bins`).
    Group j holds the utterances with ``bound[j-1] < duration <= bound[j]``, the rule the sampler
    applies; a bound that repeats k times makes one group with k * num_subbuckets sub-buckets. In each
    group keep the utterances whose TPS z-score (one-sided, population std) is <= ``tps_threshold``
    (> 0; all are kept when the std is 0); the group's ``max_tps`` is the largest kept TPS. Over the
    group's kept token counts, sorted, place sub-bucket boundaries with the same running-total rule;
    the group's last bin is its largest kept token count. So every utterance not flagged in
    ``outliers`` fits a bucket of these bins in strict mode (:mod:`workbench.bucketing.fit`).

    NeMo's estimator instead counts the utterance at a bound, and the utterances tied with it, in the
    next group; its bins then reject utterances of their own corpus (the tied ones with the most
    tokens land, when sampled, in a group whose token bins and TPS limit never saw them). These bins
    differ from NeMo's wherever a bound falls on such an utterance: on purpose.
    """
    dur = check_durations(durations)
    tok = check_num_tokens(num_tokens, dur.shape[0])
    num_buckets = check_count(num_buckets, "num_buckets", dur.shape[0])
    num_subbuckets = check_count(num_subbuckets, "num_subbuckets")
    tps_threshold = check_tps_threshold(tps_threshold)
    overflow = overflowing_tps(dur, tok)
    if overflow.size:
        i = int(overflow[0])
        raise ValueError(f"durations[{i}] = {float(dur[i])!r} s is too short for its {int(tok[i])} tokens: the tokens "
                         f"per second overflow ({overflow.size} such utterances)")

    order = np.lexsort((tok, dur))
    dur_s, tok_s = dur[order], tok[order]
    bounds = np.concatenate([dur_s[running_total_boundaries(dur_s, num_buckets)], dur_s[-1:]])
    group_bounds, repeats = np.unique(bounds, return_counts=True)  # ascending; k = repeats of a bound
    stops = np.searchsorted(dur_s, group_bounds, side="right")  # inclusive upper bounds
    starts = np.concatenate([[0], stops[:-1]])

    bins: list[tuple[float, int]] = []
    max_tps: list[float] = []
    groups: list[DurationGroup] = []
    outlier_sorted = np.zeros(dur_s.shape[0], dtype=bool)
    for bound, k, start, stop in zip(group_bounds.tolist(), repeats.tolist(), starts.tolist(), stops.tolist()):
        tps = tok_s[start:stop] / dur_s[start:stop]
        mean, std = float(np.mean(tps)), float(np.std(tps))
        keep = (tps - mean) / std <= tps_threshold if std > 0 else np.ones(tps.shape[0], dtype=bool)
        group_max_tps = float(tps[keep].max())
        kept_tokens = np.sort(tok_s[start:stop][keep])
        sub = k * num_subbuckets
        for b in running_total_boundaries(kept_tokens, sub):
            bins.append((bound, int(kept_tokens[b])))
            max_tps.append(group_max_tps)
        bins.append((bound, int(kept_tokens[-1])))
        max_tps.append(group_max_tps)
        outlier_sorted[start:stop] = ~keep
        groups.append(DurationGroup(max_duration=bound, start=start, stop=stop, num_merged=k,
                                    num_subbuckets=sub, tps_mean=mean, tps_std=std,
                                    max_tps=group_max_tps, num_outliers=int((~keep).sum())))
    outliers = np.empty_like(outlier_sorted)
    outliers[order] = outlier_sorted
    return Bins2D(bins=bins, max_tps=max_tps, groups=groups, order=order, outliers=outliers)


def tps_blind_groups(durations, duration_bounds, tps_threshold: float) -> list[tuple[float, int]]:
    """(bound s, utterances) of the duration groups where the TPS filter cannot flag anything: in a group of
    n utterances a one-sided population z-score is at most sqrt(n - 1), so a group of n <= threshold^2 + 1
    keeps every utterance, however far out. Groups as the sampler forms them (upper bounds inclusive)."""
    bounds = np.unique(np.asarray(duration_bounds, dtype=np.float64))
    counts = np.bincount(np.searchsorted(bounds, check_durations(durations), side="left"),
                         minlength=len(bounds) + 1)[:len(bounds)]
    return [(float(b), int(n)) for b, n in zip(bounds, counts) if 1 < n <= tps_threshold ** 2 + 1]
