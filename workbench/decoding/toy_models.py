"""Small transducer parts that follow the decoding protocol: an LSTM predictor and an additive joint.

Used by the tests (many random tiny models), the benchmark (vocabulary 1024, predictor and joint 640)
and the notebook. They do not depend on workbench.models, so the decoders are checked on parts they
were not written for.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LstmPredictor(nn.Module):
    """Embedding + LSTM; the blank id's embedding row is the start symbol. State: (h, c), each [B, L, H]."""

    def __init__(self, num_tokens: int, hidden: int, num_layers: int = 1):
        super().__init__()
        self.embedding = nn.Embedding(num_tokens, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers, batch_first=True)
        self.hidden, self.num_layers = hidden, num_layers

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        w = self.embedding.weight
        zeros = torch.zeros(batch_size, self.num_layers, self.hidden, dtype=w.dtype, device=w.device)
        return zeros, zeros.clone()

    def step(self, labels: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h, c = state
        x = self.embedding(labels).unsqueeze(1)
        out, (h2, c2) = self.lstm(x, (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))
        return out[:, 0], (h2.transpose(0, 1), c2.transpose(0, 1))


class AdditiveJoint(nn.Module):
    """logits = out(relu(enc_proj + pred_proj)); outputs: V + 1 tokens, then one per TDT duration."""

    def __init__(self, enc_dim: int, pred_dim: int, joint_dim: int, num_outputs: int):
        super().__init__()
        self.enc = nn.Linear(enc_dim, joint_dim)
        self.pred = nn.Linear(pred_dim, joint_dim)
        self.out = nn.Linear(joint_dim, num_outputs)

    def project_encoder(self, enc: Tensor) -> Tensor:
        return self.enc(enc)

    def project_predictor(self, out: Tensor) -> Tensor:
        return self.pred(out)

    def joint_after_projection(self, enc_proj: Tensor, pred_proj: Tensor) -> Tensor:
        return self.out(torch.relu(enc_proj + pred_proj))


def make_toy_transducer(*, vocab_size: int, enc_dim: int, pred_dim: int, joint_dim: int,
                        num_layers: int = 1, durations: list[int] | None = None, blank_id: int | None = None,
                        blank_bias: float = 0.0, seed: int = 0, logit_scale: float = 1.0,
                        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """Random (predictor, joint) with ``vocab_size`` labels plus blank (id ``blank_id``, default the last).

    ``blank_bias`` is added to the blank logit (higher: fewer labels per frame); ``logit_scale``
    multiplies the output layer (larger: sharper, more varied decisions).
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    blank = vocab_size if blank_id is None else blank_id
    if not 0 <= blank <= vocab_size:
        raise ValueError(f"blank_id must be in [0, {vocab_size}], got {blank}")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        predictor = LstmPredictor(vocab_size + 1, pred_dim, num_layers)
        joint = AdditiveJoint(enc_dim, pred_dim, joint_dim, vocab_size + 1 + len(durations or []))
    finally:
        torch.random.set_rng_state(gen_state)
    with torch.no_grad():
        joint.out.weight.mul_(logit_scale)
        joint.out.bias.mul_(logit_scale)
        joint.out.bias[blank] += blank_bias
    predictor = predictor.to(device=device, dtype=dtype).eval()
    predictor.lstm.flatten_parameters()  # one weight buffer for cuDNN (else it compacts on every call)
    return predictor, joint.to(device=device, dtype=dtype).eval()


def set_blank_bias(joint: AdditiveJoint, blank_id: int, value: float) -> None:
    """Set the blank logit's bias in place (no re-capture needed: graphs read the weights at replay)."""
    with torch.no_grad():
        joint.out.bias[blank_id] = value
