"""The fused joint + loss's two per-node passes as Triton kernels (:mod:`fused_joint_loss` runs them on CUDA).

A node (b, t, u)'s joint output is z = W relu(enc_t + pred_u) + bias. Both kernels take BLOCK_M consecutive
nodes per program and form their logits a [BLOCK_M, BLOCK_N] block at a time: the GEMM over the joint's
hidden units, BLOCK_K at a time, with the hidden activations made from enc_proj and pred_proj as they load,
so neither the [B, T, U + 1, J] activations nor the [B, T, U + 1, C] logits are ever written.

1. ``_node_stats_kernel`` (forward, all nodes in one launch): an online log-sum-exp over the token columns,
   the blank logit and the next label's logit of each node, and the columns after the tokens (TDT's
   duration logits) as they are; fp32, O(B x T x U) values.
2. ``_output_grad_kernel`` (backward, one tile of nodes): the logits again, then d loss / d z =
   softmax x g_lse + onehot(blank) x g_blank + onehot(y_{u+1}) x g_label (+ g_rest after the tokens),
   written once in the joint's dtype into the tile's [nodes, C_pad] buffer for the two GEMMs that follow.

The logits are rounded to the joint's dtype before the fp32 arithmetic, as the materialized logits are;
fp32 GEMMs run in IEEE fp32 (no TF32), as torch's matmuls do by default; bf16 ones on the tensor cores
with fp32 accumulation. Every offset is 64-bit. Both run
inside torch custom ops (``workbench::fused_joint_node_stats``, ``workbench::fused_joint_output_grad``)
whose fake implementations give a fake trace (the OOMptimizer's plan) their outputs. On CUDA each kernel's
blocks are autotuned among :data:`CUDA_CONFIGS` on its first launch for a (J, C, bias, dtype); on a CPU the
kernels run only under Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.triton_support import device_guard

_SHAPE_ARGS = ["NODES", "START", "T", "U1", "U"]  # change with every batch: one compiled kernel for all values


def _blocks(device: torch.device, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps): tensor-core tiles on CUDA (what the compile check builds; runs pick
    theirs among :data:`CUDA_CONFIGS`), small ones for the CPU interpreter."""
    if device.type != "cuda":
        return 16, 32, 16, 4
    return (64, 128, 64, 8) if dtype != torch.float32 else (64, 64, 32, 4)


@triton.jit
def _node_coords(rows, T, U1):
    """(b, t, u) of node indices ``rows`` (int64) of the [B, T, U + 1] lattice."""
    u = rows % U1
    bt = rows // U1
    return bt // T, bt % T, u


