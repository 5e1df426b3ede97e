"""The fused joint + loss's per-node passes as Triton kernels (:mod:`fused_joint_loss` runs them on CUDA).

A node (b, t, u)'s joint output is z = W relu(enc_t + pred_u) + bias. The loss goes over the lattice tile by
tile (some utterances x some frames x all U + 1 label positions); each tile's logits [nodes, C_pad] come from
one cuBLAS GEMM on its hidden activations, in the joint's dtype, exactly as the materialized path makes
them, and exist only while that tile is processed. Both kernels read them a [BLOCK_M, BLOCK_N] block at a
time, in fp32:

1. ``_logits_stats_kernel`` (forward): per node, an online log-sum-exp over the token columns, the blank
   logit, the next label's logit, and the columns after the tokens (TDT's duration logits) as they are;
   O(B x T x U) fp32 values in all.
2. ``_logits_grad_kernel`` (backward, the tile's logits made again): overwrites them in place with
   d loss / d z = softmax x g_lse + onehot(blank) x g_blank + onehot(y_{u+1}) x g_label (+ g_rest after the
   tokens), in the joint's dtype, for the two GEMMs that follow.

Each is one read (and the second one write) of the tile. Every offset is 64-bit. Both run inside torch
custom ops (``workbench::fused_joint_logits_stats``, ``workbench::fused_joint_logits_grad``) that write into
the tensors they are given, so a fake trace (the OOMptimizer's plan) sees only the buffers the caller makes.
On a CPU the kernels run only under Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.triton_support import device_guard

_SHAPE_ARGS = ["NODES", "START", "T", "U1", "U"]  # change with every batch: one compiled kernel for all values


@triton.jit
def _node_coords(rows, T, U1):
    """(b, t, u) of node indices ``rows`` (int64) of the [B, T, U + 1] lattice."""
    u = rows % U1
    bt = rows // U1
    return bt // T, bt % T, u


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _logits_stats_kernel(z_ptr, targets_ptr, lse_ptr, blank_ptr, label_ptr, rest_ptr, START, NODES, T, U1, U, C,
                         C_PAD, NUM_TOKENS, BLANK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    local = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = local < NODES
    rows = START + local
    b, t, u = _node_coords(rows, T, U1)
    has_label = row_ok & (u < U)
    target = tl.load(targets_ptr + b * U + u, mask=has_label, other=-1)
    running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    blank_logit = tl.zeros((BLOCK_M,), dtype=tl.float32)
    label_logit = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for n0 in range(0, NUM_TOKENS, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < NUM_TOKENS
        z = tl.load(z_ptr + local[:, None] * C_PAD + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        blank_logit += tl.sum(tl.where(cols[None, :] == BLANK, z, 0.0), axis=1)
        label_logit += tl.sum(tl.where(cols[None, :] == target[:, None], z, 0.0), axis=1)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(z, axis=1))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max[:, None]), axis=1)
        running_max = new_max
    tl.store(lse_ptr + rows, running_max + tl.log(running_sum), mask=row_ok)
    tl.store(blank_ptr + rows, blank_logit, mask=row_ok)
    tl.store(label_ptr + (b * T + t) * U + u, label_logit, mask=has_label)
    num_rest = C - NUM_TOKENS
    for n0 in range(NUM_TOKENS, C, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < C
        z = tl.load(z_ptr + local[:, None] * C_PAD + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        tl.store(rest_ptr + rows[:, None] * num_rest + (cols - NUM_TOKENS)[None, :], z,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _logits_grad_kernel(z_ptr, targets_ptr, lse_ptr, g_lse_ptr, g_blank_ptr, g_label_ptr, g_rest_ptr, START, NODES,
                        T, U1, U, C, C_PAD, NUM_TOKENS, BLANK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    local = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = local < NODES
    rows = START + local
    b, t, u = _node_coords(rows, T, U1)
    has_label = row_ok & (u < U)
    target = tl.load(targets_ptr + b * U + u, mask=has_label, other=-1)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    g_lse = tl.load(g_lse_ptr + rows, mask=row_ok, other=0.0)
    g_blank = tl.load(g_blank_ptr + rows, mask=row_ok, other=0.0)
    g_label = tl.load(g_label_ptr + (b * T + t) * U + u, mask=has_label, other=0.0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < C
    at = local[:, None] * C_PAD + cols[None, :]
    in_tile = row_ok[:, None] & (cols[None, :] < C_PAD)
    z = tl.load(z_ptr + at, mask=in_tile, other=0.0).to(tl.float32)
    is_token = cols[None, :] < NUM_TOKENS
    dz = tl.where(is_token, tl.exp(z - lse[:, None]) * g_lse[:, None], 0.0)
    dz += tl.where(cols[None, :] == BLANK, g_blank[:, None], 0.0)
    dz += tl.where(cols[None, :] == target[:, None], g_label[:, None], 0.0)
    is_rest = (cols[None, :] >= NUM_TOKENS) & col_ok[None, :]
    num_rest = C - NUM_TOKENS
    rest = tl.load(g_rest_ptr + rows[:, None] * num_rest + (cols - NUM_TOKENS)[None, :],
                   mask=row_ok[:, None] & is_rest, other=0.0)
    dz = tl.where(is_rest, rest, dz)
    tl.store(z_ptr + at, dz.to(z_ptr.dtype.element_ty), mask=in_tile)


# (BLOCK_M, BLOCK_N, warps) of both kernels, which read a tile's logits row by row: on CUDA, and under the
# interpreter
_BLOCKS = {"cuda": (16, 256, 4), "cpu": (8, 32, 4)}


def _blocks(x: torch.Tensor) -> tuple[int, int, int]:
    return _BLOCKS["cuda" if x.device.type == "cuda" else "cpu"]


def _check_rows(logits: torch.Tensor) -> None:
    """The kernels address row r of the logits at r x padded_width: they must be contiguous."""
    if not logits.is_contiguous():
        raise ValueError(f"logits: expected a contiguous [nodes, padded_width] tensor, got strides {logits.stride()}")


@torch.library.custom_op("workbench::fused_joint_logits_stats",
                         mutates_args=("lse", "blank_logit", "label_logit", "rest"))
def fused_joint_logits_stats(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                             blank_logit: torch.Tensor, label_logit: torch.Tensor, rest: torch.Tensor, blank: int,
                             num_tokens: int, start: int) -> None:
    """Fill the node statistics of one tile's nodes (``start`` .. ``start + num_nodes``, flat indices of
    [B, T, U + 1]) from its ``logits`` [num_nodes, padded_width] (the joint's dtype): lse [B, T, U + 1] of the
    first ``num_tokens`` logits, the blank logit [B, T, U + 1], the next label's logit [B, T, U] and the
    logits after the tokens [B, T, U + 1, C - num_tokens], all fp32; targets [B, U] int64 in range."""
    num_nodes, padded_width = logits.shape
    _check_rows(logits)
    if num_nodes == 0:
        return
    _, num_frames, num_cols = lse.shape
    block_m, block_n, warps = _blocks(logits)
    with device_guard(logits.device):
        _logits_stats_kernel[(triton.cdiv(num_nodes, block_m),)](
            logits, targets, lse, blank_logit, label_logit, rest, start, num_nodes, num_frames, num_cols,
            num_cols - 1, num_tokens + rest.shape[-1], padded_width, num_tokens, blank, BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps)


@fused_joint_logits_stats.register_fake
def _(logits, targets, lse, blank_logit, label_logit, rest, blank, num_tokens, start):
    return None


@torch.library.custom_op("workbench::fused_joint_logits_grad", mutates_args=("logits",))
def fused_joint_logits_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g_lse: torch.Tensor,
                            g_blank: torch.Tensor, g_label: torch.Tensor, g_rest: torch.Tensor, blank: int,
                            num_tokens: int, start: int) -> None:
    """Overwrite ``logits`` [num_nodes, padded_width] (one tile's: nodes ``start`` .. ``start + num_nodes``,
    flat indices of [B, T, U + 1], in the joint's dtype, 0 from column C on) with d loss / d logits. The fp32
    gradients g_* have the shapes of :func:`fused_joint_logits_stats`'s outputs, lse is its first; targets
    [B, U] int64 in range."""
    num_nodes, padded_width = logits.shape
    _check_rows(logits)
    if num_nodes == 0:
        return
    batch, num_frames, num_cols = lse.shape
    num_outputs = num_tokens + g_rest.shape[-1]
    block_m, block_n, warps = _blocks(logits)
    grid = (triton.cdiv(num_nodes, block_m), triton.cdiv(padded_width, block_n))
    with device_guard(logits.device):
        _logits_grad_kernel[grid](logits, targets, lse, g_lse, g_blank, g_label, g_rest, start, num_nodes,
                                  num_frames, num_cols, num_cols - 1, num_outputs, padded_width, num_tokens, blank,
                                  BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)


@fused_joint_logits_grad.register_fake
def _(logits, targets, lse, g_lse, g_blank, g_label, g_rest, blank, num_tokens, start):
    return None
