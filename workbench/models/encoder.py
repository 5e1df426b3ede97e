"""FastConformer-like encoder: log-mel -> 8x depthwise-separable conv subsampling -> conformer blocks.

Differences from NeMo's FastConformer, on purpose: absolute sinusoidal positions added after the
subsampling instead of relative-position attention (so attention runs through PyTorch's fused
scaled_dot_product_attention), and LayerNorm-free subsampling. Sizes, shapes and the memory profile
(activations per frame, the attention's T x T) are the same kind.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.config import DEFAULT_DEPTHWISE, DEFAULT_TIME_DEPTHWISE, DEPTHWISE, ModelConfig
from workbench.models.features import LogMel
from workbench.triton_support import kernel_device_type, triton_unavailable_reason


def subsampled_length(lengths, times: int = 3):
    """Frames left after `times` convolutions of kernel 3, stride 2, padding 1: ceil(L / 2) each time
    (int or long tensor)."""
    for _ in range(times):
        lengths = (lengths - 1) // 2 + 1
    return lengths


def sinusoidal_positions(num_positions: int, dim: int, device, dtype) -> torch.Tensor:
    """[num_positions, dim] sine/cosine position codes."""
    position = torch.arange(num_positions, device=device, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    codes = torch.zeros(num_positions, dim, device=device)
    codes[:, 0::2] = torch.sin(position * rate)
    codes[:, 1::2] = torch.cos(position * rate)
    return codes.to(dtype)


DEPTHWISE_KERNELS = {"subsampling": "workbench.models.depthwise_triton",  # the 3x3 stride-2 convolutions
                     "time": "workbench.models.time_conv_triton"}         # the convolution module's, over time


def depthwise_unavailable_reason(device: torch.device | str, *, which: str = "subsampling") -> str | None:
    """Why the Triton depthwise kernels of ``which`` (a key of DEPTHWISE_KERNELS) cannot run on ``device``
    (one line), or None when they can."""
    return triton_unavailable_reason(device, kernels_module=DEPTHWISE_KERNELS[which])


def depthwise_backend(depthwise: str, device: torch.device | str, *, which: str = "subsampling") -> str:
    """What runs the depthwise convolutions of ``which`` on ``device`` for the option ``depthwise``:
    "torch" or "triton" as given; "auto" takes the Triton kernels on CUDA when they can run there, else torch's
    (the subsampling's kernels against cuDNN: benchmarks/results/models_depthwise.json and
    models_cudnn_depthwise.json); a fake CPU trace inside ``kernels_as_on_cuda()`` counts as CUDA
    (:func:`workbench.triton_support.kernel_device_type`)."""
    if depthwise != "auto":
        return depthwise
    device = torch.device(device)
    return ("triton" if kernel_device_type(device) == "cuda" and depthwise_unavailable_reason(device, which=which)
            is None else "torch")


def depthwise_conv3x3_s2(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride=2, padding=1, groups=C)`` by the Triton kernels of
    :mod:`workbench.models.depthwise_triton` (channels-last output), x's rows (dim 2) at or past ``lengths``
    read as zero; a one-line ValueError when they cannot run on x's device (CUDA, or the CPU under Triton's
    interpreter)."""
    problem = depthwise_unavailable_reason(x.device)
    if problem:
        raise ValueError(f"depthwise='triton': {problem}")
    from workbench.models.depthwise_triton import depthwise_conv3x3_s2_triton

    return depthwise_conv3x3_s2_triton(x, weight, bias, lengths)


