"""Log-mel features computed on the model's device from 16 kHz audio (always fp32, even under autocast)."""

from __future__ import annotations

import math

import torch
from torch import nn


def mel_filterbank(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters on the HTK mel scale from 0 Hz to Nyquist."""
    def to_mel(hz):
        return 2595.0 * math.log10(1.0 + hz / 700.0)

    mel_points = torch.linspace(0.0, to_mel(sample_rate / 2), n_mels + 2, dtype=torch.float64)
    hz_points = 700.0 * (10.0 ** (mel_points / 2595.0) - 1.0)
    fft_hz = torch.linspace(0.0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    lower, center, upper = hz_points[:-2, None], hz_points[1:-1, None], hz_points[2:, None]
    rising = (fft_hz[None] - lower) / (center - lower)
    falling = (upper - fft_hz[None]) / (upper - center)
    return torch.clamp(torch.minimum(rising, falling), min=0.0).float()


class LogMel(nn.Module):
    """audio [B, S] float at sample_rate, lengths [B] in samples -> features [B, frames, n_mels], frames [B].

    Frames are centred (frame i covers samples around i * hop_length), so a clip of S samples has
    S // hop_length + 1 frames (zero padding at the edges, so batch padding changes nothing). Each feature is normalized to zero mean, unit variance over the valid
    frames of its utterance; padded frames are zero.
    """

    def __init__(self, *, sample_rate: int, n_fft: int, win_length: int, hop_length: int, n_mels: int):
        super().__init__()
        self.n_fft, self.win_length, self.hop_length = n_fft, win_length, hop_length
        self.register_buffer("window", torch.hann_window(win_length), persistent=False)
        self.register_buffer("filters", mel_filterbank(n_fft, n_mels, sample_rate), persistent=False)

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=audio.device.type, enabled=False):
            spec = torch.stft(audio.float(), self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                              window=self.window, center=True, pad_mode="constant", return_complex=True)
            power = spec.real.square() + spec.imag.square()          # [B, freq, frames]
            mel = torch.matmul(self.filters, power).clamp_min(2.0 ** -24).log().transpose(1, 2)
            frames = lengths // self.hop_length + 1
            valid = (torch.arange(mel.shape[1], device=mel.device)[None] < frames[:, None])[..., None]
            count = frames.clamp_min(1)[:, None, None].float()
            mean = (mel * valid).sum(1, keepdim=True) / count
            var = ((mel - mean).square() * valid).sum(1, keepdim=True) / count
            normalized = (mel - mean) / (var.sqrt() + 1e-5)
            return normalized * valid, frames
