"""Plain-loop bin estimates written straight from the rules in docs/ARCHITECTURE.md: the independent
reference the vectorized estimators (``workbench.bucketing.estimate``) are tested against, and the "plain loop" a
lhotse-iteration script would run in the bucketing benchmark. Slow on purpose: one Python step per value.
"""

from __future__ import annotations

import numpy as np


def loop_boundaries(sorted_values, num_parts: int) -> list[int]:
    """Indices where the running total (reset at each boundary) first exceeds sum / num_parts."""
    per = float(np.sum(sorted_values)) / num_parts
    out, total = [], 0
    for i, v in enumerate(sorted_values):
        if total > per:
            out.append(i)
            total = 0
        total += v
    return out


def loop_2d(durations, tokens, num_buckets: int, num_subbuckets: int,
            threshold: float = 4.0) -> tuple[list[tuple[float, int]], list[float]]:
    """(bins, tps limit per bin): duration groups by the running total of durations, a TPS z-score filter
    at ``threshold`` within each group, then token sub-buckets by the running total of kept token counts.
    Neighbouring duration boundaries that coincide make one group with that many times the sub-buckets."""
    pairs = sorted(zip((float(x) for x in durations), (int(x) for x in tokens)))
    d = np.array([p[0] for p in pairs])
    t = np.array([p[1] for p in pairs], dtype=np.int64)
    cuts = loop_boundaries(d, num_buckets)
    bounds = [d[i] for i in cuts] + [d[-1]]
    groups: list[list] = []  # [bound, start, stop, how many duration buckets share it]
    for b, s, e in zip(bounds, [0] + cuts, cuts + [len(d)]):
        if groups and groups[-1][0] == b:
            groups[-1][2], groups[-1][3] = e, groups[-1][3] + 1
        else:
            groups.append([b, s, e, 1])
    bins, tps_limits = [], []
    for b, s, e, k in groups:
        tps = t[s:e] / d[s:e]
        std = np.std(tps)
        keep = np.ones(len(tps), bool) if std == 0 else (tps - np.mean(tps)) / std <= threshold
        kept = sorted(t[s:e][keep].tolist())
        limit = float(tps[keep].max())
        for i in loop_boundaries(kept, k * num_subbuckets) + [len(kept) - 1]:
            bins.append((float(b), kept[i]))
            tps_limits.append(limit)
    return bins, tps_limits
