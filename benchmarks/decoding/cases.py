"""A run's cases and findings: one size's models, input and reference, the rows run last, the outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.decoding.methods import BLANK, METHODS
from workbench.decoding import GreedyTransducerDecoder
from workbench.decoding.methods import DecoderMethod


@dataclass
class Case:
    """One row group of the table: a model in a dtype on one random input of B utterances x T frames."""
    model: str
    dtype: torch.dtype
    predictor: torch.nn.Module
    joint: torch.nn.Module
    durations: list[int] | None
    enc: torch.Tensor  # [B, T, ENC]
    lengths: torch.Tensor  # [B]
    device: torch.device
    methods: list[DecoderMethod] = field(default_factory=lambda: list(METHODS))
    blank_bias: float | None = None  # None until calibrated
    reference: tuple | None = None  # (tokens, frames) per utterance of reference_method
    reference_method: str | None = None
    loop_stats: dict | None = None  # outer and inner iterations (an eager or partial-graph row's)
    profile_kernels: bool = False  # --kernel-profile: keep profiled_method's decoder for add_kernel_profiles
    measured: list[DecoderMethod] = field(default_factory=list)  # the methods the last pass over it ran

    @property
    def batch(self) -> int:
        return self.enc.shape[0]

    @property
    def frames(self) -> int:
        return self.enc.shape[1]

    @property
    def tag(self) -> str:
        return f"{self.model} {str(self.dtype)[6:]} B={self.batch} T={self.frames}"

    def decoder(self, **kw) -> GreedyTransducerDecoder:
        return GreedyTransducerDecoder(self.predictor, self.joint, blank_id=BLANK, durations=self.durations, **kw)


@dataclass
class Deferred:
    """Methods of a case that run after every other row (NeMo's full graph beside our full graphs); the case
    holds what checks them."""
    case: Case
    methods: list[DecoderMethod]


@dataclass
class ToProfile:
    """A warm decoder of ``profiled_method`` kept for its kernel profile, which runs after every timed row."""
    case: Case
    method: str
    decoder: GreedyTransducerDecoder


@dataclass
class Outcome:
    """What one record's run has found so far, besides its figures; ``failures`` is the harness Run's list."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    calibration: dict[str, dict] = field(default_factory=dict)
    deferred: list[Deferred] = field(default_factory=list)
    to_profile: list[ToProfile] = field(default_factory=list)
    context_lost: str | None = None  # the CUDA error that made the context unusable, once one has
