"""Depthwise 2D convolution, kernel 3x3, stride 2, padding 1 (one filter per channel, with a bias), as
Triton kernels: the subsampling's depthwise stages (:class:`workbench.models.encoder.Subsampling`) with
``depthwise="triton"``. The same sums as ``F.conv2d(x, weight, bias, stride=2, padding=1, groups=C)``.

The kernels work on channels-last activations ([B, H, W, C] in memory, channels the contiguous axis): a
channels-last input is read in place, any other layout is copied to it once, and the output is
channels-last. Every program holds a tile of BLOCK_P pixels by BLOCK_C channels, so each pixel's channels
are one coalesced load. Output size H_out = (H - 1) // 2 + 1 (= ceil(H / 2)), likewise W_out.

1. ``_forward_kernel``, one program per tile of output pixels: the 9 taps, each one [BLOCK_P, BLOCK_C]
   load of the input (zero outside it), times that tap's weights, summed in fp32, plus the bias.
2. ``_input_grad_kernel``, one program per tile of output positions (b, i, j): the input gradient of the
   2x2 input pixels (2i..2i+1, 2j..2j+1) it owns, from the output gradient at (i, j), (i + 1, j),
   (i, j + 1) and (i + 1, j + 1) (the only outputs whose windows cover them): every input pixel is
   written once, without atomics.
3. ``_weight_grad_kernel``, a grid of (pixel ranges, channel blocks): each program sums output gradient
   times input over its range of output pixels for the 9 taps and the bias into one fp32 row of a
   partial-sum buffer [ranges, 10, C]; the ranges' rows are then summed by torch. The split is fixed by
   the shape and the GPU's multiprocessor count, so the result is the same from run to run on one GPU
   model.

With ``lengths`` [B] (valid rows along H per batch item, e.g. the frames of each utterance), every
kernel reads input rows h >= lengths[b] as zero and writes zero input gradient there: the convolution of
the input masked past its lengths, without a masked copy of it (the subsampling then needs no mask
pass over its largest activations, and keeps one of them in memory instead of two).

Inputs fp32, bf16 or fp16; sums in fp32; the output and the input gradient in the input's dtype, the
weight and bias gradients in the weight's and the bias's. Every offset is 64-bit, so any size that fits in
memory works. On a CPU the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before
this module is imported).

Each kernel runs inside a torch custom op (``workbench::depthwise_conv3x3_s2``, differentiable, and its
``_input_grad`` and ``_weight_grad``) with a fake implementation and a FLOP formula (each the forward's
count as torch counts the same convolution): a fake trace (the OOMptimizer's plan) counts their buffers,
``torch.utils.flop_counter`` their FLOPs, and torch.compile traces through them. The layout copy to channels-last and the sum over the
weight gradient's ranges run as torch ops around them, so a trace sees those buffers too.
"""

from __future__ import annotations

from math import prod

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from workbench.triton_support import device_guard, reduction_split

BLOCK_P = 32           # output pixels per program (forward, input gradient)
WEIGHT_GRAD_BLOCK_P = 16  # output pixels per step of a weight-gradient program (10 fp32 tiles of it held)
MAX_BLOCK_C = 64       # channels per program (fewer channels: the next power of two)
WEIGHT_GRAD_WAVES = 8  # weight-gradient programs per multiprocessor (CUDA); their pixel ranges split the batch
CPU_RANGES = 4         # weight-gradient pixel ranges on the CPU interpreter
_SHAPE_ARGS = ["H", "W", "HO", "WO", "P", "CHUNK"]  # change with every batch: one compiled kernel for all


@triton.jit
def _pixel_coords(p, HO, WO):
    """(b, i, j) of flat output-pixel indices p (int64) over [B, HO, WO]."""
    b = p // (HO * WO)
    rem = p % (HO * WO)
    return b, rem // WO, rem % WO


@triton.jit
def _pixel_offsets(b, h, w, H, W, C):
    """Offset of pixel (b, h, w) of a [B, H, W, C] buffer, as a [BLOCK_P, 1] column (int64)."""
    return (((b * H + h) * W + w) * C)[:, None]