@triton.jit
def _logits_block(enc_ptr, pred_ptr, w_ptr, bias_ptr, b, t, u, row_ok, cols, col_ok, T, U1, J,
                  HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] logits W[cols] relu(enc[b, t] + pred[b, u]) + bias[cols], rounded to the
    inputs' dtype, as fp32 (0 outside row_ok x col_ok)."""
    enc_rows = (b * T + t) * J
    pred_rows = (b * U1 + u) * J
    w_rows = cols.to(tl.int64) * J
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, J, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < J
        in_rows = row_ok[:, None] & k_ok[None, :]
        enc = tl.load(enc_ptr + enc_rows[:, None] + ks[None, :], mask=in_rows, other=0.0)
        pred = tl.load(pred_ptr + pred_rows[:, None] + ks[None, :], mask=in_rows, other=0.0)
        hidden = tl.maximum(enc.to(tl.float32) + pred.to(tl.float32), 0.0).to(enc_ptr.dtype.element_ty)
        weight = tl.load(w_ptr + w_rows[None, :] + ks[:, None], mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if IEEE:  # fp32 inputs, or the interpreter (whose dot reads bf16 as integers): products exact in fp32
            acc = tl.dot(hidden.to(tl.float32), weight.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(hidden, weight, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc.to(enc_ptr.dtype.element_ty).to(tl.float32)


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _node_stats_kernel(enc_ptr, pred_ptr, w_ptr, bias_ptr, targets_ptr, lse_ptr, blank_ptr, label_ptr, rest_ptr,
                       NODES, T, U1, U, J, C, NUM_TOKENS, BLANK, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < NODES
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
        z = _logits_block(enc_ptr, pred_ptr, w_ptr, bias_ptr, b, t, u, row_ok, cols, col_ok, T, U1, J,
                          HAS_BIAS, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
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
        z = _logits_block(enc_ptr, pred_ptr, w_ptr, bias_ptr, b, t, u, row_ok, cols, col_ok, T, U1, J,
                          HAS_BIAS, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        tl.store(rest_ptr + rows[:, None] * num_rest + (cols - NUM_TOKENS)[None, :], z,
                 mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _output_grad_kernel(enc_ptr, pred_ptr, w_ptr, bias_ptr, targets_ptr, lse_ptr, g_lse_ptr, g_blank_ptr,
                        g_label_ptr, g_rest_ptr, dz_ptr, START, NODES, T, U1, U, J, C, C_PAD, NUM_TOKENS, BLANK,
                        HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
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
    num_rest = C - NUM_TOKENS
    for n0 in range(0, C_PAD, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_ok = cols < C
        z = _logits_block(enc_ptr, pred_ptr, w_ptr, bias_ptr, b, t, u, row_ok, cols, col_ok, T, U1, J,
                          HAS_BIAS, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
        is_token = cols[None, :] < NUM_TOKENS
        dz = tl.where(is_token, tl.exp(z - lse[:, None]) * g_lse[:, None], 0.0)
        dz += tl.where(cols[None, :] == BLANK, g_blank[:, None], 0.0)
        dz += tl.where(cols[None, :] == target[:, None], g_label[:, None], 0.0)
        is_rest = (cols[None, :] >= NUM_TOKENS) & col_ok[None, :]
        rest = tl.load(g_rest_ptr + rows[:, None] * num_rest + (cols - NUM_TOKENS)[None, :],
                       mask=row_ok[:, None] & is_rest, other=0.0)
        dz = tl.where(is_rest, rest, dz)
        tl.store(dz_ptr + local[:, None] * C_PAD + cols[None, :], dz.to(dz_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cols[None, :] < C_PAD))


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tried on CUDA, once per (J, C, bias, dtype class); those that
# do not fit the GPU's shared memory or registers are skipped by the autotuner
CUDA_CONFIGS = [(64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4),
                (128, 256, 64, 8, 3), (64, 256, 64, 8, 3), (64, 64, 32, 4, 3), (32, 128, 64, 4, 4)]
_TUNE_KEY = ["J", "C", "HAS_BIAS", "IEEE"]


def _autotuned(kernel):
    configs = [triton.Config(dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k), num_warps=w, num_stages=st)
               for m, n, k, w, st in CUDA_CONFIGS]
    return triton.autotune(configs, key=_TUNE_KEY)(kernel)


_KERNELS = {"node_stats": _node_stats_kernel, "output_grad": _output_grad_kernel}
_TUNED = {name: _autotuned(kernel) for name, kernel in _KERNELS.items()}


def _launch(name: str, nodes: int, enc_proj, pred_proj, weight, bias, *rest) -> None:
    """Kernel ``name`` over ``nodes`` nodes: on CUDA its autotuned twin picks the blocks; elsewhere (Triton's
    interpreter) the small fixed blocks of :func:`_blocks`."""
    ieee = enc_proj.dtype == torch.float32 or enc_proj.device.type != "cuda"
    args = (enc_proj, pred_proj, weight, weight if bias is None else bias, *rest)
    constants = dict(HAS_BIAS=bias is not None, IEEE=ieee)
    with device_guard(enc_proj.device):
        if enc_proj.device.type == "cuda":
            _TUNED[name][lambda meta: (triton.cdiv(nodes, meta["BLOCK_M"]),)](*args, **constants)
            return
        block_m, block_n, block_k, warps = _blocks(enc_proj.device, enc_proj.dtype)
        _KERNELS[name][(triton.cdiv(nodes, block_m),)](*args, **constants, BLOCK_M=block_m, BLOCK_N=block_n,
                                                       BLOCK_K=block_k, num_warps=warps)


@torch.library.custom_op("workbench::fused_joint_node_stats", mutates_args=())
def fused_joint_node_stats(enc_proj: torch.Tensor, pred_proj: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None, targets: torch.Tensor, blank: int,
                           num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """enc_proj [B, T, J], pred_proj [B, U + 1, J], weight [C, J], bias [C] | None (one dtype, contiguous),
    targets [B, U] int64 in range -> (lse [B, T, U + 1] of the first ``num_tokens`` logits, blank logit
    [B, T, U + 1], next-label logit [B, T, U], logits after the tokens [B, T, U + 1, C - num_tokens]), fp32."""
    batch, num_frames, width = enc_proj.shape
    num_cols, num_outputs = pred_proj.shape[1], weight.shape[0]
    lse, blank_logit, label_logit, rest = _stats_buffers(enc_proj, num_cols, num_outputs - num_tokens)
    nodes = batch * num_frames * num_cols
    if nodes == 0:
        return lse, blank_logit, label_logit, rest
    _launch("node_stats", nodes, enc_proj, pred_proj, weight, bias, targets, lse, blank_logit, label_logit, rest,
            nodes, num_frames, num_cols, num_cols - 1, width, num_outputs, num_tokens, blank)
    return lse, blank_logit, label_logit, rest


@fused_joint_node_stats.register_fake
def _(enc_proj, pred_proj, weight, bias, targets, blank, num_tokens):
    return _stats_buffers(enc_proj, pred_proj.shape[1], weight.shape[0] - num_tokens)


def _stats_buffers(enc_proj, num_cols, num_rest):
    batch, num_frames, _ = enc_proj.shape
    small = dict(device=enc_proj.device, dtype=torch.float32)
    return (torch.empty(batch, num_frames, num_cols, **small), torch.empty(batch, num_frames, num_cols, **small),
            torch.empty(batch, num_frames, num_cols - 1, **small),
            torch.empty(batch, num_frames, num_cols, num_rest, **small))


@torch.library.custom_op("workbench::fused_joint_output_grad", mutates_args=())
def fused_joint_output_grad(enc_proj: torch.Tensor, pred_proj: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None, targets: torch.Tensor, lse: torch.Tensor, g_lse: torch.Tensor,
                            g_blank: torch.Tensor, g_label: torch.Tensor, g_rest: torch.Tensor, blank: int,
                            num_tokens: int, start: int, num_nodes: int, padded_width: int) -> torch.Tensor:
    """d loss / d logits of nodes ``start`` .. ``start + num_nodes`` (flat indices of [B, T, U + 1]) as
    [num_nodes, padded_width] in the joint's dtype (0 in the columns from C on); the fp32 gradients g_* have
    the shapes of :func:`fused_joint_node_stats`'s outputs, lse is its first."""
    dz = torch.empty(num_nodes, padded_width, device=enc_proj.device, dtype=enc_proj.dtype)
    if num_nodes == 0:
        return dz
    _, num_frames, width = enc_proj.shape
    num_cols, num_outputs = pred_proj.shape[1], weight.shape[0]
    _launch("output_grad", num_nodes, enc_proj, pred_proj, weight, bias, targets, lse, g_lse, g_blank, g_label,
            g_rest, dz, start, num_nodes, num_frames, num_cols, num_cols - 1, width, num_outputs, padded_width,
            num_tokens, blank)
    return dz


@fused_joint_output_grad.register_fake
def _(enc_proj, pred_proj, weight, bias, targets, lse, g_lse, g_blank, g_label, g_rest, blank, num_tokens, start,
      num_nodes, padded_width):
    return enc_proj.new_empty(num_nodes, padded_width)
