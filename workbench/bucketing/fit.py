"""Which bucket an utterance goes to, or why it fits none: one rule for arrays and for single cuts.

Bounds are inclusive (lhotse's ``bisect_left``): an utterance fits a 1D bucket ``i`` when
``bins[i-1] < duration <= bins[i]``. In 2D, the utterance's duration group is the first group whose
max duration is >= its duration, and its bucket is the first sub-bucket of that group whose max tokens
is >= its token count.

The TPS limit: an utterance whose tokens per second exceed ``max_tps`` of its bucket fits nowhere.
In strict 2D mode that is the chosen bucket's limit (as in NeMo). When no sub-bucket of its group
holds its tokens, the group's last (largest) sub-bucket's limit is checked, so a TPS outlier is
reported as one rather than as "too many tokens".

Lenient 2D (``strict_2d=False``) also accepts a sub-bucket of a longer group when its own group has
none large enough. NeMo applies no TPS limit in that mode; we apply the same limit as strict mode, the
one of the utterance's own duration group, never the longer group's. The limit comes from the TPS
distribution of utterances of that duration, and the utterances that need a longer group are the
token-heavy ones the limit is there to catch; without it, turning strictness off would let back in the
outliers the estimator removed. So lenient accepts every utterance strict accepts, in the same bucket,
and adds only those that are within their group's TPS limit but have more tokens than its bins.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

FITS = 0
TOO_LONG = 1  # duration above the last bound
TPS_OVER_LIMIT = 2  # tokens per second above max_tps of its bucket in its own duration group
TOO_MANY_TOKENS = 3  # more tokens than the largest sub-bucket of its duration group
REASONS = {TOO_LONG: "too_long", TPS_OVER_LIMIT: "tps_over_limit", TOO_MANY_TOKENS: "too_many_tokens"}


@dataclass
class BucketFitter:
    """Bucket bounds prepared for fast lookups. Build with :func:`make_fitter`."""

    max_durations: np.ndarray  # [num_buckets] seconds, inclusive
    max_tokens: np.ndarray | None  # [num_buckets] tokens, inclusive; None for 1D
    max_tps: np.ndarray | None  # [num_buckets] tokens per second, inclusive; None for no limit
    group_bounds: np.ndarray  # [num_groups] distinct max durations (2D) or the bins (1D)
    group_start: np.ndarray  # [num_groups] first bucket of each group
    group_stop: np.ndarray  # [num_groups] one past the last bucket of each group
    strict_2d: bool = True

    @property
    def num_buckets(self) -> int:
        return int(self.max_durations.shape[0])

    @property
    def is_2d(self) -> bool:
        return self.max_tokens is not None

    @property
    def needs_tokens(self) -> bool:
        return self.max_tokens is not None or self.max_tps is not None

    def select(self, duration: float, num_tokens: int | None = None) -> tuple[int, int]:
        """(bucket index, FITS) or (-1, reason) for one utterance."""
        g = bisect_left(self.group_bounds_list, duration)
        if g == len(self.group_bounds_list):
            return -1, TOO_LONG
        if not self.is_2d:
            if self.max_tps is not None and num_tokens is not None and num_tokens / duration > self.max_tps[g]:
                return -1, TPS_OVER_LIMIT
            return g, FITS
        start, stop = int(self.group_start[g]), int(self.group_stop[g])
        b = bisect_left(self._tokens_list, num_tokens, start, stop)
        if self.max_tps is not None and num_tokens / duration > self.max_tps[min(b, stop - 1)]:
            return -1, TPS_OVER_LIMIT
        if b == stop:
            if self.strict_2d:
                return -1, TOO_MANY_TOKENS
            b = next((j for j in range(stop, self.num_buckets) if self._tokens_list[j] >= num_tokens), -1)
            if b < 0:
                return -1, TOO_MANY_TOKENS
        return b, FITS

    def assign(self, durations, num_tokens=None) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`select`: (bucket index or -1 [N] int64, reason [N] int8)."""
        dur = np.asarray(durations, dtype=np.float64)
        n = dur.shape[0]
        if self.needs_tokens and num_tokens is None:
            raise ValueError("num_tokens is needed: these bins have token bounds or a max_tps limit")
        tok = None if num_tokens is None else np.asarray(num_tokens, dtype=np.int64)
        if tok is not None and tok.shape[0] != n:
            raise ValueError(f"num_tokens has {tok.shape[0]} entries but durations has {n}")
        reason = np.zeros(n, dtype=np.int8)
        g = np.searchsorted(self.group_bounds, dur, side="left")
        too_long = g == len(self.group_bounds)
        g_safe = np.minimum(g, len(self.group_bounds) - 1)
        if not self.is_2d:
            idx = g_safe.astype(np.int64)
            limit_bin = idx
        else:
            group_of_bin = np.repeat(np.arange(len(self.group_bounds)), self.group_stop - self.group_start)
            scale = int(max(self.max_tokens.max(), tok.max() if n else 0)) + 1
            keys = group_of_bin.astype(np.int64) * scale + self.max_tokens
            idx = np.searchsorted(keys, g_safe.astype(np.int64) * scale + tok, side="left").astype(np.int64)
            stop = self.group_stop[g_safe]
            limit_bin = np.minimum(idx, stop - 1)  # the chosen bucket, or its group's last
            outside = idx >= stop
            idx[outside] = -1
            if not self.strict_2d:
                for j in range(self.num_buckets - 1, -1, -1):  # the smallest later bucket that holds the tokens
                    idx[outside & (j >= stop) & (self.max_tokens[j] >= tok)] = j
        no_tokens_fit = (idx < 0) & ~too_long
        if self.max_tps is not None and tok is not None:
            over = (tok / dur > self.max_tps[limit_bin]) & ~too_long
        else:
            over = np.zeros(n, dtype=bool)
        reason[no_tokens_fit] = TOO_MANY_TOKENS
        reason[over] = TPS_OVER_LIMIT
        reason[too_long] = TOO_LONG
        idx = np.where(reason == FITS, idx, -1)
        return idx, reason

    def __post_init__(self) -> None:
        self.group_bounds = np.asarray(self.group_bounds, dtype=np.float64)
        self._tokens_list = None if self.max_tokens is None else [int(t) for t in self.max_tokens]
        self.group_bounds_list = [float(b) for b in self.group_bounds]


