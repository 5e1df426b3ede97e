"""Model configs: one dataclass, and flat builders with literal sizes for tiny, large (~115M), xl (~1B).

Model names are "{size}-{head}", size in tiny | large | xl and head in rnnt | tdt | ctc | aed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

HEADS = ("rnnt", "tdt", "ctc", "aed")
DEPTHWISE = ("auto", "torch", "triton")  # what runs a depthwise convolution (auto: triton on CUDA)
DEFAULT_DEPTHWISE = "auto"        # the subsampling's depthwise 3x3 stride-2 convolutions
DEFAULT_TIME_DEPTHWISE = "auto"   # the conformer convolution modules' depthwise convolutions over time
SIZES = ("tiny", "large", "xl")
JOINT_LOSSES = ("materialized", "fused")  # transducers: the joint's logits, then the loss; or both in tiles
DEFAULT_JOINT_LOSS = "materialized"


@dataclass
class ModelConfig:
    head: str                        # rnnt | tdt | ctc | aed
    vocab_size: int                  # tokenizer pieces V; blank (= V) or bos/eos (= V, V + 1) come after
    name: str = ""                   # the builder name, e.g. "large-rnnt"
    # features: log-mel computed on the device from 16 kHz audio
    sample_rate: int = 16000         # Hz of the input audio
    n_mels: int = 80                 # mel bands
    n_fft: int = 512                 # FFT size in samples
    win_length: int = 400            # analysis window in samples (25 ms)
    hop_length: int = 160            # frame shift in samples (10 ms); 8x subsampling -> 80 ms per encoder frame
    # encoder: 8x depthwise-separable subsampling, then conformer blocks
    subsampling_channels: int = 256  # conv channels of the subsampling stack
    depthwise: str = DEFAULT_DEPTHWISE  # its depthwise 3x3 stride-2 convs: auto | torch (nn.Conv2d) | triton (kernels)
    time_depthwise: str = DEFAULT_TIME_DEPTHWISE  # the conv module's depthwise conv: torch (nn.Conv1d) | triton | auto
    d_model: int = 512               # encoder width
    num_layers: int = 17             # conformer blocks
    num_heads: int = 8               # self-attention heads
    ff_mult: int = 4                 # feed-forward hidden = ff_mult * d_model
    conv_kernel: int = 9             # depthwise conv kernel (frames) in the convolution module
    dropout: float = 0.1             # dropout everywhere (0 for deterministic tests)
    # transducer heads (rnnt, tdt)
    pred_hidden: int = 640           # LSTM prediction network width (and label embedding size)
    pred_layers: int = 1             # LSTM layers
    joint_hidden: int = 640          # joint network width
    durations: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # TDT durations in encoder frames
    joint_chunk_size: int = 0        # utterances per joint + loss chunk (0: the whole batch's joint at once)
    joint_loss: str = DEFAULT_JOINT_LOSS  # materialized (the [B, T, U + 1, outputs] logits) | fused (never built)
    # attention encoder-decoder head (aed)
    dec_layers: int = 6              # transformer decoder layers
    dec_heads: int = 8               # decoder attention heads
    dec_d_model: int = 512           # decoder width (the encoder output is projected to it)
    label_smoothing: float = 0.1     # cross-entropy label smoothing

    def __post_init__(self):
        if self.head not in HEADS:
            raise ValueError(f"head: expected one of {HEADS}, got {self.head!r}")
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size: need at least 1, got {self.vocab_size}")
        for option in ("depthwise", "time_depthwise"):
            if getattr(self, option) not in DEPTHWISE:
                raise ValueError(f"{option}: expected one of {DEPTHWISE}, got {getattr(self, option)!r}")
        if self.joint_chunk_size < 0:
            raise ValueError(f"joint_chunk_size: need >= 0 utterances (0: no chunks), got {self.joint_chunk_size}")
        if self.joint_loss not in JOINT_LOSSES:
            raise ValueError(f"joint_loss: expected one of {JOINT_LOSSES}, got {self.joint_loss!r}")
        if self.joint_loss == "fused" and self.joint_chunk_size:
            raise ValueError("joint_loss 'fused' never builds the joint's logits: joint_chunk_size does not apply "
                             f"(got {self.joint_chunk_size}; use 0)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def tiny_config(head: str, vocab_size: int = 32) -> ModelConfig:
    """CPU tests: trains in seconds (~0.3M parameters)."""
    return ModelConfig(head=head, vocab_size=vocab_size, name=f"tiny-{head}", n_mels=32,
                       subsampling_channels=16, d_model=64, num_layers=2, num_heads=4, ff_mult=2,
                       conv_kernel=5, dropout=0.0, pred_hidden=64, pred_layers=1, joint_hidden=64,
                       dec_layers=1, dec_heads=4, dec_d_model=64, label_smoothing=0.0)


def large_config(head: str, vocab_size: int = 1024) -> ModelConfig:
    """Like FastConformer-L: 17 blocks of width 512 (about 115M parameters with an RNN-T head)."""
    return ModelConfig(head=head, vocab_size=vocab_size, name=f"large-{head}", n_mels=80,
                       subsampling_channels=256, d_model=512, num_layers=17, num_heads=8, ff_mult=4,
                       conv_kernel=9, dropout=0.1, pred_hidden=640, pred_layers=1, joint_hidden=640,
                       dec_layers=4, dec_heads=8, dec_d_model=512)


def xl_config(head: str, vocab_size: int = 1024) -> ModelConfig:
    """About 1B parameters: transducer/CTC like Parakeet-1.1B (42 blocks of 1024); AED like Canary-1B
    (24 encoder blocks of 1024 and a 24-layer decoder of 1024)."""
    if head == "aed":
        return ModelConfig(head=head, vocab_size=vocab_size, name=f"xl-{head}", n_mels=128,
                           subsampling_channels=256, d_model=1024, num_layers=24, num_heads=8, ff_mult=4,
                           conv_kernel=9, dropout=0.1, dec_layers=24, dec_heads=8, dec_d_model=1024)
    return ModelConfig(head=head, vocab_size=vocab_size, name=f"xl-{head}", n_mels=80,
                       subsampling_channels=256, d_model=1024, num_layers=42, num_heads=8, ff_mult=4,
                       conv_kernel=9, dropout=0.1, pred_hidden=640, pred_layers=2, joint_hidden=640)


def check_joint_loss(joint_loss: str, head: str | None, model: str, joint_chunk_size: int = 0, *,
                     option: str = "--loss", model_option: str = "--model") -> None:
    """One-line ValueError naming ``option`` when ``joint_loss`` is unknown, is "fused" for a model that is not
    a transducer (head None: a model we did not write), or is "fused" beside ``--joint-chunk-size``."""
    if joint_loss not in JOINT_LOSSES:
        raise ValueError(f"{option}: expected one of {', '.join(JOINT_LOSSES)}, got {joint_loss!r}")
    if joint_loss == "fused" and head not in ("rnnt", "tdt"):
        raise ValueError(f"{option} fused: applies to the reference transducers (rnnt, tdt) only, not to "
                         f"{model_option} {model}")
    if joint_loss == "fused" and joint_chunk_size:
        raise ValueError(f"{option} fused: never builds the joint's logits, so --joint-chunk-size does not apply; "
                         "choose one")


def reference_head(name: str) -> str | None:
    """The head ("rnnt", "tdt", "ctc", "aed") of a reference model name, None for any other name."""
    try:
        return config_from_name(name).head
    except ValueError:
        return None


BUILDERS = {"tiny": tiny_config, "large": large_config, "xl": xl_config}


def config_from_name(name: str, *, vocab_size: int | None = None, joint_chunk_size: int = 0,
                     depthwise: str = DEFAULT_DEPTHWISE, time_depthwise: str = DEFAULT_TIME_DEPTHWISE,
                     joint_loss: str = DEFAULT_JOINT_LOSS) -> ModelConfig:
    """ModelConfig for "{tiny,large,xl}-{rnnt,tdt,ctc,aed}"; vocab_size overrides the builder's;
    joint_chunk_size (transducers) computes the joint and loss over chunks of that many utterances;
    depthwise, time_depthwise: what runs the subsampling's and the convolution modules' depthwise
    convolutions (see :func:`workbench.models.encoder.depthwise_backend`); joint_loss (transducers):
    "materialized" or "fused" (:mod:`workbench.models.fused_joint_loss`)."""
    size, _, head = name.partition("-")
    if size not in BUILDERS or head not in HEADS:
        raise ValueError(f"model name: expected '{{{','.join(SIZES)}}}-{{{','.join(HEADS)}}}', got {name!r}")
    builder = BUILDERS[size]
    config = builder(head) if vocab_size is None else builder(head, vocab_size=vocab_size)
    return dataclasses.replace(config, joint_chunk_size=joint_chunk_size, depthwise=depthwise,
                               time_depthwise=time_depthwise, joint_loss=joint_loss)
