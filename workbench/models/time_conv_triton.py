"""Depthwise 1D convolution over time on [B, T, C] activations (one filter of odd length K per channel,
stride 1, padding K // 2, with a bias), as Triton kernels: the conformer convolution module's depthwise
conv (:class:`workbench.models.encoder.ConvolutionModule` with ``time_depthwise="triton"``). The same sums
as ``F.conv1d(x.transpose(1, 2), weight, bias, padding=K // 2, groups=C).transpose(1, 2)``, without the
two layout copies around it and without PyTorch's own depthwise weight-gradient kernel.

Rows are the flattened (b, t) frames, channels the contiguous axis; a row's neighbour k frames later
sits k * C elements on, and taps that would cross into another utterance (or past either end) read zero.

1. ``_time_conv_kernel``, one program per tile of BLOCK_T frames by BLOCK_C channels: the K taps, each one
   coalesced [BLOCK_T, BLOCK_C] load, summed in fp32 (plus the bias). The input gradient is the same
   kernel with the filter reversed and no bias (odd K: the padding is symmetric).
2. ``_time_weight_grad_kernel``, a grid of (frame ranges, channel blocks, K + 1 taps): each program sums
   output gradient times the input under its tap over its range (the last "tap" is the bias: the
   gradient alone) into one fp32 row of a partial-sum buffer [ranges, K + 1, C]; torch sums the ranges.
   The split is fixed by the shape and the GPU's multiprocessor count, so the result repeats run to run.

Inputs fp32, bf16 or fp16; sums in fp32; output and input gradient in the input's dtype, the weight and
bias gradients in theirs. Offsets are 64-bit. On a CPU the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before this module is imported).

The kernels run inside torch custom ops (``workbench::time_depthwise_conv``, differentiable, which with its
filter reversed is also the input gradient, and ``workbench::time_depthwise_conv_weight_grad``) with fake
implementations and FLOP formulas (each the forward's count as torch counts the same convolution): a fake
trace (the OOMptimizer's plan) counts their buffers, ``torch.utils.flop_counter`` their FLOPs, and
torch.compile traces through them.
"""

from __future__ import annotations

from math import prod

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from workbench.triton_support import device_guard, reduction_split

BLOCK_T = 32              # frames per program (convolution, input gradient)
WEIGHT_GRAD_BLOCK_T = 32  # frames per step of a weight-gradient program
MAX_BLOCK_C = 64          # channels per program (fewer channels: the next power of two)
WEIGHT_GRAD_WAVES = 4     # weight-gradient programs per multiprocessor (CUDA), over all taps
CPU_RANGES = 3            # weight-gradient frame ranges on the CPU interpreter
_SHAPE_ARGS = ["T", "ROWS", "CHUNK"]  # change with every batch: one compiled kernel for all


