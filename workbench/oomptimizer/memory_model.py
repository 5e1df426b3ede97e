"""The memory model the predictive search fits: peak = base + batch_size * per_item_cost(bucket).

``base`` (weights, gradients, optimizer state, workspaces: bytes) is shared by all buckets. The per-item
cost (bytes per utterance) is measured per bucket from its own successful probes, and predicted for a
bucket not probed yet from a non-negative fit over the bucket shape: duration d (seconds), tokens u,
with terms 1, d, u, d^2 (attention), d*u (transducer joint). All fits weigh errors relative to the
measured value, since peaks span orders of magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

SHAPE_TERMS = ("d", "d*u", "d^2", "u", "1")  # in order of preference when fits tie


@dataclass
class MemoryFit:
    base_bytes: float  # memory that does not grow with the batch size; 0 when not identifiable yet
    base_known: bool  # True once some bucket was probed at two different batch sizes
    per_item_bytes: dict[int, float] = field(default_factory=dict)  # bucket index -> bytes per item
    noise: float = 0.0  # relative RMS of the residuals beyond what the model explains (0 when exact)


def fit_base_and_costs(points: list[tuple[int, int, float]]) -> MemoryFit:
    """Least-squares fit of peak = base + n * cost[bucket] over successful probes ``(bucket, n, peak)``.

    ``base`` is shared and clamped to [0, smallest peak); each cost is >= 0. Without a bucket probed
    at two sizes the base is not identifiable and is taken as 0, which overestimates the per-item
    cost, so predictions stay on the safe side.
    """
    if not points:
        return MemoryFit(0.0, False, {})
    b = np.array([p[0] for p in points])
    n = np.array([p[1] for p in points], dtype=np.float64)
    peak = np.array([p[2] for p in points], dtype=np.float64)
    w = 1.0 / np.maximum(peak, 1.0) ** 2
    buckets = np.unique(b)
    # For a fixed base c, cost_b(c) = (P_b - c * N_b) / S_b; residual_i = c * a_i + e_i.
    s = {k: np.sum(w[b == k] * n[b == k] ** 2) for k in buckets}
    nsum = {k: np.sum(w[b == k] * n[b == k]) for k in buckets}
    psum = {k: np.sum(w[b == k] * n[b == k] * peak[b == k]) for k in buckets}
    a = np.array([1.0 - n[i] * nsum[b[i]] / s[b[i]] for i in range(len(n))])
    e = np.array([n[i] * psum[b[i]] / s[b[i]] - peak[i] for i in range(len(n))])
    distinct = any(len(np.unique(n[b == k])) > 1 for k in buckets)
    base = 0.0
    if distinct and np.sum(w * a * a) > 0:
        base = float(-np.sum(w * a * e) / np.sum(w * a * a))
        base = min(max(base, 0.0), float(peak.min()) * 0.999)
    costs = {int(k): max((psum[k] - base * nsum[k]) / s[k], 0.0) for k in buckets}
    dof = len(n) - len(buckets) - 1
    noise = 0.0
    if distinct and dof > 0:
        fitted = base + n * np.array([costs[int(k)] for k in b])
        noise = float(np.sqrt(np.sum(((fitted - peak) / peak) ** 2) / dof))
    return MemoryFit(base, distinct, costs, noise)


def shape_features(buckets: list[tuple[float, float]], scale: tuple[float, float]) -> np.ndarray:
    """Columns for SHAPE_TERMS, with duration and tokens divided by ``scale`` for conditioning."""
    d = np.array([x[0] for x in buckets], dtype=np.float64) / scale[0]
    u = np.array([x[1] for x in buckets], dtype=np.float64) / scale[1]
    return np.stack([d, d * u, d * d, u, np.ones_like(d)], axis=1)


def fit_shape_model(features: np.ndarray, costs: np.ndarray, *, tolerance: float = 0.01) -> np.ndarray:
    """Non-negative weights over SHAPE_TERMS predicting per-item cost from bucket shape.

    Exhaustive non-negative least squares over subsets of terms (5 terms: 31 subsets), errors relative
    to the cost. Uses at most as many terms as buckets, and the fewest terms whose relative RMS error
    is within ``tolerance`` of the best, so that one or two buckets give a simple scaling.
    """
    k = len(costs)
    rows = features / costs[:, None]
    target = np.ones(k)
    best: dict[int, tuple[float, np.ndarray]] = {}
    for size in range(1, min(k, features.shape[1]) + 1):
        for subset in combinations(range(features.shape[1]), size):
            cols = list(subset)
            coef, *_ = np.linalg.lstsq(rows[:, cols], target, rcond=None)
            if np.any(coef < 0) or not np.all(np.isfinite(coef)):
                continue
            rms = float(np.sqrt(np.mean((rows[:, cols] @ coef - target) ** 2)))
            if size not in best or rms < best[size][0] - 1e-12:
                weights = np.zeros(features.shape[1])
                weights[cols] = coef
                best[size] = (rms, weights)
    if not best:
        return np.zeros(features.shape[1])
    lowest = min(r for r, _ in best.values())
    for size in sorted(best):
        if best[size][0] <= lowest + tolerance:
            return best[size][1]
    return best[min(best)][1]  # pragma: no cover
