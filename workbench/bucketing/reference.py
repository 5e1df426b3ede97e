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
    """(bins, tps limit per bin): duration bounds by the running total of durations; group j holds the
    utterances with bound[j-1] < duration <= bound[j], and a bound that repeats k times makes one group
    with k * num_subbuckets sub-buckets; a TPS z-score filter at ``threshold`` within each group, then
    token sub-buckets by the running total of the group's kept token counts."""
    pairs = sorted(zip((float(x) for x in durations), (int(x) for x in tokens)))
    d = np.array([p[0] for p in pairs])
    bounds = [d[i] for i in loop_boundaries(d, num_buckets)] + [d[-1]]
    groups: list[list] = []  # [bound, how many times it repeats, durations, token counts]
    for b in bounds:
        if groups and groups[-1][0] == b:
            groups[-1][1] += 1
        else:
            groups.append([b, 1, [], []])
    g = 0
    for dur, tok in pairs:  # ascending: move to the next group once the duration is above its bound
        while dur > groups[g][0]:
            g += 1
        groups[g][2].append(dur)
        groups[g][3].append(tok)
    bins, tps_limits = [], []
    for b, k, durs, toks in groups:
        tps = np.array(toks) / np.array(durs)
        std = np.std(tps)
        keep = np.ones(len(tps), bool) if std == 0 else (tps - np.mean(tps)) / std <= threshold
        kept = sorted(x for x, y in zip(toks, keep) if y)
        limit = float(tps[keep].max())
        for i in loop_boundaries(kept, k * num_subbuckets) + [len(kept) - 1]:
            bins.append((float(b), kept[i]))
            tps_limits.append(limit)
    return bins, tps_limits
