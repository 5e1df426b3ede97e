"""Transducer losses (RNN-T, TDT) as Triton kernels: the same lattice and results as :mod:`losses`.

Three kernels, each reading the logits at most once:

1. ``_normalize_kernel``, one program per tile of ROWS lattice nodes (b, t, u) (consecutive rows of the
   logits, a [ROWS, BLOCK_V] tile per vocabulary block; a row that fits one block takes its max, then one
   exp per lane, a longer one an online log-sum-exp over its blocks): each node's log-normalizer of the
   token logits (fp32 [B, T, U + 1]), (TDT) the duration log-softmax ([B, T, U + 1, D]) and every edge
   weight leaving the node, token plus duration log-prob, into a buffer [B, 2 (blank, label), slots, T + U,
   U + 1] laid out by anti-diagonal n = t + u, so that the nodes of one diagonal are contiguous;
2. ``_lattice_kernel``, one program per utterance for alpha over the anti-diagonals (a block of u per
   step, all edges of a node in one [BLOCK_U, slots] tile: one coalesced load per edge kind and weight
   kind, one max and one exp per edge) and log P, and, when backward will run, a second one per utterance
   for beta over the diagonals in reverse, at the same time; alpha and beta are [B, T + U, U + 1] by
   diagonal too;
3. ``_grad_kernel`` (backward only), one program per tile of ROWS nodes: the edge weights again from each
   row's blank and target logits (the lattice's buffer is freed after forward), the edge posteriors
   exp(alpha + w + beta(destination) - log P) in a [ROWS, slots] tile, and d loss / d logits, written once
   into one buffer of the logits' size and dtype (no fp32 copy of the logits is ever made).

Every per-node quantity of a tile (coordinates, lengths, normalizers, alpha, beta, edge weights) is a
[ROWS] or [ROWS, slots] vector; nodes past the last one of the tensor are masked. A program issues its
loads (a row that fits one block: its logit tile first) before it computes and stores, so that they are in
flight together. ROWS is a power of two picked from the vocabulary block (:func:`_node_rows`);
:func:`rows_per_program` overrides it, e.g. 1 for one node per program.

A row may end in padding columns after the classes (a joint output padded to an aligned width): the
kernels read the logits in place at that row stride and write a zero gradient for the padding. Every
offset into the logits is 64-bit, so any size that fits in memory works. Edges come in slots of a
blank and a label duration each (a blank duration of 0 is no blank edge): RNN-T has one slot, a blank of
duration 1 and a label of duration 0, and no duration logits; TDT has slot i for ``durations[i]``, a blank
and a label edge of that duration, each adding the log-prob of duration column i. On a CPU the kernels run
only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported).

The kernels run inside two torch custom ops, ``workbench::transducer_loss_forward`` (1 and 2, differentiable)
and ``workbench::transducer_loss_backward`` (3), whose fake implementations make every buffer the kernels'
launches get: a fake trace (the OOMptimizer's plan) counts them, and torch.compile traces through the ops.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Sequence

import torch
import triton
import triton.language as tl

from workbench.models.loss_inputs import LOG_ZERO, check_durations, check_num_classes
from workbench.models.loss_inputs import check_inputs as _check_inputs
from workbench.models.loss_inputs import reduce_losses as _reduce
from workbench.triton_support import device_guard

_LOG_ZERO = tl.constexpr(LOG_ZERO)
_MAX_BLOCK_V = 4096  # vocabulary block of the per-node kernels (larger vocabularies loop)
_MAX_BLOCK_U = 256   # label block of the per-utterance kernels (longer targets loop)
_SHAPE_ARGS = ["NODES", "T", "U1", "U", "NDIAG"]  # change with every batch: one compiled kernel for all values
_TILE_ELEMENTS = 8192  # logits per program of the per-node kernels: ROWS * BLOCK_V, at most
_MAX_ROWS = 2          # nodes per program at most (losses.json's rows part times 1, 2, 4 and 8 per program)
_rows_setting: int | None = None  # rows_per_program's override (None: _node_rows picks)


def _node_rows(block_v: int) -> int:
    """Nodes per program of the per-node kernels (a power of two): the override of :func:`rows_per_program`,
    else as many as make a tile of about ``_TILE_ELEMENTS`` logits, 1 to ``_MAX_ROWS``."""
    if _rows_setting is not None:
        return _rows_setting
    return max(1, min(_MAX_ROWS, _TILE_ELEMENTS // block_v))


def _vocab_block(num_tokens: int) -> int:
    """BLOCK_V of the per-node kernels for rows of ``num_tokens`` token columns."""
    return min(triton.next_power_of_2(num_tokens), _MAX_BLOCK_V)


def node_rows(num_tokens: int) -> int:
    """Lattice nodes per program the per-node kernels take now for rows of ``num_tokens`` token columns."""
    return _node_rows(_vocab_block(num_tokens))


def _node_warps(rows: int, block_v: int) -> int:
    """Warps of a per-node program: 8 for a tile of ``_TILE_ELEMENTS`` logits or more, else 4."""
    return 8 if rows * block_v >= _TILE_ELEMENTS else 4


@contextlib.contextmanager
def rows_per_program(rows: int):
    """Run the per-node kernels with ``rows`` lattice nodes per program (a power of two) inside the block,
    e.g. 1 for one node per program; the default choice is restored on exit."""
    global _rows_setting
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 or rows & (rows - 1):
        raise ValueError(f"rows_per_program: expected a power of two >= 1, got {rows!r}")
    saved, _rows_setting = _rows_setting, rows
    try:
        yield
    finally:
        _rows_setting = saved


def _lattice_warps(block_u: int, block_s: int) -> int:
    """Warps of a lattice program: 4, or 8 once a diagonal's [BLOCK_U, BLOCK_S] tile passes 512 edges (TDT's
    slots at long targets), halving the edges each thread loads per diagonal."""
    return 8 if block_u * block_s > 512 else 4


@triton.jit
def _lse_add(m, s, x):
    """Online log-sum-exp: (running max, scaled sum) after adding x."""
    m_new = tl.maximum(m, x)
    return m_new, s * tl.exp(m - m_new) + tl.exp(x - m_new)


@triton.jit
def _logsumexp_rows(xb, xl):
    """log-sum-exp over axis 1 of two [BLOCK_U, BLOCK_S] edge tensors together: one max, one exp per edge."""
    m = tl.maximum(tl.max(xb, axis=1), tl.max(xl, axis=1))
    total = tl.sum(tl.exp(xb - m[:, None]), axis=1) + tl.sum(tl.exp(xl - m[:, None]), axis=1)
    return m + tl.log(total)


@triton.jit
def _node_coords(row, NODES, T, U1, logit_lengths_ptr, target_lengths_ptr):
    """(b, t, u, T_b, U_b, in the tensor, on the utterance's lattice) of the nodes ``row`` (int64, any shape)
    of the [B, T, U + 1] lattice, NODES of them in all; all int64 but the masks."""
    in_tensor = row < NODES
    b = row // (T * U1)
    rem = row % (T * U1)
    t = rem // U1
    u = rem % U1
    t_len = tl.load(logit_lengths_ptr + b, mask=in_tensor, other=0).to(tl.int64)
    u_len = tl.load(target_lengths_ptr + b, mask=in_tensor, other=0).to(tl.int64)
    return b, t, u, t_len, u_len, in_tensor, in_tensor & (t < t_len) & (u <= u_len)


@triton.jit
def _program_rows(ROWS: tl.constexpr):
    """The node indices [ROWS] (int64) of this program's tile."""
    return tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)


