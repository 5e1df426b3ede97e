"""Blank-bias calibration: bisect a joint's blank bias towards a rate of labels per frame on the input itself."""

from __future__ import annotations

import torch

from benchmarks.decoding.methods import BLANK
from workbench.decoding import GreedyTransducerDecoder
from workbench.decoding.toy_models import set_blank_bias


def calibrate_blank_bias(decoder: GreedyTransducerDecoder, enc: torch.Tensor, lengths: torch.Tensor,
                         target: float = 1 / 3, steps: int = 11) -> tuple[float, float]:
    """Bisect the blank bias of ``decoder``'s joint so labels per frame on this very input is about
    ``target``; returns (bias, labels per frame): of every bias tried, the one whose rate came closest.
    Each row of the table is calibrated on its own input: the rate of a random model at one fixed bias varies
    a lot between random inputs, and on one short utterance it jumps (one label more changes the rest of
    the path), so the last midpoint can sit on the far side of a jump."""
    frames = float(lengths.sum())

    def rate_at(bias: float) -> float:
        set_blank_bias(decoder.joint, BLANK, bias)
        return sum(len(h.tokens) for h in decoder(enc, lengths)) / frames

    low, high = -10.0, 10.0
    tried = []
    for _ in range(steps):
        mid = (low + high) / 2
        rate = rate_at(mid)
        tried.append((abs(rate - target), mid, rate))
        low, high = (mid, high) if rate > target else (low, mid)
    end = (low + high) / 2
    end_rate = rate_at(end)
    tried.append((abs(end_rate - target), end, end_rate))
    _, bias, rate = min(tried)
    set_blank_bias(decoder.joint, BLANK, bias)
    return bias, rate