def make_fitter(bins, max_tps=None, *, strict_2d: bool = True) -> BucketFitter:
    """A :class:`BucketFitter` for 1D bins ``[max_dur_s, ...]`` or 2D bins ``[(max_dur_s, max_tokens), ...]``.

    ``max_tps`` is None (no limit), one number for all buckets, or one number per bucket.
    """
    if not bins:
        raise ValueError("bins is empty: need at least one bucket")
    is_2d = isinstance(bins[0], (list, tuple, np.ndarray))
    if is_2d:
        arr = np.asarray(bins, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError(f"2D bins must be (max_duration, max_tokens) pairs, got shape {arr.shape}")
        durs, toks = arr[:, 0], arr[:, 1].astype(np.int64)
    else:
        durs, toks = np.asarray(bins, dtype=np.float64), None
    if (np.diff(durs) < 0).any():
        raise ValueError(f"bins must be sorted by duration ({int((np.diff(durs) < 0).sum())} out of order)")
    if is_2d:
        bounds, starts = np.unique(durs, return_index=True)
        stops = np.concatenate([starts[1:], [len(durs)]])
        for s, e in zip(starts, stops):
            if (np.diff(toks[s:e]) < 0).any():
                raise ValueError(f"2D bins of duration group {durs[s]} s are not sorted by max_tokens")
    else:
        bounds, starts, stops = durs, np.arange(len(durs)), np.arange(1, len(durs) + 1)
    tps = None
    if max_tps is not None:
        tps = np.asarray(max_tps, dtype=np.float64)
        if tps.ndim > 1 or (tps.ndim == 1 and tps.shape[0] != len(durs)):
            raise ValueError(f"max_tps has {tps.size} entries but there are {len(durs)} bins")
        tps = np.broadcast_to(tps, durs.shape).copy()
        if not (tps >= 0).all():
            raise ValueError(f"max_tps has {int((~(tps >= 0)).sum())} values that are negative or NaN")
    return BucketFitter(max_durations=durs, max_tokens=toks, max_tps=tps, group_bounds=bounds,
                        group_start=np.asarray(starts, dtype=np.int64),
                        group_stop=np.asarray(stops, dtype=np.int64), strict_2d=strict_2d)


def unfit_table(durations, num_tokens, bins, max_tps=None, *, ids=None, max_examples: int = 5,
                strict_2d: bool = True):
    """(counts per reason, a pandas table of up to ``max_examples`` examples per reason) for the
    utterances that fit no bucket: what a sampler on these bins would skip."""
    import pandas as pd

    fitter = make_fitter(bins, max_tps, strict_2d=strict_2d)
    dur = np.asarray(durations, dtype=np.float64)
    tok = None if num_tokens is None else np.asarray(num_tokens, dtype=np.int64)
    _, reason = fitter.assign(dur, tok if fitter.needs_tokens else None)
    counts = {name: int((reason == code).sum()) for code, name in REASONS.items()}
    rows = []
    for code, name in REASONS.items():
        for i in np.flatnonzero(reason == code)[:max_examples]:
            rows.append({"reason": name, "id": ids[i] if ids is not None else int(i), "duration_s": float(dur[i]),
                         "num_tokens": None if tok is None else int(tok[i]),
                         "tokens_per_s": None if tok is None else float(tok[i] / dur[i])})
    return counts, pd.DataFrame(rows, columns=["reason", "id", "duration_s", "num_tokens", "tokens_per_s"])