@triton.jit
def _slots(edges_ptr, NS: tl.constexpr, BLOCK_S: tl.constexpr):
    """(slot index, in range, blank duration (0: no blank edge), label duration), each [BLOCK_S]."""
    slot = tl.arange(0, BLOCK_S)
    in_range = slot < NS
    blank_dur = tl.load(edges_ptr + slot, mask=in_range, other=0)
    label_dur = tl.load(edges_ptr + NS + slot, mask=in_range, other=0)
    return slot, in_range, blank_dur, label_dur


@triton.jit
def _slot_columns(edges_ptr, NS: tl.constexpr, BLOCK_S: tl.constexpr):
    """:func:`_slots` as [1, BLOCK_S] rows of a [BLOCK_U, BLOCK_S] tile, with "has a blank edge"."""
    slot, in_range, blank_dur, label_dur = _slots(edges_ptr, NS, BLOCK_S)
    has_blank = in_range & (blank_dur > 0)
    return slot[None, :], in_range[None, :], has_blank[None, :], blank_dur[None, :], label_dur[None, :]


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _normalize_kernel(logits_ptr, targets_ptr, logit_lengths_ptr, target_lengths_ptr, lse_ptr, weight_ptr,
                      dur_ptr, NODES, T, U1, NDIAG, C, V_TOK, U, blank, sigma,
                      ND: tl.constexpr, NS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr,
                      ROWS: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = _program_rows(ROWS)
    b, t, u, t_len, u_len, in_tensor, valid = _node_coords(row, NODES, T, U1, logit_lengths_ptr, target_lengths_ptr)
    row_ptr = logits_ptr + row * C  # [ROWS]
    valid2 = valid[:, None]
    offs = tl.arange(0, BLOCK_V)[None, :]
    slot = tl.arange(0, BLOCK_S)[None, :]
    in_range = slot < NS
    # the loads first, none waiting on another but the label logit on its target; the stores last
    if ONE_BLOCK:
        x = tl.load(row_ptr[:, None] + offs, mask=valid2 & (offs < V_TOK), other=float("-inf")).to(tl.float32)
    blank_logit, label_logit, target, has_label = _edge_logits(row_ptr, targets_ptr, b, u, U, u_len, in_tensor,
                                                               valid, blank)
    if ND > 0:  # slot s is duration column s
        dx = tl.load(row_ptr[:, None] + V_TOK + slot, mask=valid2 & in_range, other=0.0).to(tl.float32)
    if ONE_BLOCK:  # the whole row in one [ROWS, BLOCK_V] tile: max, then one exp per lane
        m_all = tl.where(valid, tl.max(x, axis=1), 0.0)
        total = tl.sum(tl.exp(x - m_all[:, None]), axis=1)
    else:  # online over the row's blocks
        m = tl.full([ROWS, BLOCK_V], -3.0e38, tl.float32)
        s = tl.zeros([ROWS, BLOCK_V], tl.float32)
        for v0 in range(0, V_TOK, BLOCK_V):
            x = tl.load(row_ptr[:, None] + v0 + offs, mask=valid2 & (v0 + offs < V_TOK),
                        other=float("-inf")).to(tl.float32)
            m, s = _lse_add(m, s, x)
        m_all = tl.max(m, axis=1)
        total = tl.sum(s * tl.exp(m - m_all[:, None]), axis=1)
    lse = tl.where(valid, m_all + tl.log(tl.where(valid, total, 1.0)), 0.0)  # [ROWS]
    dur_logp = tl.zeros([ROWS, BLOCK_S], tl.float32)
    if ND > 0:  # the duration log-softmax
        dx = tl.where(in_range, dx, float("-inf"))
        dmax = tl.max(dx, axis=1)[:, None]
        dur_logp = tl.where(valid2, dx - (dmax + tl.log(tl.sum(tl.exp(dx - dmax), axis=1)[:, None])), 0.0)
    # each slot's blank and label edge weight, on the skewed lattice (see _weight_index)
    blank_w, label_w = _edge_weights(blank_logit, label_logit, has_label, valid, lse, sigma, dur_logp)
    stored = in_tensor[:, None] & in_range
    tl.store(lse_ptr + row, lse, mask=in_tensor)
    if ND > 0:
        tl.store(dur_ptr + row[:, None] * ND + slot, dur_logp, mask=stored)
    b2, n2, u2 = b[:, None], (t + u)[:, None], u[:, None]
    tl.store(weight_ptr + _weight_index(b2, 0, slot, n2, u2, NS, NDIAG, U1), blank_w, mask=stored)
    tl.store(weight_ptr + _weight_index(b2, 1, slot, n2, u2, NS, NDIAG, U1), label_w, mask=stored)


@triton.jit
def _edge_logits(row_ptr, targets_ptr, b, u, U, u_len, in_tensor, valid, blank):
    """(blank logit, target logit, target (-1: none), has a label edge) of the nodes [ROWS], from their rows'
    pointers and coordinates; each [ROWS], the logits in fp32 (0 where there is no such edge). The target is
    read wherever it is in the targets tensor, without waiting for the lengths."""
    blank_logit = tl.load(row_ptr + blank, mask=valid, other=0.0).to(tl.float32)
    has_label = valid & (u < u_len)
    target = tl.load(targets_ptr + b * U + u, mask=in_tensor & (u < U), other=0).to(tl.int64)
    label_logit = tl.load(row_ptr + target, mask=has_label, other=0.0).to(tl.float32)
    return blank_logit, label_logit, tl.where(has_label, target, -1), has_label


@triton.jit
def _edge_weights(blank_logit, label_logit, has_label, valid, lse, sigma, dur_logp):
    """(blank, label) edge weights [ROWS, BLOCK_S] of the nodes [ROWS]: token log-prob minus sigma plus each
    slot's duration log-prob, LOG_ZERO where a node has no such edge."""
    blank_logp = blank_logit - lse - sigma
    label_logp = label_logit - lse - sigma
    return (tl.where(valid[:, None], blank_logp[:, None] + dur_logp, _LOG_ZERO),
            tl.where(has_label[:, None], label_logp[:, None] + dur_logp, _LOG_ZERO))


@triton.jit
def _weight_index(b, kind, slot, n, u, NS: tl.constexpr, NDIAG, U1):
    """Offset of the edge weight of (kind 0 blank / 1 label, slot) at node (t = n - u, u) of utterance b
    in the [B, 2, NS, diagonals, U + 1] buffer: a diagonal's nodes are contiguous."""
    return (((b * 2 + kind) * NS + slot) * NDIAG + n) * U1 + u


@triton.jit
def _lattice_index(b, n, u, NDIAG, U1):
    """Offset of node (t = n - u, u) of utterance b in an alpha/beta buffer [B, diagonals, U + 1]."""
    return (b * NDIAG + n) * U1 + u


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _lattice_kernel(weight_ptr, alpha_ptr, beta_ptr, ll_ptr, logit_lengths_ptr, target_lengths_ptr, edges_ptr,
                    NDIAG, U1, NS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_U: tl.constexpr):
    """Grid (B, 1): alpha and log P. Grid (B, 2): beta too, by a second program per utterance at once."""
    b = tl.program_id(0).to(tl.int64)
    t_len = tl.load(logit_lengths_ptr + b).to(tl.int64)
    u_len = tl.load(target_lengths_ptr + b).to(tl.int64)
    if tl.program_id(1) == 0:
        _alpha(weight_ptr, alpha_ptr, ll_ptr, edges_ptr, NDIAG, U1, b, t_len, u_len, NS, BLOCK_S, BLOCK_U)
    else:
        _beta(weight_ptr, beta_ptr, edges_ptr, NDIAG, U1, b, t_len, u_len, NS, BLOCK_S, BLOCK_U)


@triton.jit
def _alpha(weight_ptr, alpha_ptr, ll_ptr, edges_ptr, NDIAG, U1, b, t_len, u_len,
           NS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_U: tl.constexpr):
    """alpha over the diagonals of utterance b (every edge of a node in one [BLOCK_U, BLOCK_S] step),
    then log P into ll_ptr[b]."""
    slot2, in_range2, has_blank, bd, ld = _slot_columns(edges_ptr, NS, BLOCK_S)
    tl.store(alpha_ptr + _lattice_index(b, 0, 0, NDIAG, U1), 0.0)
    tl.debug_barrier()
    offs = tl.arange(0, BLOCK_U).to(tl.int64)
    for n in range(1, t_len + u_len):
        for u0 in range(0, u_len + 1, BLOCK_U):
            u = u0 + offs
            t = n - u
            valid = (u <= u_len) & (t >= 0) & (t < t_len)
            u2, t2, valid2 = u[:, None], t[:, None], valid[:, None]
            ok = valid2 & has_blank & (t2 - bd >= 0)  # blank of duration d from (t - d, u)
            xb = tl.load(alpha_ptr + _lattice_index(b, n - bd, u2, NDIAG, U1), mask=ok, other=_LOG_ZERO) + tl.load(
                weight_ptr + _weight_index(b, 0, slot2, n - bd, u2, NS, NDIAG, U1), mask=ok, other=_LOG_ZERO)
            xb = tl.where(ok, xb, _LOG_ZERO)
            ok = valid2 & in_range2 & (t2 - ld >= 0) & (u2 >= 1)  # label u with duration d from (t - d, u - 1)
            xl = tl.load(alpha_ptr + _lattice_index(b, n - ld - 1, u2 - 1, NDIAG, U1), mask=ok, other=_LOG_ZERO) + \
                tl.load(weight_ptr + _weight_index(b, 1, slot2, n - ld - 1, u2 - 1, NS, NDIAG, U1), mask=ok,
                        other=_LOG_ZERO)
            xl = tl.where(ok, xl, _LOG_ZERO)
            tl.store(alpha_ptr + _lattice_index(b, n, u, NDIAG, U1), _logsumexp_rows(xb, xl), mask=valid)
        tl.debug_barrier()
    slot, in_range, blank_dur, _ = _slots(edges_ptr, NS, BLOCK_S)
    ok = in_range & (blank_dur > 0) & (t_len - blank_dur >= 0)  # the ending blank lands on frame T_b at u = U_b
    n_from = t_len - blank_dur + u_len
    x = tl.load(alpha_ptr + _lattice_index(b, n_from, u_len, NDIAG, U1), mask=ok, other=_LOG_ZERO) + tl.load(
        weight_ptr + _weight_index(b, 0, slot, n_from, u_len, NS, NDIAG, U1), mask=ok, other=_LOG_ZERO)
    x = tl.where(ok, x, _LOG_ZERO)
    m = tl.max(x, axis=0)
    tl.store(ll_ptr + b, m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


@triton.jit
def _beta(weight_ptr, beta_ptr, edges_ptr, NDIAG, U1, b, t_len, u_len,
          NS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_U: tl.constexpr):
    """beta over the diagonals of one utterance, in reverse."""
    slot2, in_range2, has_blank, bd, ld = _slot_columns(edges_ptr, NS, BLOCK_S)
    offs = tl.arange(0, BLOCK_U).to(tl.int64)
    for k in range(0, t_len + u_len):
        n = t_len + u_len - 1 - k
        for u0 in range(0, u_len + 1, BLOCK_U):
            u = u0 + offs
            t = n - u
            valid = (u <= u_len) & (t >= 0) & (t < t_len)
            u2, t2, valid2 = u[:, None], t[:, None], valid[:, None]
            inner = valid2 & has_blank & (t2 + bd < t_len)  # blank of duration d to (t + d, u), or the end
            ending = valid2 & has_blank & (t2 + bd == t_len) & (u2 == u_len)
            w = tl.load(weight_ptr + _weight_index(b, 0, slot2, n, u2, NS, NDIAG, U1), mask=inner | ending,
                        other=_LOG_ZERO)
            after = tl.load(beta_ptr + _lattice_index(b, n + bd, u2, NDIAG, U1), mask=inner, other=_LOG_ZERO)
            xb = tl.where(inner, after + w, tl.where(ending, w, _LOG_ZERO))
            inner = valid2 & in_range2 & (t2 + ld < t_len) & (u2 < u_len)  # label u + 1, duration d: to (t + d, u + 1)
            w = tl.load(weight_ptr + _weight_index(b, 1, slot2, n, u2, NS, NDIAG, U1), mask=inner, other=_LOG_ZERO)
            after = tl.load(beta_ptr + _lattice_index(b, n + ld + 1, u2 + 1, NDIAG, U1), mask=inner,
                            other=_LOG_ZERO)
            xl = tl.where(inner, after + w, _LOG_ZERO)
            tl.store(beta_ptr + _lattice_index(b, n, u, NDIAG, U1), _logsumexp_rows(xb, xl), mask=valid)
        tl.debug_barrier()


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _grad_kernel(logits_ptr, grad_ptr, targets_ptr, logit_lengths_ptr, target_lengths_ptr, lse_ptr, dur_ptr,
                 alpha_ptr, beta_ptr, ll_ptr, scale_ptr, edges_ptr, NODES, T, U1, NDIAG, C, V_TOK, U, blank, sigma,
                 ND: tl.constexpr, NS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr,
                 ROWS: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = _program_rows(ROWS)
    b, t, u, t_len, u_len, in_tensor, valid = _node_coords(row, NODES, T, U1, logit_lengths_ptr, target_lengths_ptr)
    n = t + u
    row_ptr = logits_ptr + row * C  # [ROWS]
    offs = tl.arange(0, BLOCK_V)[None, :]
    b2, t2, u2, n2, t_len2, u_len2, valid2 = b[:, None], t[:, None], u[:, None], n[:, None], t_len[:, None], \
        u_len[:, None], valid[:, None]
    if ONE_BLOCK:  # the row's tile first: its load overlaps the per-node loads below
        z = tl.load(row_ptr[:, None] + offs, mask=valid2 & (offs < V_TOK), other=0.0).to(tl.float32)
    log_p = tl.load(ll_ptr + b, mask=in_tensor, other=0.0)
    log_p = tl.where(log_p > _LOG_ZERO / 2, log_p, 0.0)  # an impossible utterance gets zero gradient
    alpha = tl.load(alpha_ptr + _lattice_index(b, n, u, NDIAG, U1), mask=valid, other=_LOG_ZERO) - log_p
    lse = tl.load(lse_ptr + row, mask=in_tensor, other=0.0)
    scale = tl.load(scale_ptr + b, mask=in_tensor, other=0.0).to(tl.float32)[:, None]
    slot, in_range, blank_dur, label_dur = _slots(edges_ptr, NS, BLOCK_S)
    slot, in_range, blank_dur, label_dur = slot[None, :], in_range[None, :], blank_dur[None, :], label_dur[None, :]
    dur_logp = tl.zeros([ROWS, BLOCK_S], tl.float32)
    if ND > 0:
        dur_logp = tl.load(dur_ptr + row[:, None] * ND + slot, mask=valid2 & in_range, other=0.0)
    # the edge weights again from these rows (two logits each; the lattice's copy is not kept for backward),
    # then every edge leaving each node at once, one slot per lane: exp(alpha + w + beta(destination) - log P)
    blank_logit, label_logit, target, has_label = _edge_logits(row_ptr, targets_ptr, b, u, U, u_len, in_tensor,
                                                               valid, blank)
    inner_blank = valid2 & in_range & (blank_dur > 0) & (t2 + blank_dur < t_len2)
    ending = valid2 & in_range & (blank_dur > 0) & (t2 + blank_dur == t_len2) & (u2 == u_len2)
    after_blank = tl.load(beta_ptr + _lattice_index(b2, n2 + blank_dur, u2, NDIAG, U1), mask=inner_blank,
                          other=_LOG_ZERO)
    inner_label = valid2 & in_range & (t2 + label_dur < t_len2) & (u2 < u_len2)
    after_label = tl.load(beta_ptr + _lattice_index(b2, n2 + label_dur + 1, u2 + 1, NDIAG, U1), mask=inner_label,
                          other=_LOG_ZERO)
    blank_w, label_w = _edge_weights(blank_logit, label_logit, has_label, valid, lse, sigma, dur_logp)
    blank_post = tl.where(inner_blank | ending,
                          tl.exp(alpha[:, None] + blank_w + tl.where(inner_blank, after_blank, 0.0)), 0.0)
    label_post = tl.where(inner_label, tl.exp(alpha[:, None] + label_w + after_label), 0.0)
    blank_posterior = tl.sum(blank_post, axis=1)[:, None]  # [ROWS, 1]
    label_posterior = tl.sum(label_post, axis=1)[:, None]
    occupancy = blank_posterior + label_posterior
    grad_row = (grad_ptr + row * C)[:, None]
    row_ptr, lse, target, written = row_ptr[:, None], lse[:, None], target[:, None], in_tensor[:, None]
    if ONE_BLOCK:
        g = _token_grad(z, offs, occupancy, lse, blank, blank_posterior, target, label_posterior)
        tl.store(grad_row + offs, tl.where(valid2, g * scale, 0.0).to(grad_ptr.dtype.element_ty),
                 mask=written & (offs < V_TOK))
    else:
        for v0 in range(0, V_TOK, BLOCK_V):
            v = v0 + offs
            in_vocab = v < V_TOK
            z = tl.load(row_ptr + v, mask=valid2 & in_vocab, other=0.0).to(tl.float32)
            g = _token_grad(z, v, occupancy, lse, blank, blank_posterior, target, label_posterior)
            tl.store(grad_row + v, tl.where(valid2, g * scale, 0.0).to(grad_ptr.dtype.element_ty),
                     mask=written & in_vocab)
    if ND > 0:  # slot s is duration column s: both its edges' posteriors
        g = occupancy * tl.exp(dur_logp) - (blank_post + label_post)
        tl.store(grad_row + V_TOK + slot, tl.where(valid2, g * scale, 0.0).to(grad_ptr.dtype.element_ty),
                 mask=written & in_range)
    for v0 in range(V_TOK + ND, C, BLOCK_V):  # the rows' padding columns past the classes: zero gradient
        v = v0 + offs
        tl.store(grad_row + v, tl.zeros([ROWS, BLOCK_V], tl.float32).to(grad_ptr.dtype.element_ty),
                 mask=written & (v < C))


@triton.jit
def _token_grad(z, v, occupancy, lse, blank, blank_posterior, target, label_posterior):
    """d loss / d logits (before the utterance's scale) of token columns v [1, BLOCK_V] of logits z [ROWS,
    BLOCK_V]: occupancy * softmax minus the blank and target edges' posteriors ([ROWS, 1] each)."""
    return occupancy * tl.exp(z - lse) - tl.where(v == blank, blank_posterior, 0.0) \
        - tl.where(v == target, label_posterior, 0.0)


@torch.library.custom_op("workbench::transducer_loss_forward", mutates_args=())
def transducer_loss_forward(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                            target_lengths: torch.Tensor, blank_durations: list[int], label_durations: list[int],
                            blank: int, num_tokens: int, num_dur: int, sigma: float, want_grad: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                       torch.Tensor]:
    """The lattice of contiguous logits [B, T, U + 1, row]: (log P [B], lse, dur_logp, alpha, beta, edge
    weights), fp32 (:func:`_forward_buffers`). ``targets`` [B, U] and the lengths [B] int64 and contiguous; slot
    i has a blank edge of ``blank_durations[i]`` frames and a label edge of ``label_durations[i]``. beta is
    computed only with ``want_grad``. The edge weights are returned only so that a memory trace sees the
    buffer while the op runs: backward reads them again from the logits."""
    lse, dur_logp, alpha, beta, log_likelihood, weights = _forward_buffers(logits, len(blank_durations), num_dur)
    batch, num_frames, num_cols, row_stride = logits.shape
    num_slots, num_diagonals = len(blank_durations), alpha.shape[1]
    edges = _edge_tensor((tuple(blank_durations), tuple(label_durations)), logits.device)
    targets = _label_pointer(targets)
    rows = batch * num_frames * num_cols
    block_v, block_s = _vocab_block(num_tokens), triton.next_power_of_2(num_slots)
    block_u = min(triton.next_power_of_2(num_cols), _MAX_BLOCK_U)
    tile_rows = _node_rows(block_v)
    with device_guard(logits.device):
        _normalize_kernel[(triton.cdiv(rows, tile_rows),)](
            logits, targets, logit_lengths, target_lengths, lse, weights, dur_logp, rows, num_frames, num_cols,
            num_diagonals, row_stride, num_tokens, num_cols - 1, blank, float(sigma), ND=num_dur, NS=num_slots,
            BLOCK_V=block_v, BLOCK_S=block_s, ROWS=tile_rows, ONE_BLOCK=num_tokens <= block_v,
            num_warps=_node_warps(tile_rows, block_v))
        _lattice_kernel[(batch, 2 if want_grad else 1)](  # beta alongside alpha only when backward will run
            weights, alpha, beta, log_likelihood, logit_lengths, target_lengths, edges, num_diagonals, num_cols,
            NS=num_slots, BLOCK_S=block_s, BLOCK_U=block_u, num_warps=_lattice_warps(block_u, block_s))
    return log_likelihood, lse, dur_logp, alpha, beta, weights


@transducer_loss_forward.register_fake
def _(logits, targets, logit_lengths, target_lengths, blank_durations, label_durations, blank, num_tokens, num_dur,
      sigma, want_grad):
    lse, dur_logp, alpha, beta, log_likelihood, weights = _forward_buffers(logits, len(blank_durations), num_dur)
    return log_likelihood, lse, dur_logp, alpha, beta, weights


def _forward_buffers(logits: torch.Tensor, num_slots: int, num_dur: int) -> tuple[torch.Tensor, ...]:
    """The forward's new buffers for logits [B, T, U + 1, row], fp32 on their device: lse [B, T, U + 1],
    dur_logp [B, T, U + 1, max(D, 1)], alpha and beta [B, T + U, U + 1], log P [B], edge weights
    [B, 2, slots, T + U, U + 1]."""
    batch, num_frames, num_cols, _ = logits.shape
    num_diagonals = num_frames + num_cols - 1
    small = dict(device=logits.device, dtype=torch.float32)
    return (torch.empty(batch, num_frames, num_cols, **small),
            torch.empty(batch, num_frames, num_cols, max(num_dur, 1), **small),
            torch.empty(batch, num_diagonals, num_cols, **small),
            torch.empty(batch, num_diagonals, num_cols, **small),
            torch.empty(batch, **small),
            torch.empty(batch, 2, num_slots, num_diagonals, num_cols, **small))


@torch.library.custom_op("workbench::transducer_loss_backward", mutates_args=())
def transducer_loss_backward(scale: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor,
                             logit_lengths: torch.Tensor, target_lengths: torch.Tensor, lse: torch.Tensor,
                             dur_logp: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                             log_likelihood: torch.Tensor, blank_durations: list[int], label_durations: list[int],
                             blank: int, num_tokens: int, num_dur: int, sigma: float) -> torch.Tensor:
    """d (scale[b] x -log P[b]) / d logits, in the logits' shape and dtype (padding columns zero), from
    :func:`transducer_loss_forward`'s inputs and outputs; ``scale`` [B] fp32."""
    batch, num_frames, num_cols, row_stride = logits.shape
    num_slots = len(blank_durations)
    edges = _edge_tensor((tuple(blank_durations), tuple(label_durations)), logits.device)
    targets = _label_pointer(targets)
    block_v, block_s = _vocab_block(num_tokens), triton.next_power_of_2(num_slots)
    tile_rows = _node_rows(block_v)
    rows = batch * num_frames * num_cols
    grad = torch.empty_like(logits)
    with device_guard(logits.device):
        _grad_kernel[(triton.cdiv(rows, tile_rows),)](
            logits, grad, targets, logit_lengths, target_lengths, lse, dur_logp, alpha, beta, log_likelihood,
            scale, edges, rows, num_frames, num_cols, alpha.shape[1], row_stride, num_tokens, num_cols - 1, blank,
            float(sigma), ND=num_dur, NS=num_slots, BLOCK_V=block_v, BLOCK_S=block_s, ROWS=tile_rows,
            ONE_BLOCK=num_tokens <= block_v, num_warps=_node_warps(tile_rows, block_v))
    return grad


@transducer_loss_backward.register_fake
def _(scale, logits, *rest):
    return torch.empty_like(logits)


def _setup_loss_context(ctx, inputs, output):
    logits, targets, logit_lengths, target_lengths, blank_durations, label_durations, blank, num_tokens, num_dur, \
        sigma, _ = inputs
    log_likelihood, lse, dur_logp, alpha, beta, weights = output
    ctx.mark_non_differentiable(lse, dur_logp, alpha, beta, weights)
    ctx.save_for_backward(logits, targets, logit_lengths, target_lengths, lse, dur_logp, alpha, beta,
                          log_likelihood)  # not the edge weights: backward reads them from the logits
    ctx.sizes = (list(blank_durations), list(label_durations), blank, num_tokens, num_dur, float(sigma))


def _loss_backward(ctx, grad_log_likelihood, *_):
    if torch.is_grad_enabled():
        raise RuntimeError("transducer losses: second derivatives are not supported (the gradient is computed "
                           "analytically); use create_graph=False")
    scale = (-grad_log_likelihood).to(torch.float32).contiguous()  # the loss is -log P
    grad = transducer_loss_backward(scale, *ctx.saved_tensors, *ctx.sizes)
    return grad, None, None, None, None, None, None, None, None, None, None


transducer_loss_forward.register_autograd(_loss_backward, setup_context=_setup_loss_context)


def _label_pointer(targets: torch.Tensor) -> torch.Tensor:
    """``targets``, or one zero label per utterance when U = 0: no label is read, but the kernels need a real
    pointer."""
    if targets.numel():
        return targets
    return torch.zeros(targets.shape[0], 1, dtype=torch.int64, device=targets.device)


def _transducer_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                     target_lengths: torch.Tensor, blank: int, num_tokens: int, num_dur: int, sigma: float,
                     slots: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    """Per-utterance -log P [B] by :func:`transducer_loss_forward` (its gradient by the backward op). The
    logits' rows are ``num_tokens`` token columns, ``num_dur`` duration columns, then any padding up to the
    last dim (read never, gradient zero); ``slots``: (blank durations, label durations)."""
    device = logits.device
    targets, logit_lengths, target_lengths = (t.to(device=device, dtype=torch.int64).contiguous()
                                              for t in (targets, logit_lengths, target_lengths))
    log_likelihood, *_ = transducer_loss_forward(logits, targets, logit_lengths, target_lengths, list(slots[0]),
                                                 list(slots[1]), blank, num_tokens, num_dur, float(sigma),
                                                 _wants_grad(logits))
    return -log_likelihood


def rnnt_loss_triton(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                     target_lengths: torch.Tensor, *, blank: int = -1, reduction: str = "mean",
                     check: str = "host", num_classes: int | None = None) -> torch.Tensor:
    """:func:`losses.rnnt_loss` in Triton: logits [B, T, U + 1, V + 1 (+ padding)] fp32 or bf16 (copied
    only when not contiguous; padded rows are read in place, at their padded stride)."""
    num_classes = check_num_classes(logits, num_classes)
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_classes, check)
    _check_dtype(logits)
    slots = ((1,), (0,))  # one slot: a blank of duration 1 and a label of duration 0, no duration logits
    losses = _transducer_loss(logits.contiguous(), targets, logit_lengths, target_lengths, blank, num_classes, 0,
                              0.0, slots)
    return _reduce(losses, reduction)


def tdt_loss_triton(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                    target_lengths: torch.Tensor, *, blank: int, durations: Sequence[int] = (0, 1, 2, 3, 4),
                    sigma: float = 0.0, reduction: str = "mean", check: str = "host",
                    num_classes: int | None = None) -> torch.Tensor:
    """:func:`losses.tdt_loss` in Triton: logits [B, T, U + 1, V + 1 + len(durations) (+ padding)] fp32 or
    bf16."""
    durations, num_tokens = check_durations(logits, durations, num_classes)
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_tokens, check)
    _check_dtype(logits)
    slots = (tuple(durations), tuple(durations))  # slot i: duration column i (a blank of duration 0 is no edge)
    losses = _transducer_loss(logits.contiguous(), targets, logit_lengths, target_lengths, blank, num_tokens,
                              len(durations), float(sigma), slots)
    return _reduce(losses, reduction)


def lattice_kernel(weights: torch.Tensor, blank_durations: Sequence[int], label_durations: Sequence[int],
                   logit_lengths: torch.Tensor, target_lengths: torch.Tensor, want_beta: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The lattice kernel alone on edge weights the caller made: weights [B, 2 (blank, label), slots, T + U, U + 1]
    fp32 by anti-diagonal (slot i: a blank of ``blank_durations[i]`` frames, 0 for none, and a label of
    ``label_durations[i]``) -> (log P [B], alpha, beta or None), alpha and beta [B, T + U, U + 1] fp32 with
    LOG_ZERO at the nodes off each utterance's lattice."""
    batch, _, num_slots, num_diagonals, num_cols = weights.shape
    edges = _edge_tensor((tuple(blank_durations), tuple(label_durations)), weights.device)
    logit_lengths, target_lengths = (t.to(device=weights.device, dtype=torch.int64).contiguous()
                                     for t in (logit_lengths, target_lengths))
    alpha = torch.full((batch, num_diagonals, num_cols), LOG_ZERO, device=weights.device)
    beta = torch.full_like(alpha, LOG_ZERO) if want_beta else alpha
    log_likelihood = torch.empty(batch, device=weights.device)
    block_s = triton.next_power_of_2(num_slots)
    block_u = min(triton.next_power_of_2(num_cols), _MAX_BLOCK_U)
    with device_guard(weights.device):
        _lattice_kernel[(batch, 2 if want_beta else 1)](
            weights.contiguous(), alpha, beta, log_likelihood, logit_lengths, target_lengths, edges, num_diagonals,
            num_cols, NS=num_slots, BLOCK_S=block_s, BLOCK_U=block_u, num_warps=_lattice_warps(block_u, block_s))
    return log_likelihood, alpha, beta if want_beta else None


def _wants_grad(logits: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and logits.requires_grad


@functools.lru_cache(maxsize=64)
def _host_edge_tensor(slots: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    """The slots' blank and label durations as one int64 host tensor [2, slots] (pinned where CUDA is),
    made once per duration set."""
    tensor = torch.tensor(slots, dtype=torch.int64)
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


def _edge_tensor(slots: tuple[tuple[int, ...], tuple[int, ...]], device: torch.device) -> torch.Tensor:
    """The slots' durations on ``device``: one copy from pinned memory without waiting for the device (no
    host sync in the training step), and nothing kept on the device between calls (the OOMptimizer checks
    that probes leave no memory allocated)."""
    return _host_edge_tensor(slots).to(device, non_blocking=True)


def _check_dtype(logits: torch.Tensor) -> None:
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"logits: the Triton loss takes float32 or bfloat16, got {logits.dtype}")
