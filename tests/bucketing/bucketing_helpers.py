"""Plain-loop implementations written straight from the DESIGN.md text (independent oracles for the
estimators), and random corpora with awkward shapes (rounded, skewed, constant durations)."""

from __future__ import annotations

import numpy as np


def loop_boundaries(sorted_values, num_parts):
    """Indices where the running total (reset at each boundary) first exceeds sum/num_parts."""
    per = sum(sorted_values) / num_parts if not isinstance(sorted_values, np.ndarray) else sorted_values.sum() / num_parts
    out, tot = [], 0
    for i, v in enumerate(sorted_values):
        if tot > per:
            out.append(i)
            tot = 0
        tot += v
    return out


def loop_2d(durations, tokens, num_buckets, num_subbuckets, threshold=4.0):
    order = sorted(range(len(durations)), key=lambda i: (durations[i], tokens[i]))
    d = np.array([float(durations[i]) for i in order])
    t = np.array([int(tokens[i]) for i in order], dtype=np.int64)
    cuts = loop_boundaries(d, num_buckets)
    starts, stops = [0] + cuts, cuts + [len(d)]
    bounds = [d[i] for i in cuts] + [d[-1]]
    groups = []  # [bound, start, stop, k]
    for b, s, e in zip(bounds, starts, stops):
        if groups and groups[-1][0] == b:
            groups[-1][2] = e
            groups[-1][3] += 1
        else:
            groups.append([b, s, e, 1])
    bins, tps_limits = [], []
    for b, s, e, k in groups:
        tps = t[s:e] / d[s:e]
        std = np.std(tps)
        keep = [True] * len(tps) if std == 0 else [(x - np.mean(tps)) / std <= threshold for x in tps]
        kept = sorted(int(x) for x, ok in zip(t[s:e], keep) if ok)
        limit = max(float(x) for x, ok in zip(tps, keep) if ok)
        for i in loop_boundaries(kept, k * num_subbuckets):
            bins.append((float(b), kept[i]))
            tps_limits.append(limit)
        bins.append((float(b), kept[-1]))
        tps_limits.append(limit)
    return bins, tps_limits


def corpus(n, seed=0, kind="gamma"):
    rng = np.random.default_rng(seed)
    if kind == "gamma":
        d = rng.gamma(2.0, 3.0, n) + 0.05
    elif kind == "rounded":
        d = np.round(rng.gamma(2.0, 3.0, n), 1) + 0.1
    elif kind == "skewed":  # most utterances share one duration: repeated bounds, merged groups
        d = np.where(rng.random(n) < 0.7, 5.0, rng.uniform(0.5, 20.0, n))
    else:
        d = np.full(n, 3.0)
    t = np.maximum(0, (d * rng.uniform(1, 5, n)).astype(np.int64) + (rng.random(n) < 0.01) * 200)
    return d, t