@triton.jit
def _shifted(x_ptr, r, t, shift, T, ROWS, C, c, in_r, in_c):
    """x at frame t + shift of each row r's utterance, [BLOCK_T, BLOCK_C] fp32 (zero outside it)."""
    ts = t + shift
    inside = in_r & (ts >= 0) & (ts < T)
    return tl.load(x_ptr + ((r + shift) * C)[:, None] + c[None, :], mask=inside[:, None] & in_c[None, :],
                   other=0.0).to(tl.float32)


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _time_conv_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, T, ROWS, C, K: tl.constexpr, FLIP: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_r, in_c = r < ROWS, c < C
    t = r % T
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    for k in tl.static_range(K):
        tap = tl.load(w_ptr + c * K + ((K - 1 - k) if FLIP else k), mask=in_c, other=0.0).to(tl.float32)
        acc += _shifted(x_ptr, r, t, k - K // 2, T, ROWS, C, c, in_r, in_c) * tap[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=in_c, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + (r * C)[:, None] + c[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=in_r[:, None] & in_c[None, :])


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _time_weight_grad_kernel(x_ptr, g_ptr, partial_ptr, T, ROWS, CHUNK, C, K: tl.constexpr,
                             BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (q, cb, k): over rows [q * CHUNK, (q + 1) * CHUNK), the sum of gradient times the input under
    tap k (k == K: the gradient alone, the bias's) into partial[q, k, channels of block cb]."""
    q = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    k = tl.program_id(2)
    in_c = c < C
    shift = k - K // 2
    offs = tl.arange(0, BLOCK_T)
    acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32)
    start = q * CHUNK
    for r0 in range(0, CHUNK, BLOCK_T):
        r = start + r0 + offs
        in_r = r < ROWS
        g = tl.load(g_ptr + (r * C)[:, None] + c[None, :], mask=in_r[:, None] & in_c[None, :],
                    other=0.0).to(tl.float32)
        if k < K:
            g = g * _shifted(x_ptr, r, r % T, shift, T, ROWS, C, c, in_r, in_c)
        acc += g
    tl.store(partial_ptr + (q * (K + 1) + k) * C + c, tl.sum(acc, axis=0), mask=in_c)


def _block_c(channels: int) -> int:
    return min(triton.next_power_of_2(channels), MAX_BLOCK_C)


def _weight_grad_ranges(rows: int, programs_per_range: int, device: torch.device) -> tuple[int, int]:
    """(ranges, frames per range) of the weight-gradient grid (:func:`reduction_split`)."""
    return reduction_split(rows, WEIGHT_GRAD_BLOCK_T, programs_per_range, device, waves=WEIGHT_GRAD_WAVES,
                           cpu_ranges=CPU_RANGES)


@torch.library.custom_op("workbench::time_depthwise_conv", mutates_args=())
def time_depthwise_conv_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           flip: bool) -> torch.Tensor:
    """``_time_conv_kernel``: x [B, T, C] contiguous, weight [C, 1, K] (``flip``: its taps reversed), bias [C]
    or None -> [B, T, C] contiguous, in x's dtype."""
    batch, frames, channels = x.shape
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty_like(x)
    rows, block_c = batch * frames, _block_c(channels)
    if rows:
        with device_guard(x.device):
            _time_conv_kernel[(triton.cdiv(rows, BLOCK_T), triton.cdiv(channels, block_c))](
                x, weight, weight if bias is None else bias.contiguous(), y, frames, rows, channels,
                K=weight.shape[-1], FLIP=flip, HAS_BIAS=bias is not None, BLOCK_T=BLOCK_T, BLOCK_C=block_c)
    return y


@time_depthwise_conv_op.register_fake
def _(x, weight, bias, flip):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("workbench::time_depthwise_conv_weight_grad", mutates_args=())
def time_depthwise_conv_weight_grad(x: torch.Tensor, grad: torch.Tensor, kernel: int, chunk: int) -> torch.Tensor:
    """``_time_weight_grad_kernel``: x and the output gradient [B, T, C], both contiguous -> the partial sums
    [ranges, K + 1, C] fp32 of the K taps' and the bias's gradients over ranges of ``chunk`` frames each (a
    multiple of WEIGHT_GRAD_BLOCK_T; ranges = ceil(B x T / chunk)), for the caller to sum over ranges."""
    batch, frames, channels = grad.shape
    x, grad = x.contiguous(), grad.contiguous()
    rows, block_c = batch * frames, _block_c(channels)
    partial = torch.empty(-(-rows // chunk), kernel + 1, channels, dtype=torch.float32, device=grad.device)
    if rows:
        with device_guard(grad.device):
            _time_weight_grad_kernel[(partial.shape[0], triton.cdiv(channels, block_c), kernel + 1)](
                x, grad, partial, frames, rows, chunk, channels, K=kernel, BLOCK_T=WEIGHT_GRAD_BLOCK_T,
                BLOCK_C=block_c)
    return partial


@time_depthwise_conv_weight_grad.register_fake
def _(x, grad, kernel, chunk):
    batch, frames, channels = grad.shape
    return grad.new_empty(-(-(batch * frames) // chunk), kernel + 1, channels, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, bias, flip = inputs
    wants_x, wants_w, wants_b = ctx.needs_input_grad[:3]
    ctx.save_for_backward(x if wants_w or wants_b else None, weight if wants_x else None)
    ctx.has_bias, ctx.flip = bias is not None, flip
    ctx.weight_dtype, ctx.bias_dtype = weight.dtype, None if bias is None else bias.dtype
    ctx.kernel = weight.shape[-1]


def _backward(ctx, grad_output):
    x, weight = ctx.saved_tensors
    g = grad_output.contiguous()
    batch, frames, channels = g.shape
    kernel = ctx.kernel
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = time_depthwise_conv_op(g, weight, None, not ctx.flip)  # odd K: the padding is symmetric
    wants_w, wants_b = ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]
    if wants_w or wants_b:
        rows = batch * frames
        if rows:
            channel_blocks = triton.cdiv(channels, _block_c(channels))
            _, chunk = _weight_grad_ranges(rows, channel_blocks * (kernel + 1), g.device)
            sums = time_depthwise_conv_weight_grad(x, g, kernel, chunk).sum(0)
        else:
            sums = torch.zeros(kernel + 1, channels, dtype=torch.float32, device=g.device)
        if wants_w:
            taps = sums[:kernel].flip(0) if ctx.flip else sums[:kernel]
            grad_weight = taps.t().reshape(channels, 1, kernel).to(ctx.weight_dtype)
        if wants_b:
            grad_bias = sums[kernel].to(ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias, None


time_depthwise_conv_op.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.workbench.time_depthwise_conv)
def _conv_flops(x_shape, weight_shape, bias_shape, flip, *, out_shape) -> int:
    """As torch counts a depthwise ``F.conv1d`` (or its input gradient): 2 x K multiply-adds per output element
    (the bias not counted)."""
    return 2 * weight_shape[-1] * prod(out_shape)


@register_flop_formula(torch.ops.workbench.time_depthwise_conv_weight_grad)
def _weight_grad_flops(x_shape, grad_shape, kernel, chunk, *, out_shape) -> int:
    """The forward's count (torch's counter counts a grouped convolution's weight gradient C times over)."""
    return 2 * kernel * prod(grad_shape)


def time_depthwise_conv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, C] (fp32, bf16 or fp16), weight [C, 1, K] with K odd, bias [C] or None -> [B, T, C] in x's
    dtype: each channel convolved over time with its filter, padding K // 2 (zeros), by the Triton kernels.
    Under autocast, x is first cast to autocast's dtype (as a convolution's input is)."""
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    _check_inputs(x, weight, bias)
    return time_depthwise_conv_op(x.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(),
                                  False)


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 3:
        raise ValueError(f"x: the time depthwise convolution takes [B, T, C], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x: the Triton time depthwise convolution takes float32, bfloat16 or float16, got {x.dtype}")
    channels = x.shape[2]
    if weight.dim() != 3 or weight.shape[:2] != (channels, 1) or weight.shape[2] % 2 == 0:
        raise ValueError(f"weight: expected [{channels}, 1, K] with K odd for {channels} channels, "
                         f"got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"bias: expected [{channels}], got {tuple(bias.shape)}")
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError(f"weight and bias must be on x's device {x.device}")

