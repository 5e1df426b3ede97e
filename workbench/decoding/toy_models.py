"""Random transducer parts of any size for the decoders' tests, benchmark and notebook.

The parts are the reference models' own predictor and joint (workbench.models.transducer), so there is
one LSTM predictor and one joint in the library; what this adds is random weights with a chosen blank
id, blank bias and sharpness.
"""

from __future__ import annotations

import torch

from workbench.models.transducer import Joint, Predictor


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
        # The predictor embeds every token id 0..vocab_size; the blank's row is the start symbol.
        predictor = Predictor(vocab_size, pred_dim, num_layers, dropout=0.0, blank_id=blank)
        joint = Joint(enc_dim, pred_dim, joint_dim, vocab_size + 1 + len(durations or []))
    finally:
        torch.random.set_rng_state(gen_state)
    with torch.no_grad():
        joint.out.weight.mul_(logit_scale)
        joint.out.bias.mul_(logit_scale)
        joint.out.bias[blank] += blank_bias
    predictor = predictor.to(device=device, dtype=dtype).eval()
    predictor.lstm.flatten_parameters()  # one weight buffer for cuDNN (else it compacts on every call)
    return predictor, joint.to(device=device, dtype=dtype).eval()


def set_blank_bias(joint: Joint, blank_id: int, value: float) -> None:
    """Set the blank logit's bias in place (no re-capture needed: graphs read the weights at replay)."""
    with torch.no_grad():
        joint.out.bias[blank_id] = value