@triton.jit
def _row_limit(len_ptr, b, in_p, H, HAS_LENGTHS: tl.constexpr):
    """Valid input rows of each pixel's batch item: lengths[b] (clamped to H), or H without lengths."""
    limit = b * 0 + H  # [BLOCK_P] int64
    if HAS_LENGTHS:
        limit = tl.minimum(tl.load(len_ptr + b, mask=in_p, other=0), limit)
    return limit


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _forward_kernel(x_ptr, w_ptr, bias_ptr, len_ptr, y_ptr, H, W, HO, WO, P, C,
                    HAS_BIAS: tl.constexpr, HAS_LENGTHS: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_p, in_c = p < P, c < C
    b, i, j = _pixel_coords(p, HO, WO)
    limit = _row_limit(len_ptr, b, in_p, H, HAS_LENGTHS)
    acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    for kh in tl.static_range(3):
        h = 2 * i - 1 + kh
        for kw in tl.static_range(3):
            w = 2 * j - 1 + kw
            inside = in_p & (h >= 0) & (h < limit) & (w >= 0) & (w < W)
            x = tl.load(x_ptr + _pixel_offsets(b, h, w, H, W, C) + c[None, :],
                        mask=inside[:, None] & in_c[None, :], other=0.0).to(tl.float32)
            tap = tl.load(w_ptr + c * 9 + (kh * 3 + kw), mask=in_c, other=0.0).to(tl.float32)
            acc += x * tap[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=in_c, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + _pixel_offsets(b, i, j, HO, WO, C) + c[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=in_p[:, None] & in_c[None, :])


@triton.jit
def _load_grad(g_ptr, b, i, j, HO, WO, C, c, in_p, in_c):
    """Output gradient at (b, i, j) [BLOCK_P, BLOCK_C] in fp32, zero past the output's edge."""
    inside = in_p & (i < HO) & (j < WO)
    return tl.load(g_ptr + _pixel_offsets(b, i, j, HO, WO, C) + c[None, :],
                   mask=inside[:, None] & in_c[None, :], other=0.0).to(tl.float32)


@triton.jit
def _tap(w_ptr, c, in_c, kh: tl.constexpr, kw: tl.constexpr):
    """Weight of tap (kh, kw) of every channel c, as a [1, BLOCK_C] fp32 row."""
    return tl.load(w_ptr + c * 9 + (kh * 3 + kw), mask=in_c, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _store_input_grad(gx_ptr, value, b, h, w, H, W, C, c, in_p, in_c, limit):
    """Store the input gradient of pixels (b, h, w); zero on rows h >= limit (read as zero forward)."""
    inside = in_p & (h < H) & (w < W)
    value = tl.where((h < limit)[:, None], value, 0.0)
    tl.store(gx_ptr + _pixel_offsets(b, h, w, H, W, C) + c[None, :], value.to(gx_ptr.dtype.element_ty),
             mask=inside[:, None] & in_c[None, :])


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _input_grad_kernel(g_ptr, w_ptr, len_ptr, gx_ptr, H, W, HO, WO, P, C, HAS_LENGTHS: tl.constexpr,
                       BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Input pixel h = 2i - 1 + kh is covered by output row i with tap kh: an even h only by i = h / 2
    (kh = 1), an odd h by i = (h - 1) / 2 (kh = 2) and i + 1 (kh = 0); columns likewise."""
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_p, in_c = p < P, c < C
    b, i, j = _pixel_coords(p, HO, WO)
    limit = _row_limit(len_ptr, b, in_p, H, HAS_LENGTHS)
    g00 = _load_grad(g_ptr, b, i, j, HO, WO, C, c, in_p, in_c)
    g01 = _load_grad(g_ptr, b, i, j + 1, HO, WO, C, c, in_p, in_c)
    g10 = _load_grad(g_ptr, b, i + 1, j, HO, WO, C, c, in_p, in_c)
    g11 = _load_grad(g_ptr, b, i + 1, j + 1, HO, WO, C, c, in_p, in_c)
    h, w = 2 * i, 2 * j
    _store_input_grad(gx_ptr, g00 * _tap(w_ptr, c, in_c, 1, 1), b, h, w, H, W, C, c, in_p, in_c, limit)
    _store_input_grad(gx_ptr, g00 * _tap(w_ptr, c, in_c, 1, 2) + g01 * _tap(w_ptr, c, in_c, 1, 0),
                      b, h, w + 1, H, W, C, c, in_p, in_c, limit)
    _store_input_grad(gx_ptr, g00 * _tap(w_ptr, c, in_c, 2, 1) + g10 * _tap(w_ptr, c, in_c, 0, 1),
                      b, h + 1, w, H, W, C, c, in_p, in_c, limit)
    _store_input_grad(gx_ptr, g00 * _tap(w_ptr, c, in_c, 2, 2) + g01 * _tap(w_ptr, c, in_c, 2, 0)
                      + g10 * _tap(w_ptr, c, in_c, 0, 2) + g11 * _tap(w_ptr, c, in_c, 0, 0),
                      b, h + 1, w + 1, H, W, C, c, in_p, in_c, limit)


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _weight_grad_kernel(x_ptr, g_ptr, len_ptr, partial_ptr, H, W, HO, WO, P, CHUNK, C,
                        HAS_LENGTHS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (r, cb): over output pixels [r * CHUNK, (r + 1) * CHUNK), the sums of gradient times input
    of each tap, and of the gradient (the bias), into partial[r, 0..9, channels of block cb]."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = c < C
    offs = tl.arange(0, BLOCK_P)
    s0 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)  # one tile per tap and the bias, reduced over pixels at the end
    s1 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s2 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s3 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s4 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s5 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s6 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s7 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    s8 = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    sb = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    start = r * CHUNK
    for p0 in range(0, CHUNK, BLOCK_P):
        p = start + p0 + offs
        in_p = p < P
        b, i, j = _pixel_coords(p, HO, WO)
        limit = _row_limit(len_ptr, b, in_p, H, HAS_LENGTHS)
        g = _load_grad(g_ptr, b, i, j, HO, WO, C, c, in_p, in_c)
        sb += g
        s0 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 0, 0)
        s1 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 0, 1)
        s2 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 0, 2)
        s3 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 1, 0)
        s4 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 1, 1)
        s5 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 1, 2)
        s6 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 2, 0)
        s7 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 2, 1)
        s8 += g * _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, 2, 2)
    row = partial_ptr + r * 10 * C + c
    tl.store(row, tl.sum(s0, axis=0), mask=in_c)
    tl.store(row + C, tl.sum(s1, axis=0), mask=in_c)
    tl.store(row + 2 * C, tl.sum(s2, axis=0), mask=in_c)
    tl.store(row + 3 * C, tl.sum(s3, axis=0), mask=in_c)
    tl.store(row + 4 * C, tl.sum(s4, axis=0), mask=in_c)
    tl.store(row + 5 * C, tl.sum(s5, axis=0), mask=in_c)
    tl.store(row + 6 * C, tl.sum(s6, axis=0), mask=in_c)
    tl.store(row + 7 * C, tl.sum(s7, axis=0), mask=in_c)
    tl.store(row + 8 * C, tl.sum(s8, axis=0), mask=in_c)
    tl.store(row + 9 * C, tl.sum(sb, axis=0), mask=in_c)


@triton.jit
def _load_tap_input(x_ptr, b, i, j, H, limit, W, C, c, in_p, in_c, kh: tl.constexpr, kw: tl.constexpr):
    """The input under tap (kh, kw) of output pixels (b, i, j), [BLOCK_P, BLOCK_C] fp32 (zero in the padding
    and on rows h >= limit)."""
    h = 2 * i - 1 + kh
    w = 2 * j - 1 + kw
    inside = in_p & (h >= 0) & (h < limit) & (w >= 0) & (w < W)
    return tl.load(x_ptr + _pixel_offsets(b, h, w, H, W, C) + c[None, :],
                   mask=inside[:, None] & in_c[None, :], other=0.0).to(tl.float32)


def output_size(size: int) -> int:
    """Output length of a kernel-3, stride-2, padding-1 convolution over ``size`` (torch's)."""
    return (size + 2 - 3) // 2 + 1


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] (any strides) -> a contiguous [B, H, W, C] tensor: a view when x is channels-last."""
    return x.permute(0, 2, 3, 1).contiguous()


def _block_c(channels: int) -> int:
    return min(triton.next_power_of_2(channels), MAX_BLOCK_C)


def _weight_grad_ranges(pixels: int, channel_blocks: int, device: torch.device) -> tuple[int, int]:
    """(ranges, pixels per range) of the weight-gradient grid (:func:`reduction_split`)."""
    return reduction_split(pixels, WEIGHT_GRAD_BLOCK_P, channel_blocks, device, waves=WEIGHT_GRAD_WAVES,
                           cpu_ranges=CPU_RANGES)


@torch.library.custom_op("workbench::depthwise_conv3x3_s2", mutates_args=())
def depthwise_conv3x3_s2_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                            lengths: torch.Tensor | None) -> torch.Tensor:
    """``_forward_kernel``: x [B, H, W, C] contiguous (channels-last activations), weight [C, 1, 3, 3], bias [C]
    or None, lengths [B] int64 or None -> y [B, H_out, W_out, C] contiguous, in x's dtype."""
    batch, height, width, channels = x.shape
    out_h, out_w = output_size(height), output_size(width)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(batch, out_h, out_w, channels, dtype=x.dtype, device=x.device)
    pixels = batch * out_h * out_w
    block_c = _block_c(channels)
    if pixels:
        with device_guard(x.device):
            _forward_kernel[(triton.cdiv(pixels, BLOCK_P), triton.cdiv(channels, block_c))](
                x, weight, weight if bias is None else bias.contiguous(), _lengths_arg(lengths, weight), y,
                height, width, out_h, out_w, pixels, channels, HAS_BIAS=bias is not None,
                HAS_LENGTHS=lengths is not None, BLOCK_P=BLOCK_P, BLOCK_C=block_c)
    return y


@depthwise_conv3x3_s2_op.register_fake
def _(x, weight, bias, lengths):
    batch, height, width, channels = x.shape
    return x.new_empty(batch, output_size(height), output_size(width), channels)


@torch.library.custom_op("workbench::depthwise_conv3x3_s2_input_grad", mutates_args=())
def depthwise_conv3x3_s2_input_grad(grad: torch.Tensor, weight: torch.Tensor, lengths: torch.Tensor | None,
                                    height: int, width: int) -> torch.Tensor:
    """``_input_grad_kernel``: the output gradient [B, H_out, W_out, C] contiguous -> the input gradient
    [B, height, width, C] contiguous, in the output gradient's dtype (zero on rows past ``lengths``)."""
    batch, out_h, out_w, channels = grad.shape
    grad, weight = grad.contiguous(), weight.contiguous()
    grad_x = torch.empty(batch, height, width, channels, dtype=grad.dtype, device=grad.device)
    pixels = batch * out_h * out_w
    block_c = _block_c(channels)
    if pixels:
        with device_guard(grad.device):
            _input_grad_kernel[(triton.cdiv(pixels, BLOCK_P), triton.cdiv(channels, block_c))](
                grad, weight, _lengths_arg(lengths, weight), grad_x, height, width, out_h, out_w, pixels,
                channels, HAS_LENGTHS=lengths is not None, BLOCK_P=BLOCK_P, BLOCK_C=block_c)
    return grad_x


@depthwise_conv3x3_s2_input_grad.register_fake
def _(grad, weight, lengths, height, width):
    return grad.new_empty(grad.shape[0], height, width, grad.shape[3])


@torch.library.custom_op("workbench::depthwise_conv3x3_s2_weight_grad", mutates_args=())
def depthwise_conv3x3_s2_weight_grad(x: torch.Tensor, grad: torch.Tensor, lengths: torch.Tensor | None,
                                     chunk: int) -> torch.Tensor:
    """``_weight_grad_kernel``: x [B, H, W, C] and the output gradient [B, H_out, W_out, C], both contiguous
    -> the partial sums [ranges, 10, C] fp32 of the 9 taps' and the bias's gradients over ranges of ``chunk``
    output pixels each (a multiple of WEIGHT_GRAD_BLOCK_P; ranges = ceil(pixels / chunk)), for the caller to
    sum over ranges."""
    batch, height, width, channels = x.shape
    out_h, out_w = grad.shape[1:3]
    x, grad = x.contiguous(), grad.contiguous()
    pixels = batch * out_h * out_w
    block_c = _block_c(channels)
    partial = torch.empty(-(-pixels // chunk), 10, channels, dtype=torch.float32, device=x.device)
    if pixels:
        with device_guard(x.device):
            _weight_grad_kernel[(partial.shape[0], triton.cdiv(channels, block_c))](
                x, grad, _lengths_arg(lengths, grad), partial, height, width, out_h, out_w, pixels, chunk,
                channels, HAS_LENGTHS=lengths is not None, BLOCK_P=WEIGHT_GRAD_BLOCK_P, BLOCK_C=block_c)
    return partial


@depthwise_conv3x3_s2_weight_grad.register_fake
def _(x, grad, lengths, chunk):
    pixels = grad.shape[0] * grad.shape[1] * grad.shape[2]
    return x.new_empty(-(-pixels // chunk), 10, x.shape[3], dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    x, weight, bias, lengths = inputs
    wants_x, wants_w, wants_b = ctx.needs_input_grad[:3]
    ctx.save_for_backward(x if wants_w or wants_b else None, weight if wants_x else None, lengths)
    ctx.shape = tuple(x.shape)
    ctx.has_bias = bias is not None
    ctx.weight_dtype, ctx.bias_dtype = weight.dtype, None if bias is None else bias.dtype


def _backward(ctx, grad_output):
    x, weight, lengths = ctx.saved_tensors
    batch, height, width, channels = ctx.shape
    g = grad_output.contiguous()
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = depthwise_conv3x3_s2_input_grad(g, weight, lengths, height, width)
    if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
        pixels = g.shape[0] * g.shape[1] * g.shape[2]
        if pixels:
            _, chunk = _weight_grad_ranges(pixels, triton.cdiv(channels, _block_c(channels)), g.device)
            sums = depthwise_conv3x3_s2_weight_grad(x, g, lengths, chunk).sum(0)
        else:
            sums = torch.zeros(10, channels, dtype=torch.float32, device=g.device)
        if ctx.needs_input_grad[1]:
            grad_weight = sums[:9].t().reshape(channels, 1, 3, 3).to(ctx.weight_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = sums[9].to(ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias, None


depthwise_conv3x3_s2_op.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.workbench.depthwise_conv3x3_s2)
def _forward_flops(x_shape, weight_shape, bias_shape, lengths_shape, *, out_shape) -> int:
    """As torch counts a depthwise ``F.conv2d``: 2 x 9 multiply-adds per output element (the bias not counted)."""
    return 2 * 9 * prod(out_shape)


@register_flop_formula(torch.ops.workbench.depthwise_conv3x3_s2_input_grad)
def _input_grad_flops(grad_shape, weight_shape, lengths_shape, height, width, *, out_shape) -> int:
    """As torch counts a convolution's input gradient: the forward's count."""
    return 2 * 9 * prod(grad_shape)


@register_flop_formula(torch.ops.workbench.depthwise_conv3x3_s2_weight_grad)
def _weight_grad_flops(x_shape, grad_shape, lengths_shape, chunk, *, out_shape) -> int:
    """The forward's count (torch's counter counts a grouped convolution's weight gradient C times over)."""
    return 2 * 9 * prod(grad_shape)


def _lengths_arg(lengths: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The kernels' lengths pointer: the lengths, or any tensor of the device when there are none (unread)."""
    return placeholder if lengths is None else lengths


def depthwise_conv3x3_s2_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``F.conv2d(x, weight, bias, stride=2, padding=1, groups=C)`` by the Triton kernels: x [B, C, H, W]
    fp32, bf16 or fp16 in any layout, weight [C, 1, 3, 3], bias [C] or None -> [B, C, ceil(H / 2), ceil(W / 2)]
    channels-last in x's dtype. ``lengths`` [B] (integers, on x's device): rows h >= lengths[b] of x are read
    as zero (the result is the convolution of x masked there, and their gradient is zero). Under autocast, x
    is first cast to autocast's dtype (as a convolution's input is)."""
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    _check_inputs(x, weight, bias, lengths)
    if lengths is not None:
        lengths = lengths.to(torch.int64).contiguous()
    y = depthwise_conv3x3_s2_op(_channels_last(x), weight.contiguous(), None if bias is None else bias.contiguous(),
                                lengths)
    return y.permute(0, 3, 1, 2)  # [B, C, H_out, W_out], channels-last


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  lengths: torch.Tensor | None = None) -> None:
    if x.dim() != 4:
        raise ValueError(f"x: the depthwise convolution takes [B, C, H, W], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x: the Triton depthwise convolution takes float32, bfloat16 or float16, got {x.dtype}")
    channels = x.shape[1]
    if tuple(weight.shape) != (channels, 1, 3, 3):
        raise ValueError(f"weight: expected [{channels}, 1, 3, 3] for {channels} channels, got {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (channels,):
        raise ValueError(f"bias: expected [{channels}], got {tuple(bias.shape)}")
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        raise ValueError(f"weight and bias must be on x's device {x.device}")
    if lengths is not None:
        if tuple(lengths.shape) != (x.shape[0],) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
            raise ValueError(f"lengths: expected [{x.shape[0]}] integers (valid rows per batch item), got "
                             f"{lengths.dtype} of shape {tuple(lengths.shape)}")
        if lengths.device != x.device:
            raise ValueError(f"lengths must be on x's device {x.device}, got {lengths.device}")
