"""RNN-T / TDT prediction network and joint, following the decoding protocol in docs/ARCHITECTURE.md (batch first).

Blank is the last token class (id = vocab_size) and doubles as the predictor's start symbol. A TDT joint
appends one logit per duration after the V + 1 token logits.
"""

from __future__ import annotations

import torch
from torch import nn


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
        out, (h, c) = self.lstm(self.embed(labels)[:, None, :],
                                (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))
        return out[:, 0], (h.transpose(0, 1), c.transpose(0, 1))

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: targets [B, U] -> [B, U + 1, hidden] (position u has seen the first u labels)."""
        start = torch.full_like(targets[:, :1], self.blank_id)
        out, _ = self.lstm(self.embed(torch.cat([start, targets], dim=1)))
        return self.dropout(out)


class Joint(nn.Module):
    """relu(W_enc enc + W_pred pred) -> V + 1 token logits (+ one per TDT duration)."""

    def __init__(self, enc_dim: int, pred_dim: int, hidden: int, num_outputs: int):
        super().__init__()
        self.enc_proj = nn.Linear(enc_dim, hidden)
        self.pred_proj = nn.Linear(pred_dim, hidden)
        self.out = nn.Linear(hidden, num_outputs)

    def project_encoder(self, enc: torch.Tensor) -> torch.Tensor:
        return self.enc_proj(enc)

    def project_predictor(self, pred: torch.Tensor) -> torch.Tensor:
        return self.pred_proj(pred)

    def joint_after_projection(self, enc_proj: torch.Tensor, pred_proj: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(enc_proj + pred_proj))

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """enc [B, T, D], pred [B, U + 1, H] -> logits [B, T, U + 1, outputs] (the full training lattice)."""
        return self.joint_after_projection(self.project_encoder(enc)[:, :, None, :],
                                           self.project_predictor(pred)[:, None, :, :])
