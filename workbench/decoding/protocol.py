"""The transducer protocol the greedy decoders drive, and the hypothesis they return.

Any predictor/joint pair with these methods can be decoded; all states are batch-first (batch on dim 0)
so the decoders can update them row by row with masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor


class PredictorProtocol(Protocol):
    """What a decoder needs of a transducer predictor (``workbench.models.transducer.Predictor`` is one)."""

    def init_state(self, batch_size: int) -> tuple[Tensor, ...]:
        """Start state for ``batch_size`` utterances; each tensor has the batch on dim 0."""

    def step(self, labels: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """One label per utterance (``labels[B]`` long; ``blank_id`` is the start symbol) -> (out[B, H], state)."""


class JointProtocol(Protocol):
    """What a decoder needs of a transducer joint (``workbench.models.transducer.Joint`` is one)."""

    def project_encoder(self, enc: Tensor) -> Tensor:
        """[B, T, D] -> [B, T, J]."""

    def project_predictor(self, out: Tensor) -> Tensor:
        """[B, H] -> [B, J]."""

    def joint_after_projection(self, enc_proj: Tensor, pred_proj: Tensor) -> Tensor:
        """[B, J], [B, J] -> [B, V + 1 (+ number of durations)] logits."""

    # Optional: ``activation_and_output() -> (activation name, output nn.Linear) | None``, declaring that
    # joint_after_projection(e, p) is output(activation(e + p)). With "relu", the fused kernels compute the hidden
    # rows while gathering the window and call only the output layer (checked once on random inputs).


@dataclass
class Hypothesis:
    """One decoded utterance.

    tokens: emitted label ids (blank never appears); timestamps: the encoder frame (0-based) at which
    each token was emitted; score: sum of the log-probabilities of every decision taken (blanks
    included; for TDT the chosen duration's log-probability is added too).
    """

    tokens: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    score: float = 0.0


def hypotheses_from_buffers(tokens: Tensor, timestamps: Tensor, num_emitted: Tensor, scores: Tensor,
                            batch_size: int) -> list[Hypothesis]:
    """Cut the first ``batch_size`` rows of padded output buffers into hypotheses: after the decode, the
    counts come to the host first, so only the used columns of tokens and timestamps are copied."""
    counts = num_emitted[:batch_size].cpu().tolist()
    width = max(counts, default=0)
    toks = tokens[:batch_size, :width].cpu().tolist()
    times = timestamps[:batch_size, :width].cpu().tolist()
    score_list = scores[:batch_size].double().cpu().tolist()
    return [Hypothesis(toks[b][:n], times[b][:n], float(score_list[b])) for b, n in enumerate(counts)]


def module_dtype(module, default: torch.dtype) -> torch.dtype:
    """The dtype of a module's first floating parameter, else ``default``."""
    params = getattr(module, "parameters", None)
    if params is not None:
        for p in params():
            if p.is_floating_point():
                return p.dtype
    return default
