"""The declarative form of the model contract: name the inputs and a loss, and get make_batch and
training_step.

    model = SchemaModel(my_module, inputs=[AudioInput(sample_rate=16000), TokenInput(vocab_size=1024)],
                        loss=lambda module, batch: my_loss(module, batch))

The worst-case batch of a bucket holds, per input, a tensor of the bucket's size (random: Gaussian audio or
features, uniform token ids) and, under ``lengths_key``, its lengths. The loss function gets the wrapped
module and that batch and returns a scalar; it turns lengths into whatever the module wants (masks,
padded labels), so the soak's shortened lengths reach the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from workbench.models.model import TRAINING_DTYPES, check_bucket_request


@dataclass(frozen=True)
class AudioInput:
    """Raw waveform [B, S] float32 at ``sample_rate`` Hz (std 0.1 noise); lengths [B] in samples."""

    key: str = "audio"
    sample_rate: int = 16000
    lengths_key: str | None = "audio_lens"

    def make(self, batch_size: int, duration_s: float, num_tokens: int, device, generator) -> dict:
        samples = max(1, round(duration_s * self.sample_rate))
        audio = torch.randn(batch_size, samples, generator=generator, device=device) * 0.1
        return _with_lengths(self.key, audio, self.lengths_key, samples)


@dataclass(frozen=True)
class FeatureInput:
    """Features at ``frame_rate`` frames per second, ``dim`` per frame: [B, T, dim], or [B, dim, T] when
    ``channels_first``; lengths [B] in frames. ``fixed_frames`` pads every batch to that many frames (a model
    with a fixed window, e.g. Whisper's 3000); ``extra_frames`` are appended past the utterance (a
    streaming encoder's right context)."""

    key: str = "features"
    dim: int = 80
    frame_rate: float = 100.0
    lengths_key: str | None = "feature_lens"
    channels_first: bool = False
    fixed_frames: int | None = None
    extra_frames: int = 0

    def make(self, batch_size: int, duration_s: float, num_tokens: int, device, generator) -> dict:
        frames = max(1, math.ceil(duration_s * self.frame_rate))
        if self.fixed_frames is not None and frames > self.fixed_frames:
            raise ValueError(f"{duration_s:g} s is {frames} frames; this model takes at most "
                             f"{self.fixed_frames} ({self.fixed_frames / self.frame_rate:g} s)")
        total = (self.fixed_frames or frames) + self.extra_frames
        shape = (batch_size, self.dim, total) if self.channels_first else (batch_size, total, self.dim)
        features = torch.randn(*shape, generator=generator, device=device)
        return _with_lengths(self.key, features, self.lengths_key, frames)


@dataclass(frozen=True)
class TokenInput:
    """Output token ids [B, U] uniform in [``low``, ``vocab_size``); lengths [B]. ``max_tokens`` is the
    longest sequence the model takes (a bucket past it is refused with one line)."""

    vocab_size: int
    key: str = "tokens"
    lengths_key: str | None = "token_lens"
    low: int = 0
    max_tokens: int | None = None

    def make(self, batch_size: int, duration_s: float, num_tokens: int, device, generator) -> dict:
        if self.max_tokens is not None and num_tokens > self.max_tokens:
            raise ValueError(f"{num_tokens} tokens: this model takes at most {self.max_tokens}")
        tokens = torch.randint(self.low, self.vocab_size, (batch_size, num_tokens), generator=generator,
                               device=device)
        return _with_lengths(self.key, tokens, self.lengths_key, num_tokens)


Input = AudioInput | FeatureInput | TokenInput


def _with_lengths(key: str, value: torch.Tensor, lengths_key: str | None, length: int) -> dict:
    out = {key: value}
    if lengths_key:
        out[lengths_key] = torch.full((value.shape[0],), length, dtype=torch.long, device=value.device)
    return out


def length_mask(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """[B] lengths -> [B, size] bool, True inside each sequence."""
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


class SchemaModel(nn.Module):
    """Wraps ``module`` so that it keeps the model contract: ``make_batch`` from ``inputs`` and
    ``training_step`` from ``loss(module, batch) -> scalar``. The wrapped module is ``self.module``; its
    parameters are this model's."""

    def __init__(self, module: nn.Module, inputs: Sequence[Input],
                 loss: Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor], *, name: str | None = None):
        super().__init__()
        keys = [k for i in inputs for k in (i.key, i.lengths_key) if k]
        if len(set(keys)) != len(keys):
            raise ValueError(f"inputs: batch keys repeat: {keys}")
        if not inputs:
            raise ValueError("inputs: name at least one input")
        self.module, self.inputs, self.loss_fn = module, tuple(inputs), loss
        self.name = name or type(module).__name__

    def make_batch(self, batch_size: int, duration_s: float, num_tokens: int, device: torch.device | str,
                   *, seed: int = 0) -> dict[str, torch.Tensor]:
        """The worst case of a bucket: every input at the bucket's size; the same seed gives the same batch."""
        check_bucket_request(batch_size, duration_s, num_tokens)
        device = torch.device(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        batch = {}
        for spec in self.inputs:
            batch.update(spec.make(batch_size, duration_s, int(num_tokens), device, generator))
        return batch

    def training_step(self, batch: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Forward and loss under bf16 autocast (or fp32), then backward; returns the detached loss."""
        if dtype not in TRAINING_DTYPES:
            raise ValueError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype}")
        self.train()
        device_type = next(iter(batch.values())).device.type
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = self.loss_fn(self.module, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(f"the loss function returned {shape}; it must be a scalar tensor (sum or mean it)")
        loss.backward()
        return loss.detach()
