"""Transducer losses (RNN-T, TDT) as Triton kernels: the same lattice and results as :mod:`losses`.

Three kernels, each reading the logits at most once:

1. ``_normalize_kernel``, one program per lattice node (b, t, u): the log-normalizer of the token
   logits, the blank and target-label log-probabilities and (TDT) the duration log-softmax, into small
   fp32 buffers [B, T, U + 1] (durations [B, T, U + 1, D]).
2. ``_lattice_kernel``, one program per utterance for alpha over the anti-diagonals n = t + u (a block of
   u per step) and log P, and, when backward will run, a second one per utterance for beta over the
   diagonals in reverse, at the same time;
3. ``_grad_kernel`` (backward only), one program per node: the edge posteriors
   exp(alpha + w + beta(destination) - log P) and d loss / d logits, written once into one buffer of the
   logits' size and dtype (no fp32 copy of the logits is ever made).

Every offset into the logits is 64-bit, so any size that fits in memory works. Edges are described by
duration lists as in :func:`losses.lattice_log_likelihood`: RNN-T has one blank edge of duration 1 and
one label edge of duration 0 and no duration logits; TDT has a blank edge per duration > 0 and a label
edge per duration, each adding its duration log-probability. On a CPU the kernels run only under
Triton's interpreter (``TRITON_INTERPRET=1`` set before this module is imported).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Sequence

import torch
import triton
import triton.language as tl

from workbench.models.loss_inputs import LOG_ZERO, check_durations
from workbench.models.loss_inputs import check_inputs as _check_inputs
from workbench.models.loss_inputs import reduce_losses as _reduce

_LOG_ZERO = tl.constexpr(LOG_ZERO)
_MAX_BLOCK_V = 4096  # vocabulary block of the per-node kernels (larger vocabularies loop)
_MAX_BLOCK_U = 256   # label block of the per-utterance kernels (longer targets loop)
_SHAPE_ARGS = ["T", "U1", "U"]  # change with every batch: one compiled kernel for all their values


@triton.jit
def _lse_add(m, s, x):
    """Online log-sum-exp: (running max, scaled sum) after adding x."""
    m_new = tl.maximum(m, x)
    return m_new, s * tl.exp(m - m_new) + tl.exp(x - m_new)


@triton.jit
def _edge_weight(tok_ptr, dur_ptr, node, col, mask, ND: tl.constexpr):
    """Log-weight of an edge leaving ``node``: its token log-prob plus (TDT) duration column ``col``."""
    w = tl.load(tok_ptr + node, mask=mask, other=_LOG_ZERO)
    if ND > 0:
        w += tl.load(dur_ptr + node * ND + col, mask=mask, other=0.0)
    return w


@triton.jit
def _node_coords(T, U1, logit_lengths_ptr, target_lengths_ptr):
    """(b, t, u, T_b, U_b, on the utterance's lattice) of this program's node; all int64."""
    row = tl.program_id(0).to(tl.int64)
    b = row // (T * U1)
    rem = row % (T * U1)
    t = rem // U1
    u = rem % U1
    t_len = tl.load(logit_lengths_ptr + b).to(tl.int64)
    u_len = tl.load(target_lengths_ptr + b).to(tl.int64)
    return row, b, t, u, t_len, u_len, (t < t_len) & (u <= u_len)


@triton.jit
def _utterance(T, U1, logit_lengths_ptr, target_lengths_ptr):
    """(b, T_b, U_b, offset of node (b, 0, 0)) of this program's utterance; all int64."""
    b = tl.program_id(0).to(tl.int64)
    t_len = tl.load(logit_lengths_ptr + b).to(tl.int64)
    u_len = tl.load(target_lengths_ptr + b).to(tl.int64)
    return b, t_len, u_len, b * T * U1


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _normalize_kernel(logits_ptr, targets_ptr, logit_lengths_ptr, target_lengths_ptr, lse_ptr, blank_ptr,
                      label_ptr, dur_ptr, T, U1, C, V_TOK, U, blank, sigma,
                      ND: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    row, b, t, u, t_len, u_len, valid = _node_coords(T, U1, logit_lengths_ptr, target_lengths_ptr)
    row_ptr = logits_ptr + row * C
    offs = tl.arange(0, BLOCK_V)
    m = tl.full([BLOCK_V], -3.0e38, tl.float32)
    s = tl.zeros([BLOCK_V], tl.float32)
    for v0 in range(0, V_TOK, BLOCK_V):
        x = tl.load(row_ptr + v0 + offs, mask=valid & (v0 + offs < V_TOK), other=float("-inf")).to(tl.float32)
        m, s = _lse_add(m, s, x)
    m_all = tl.max(m, axis=0)
    lse = tl.where(valid, m_all + tl.log(tl.where(valid, tl.sum(s * tl.exp(m - m_all), axis=0), 1.0)), 0.0)
    tl.store(lse_ptr + row, lse)
    blank_logp = tl.load(row_ptr + blank, mask=valid, other=0.0).to(tl.float32) - lse - sigma
    tl.store(blank_ptr + row, tl.where(valid, blank_logp, _LOG_ZERO))
    has_label = valid & (u < u_len)
    target = tl.load(targets_ptr + b * U + u, mask=has_label, other=0).to(tl.int64)
    label_logp = tl.load(row_ptr + target, mask=has_label, other=0.0).to(tl.float32) - lse - sigma
    tl.store(label_ptr + row, tl.where(has_label, label_logp, _LOG_ZERO))
    if ND > 0:
        doffs = tl.arange(0, BLOCK_D)
        dmask = doffs < ND
        dx = tl.load(row_ptr + V_TOK + doffs, mask=valid & dmask, other=0.0).to(tl.float32)
        dx = tl.where(dmask, dx, float("-inf"))
        dmax = tl.max(dx, axis=0)
        dlse = dmax + tl.log(tl.sum(tl.exp(dx - dmax), axis=0))
        tl.store(dur_ptr + row * ND + doffs, tl.where(valid, dx - dlse, 0.0), mask=dmask)


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _lattice_kernel(blank_ptr, label_ptr, dur_ptr, alpha_ptr, beta_ptr, ll_ptr, logit_lengths_ptr, target_lengths_ptr,
                    blank_dur_ptr, blank_col_ptr, label_dur_ptr, label_col_ptr, T, U1,
                    NB: tl.constexpr, NL: tl.constexpr, ND: tl.constexpr, BLOCK_U: tl.constexpr):
    """Grid (B, 1): alpha and log P. Grid (B, 2): beta too, by a second program per utterance at once."""
    b, t_len, u_len, base = _utterance(T, U1, logit_lengths_ptr, target_lengths_ptr)
    if tl.program_id(1) == 0:
        _alpha(blank_ptr, label_ptr, dur_ptr, alpha_ptr, ll_ptr, blank_dur_ptr, blank_col_ptr, label_dur_ptr,
               label_col_ptr, U1, b, t_len, u_len, base, NB, NL, ND, BLOCK_U)
    else:
        _beta(blank_ptr, label_ptr, dur_ptr, beta_ptr, blank_dur_ptr, blank_col_ptr, label_dur_ptr, label_col_ptr,
              U1, t_len, u_len, base, NB, NL, ND, BLOCK_U)


@triton.jit
def _alpha(blank_ptr, label_ptr, dur_ptr, alpha_ptr, ll_ptr, blank_dur_ptr, blank_col_ptr, label_dur_ptr,
           label_col_ptr, U1, b, t_len, u_len, base,
           NB: tl.constexpr, NL: tl.constexpr, ND: tl.constexpr, BLOCK_U: tl.constexpr):
    """alpha over the diagonals of utterance b, then log P into ll_ptr[b]."""
    tl.store(alpha_ptr + base, 0.0)
    tl.debug_barrier()
    offs = tl.arange(0, BLOCK_U).to(tl.int64)
    for n in range(1, t_len + u_len):
        for u0 in range(0, u_len + 1, BLOCK_U):
            u = u0 + offs
            t = n - u
            valid = (u <= u_len) & (t >= 0) & (t < t_len)
            m = tl.full([BLOCK_U], _LOG_ZERO, tl.float32)
            s = tl.zeros([BLOCK_U], tl.float32)
            for i in tl.static_range(NB):  # blank of duration d from (t - d, u)
                d = tl.load(blank_dur_ptr + i).to(tl.int64)
                ok = valid & (t - d >= 0)
                src = base + (t - d) * U1 + u
                x = tl.load(alpha_ptr + src, mask=ok, other=_LOG_ZERO) + _edge_weight(
                    blank_ptr, dur_ptr, src, tl.load(blank_col_ptr + i), ok, ND)
                m, s = _lse_add(m, s, tl.where(ok, x, _LOG_ZERO))
            for i in tl.static_range(NL):  # label u with duration d from (t - d, u - 1)
                d = tl.load(label_dur_ptr + i).to(tl.int64)
                ok = valid & (t - d >= 0) & (u >= 1)
                src = base + (t - d) * U1 + u - 1
                x = tl.load(alpha_ptr + src, mask=ok, other=_LOG_ZERO) + _edge_weight(
                    label_ptr, dur_ptr, src, tl.load(label_col_ptr + i), ok, ND)
                m, s = _lse_add(m, s, tl.where(ok, x, _LOG_ZERO))
            tl.store(alpha_ptr + base + t * U1 + u, m + tl.log(s), mask=valid)
        tl.debug_barrier()
    m1 = tl.full((), _LOG_ZERO, tl.float32)
    s1 = tl.zeros((), tl.float32)
    for i in tl.static_range(NB):  # the ending blank lands exactly on frame T_b at u = U_b
        d = tl.load(blank_dur_ptr + i).to(tl.int64)
        ok = t_len - d >= 0
        src = base + (t_len - d) * U1 + u_len
        x = tl.load(alpha_ptr + src, mask=ok, other=_LOG_ZERO) + _edge_weight(
            blank_ptr, dur_ptr, src, tl.load(blank_col_ptr + i), ok, ND)
        m1, s1 = _lse_add(m1, s1, tl.where(ok, x, _LOG_ZERO))
    tl.store(ll_ptr + b, m1 + tl.log(s1))


@triton.jit
def _beta(blank_ptr, label_ptr, dur_ptr, beta_ptr, blank_dur_ptr, blank_col_ptr, label_dur_ptr, label_col_ptr,
          U1, t_len, u_len, base, NB: tl.constexpr, NL: tl.constexpr, ND: tl.constexpr, BLOCK_U: tl.constexpr):
    """beta over the diagonals of one utterance, in reverse."""
    offs = tl.arange(0, BLOCK_U).to(tl.int64)
    for k in range(0, t_len + u_len):
        n = t_len + u_len - 1 - k
        for u0 in range(0, u_len + 1, BLOCK_U):
            u = u0 + offs
            t = n - u
            valid = (u <= u_len) & (t >= 0) & (t < t_len)
            node = base + t * U1 + u
            m = tl.full([BLOCK_U], _LOG_ZERO, tl.float32)
            s = tl.zeros([BLOCK_U], tl.float32)
            for i in tl.static_range(NB):  # blank of duration d to (t + d, u), or the end
                d = tl.load(blank_dur_ptr + i).to(tl.int64)
                w = _edge_weight(blank_ptr, dur_ptr, node, tl.load(blank_col_ptr + i), valid, ND)
                inner = valid & (t + d < t_len)
                ending = valid & (t + d == t_len) & (u == u_len)
                after = tl.load(beta_ptr + base + (t + d) * U1 + u, mask=inner, other=_LOG_ZERO)
                x = tl.where(inner, after + w, tl.where(ending, w, _LOG_ZERO))
                m, s = _lse_add(m, s, x)
            for i in tl.static_range(NL):  # label u + 1 with duration d to (t + d, u + 1)
                d = tl.load(label_dur_ptr + i).to(tl.int64)
                inner = valid & (t + d < t_len) & (u < u_len)
                w = _edge_weight(label_ptr, dur_ptr, node, tl.load(label_col_ptr + i), inner, ND)
                after = tl.load(beta_ptr + base + (t + d) * U1 + u + 1, mask=inner, other=_LOG_ZERO)
                m, s = _lse_add(m, s, tl.where(inner, after + w, _LOG_ZERO))
            tl.store(beta_ptr + node, m + tl.log(s), mask=valid)
        tl.debug_barrier()


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _grad_kernel(logits_ptr, grad_ptr, targets_ptr, logit_lengths_ptr, target_lengths_ptr, lse_ptr, blank_ptr,
                 label_ptr, dur_ptr, alpha_ptr, beta_ptr, ll_ptr, scale_ptr,
                 blank_dur_ptr, blank_col_ptr, label_dur_ptr, label_col_ptr, T, U1, C, V_TOK, U, blank,
                 NB: tl.constexpr, NL: tl.constexpr, ND: tl.constexpr, BLOCK_V: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    row, b, t, u, t_len, u_len, valid = _node_coords(T, U1, logit_lengths_ptr, target_lengths_ptr)
    base = b * T * U1
    log_p = tl.load(ll_ptr + b)
    log_p = tl.where(log_p > _LOG_ZERO / 2, log_p, 0.0)  # an impossible utterance gets zero gradient
    alpha = tl.load(alpha_ptr + row, mask=valid, other=_LOG_ZERO) - log_p
    doffs = tl.arange(0, BLOCK_D)
    dur_posterior = tl.zeros([BLOCK_D], tl.float32)
    blank_posterior = 0.0
    for i in tl.static_range(NB):
        d = tl.load(blank_dur_ptr + i).to(tl.int64)
        col = tl.load(blank_col_ptr + i)
        w = _edge_weight(blank_ptr, dur_ptr, row, col, valid, ND)
        inner = valid & (t + d < t_len)
        ending = valid & (t + d == t_len) & (u == u_len)
        after = tl.load(beta_ptr + base + (t + d) * U1 + u, mask=inner, other=_LOG_ZERO)
        after = tl.where(inner, after, tl.where(ending, 0.0, _LOG_ZERO))
        posterior = tl.where(valid, tl.exp(alpha + w + after), 0.0)
        blank_posterior += posterior
        dur_posterior += tl.where(doffs == col, posterior, 0.0)
    label_posterior = 0.0
    for i in tl.static_range(NL):
        d = tl.load(label_dur_ptr + i).to(tl.int64)
        col = tl.load(label_col_ptr + i)
        inner = valid & (t + d < t_len) & (u < u_len)
        w = _edge_weight(label_ptr, dur_ptr, row, col, inner, ND)
        after = tl.load(beta_ptr + base + (t + d) * U1 + u + 1, mask=inner, other=_LOG_ZERO)
        posterior = tl.where(inner, tl.exp(alpha + w + after), 0.0)
        label_posterior += posterior
        dur_posterior += tl.where(doffs == col, posterior, 0.0)
    occupancy = blank_posterior + label_posterior
    scale = tl.load(scale_ptr + b).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + b * U + u, mask=valid & (u < u_len), other=-1).to(tl.int64)
    row_ptr = logits_ptr + row * C
    grad_row = grad_ptr + row * C
    offs = tl.arange(0, BLOCK_V)
    for v0 in range(0, V_TOK, BLOCK_V):
        v = v0 + offs
        in_vocab = v < V_TOK
        z = tl.load(row_ptr + v, mask=valid & in_vocab, other=0.0).to(tl.float32)
        g = occupancy * tl.exp(z - lse) - tl.where(v == blank, blank_posterior, 0.0) \
            - tl.where(v == target, label_posterior, 0.0)
        tl.store(grad_row + v, tl.where(valid, g * scale, 0.0).to(grad_ptr.dtype.element_ty), mask=in_vocab)
    if ND > 0:
        dmask = doffs < ND
        dur_logp = tl.load(dur_ptr + row * ND + doffs, mask=valid & dmask, other=0.0)
        g = occupancy * tl.exp(dur_logp) - dur_posterior
        tl.store(grad_row + V_TOK + doffs, tl.where(valid, g * scale, 0.0).to(grad_ptr.dtype.element_ty),
                 mask=dmask)


class _TritonTransducerLoss(torch.autograd.Function):
    """Per-utterance -log P [B]; the logits' gradient is computed in backward, into one new buffer."""

    @staticmethod
    def forward(ctx, logits, targets, logit_lengths, target_lengths, blank, num_tokens, sigma, edges, want_grad):
        batch, num_frames, num_cols, num_classes = logits.shape
        num_dur = num_classes - num_tokens
        device = logits.device
        small = dict(device=device, dtype=torch.float32)
        lse = torch.empty(batch, num_frames, num_cols, **small)
        blank_logp, label_logp = torch.empty_like(lse), torch.empty_like(lse)
        dur_logp = torch.empty(batch, num_frames, num_cols, max(num_dur, 1), **small)
        targets = targets.to(device=device, dtype=torch.int64).contiguous()
        if targets.numel() == 0:  # U = 0: no label is read, but the kernels need a real pointer
            targets = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        logit_lengths = logit_lengths.to(device=device, dtype=torch.int64).contiguous()
        target_lengths = target_lengths.to(device=device, dtype=torch.int64).contiguous()
        edge_tensors = _edge_tensors(edges, device)
        rows = batch * num_frames * num_cols
        block_v = min(triton.next_power_of_2(num_tokens), _MAX_BLOCK_V)
        block_d = triton.next_power_of_2(max(num_dur, 1))
        block_u = min(triton.next_power_of_2(num_cols), _MAX_BLOCK_U)
        _normalize_kernel[(rows,)](logits, targets, logit_lengths, target_lengths, lse, blank_logp, label_logp,
                                   dur_logp, num_frames, num_cols, num_classes, num_tokens, num_cols - 1, blank,
                                   float(sigma), ND=num_dur, BLOCK_V=block_v, BLOCK_D=block_d)
        alpha, beta = torch.empty_like(lse), torch.empty_like(lse)
        log_likelihood = torch.empty(batch, **small)
        lattice = dict(NB=len(edges[0]), NL=len(edges[2]), ND=num_dur, BLOCK_U=block_u)
        _lattice_kernel[(batch, 2 if want_grad else 1)](  # beta alongside alpha only when backward will run
            blank_logp, label_logp, dur_logp, alpha, beta, log_likelihood, logit_lengths, target_lengths,
            *edge_tensors, num_frames, num_cols, **lattice)
        ctx.save_for_backward(logits, targets, logit_lengths, target_lengths, lse, blank_logp, label_logp,
                              dur_logp, alpha, beta, log_likelihood, *edge_tensors)
        ctx.sizes = (blank, num_tokens, block_v, block_d, lattice)
        return -log_likelihood

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():
            raise RuntimeError("transducer losses: second derivatives are not supported (the gradient is computed "
                               "analytically); use create_graph=False")
        (logits, targets, logit_lengths, target_lengths, lse, blank_logp, label_logp, dur_logp, alpha, beta,
         log_likelihood, *edge_tensors) = ctx.saved_tensors
        blank, num_tokens, block_v, block_d, lattice = ctx.sizes
        batch, num_frames, num_cols, num_classes = logits.shape
        grad = torch.empty_like(logits)
        scale = grad_output.to(torch.float32).contiguous()
        _grad_kernel[(batch * num_frames * num_cols,)](
            logits, grad, targets, logit_lengths, target_lengths, lse, blank_logp, label_logp, dur_logp, alpha,
            beta, log_likelihood, scale, *edge_tensors, num_frames, num_cols, num_classes, num_tokens,
            num_cols - 1, blank, NB=lattice["NB"], NL=lattice["NL"], ND=lattice["ND"], BLOCK_V=block_v,
            BLOCK_D=block_d)
        return grad, None, None, None, None, None, None, None, None


def rnnt_loss_triton(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                     target_lengths: torch.Tensor, *, blank: int = -1, reduction: str = "mean",
                     check: str = "host") -> torch.Tensor:
    """:func:`losses.rnnt_loss` in Triton: logits [B, T, U + 1, V + 1] fp32 or bf16 (copied only when not
    contiguous)."""
    num_classes = logits.shape[-1] if logits.dim() == 4 else 0
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_classes, check)
    _check_dtype(logits)
    edges = ((1,), (0,), (0,), (0,))  # blank durations, their duration columns; label durations, columns
    with _device_guard(logits.device):
        losses = _TritonTransducerLoss.apply(logits.contiguous(), targets, logit_lengths, target_lengths, blank,
                                             num_classes, 0.0, edges, _wants_grad(logits))
    return _reduce(losses, reduction)


def tdt_loss_triton(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                    target_lengths: torch.Tensor, *, blank: int, durations: Sequence[int] = (0, 1, 2, 3, 4),
                    sigma: float = 0.0, reduction: str = "mean", check: str = "host") -> torch.Tensor:
    """:func:`losses.tdt_loss` in Triton: logits [B, T, U + 1, V + 1 + len(durations)] fp32 or bf16."""
    durations, num_tokens = check_durations(logits, durations)
    blank = _check_inputs(logits, targets, logit_lengths, target_lengths, blank, num_tokens, check)
    _check_dtype(logits)
    blank_edges = [(d, i) for i, d in enumerate(durations) if d > 0]
    edges = (tuple(d for d, _ in blank_edges), tuple(i for _, i in blank_edges), tuple(durations),
             tuple(range(len(durations))))
    with _device_guard(logits.device):
        losses = _TritonTransducerLoss.apply(logits.contiguous(), targets, logit_lengths, target_lengths, blank,
                                             num_tokens, float(sigma), edges, _wants_grad(logits))
    return _reduce(losses, reduction)


def _device_guard(device: torch.device):
    """Kernels launch on the current CUDA device: make it the logits' (backward runs on the autograd
    engine's thread for that device already)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _wants_grad(logits: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and logits.requires_grad


@functools.lru_cache(maxsize=64)
def _host_edge_tensors(edges: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    """The edge lists as int64 host tensors (pinned where CUDA is), made once per edge set."""
    tensors = [torch.tensor(x, dtype=torch.int64) for x in edges]
    return [t.pin_memory() for t in tensors] if torch.cuda.is_available() else tensors


def _edge_tensors(edges: tuple[tuple[int, ...], ...], device: torch.device) -> list[torch.Tensor]:
    """The edge lists on ``device``: copied from pinned memory without waiting for the device (no host
    sync in the training step), and nothing kept on the device between calls (the OOMptimizer checks
    that probes leave no memory allocated)."""
    return [t.to(device, non_blocking=True) for t in _host_edge_tensors(edges)]


def _check_dtype(logits: torch.Tensor) -> None:
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"logits: the Triton loss takes float32 or bfloat16, got {logits.dtype}")
