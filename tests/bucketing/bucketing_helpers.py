"""Random corpora with awkward shapes (rounded, skewed, constant durations) for the estimator tests; the
plain-loop reference they are checked against is workbench.bucketing.reference."""

from __future__ import annotations

import numpy as np


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
