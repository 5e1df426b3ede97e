"""Random corpora with awkward shapes (rounded, skewed, tied, constant durations) for the estimator tests;
the plain-loop reference they are checked against is workbench.bucketing.reference."""

from __future__ import annotations

import numpy as np

KINDS = ("gamma", "rounded", "skewed", "equal", "integer", "few", "samples16k")


def corpus(n, seed=0, kind="gamma"):
    """(durations in seconds, token counts) of ``n`` utterances; about 1 % have 200 extra tokens.

    gamma: continuous; rounded: 0.1 s steps; skewed: 70 % share one duration; equal: all 3 s;
    integer: whole seconds 1-20; few: three durations only; samples16k: 16 kHz sample counts of 0.5-4 s,
    half of them whole 10 ms frames.
    """
    rng = np.random.default_rng(seed)
    if kind == "gamma":
        d = rng.gamma(2.0, 3.0, n) + 0.05
    elif kind == "rounded":
        d = np.round(rng.gamma(2.0, 3.0, n), 1) + 0.1
    elif kind == "skewed":  # most utterances share one duration: repeated bounds, merged groups
        d = np.where(rng.random(n) < 0.7, 5.0, rng.uniform(0.5, 20.0, n))
    elif kind == "integer":
        d = rng.integers(1, 21, n).astype(np.float64)
    elif kind == "few":
        d = rng.choice([1.0, 2.5, 15.0], n, p=[0.5, 0.3, 0.2])
    elif kind == "samples16k":  # half of them on 10 ms frames (160 samples): many ties
        samples = rng.integers(8_000, 64_001, n)
        d = np.where(rng.random(n) < 0.5, samples // 160 * 160, samples) / 16_000
    elif kind == "equal":
        d = np.full(n, 3.0)
    else:
        raise ValueError(f"unknown corpus kind {kind!r}")
    t = np.maximum(0, (d * rng.uniform(1, 5, n)).astype(np.int64) + (rng.random(n) < 0.01) * 200)
    return d, t