def time_depthwise_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, C], weight [C, 1, K] (K odd), bias [C] -> [B, T, C]: each channel convolved over time,
    padding K // 2, by the Triton kernels of :mod:`workbench.models.time_conv_triton`; a one-line
    ValueError when they cannot run on x's device (CUDA, or the CPU under Triton's interpreter)."""
    problem = depthwise_unavailable_reason(x.device, which="time")
    if problem:
        raise ValueError(f"time_depthwise='triton': {problem}")
    from workbench.models.time_conv_triton import time_depthwise_conv_triton

    return time_depthwise_conv_triton(x, weight, bias)


class Subsampling(nn.Module):
    """[B, frames, n_mels] -> [B, ceil(frames / 8), d_model]: one conv, then two depthwise-separable convs,
    each with stride 2 in time and frequency, then a linear over channels x remaining mel bins. Frames
    past each utterance's length count as zero after every stage (zeroed, or read as zero by the next stage's
    Triton kernels), so padding never leaks into valid frames.
    ``channels_last`` (None: on CUDA, :func:`~workbench.triton_support.kernel_device_type`): the convolutions
    run on channels-last activations, which sends the depthwise ones to cuDNN (for bf16 in the default layout
    PyTorch runs its own, much slower, kernel).
    ``depthwise``: "torch" runs the depthwise convolutions by their nn.Conv2d modules; "triton" by
    :func:`depthwise_conv3x3_s2` on the same modules' weight and bias (same parameters and state_dict);
    "auto" (the default) picks per input device (:func:`depthwise_backend`). On the Triton path a stage's
    output is not masked when the next stage's kernels read it: they read its frames past the lengths as
    zero, which saves a pass over the largest activations and keeps one copy of them instead of two."""

    def __init__(self, n_mels: int, channels: int, d_model: int, channels_last: bool | None = None,
                 depthwise: str = DEFAULT_DEPTHWISE):
        super().__init__()
        if depthwise not in DEPTHWISE:
            raise ValueError(f"depthwise: expected one of {DEPTHWISE}, got {depthwise!r}")
        self.channels_last = channels_last
        self.depthwise = depthwise
        self.stages = nn.ModuleList([
            nn.Sequential(nn.Conv2d(1, channels, 3, stride=2, padding=1), nn.ReLU()),
            nn.Sequential(nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels),
                          nn.Conv2d(channels, channels, 1), nn.ReLU()),
            nn.Sequential(nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels),
                          nn.Conv2d(channels, channels, 1), nn.ReLU()),
        ])
        self.out = nn.Linear(channels * subsampled_length(n_mels), d_model)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = features[:, None]                                  # [B, 1, T, F]
        channels_last = kernel_device_type(x.device) == "cuda" if self.channels_last is None else self.channels_last
        triton = depthwise_backend(self.depthwise, x.device) == "triton"
        masks_on_load = [self._masks_on_load(stage, triton) for stage in self.stages]
        for stage, masks, next_masks in zip(self.stages, masks_on_load, masks_on_load[1:] + [False]):
            if channels_last:   # after the first stage too: its output's layout follows its 1-channel input's
                x = x.contiguous(memory_format=torch.channels_last)
            x = self._stage(stage, x, lengths) if masks else stage(x)
            lengths = subsampled_length(lengths, times=1)
            if not next_masks:  # else the next stage's kernels read this output's frames past lengths as zero
                valid = torch.arange(x.shape[2], device=x.device)[None] < lengths[:, None]
                x = x * valid[:, None, :, None].to(x.dtype)
        x = self.out(x.permute(0, 2, 1, 3).flatten(2))         # [B, T/8, d_model]
        return x, lengths

    @staticmethod
    def _masks_on_load(stage: nn.Sequential, triton: bool) -> bool:
        """True when ``stage`` is a depthwise one run by the Triton kernels (``triton``), which read frames
        past the lengths as zero."""
        conv = stage[0]
        return triton and conv.groups == conv.out_channels

    @staticmethod
    def _stage(stage: nn.Sequential, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """A depthwise stage by the Triton kernels on x [B, C, T, F], whose frames at or past ``lengths`` [B]
        count as zero."""
        conv = stage[0]
        x = depthwise_conv3x3_s2(x, conv.weight, conv.bias, lengths)
        for layer in stage[1:]:
            x = layer(x)
        return x


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the attention's projections give for input ``x``: autocast's when it is on, else x's."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


def key_padding_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """valid [B, Tk] bool (True = attend) -> additive attention bias [B, 1, 1, Tk] in ``dtype``: 0 where
    valid, -inf elsewhere (what SDPA makes of a boolean mask, made once for every layer instead of in
    each call). Its rows are stored 8-element aligned, so the memory-efficient kernel takes it as it is
    (an unaligned mask is padded into a copy on every call), and always with spare room (never
    contiguous), so a compiled block sees one stride pattern for every length."""
    batch, length = valid.shape
    aligned = (length // 8 + 1) * 8
    bias = torch.full((batch, 1, 1, aligned), float("-inf"), dtype=dtype, device=valid.device)
    bias[..., :length].masked_fill_(valid[:, None, None, :], 0.0)
    return bias[..., :length]


class Attention(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention; key_bias [B, 1, 1, Tk] additive (from
    :func:`key_padding_bias`), or ``causal`` self-attention without a mask (SDPA's flash kernel)."""

    def __init__(self, dim: int, num_heads: int, dropout: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} does not divide width {dim}")
        self.num_heads, self.dropout = num_heads, dropout
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, *, key_bias: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
        memory = x if memory is None else memory
        batch, length, dim = x.shape
        q = self.query(x).view(batch, length, self.num_heads, -1).transpose(1, 2)
        k, v = self.key_value(memory).view(batch, memory.shape[1], 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_bias, is_causal=causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(batch, length, dim))


