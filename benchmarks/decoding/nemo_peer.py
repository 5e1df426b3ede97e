"""NeMo 3.0.0 as the decoding bench's peer: its prediction network and joint with random weights, adapted to
our transducer protocol (so our decoder runs on NeMo's very weights), and its own greedy batched decoders.

NeMo is optional: nothing here imports it at module load. ``nemo_unavailable_reason()`` says why it cannot be
used (None when it can); ../shared/tools/fetch_nemo_wheels.sh says how to install it on a GPU host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# NeMo's label-looping graph modes by our names; "off" runs its eager (torch) implementation.
NEMO_MODES = {"full": "full_graph", "partial": "no_while_loops", "off": None}


def nemo_unavailable_reason() -> str | None:
    """Why NeMo's RNN-T modules and greedy decoders cannot be imported here (None when they can)."""
    try:
        from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint  # noqa: F401
        from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import (  # noqa: F401
            GreedyBatchedRNNTInfer, GreedyBatchedTDTInfer)
    except Exception as e:  # noqa: BLE001 - any import failure (missing package, broken dependency) is a reason
        return f"NeMo is not importable ({type(e).__name__}: {e})"
    return None


class NemoPredictor(torch.nn.Module):
    """NeMo's ``RNNTDecoder`` (embedding + LSTM) behind our predictor protocol. State: (h, c), each
    [B, layers, hidden] (batch first); NeMo's own is [layers, B, hidden]. The blank id is NeMo's pad token,
    whose embedding is zero: NeMo's start symbol too."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        weight = self.decoder.prediction["embed"].weight
        zeros = torch.zeros(batch_size, self.decoder.pred_rnn_layers, self.decoder.pred_hidden,
                            device=weight.device, dtype=weight.dtype)
        return zeros, zeros.clone()

    def step(self, labels: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """labels [B] long -> (out [B, hidden], new state), through NeMo's own ``predict`` as its decoders call it."""
        h, c = (s.transpose(0, 1).contiguous() for s in state)
        out, (h, c) = self.decoder.predict(labels.unsqueeze(1), (h, c), add_sos=False, batch_size=labels.shape[0])
        return out[:, 0], (h.transpose(0, 1), c.transpose(0, 1))


class NemoJoint(torch.nn.Module):
    """NeMo's ``RNNTJoint`` behind our joint protocol; ``out`` is its output layer (the blank bias lives there)."""

    def __init__(self, joint):
        super().__init__()
        self.joint = joint

    @property
    def out(self) -> torch.nn.Linear:
        return self.joint.joint_net[-1]

    def project_encoder(self, enc: Tensor) -> Tensor:
        return self.joint.project_encoder(enc)

    def project_predictor(self, out: Tensor) -> Tensor:
        return self.joint.project_prednet(out)

    def joint_after_projection(self, enc_proj: Tensor, pred_proj: Tensor) -> Tensor:
        """[N, J], [N, J] -> [N, outputs]: NeMo's joint on N (frame, label) pairs."""
        return self.joint.joint_after_projection(enc_proj.unsqueeze(1), pred_proj.unsqueeze(1))[:, 0, 0]

    def activation_and_output(self) -> tuple[str, torch.nn.Linear] | None:
        """("relu", its output layer) when NeMo's joint network is ReLU, (dropout,) Linear and no dropout is
        active (eval mode, or p = 0); else None."""
        layers = list(self.joint.joint_net)
        if self.joint.training and any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in layers):
            return None
        if len(layers) < 2 or not isinstance(layers[0], torch.nn.ReLU) or not isinstance(layers[-1], torch.nn.Linear) \
                or not all(isinstance(m, torch.nn.Dropout) for m in layers[1:-1]):
            return None
        return "relu", layers[-1]


def make_nemo_transducer(*, vocab_size: int, enc_dim: int, pred_dim: int, joint_dim: int,
                         durations: list[int] | None = None, seed: int = 0,
                         device: str | torch.device = "cpu") -> tuple[NemoPredictor, NemoJoint]:
    """NeMo's RNNTDecoder (one LSTM layer) and RNNTJoint (ReLU) with seeded random weights, adapted; blank is
    ``vocab_size`` (NeMo's convention); a TDT joint ends with one logit per duration. The joint returns raw
    logits (``log_softmax=False``) on every device."""
    from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint

    saved = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        decoder = RNNTDecoder(prednet={"pred_hidden": pred_dim, "pred_rnn_layers": 1}, vocab_size=vocab_size)
        joint = RNNTJoint(jointnet={"encoder_hidden": enc_dim, "pred_hidden": pred_dim, "joint_hidden": joint_dim,
                                    "activation": "relu"},
                          num_classes=vocab_size, num_extra_outputs=len(durations or []), log_softmax=False)
    finally:
        torch.random.set_rng_state(saved)
    return NemoPredictor(decoder.to(device).eval()), NemoJoint(joint.to(device).eval())


@dataclass
class NemoGreedy:
    """NeMo's GreedyBatchedRNNTInfer / GreedyBatchedTDTInfer (label-looping) on adapted modules, in one graph
    mode of ``NEMO_MODES``; call with (enc[B, T, D], lengths[B]) -> (tokens, frames) per utterance."""

    predictor: NemoPredictor
    joint: NemoJoint
    durations: list[int] | None
    mode: str
    max_symbols: int = 10

    def __post_init__(self):
        from nemo.collections.asr.parts.submodules import rnnt_greedy_decoding as greedy

        if self.mode not in NEMO_MODES:
            raise ValueError(f"NeMo graph mode must be one of {list(NEMO_MODES)}, got {self.mode!r}")
        common = dict(decoder_model=self.predictor.decoder, joint_model=self.joint.joint,
                      blank_index=self.predictor.decoder.blank_idx, max_symbols_per_step=self.max_symbols,
                      use_cuda_graph_decoder=self.mode != "off")
        self.infer = (greedy.GreedyBatchedRNNTInfer(**common, loop_labels=True) if self.durations is None
                      else greedy.GreedyBatchedTDTInfer(**common, durations=list(self.durations)))
        if self.mode != "off":  # forced: no silent fallback to another mode
            self.infer.decoding_computer.force_cuda_graphs_mode(NEMO_MODES[self.mode])
        else:
            self.infer.decoding_computer.disable_cuda_graphs()

    def __call__(self, enc: Tensor, lengths: Tensor) -> tuple[list[list[int]], list[list[int]]]:
        enc = enc.to(self.joint.out.weight.dtype)  # NeMo's eager path does not cast (ours and its graphs do)
        (hyps,) = self.infer(encoder_output=enc.transpose(1, 2), encoded_lengths=lengths)
        tokens = [h.y_sequence.tolist() if torch.is_tensor(h.y_sequence) else list(h.y_sequence) for h in hyps]
        frames = [h.timestamp.tolist() if torch.is_tensor(h.timestamp) else list(h.timestamp) for h in hyps]
        return tokens, frames


def peer_description() -> dict[str, str]:
    """Which NeMo ran: its version and the classes compared."""
    import nemo

    return {"name": "NeMo", "version": getattr(nemo, "__version__", "unknown"),
            "decoders": "GreedyBatchedRNNTInfer (loop_labels) / GreedyBatchedTDTInfer",
            "modules": "RNNTDecoder (1 LSTM layer) and RNNTJoint (ReLU), random weights"}
