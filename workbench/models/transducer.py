"""RNN-T / TDT prediction network and joint, following the decoding protocol in docs/ARCHITECTURE.md (batch first).

Blank is the last token class (id = vocab_size) and doubles as the predictor's start symbol. A TDT joint
appends one logit per duration after the V + 1 token logits. :func:`chunked_joint_loss` computes the
joint and the loss together over chunks of the batch, so the whole [B, T, U + 1, outputs] joint is never
held at once.

Training computes the joint's output layer at :func:`padded_width` outputs (zero weight rows and bias
added on the fly; the parameters keep the true width): an odd width such as V + 1 = 1025 makes cuBLAS
fall back to slow unaligned GEMM kernels. The losses read the padded logits in place (``num_classes``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

OUTPUT_ALIGNMENT = 8  # the joint's training outputs are padded to a multiple of this (16 bytes of bf16)


def padded_width(num_outputs: int, multiple: int = OUTPUT_ALIGNMENT) -> int:
    """The smallest multiple of ``multiple`` that is >= num_outputs (num_outputs itself when aligned)."""
    return -(-num_outputs // multiple) * multiple


class Predictor(nn.Module):
    """Label embedding + LSTM. State is (h, c), each [B, layers, hidden]."""

    def __init__(self, vocab_size: int, hidden: int, num_layers: int, dropout: float, blank_id: int | None = None):
        super().__init__()
        self.blank_id = vocab_size if blank_id is None else blank_id  # the start symbol of teacher forcing
        self.hidden, self.num_layers = hidden, num_layers
        self.embed = nn.Embedding(vocab_size + 1, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = self.embed.weight
        zeros = torch.zeros(batch_size, self.num_layers, self.hidden, device=weight.device, dtype=weight.dtype)
        return zeros, zeros.clone()

    def step(self, labels: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """labels [B] long (blank = start) -> (out [B, hidden], new state)."""
        h, c = state
        out, (h, c) = self._lstm(self.embed(labels)[:, None, :],
                                 (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))
        return out[:, 0], (h.transpose(0, 1), c.transpose(0, 1))

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: targets [B, U] -> [B, U + 1, hidden] (position u has seen the first u labels)."""
        start = targets.new_full((targets.shape[0], 1), self.blank_id)  # also when U = 0 (no labels at all)
        out, _ = self._lstm(self.embed(torch.cat([start, targets], dim=1)))
        return self.dropout(out)

    def _lstm(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The LSTM; under CPU autocast it runs in fp32 (oneDNN's bf16 LSTM cannot start on CPUs without
        bf16 instructions, e.g. AVX2-only ones), so a CPU bf16 step runs on any x86 machine."""
        if x.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return self.lstm(x, state)
        with torch.autocast("cpu", enabled=False):
            return self.lstm(x.float(), None if state is None else tuple(t.float() for t in state))


class Joint(nn.Module):
    """relu(W_enc enc + W_pred pred) -> V + 1 token logits (+ one per TDT duration): ``num_outputs``."""

    def __init__(self, enc_dim: int, pred_dim: int, hidden: int, num_outputs: int):
        super().__init__()
        self.enc_proj = nn.Linear(enc_dim, hidden)
        self.pred_proj = nn.Linear(pred_dim, hidden)
        self.out = nn.Linear(hidden, num_outputs)

    @property
    def num_outputs(self) -> int:
        return self.out.out_features

    def project_encoder(self, enc: torch.Tensor) -> torch.Tensor:
        return self.enc_proj(enc)

    def project_predictor(self, pred: torch.Tensor) -> torch.Tensor:
        return self.pred_proj(pred)

    def joint_after_projection(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(enc_proj + pred_proj))

    def activation_and_output(self) -> tuple[str, nn.Linear]:
        """joint_after_projection is out(relu(enc + pred)) (the decoders' fused kernels use it)."""
        return "relu", self.out

    def padded_joint_after_projection(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        """:meth:`joint_after_projection` with the last dim padded to ``padded_width(num_outputs)``: the
        padding columns are exactly 0 and their weight rows get no gradient (they are not parameters)."""
        extra = padded_width(self.num_outputs) - self.num_outputs
        if not extra:
            return self.joint_after_projection(enc_proj, pred_proj)
        bias = None if self.out.bias is None else F.pad(self.out.bias, (0, extra))
        return F.linear(torch.relu(enc_proj + pred_proj), F.pad(self.out.weight, (0, 0, 0, extra)), bias)

    def forward(self, enc: torch.Tensor, pred: torch.Tensor, *, padded: bool = False) -> torch.Tensor:
        """enc [B, T, D], pred [B, U + 1, H] -> logits [B, T, U + 1, outputs] (the full training lattice);
        ``padded``: [B, T, U + 1, padded_width(outputs)], the training layout (see
        :meth:`padded_joint_after_projection`)."""
        return _lattice_logits(self, self.project_encoder(enc), self.project_predictor(pred), padded)


def chunked_joint_loss(joint: Joint, enc: torch.Tensor, pred: torch.Tensor,
                       chunk_loss: Callable[[torch.Tensor, slice], torch.Tensor], chunk_size: int, *,
                       padded: bool = False) -> torch.Tensor:
    """sum over batch chunks of ``chunk_loss(joint logits of the chunk, its rows)``, holding one chunk's
    [b, T, U + 1, outputs] joint at a time (NeMo's "fused batch"); ``padded``: the chunks' logits in the
    training layout of ``joint(enc, pred, padded=True)``.

    enc [B, T, D], pred [B, U + 1, H]; ``chunk_loss`` returns a scalar (e.g. the chunk's summed NLL).
    With gradients enabled, each chunk's backward through the loss and the joint runs inside this call,
    right after its forward, and its logits are freed before the next chunk; the returned scalar then
    carries the accumulated gradients of the projections and the joint's parameters, which reach the
    encoder and predictor when the caller's backward runs. Without gradients the chunks are only
    evaluated. chunk_size: utterances per chunk (>= 1).
    """
    if chunk_size < 1:
        raise ValueError(f"joint_chunk_size: need at least 1 utterance per chunk, got {chunk_size}")
    enc_proj, pred_proj = joint.project_encoder(enc), joint.project_predictor(pred)
    chunks = [slice(start, start + chunk_size) for start in range(0, enc.shape[0], chunk_size)]
    if not torch.is_grad_enabled():
        return sum(chunk_loss(_lattice_logits(joint, enc_proj[rows], pred_proj[rows], padded), rows)
                   for rows in chunks)
    params = list(joint.out.parameters())  # the projections' own get theirs through enc_proj and pred_proj
    return _ChunkedJointLoss.apply(enc_proj, pred_proj, joint, chunk_loss, chunks, padded, *params)


def _lattice_logits(joint: Joint, enc_proj: torch.Tensor, pred_proj: torch.Tensor, padded: bool) -> torch.Tensor:
    """[b, T, J] and [b, U + 1, J] projections -> joint logits [b, T, U + 1, outputs (padded if asked)]."""
    combine = joint.padded_joint_after_projection if padded else joint.joint_after_projection
    return combine(enc_proj[:, :, None, :], pred_proj[:, None, :, :])


class _ChunkedJointLoss(torch.autograd.Function):
    """Forward runs each chunk's joint, loss and backward and keeps only the gradients (small: the size of
    the projections and the joint's output layer); backward scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, enc_proj, pred_proj, joint, chunk_loss, chunks, padded, *params):
        inputs = (enc_proj, pred_proj, *params)
        needs = [x.requires_grad for x in inputs]
        grads = [torch.zeros_like(x) if need else None for x, need in zip(inputs, needs)]
        total = None
        for rows in chunks:
            with torch.enable_grad():
                enc_rows = enc_proj[rows].detach().requires_grad_(needs[0])
                pred_rows = pred_proj[rows].detach().requires_grad_(needs[1])
                loss = chunk_loss(_lattice_logits(joint, enc_rows, pred_rows, padded), rows)
                wrt = [x for x, need in zip((enc_rows, pred_rows, *params), needs) if need]
                chunk_grads = iter(torch.autograd.grad(loss, wrt, allow_unused=True) if wrt else ())
            for i, need in enumerate(needs):
                if not need:
                    continue
                g = next(chunk_grads)
                if g is None:
                    continue
                if i < 2:
                    grads[i][rows] = g
                else:
                    grads[i] += g
            total = loss.detach() if total is None else total + loss.detach()
        ctx.grads = grads
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grads = [None if g is None else g * grad_output.to(g.dtype) for g in ctx.grads]
        ctx.grads = None
        return grads[0], grads[1], None, None, None, None, *grads[2:]