def feed_forward(dim: int, hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.SiLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, dim), nn.Dropout(dropout))


class ConvolutionModule(nn.Module):
    """Pointwise conv + GLU, depthwise conv over time, batch norm, SiLU, pointwise conv; padding zeroed.

    The pointwise (kernel 1) convs keep their Conv1d parameters but run as matmuls over [B, T, C]
    (F.linear on the squeezed weight: the same sums, without a convolution kernel or layout copies).
    ``time_depthwise``: "torch" runs the depthwise conv by its nn.Conv1d on [B, C, T]; "triton" by
    :func:`time_depthwise_conv` on [B, T, C] with the same weight and bias (no layout copies; the batch
    norm over the B * T frames, the same statistics); "auto" picks per input device."""

    def __init__(self, dim: int, kernel: int, dropout: float, time_depthwise: str = DEFAULT_TIME_DEPTHWISE):
        super().__init__()
        if time_depthwise not in DEPTHWISE:
            raise ValueError(f"time_depthwise: expected one of {DEPTHWISE}, got {time_depthwise!r}")
        self.time_depthwise = time_depthwise
        self.time_conv = time_depthwise_conv  # the triton path's function (compile_encoder_layers keeps it eager)
        self.norm = nn.LayerNorm(dim)
        self.pointwise_in = nn.Conv1d(dim, 2 * dim, 1)
        self.depthwise = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.batch_norm = nn.BatchNorm1d(dim)
        self.pointwise_out = nn.Conv1d(dim, dim, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        y = F.glu(F.linear(self.norm(x), self.pointwise_in.weight[..., 0], self.pointwise_in.bias), dim=-1)
        y = y * valid[..., None]                                            # [B, T, D]
        if depthwise_backend(self.time_depthwise, y.device, which="time") == "torch":
            y = F.silu(self.batch_norm(self.depthwise(y.transpose(1, 2)))).transpose(1, 2)
        else:
            y = self.time_conv(y, self.depthwise.weight, self.depthwise.bias)
            y = F.silu(self.batch_norm(y.flatten(0, 1))).view_as(y)
        return self.dropout(F.linear(y, self.pointwise_out.weight[..., 0], self.pointwise_out.bias))


class ConformerBlock(nn.Module):
    """Half feed-forward, self-attention, convolution module, half feed-forward, final norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        dim = config.d_model
        self.ff1 = feed_forward(dim, config.ff_mult * dim, config.dropout)
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = Attention(dim, config.num_heads, config.dropout)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.conv = ConvolutionModule(dim, config.conv_kernel, config.dropout, config.time_depthwise)
        self.ff2 = feed_forward(dim, config.ff_mult * dim, config.dropout)
        self.out_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, valid: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, D], valid [B, T] bool, key_bias [B, 1, 1, T] (:func:`key_padding_bias` of valid)."""
        x = torch.add(x, self.ff1(x), alpha=0.5)  # x + 0.5 * ff(x) in one pass (the halving is exact)
        x = x + self.attn_dropout(self.attn(self.attn_norm(x), key_bias=key_bias))
        x = x + self.conv(x, valid)
        x = torch.add(x, self.ff2(x), alpha=0.5)
        return self.out_norm(x)


class Encoder(nn.Module):
    """audio [B, S] 16 kHz, audio_lens [B] samples -> (enc [B, T, d_model], enc_lens [B]), T = ceil(frames/8)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.features = LogMel(sample_rate=config.sample_rate, n_fft=config.n_fft, win_length=config.win_length,
                               hop_length=config.hop_length, n_mels=config.n_mels)
        self.subsampling = Subsampling(config.n_mels, config.subsampling_channels, config.d_model,
                                       depthwise=config.depthwise)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_layers))

    def forward(self, audio: torch.Tensor, audio_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features, frames = self.features(audio, audio_lens)
        x, lengths = self.subsampling(features, frames)
        x = self.dropout(x + sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype))
        valid = torch.arange(x.shape[1], device=x.device)[None] < lengths[:, None]
        key_bias = key_padding_bias(valid, attention_dtype(x))
        for block in self.blocks:
            x = block(x, valid, key_bias)
        return x, lengths
