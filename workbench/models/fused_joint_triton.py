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

3. ``_hidden_kernel`` (both passes): the tile's hidden units relu(enc_t + pred_u) [nodes, width] in one
   write, with the constant 1 of the bias column, for the GEMM that makes the logits.
4. ``_hidden_grad_kernel`` (backward): reads dh = dz W and h once; d pre-activation = dh where h > 0, summed
   over a block of label positions into enc's gradient and over a block of frames into pred's (fp32 atomic
   adds, in any order: those two gradients are not bit-for-bit deterministic on CUDA).

Each is one read (and the second one write) of the tile. Every offset is 64-bit. Each runs inside a torch
custom op (``workbench::fused_joint_logits_stats``, ``..._logits_grad``, ``..._hidden``, ``..._hidden_grad``)
that writes into the tensors it is given, so a fake trace (the OOMptimizer's plan) sees only the buffers
the caller makes.
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


def _check_rows(rows: torch.Tensor, name: str = "logits") -> None:
    """The kernels address row r of a tile's [nodes, width] tensor at r x width: it must be contiguous."""
    if not rows.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous [nodes, width] tensor, got strides {rows.stride()}")


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


@triton.jit(do_not_specialize=["NODES", "NT", "U1"])
def _hidden_kernel(enc_ptr, pred_ptr, h_ptr, NODES, NT, U1, J, WIDTH, enc_sb, enc_st, enc_sj, pred_sb, pred_su,
                   pred_sj, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    local = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = local < NODES
    u = local % U1
    bt = local // U1
    t = bt % NT
    b = bt // NT
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_j = row_ok[:, None] & (cols < J)[None, :]
    wide = cols.to(tl.int64)
    enc = tl.load(enc_ptr + (b * enc_sb + t * enc_st)[:, None] + wide[None, :] * enc_sj, mask=in_j, other=0.0)
    pred = tl.load(pred_ptr + (b * pred_sb + u * pred_su)[:, None] + wide[None, :] * pred_sj, mask=in_j, other=0.0)
    h = tl.maximum(enc.to(tl.float32) + pred.to(tl.float32), 0.0)
    if HAS_BIAS:
        h = tl.where(cols[None, :] == J, 1.0, h)
    h = h.to(h_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # as PyTorch rounds (the interpreter truncates)
    tl.store(h_ptr + local[:, None] * WIDTH + cols[None, :], h,
             mask=row_ok[:, None] & (cols < WIDTH)[None, :])


@triton.jit(do_not_specialize=["FIRST_ROW", "FIRST_FRAME", "NT", "T", "U1"])
def _hidden_grad_kernel(dh_ptr, h_ptr, grad_enc_ptr, grad_pred_ptr, FIRST_ROW, FIRST_FRAME, NT, T, U1, J, WIDTH,
                        BLOCK_U: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_J: tl.constexpr):
    u_blocks = tl.cdiv(U1, BLOCK_U)
    local_b = tl.program_id(0) // u_blocks
    us = (tl.program_id(0) % u_blocks) * BLOCK_U + tl.arange(0, BLOCK_U)
    js = tl.program_id(2) * BLOCK_J + tl.arange(0, BLOCK_J)
    ok = (us < U1)[:, None] & (js < J)[None, :]
    b = (FIRST_ROW + local_b).to(tl.int64)
    acc = tl.zeros((BLOCK_U, BLOCK_J), dtype=tl.float32)
    for dt in range(0, BLOCK_T):
        t = tl.program_id(1) * BLOCK_T + dt
        here = ok & (t < NT)
        nodes = (local_b.to(tl.int64) * NT + t) * U1 + us
        at = nodes[:, None] * WIDTH + js[None, :]
        dh = tl.load(dh_ptr + at, mask=here, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + at, mask=here, other=0.0)
        g = tl.where(h > 0, dh, 0.0)
        acc += g
        tl.atomic_add(grad_enc_ptr + (b * T + FIRST_FRAME + t) * J + js, tl.sum(g, axis=0), mask=(js < J) & (t < NT))
    tl.atomic_add(grad_pred_ptr + (b * U1 + us[:, None]) * J + js[None, :], acc, mask=ok)


# (BLOCK_M, BLOCK_N, warps) of the hidden units' kernel and (BLOCK_U, BLOCK_T, BLOCK_J, warps) of their gradient's
_HIDDEN_BLOCKS = {"cuda": (32, 128, 4), "cpu": (8, 16, 4)}
_HIDDEN_GRAD_BLOCKS = {"cuda": (32, 16, 64, 4), "cpu": (4, 3, 8, 4)}


@torch.library.custom_op("workbench::fused_joint_hidden", mutates_args=("hidden",))
def fused_joint_hidden(enc_tile: torch.Tensor, pred_rows: torch.Tensor, hidden: torch.Tensor, has_bias: bool) -> None:
    """Fill ``hidden`` [b x t x (U + 1), width] (contiguous) with relu(enc_tile[b, t] + pred_rows[b, u]) in its
    first J columns (enc_tile [b, t, J], pred_rows [b, U + 1, J], any strides; the sum rounded to hidden's
    dtype as PyTorch rounds it), 1 in column J when ``has_bias``, and 0 in the columns after."""
    _check_rows(hidden, "hidden")
    num_nodes, width = hidden.shape
    if num_nodes == 0:
        return
    _, num_frames, hidden_units = enc_tile.shape
    block_m, block_n, warps = _HIDDEN_BLOCKS["cuda" if hidden.device.type == "cuda" else "cpu"]
    grid = (triton.cdiv(num_nodes, block_m), triton.cdiv(width, block_n))
    with device_guard(hidden.device):
        _hidden_kernel[grid](enc_tile, pred_rows, hidden, num_nodes, num_frames, pred_rows.shape[1], hidden_units,
                             width, *enc_tile.stride(), *pred_rows.stride(), HAS_BIAS=has_bias, BLOCK_M=block_m,
                             BLOCK_N=block_n, num_warps=warps)


@fused_joint_hidden.register_fake
def _(enc_tile, pred_rows, hidden, has_bias):
    return None


@torch.library.custom_op("workbench::fused_joint_hidden_grad", mutates_args=("grad_enc", "grad_pred"))
def fused_joint_hidden_grad(grad_hidden: torch.Tensor, hidden: torch.Tensor, grad_enc: torch.Tensor,
                            grad_pred: torch.Tensor, first_row: int, first_frame: int, num_frames: int) -> None:
    """Add one tile's gradient of the joint's inputs: with d pre-activation = grad_hidden where hidden > 0
    (both [nodes, width], contiguous, the tile's nodes of utterances ``first_row`` .. and frames
    ``first_frame`` .. ``first_frame + num_frames``), its sum over label positions to grad_enc [B, T, J] and
    its sum over frames to grad_pred [B, U + 1, J] (both contiguous fp32; J columns of width are read)."""
    _check_rows(grad_hidden, "grad_hidden")
    _check_rows(hidden, "hidden")
    num_nodes, width = hidden.shape
    if num_nodes == 0:
        return
    _, total_frames, hidden_units = grad_enc.shape
    num_cols = grad_pred.shape[1]
    rows = num_nodes // (num_frames * num_cols)
    block_u, block_t, block_j, warps = _HIDDEN_GRAD_BLOCKS["cuda" if hidden.device.type == "cuda" else "cpu"]
    grid = (rows * triton.cdiv(num_cols, block_u), triton.cdiv(num_frames, block_t), triton.cdiv(hidden_units, block_j))
    with device_guard(hidden.device):
        _hidden_grad_kernel[grid](grad_hidden, hidden, grad_enc, grad_pred, first_row, first_frame, num_frames,
                                  total_frames, num_cols, hidden_units, width, BLOCK_U=block_u, BLOCK_T=block_t,
                                  BLOCK_J=block_j, num_warps=warps)


@fused_joint_hidden_grad.register_fake
def _(grad_hidden, hidden, grad_enc, grad_pred, first_row, first_frame, num_frames):
    return None
