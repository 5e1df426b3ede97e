"""The Triton kernels of :mod:`workbench.decoding.fused` (imported only when they are checked or run: on CPU,
Triton's interpreter runs them when TRITON_INTERPRET=1 is set before this module and triton are imported).

Loop bounds are compile-time constants throughout (the interpreter needs them so).
"""

import triton
import triton.language as tl


@triton.jit
def gather_window_kernel(enc_proj, pred_proj, time, enc_out, pred_out,
                         frame_capacity, stride_eb, stride_et,
                         J: tl.constexpr, W: tl.constexpr, BLOCK_J: tl.constexpr, RELU: tl.constexpr):
    """One (utterance, window offset) row: the encoder projection of its frame and the predictor projection,
    or with RELU the joint's hidden row relu(enc + pred) alone (a half-precision sum taken in float32 and
    rounded, as torch's add does, so the output layer sees the very values the joint would give it)."""
    row = tl.program_id(0)
    b = row // W
    w = row % W
    frame = tl.minimum(tl.load(time + b) + w, frame_capacity - 1)
    for j0 in range(0, J, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        m = j < J
        e = tl.load(enc_proj + b * stride_eb + frame * stride_et + j, mask=m)
        p = tl.load(pred_proj + b * J + j, mask=m)
        if RELU:
            if e.dtype.is_fp16() or e.dtype.is_bf16():
                hidden = (e.to(tl.float32) + p.to(tl.float32)).to(enc_out.dtype.element_ty, fp_downcast_rounding="rtne")
            else:
                hidden = e + p
            relu = tl.maximum(hidden, 0.0, propagate_nan=tl.PropagateNan.ALL)     # NaN stays NaN, as in torch
            tl.store(enc_out + row * J + j, relu.to(enc_out.dtype.element_ty), mask=m)
        else:
            tl.store(enc_out + row * J + j, e, mask=m)
            tl.store(pred_out + row * J + j, p, mask=m)


@triton.jit
def decide_kernel(logits, stride_l, durations, tok_out, dur_out, score_out, blank, V1,
                  K: tl.constexpr, TDT: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """The greedy decision of one joint row: log-softmax argmax token (ties: the lowest id), frames to move,
    log-probability (for TDT with the duration's)."""
    r = tl.program_id(0)
    acc = score_out.dtype.element_ty
    offs_v = tl.arange(0, BLOCK_V)
    base = logits + r * stride_l
    x = tl.load(base + offs_v, mask=offs_v < V1, other=-float("inf")).to(acc)
    top = tl.max(x, axis=0)
    lp = x - (top + tl.log(tl.sum(tl.exp(x - top), axis=0)))
    best = tl.max(lp, axis=0)
    tok = tl.min(tl.where(lp == best, offs_v, BLOCK_V), axis=0).to(tl.int64)
    score = best
    dur = (tok == blank).to(tl.int64)
    if TDT:
        offs_k = tl.arange(0, BLOCK_K)
        xd = tl.load(base + V1 + offs_k, mask=offs_k < K, other=-float("inf")).to(acc)
        top_d = tl.max(xd, axis=0)
        lpd = xd - (top_d + tl.log(tl.sum(tl.exp(xd - top_d), axis=0)))
        best_d = tl.max(lpd, axis=0)
        index_d = tl.min(tl.where(lpd == best_d, offs_k, BLOCK_K), axis=0)
        dur = tl.load(durations + index_d)
        dur = tl.where((tok == blank) & (dur == 0), 1, dur)        # a blank always moves
        score = score + best_d
    tl.store(tok_out + r, tok)
    tl.store(dur_out + r, dur)
    tl.store(score_out + r, score)


@triton.jit
def scan_kernel(tok, dur, score, rows, time, lengths, labels, step_duration, scores, symbols_at_frame, active,
                searching, flag, blank, batch,
                W: tl.constexpr, TDT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program for every row: the blank-window scan of the W decisions per row and the masked update of
    the loop state, and the inner-loop flag."""
    acc = scores.dtype.element_ty
    offs_b = tl.arange(0, BLOCK_B)
    offs_w = tl.arange(0, BLOCK_W)
    mb = offs_b < batch
    m2 = mb[:, None] & (offs_w[None, :] < W)
    idx = offs_b[:, None] * W + offs_w[None, :]
    tok_w = tl.load(tok + idx, mask=m2, other=0)
    dur_w = tl.load(dur + idx, mask=m2, other=0)
    score_w = tl.load(score + idx, mask=m2, other=0.0).to(acc)
    t0 = tl.load(time + offs_b, mask=mb, other=0)
    length = tl.load(lengths + offs_b, mask=mb, other=0)
    row = (tl.load(rows + offs_b, mask=mb, other=0) != 0) & mb
    old_label = tl.load(labels + offs_b, mask=mb, other=0)
    old_duration = tl.load(step_duration + offs_b, mask=mb, other=0)
    old_score = tl.load(scores + offs_b, mask=mb, other=0.0)
    symbols = tl.load(symbols_at_frame + offs_b, mask=mb, other=0)
    tl.debug_barrier()  # every read first: ``rows`` is ``active`` or ``searching``, which are written below
    valid_w = m2 & (t0[:, None] + offs_w[None, :] < length[:, None])
    zero = tl.full([BLOCK_B, BLOCK_W], 0, dtype=acc)
    if TDT:                                     # follow the blank jumps from offset 0
        stop = tl.full([BLOCK_B], 0, dtype=tl.int64)
        gained = tl.full([BLOCK_B], 0, dtype=acc)
        for _ in range(W):
            here = offs_w[None, :] == stop[:, None]
            moves = tl.sum((here & valid_w & (tok_w == blank)).to(tl.int32), axis=1) > 0
            gained = gained + tl.where(moves, tl.sum(tl.where(here, score_w, zero), axis=1), 0.0)
            stop = tl.where(moves, stop + tl.sum(tl.where(here, dur_w, 0), axis=1), stop)
        at_stop = tl.minimum(stop, W - 1)
        here = offs_w[None, :] == at_stop[:, None]
        found = (stop < W) & (tl.sum((here & valid_w).to(tl.int32), axis=1) > 0)
        label = tl.sum(tl.where(here, tok_w, 0), axis=1)
        label_duration = tl.sum(tl.where(here, dur_w, 0), axis=1)
        total = gained + tl.where(found, tl.sum(tl.where(here, score_w, zero), axis=1), 0.0)
        moved = stop
    else:                                       # every blank moves one frame: go to the first label
        is_label = valid_w & (tok_w != blank)
        first = tl.min(tl.where(is_label, offs_w[None, :], BLOCK_W), axis=1)
        found = first < BLOCK_W
        moved = tl.where(found, first, W).to(tl.int64)       # the blank frames passed
        here = offs_w[None, :] == tl.where(found, first, 0)[:, None]
        label = tl.sum(tl.where(here, tok_w, 0), axis=1)
        label_duration = tl.full([BLOCK_B], 0, dtype=tl.int64)
        total = tl.sum(tl.where((offs_w[None, :] <= moved[:, None]) & valid_w, score_w, zero), axis=1)
    found = row & found
    tl.store(labels + offs_b, tl.where(found, label, old_label), mask=mb)
    tl.store(step_duration + offs_b, tl.where(found, label_duration, old_duration), mask=mb)
    tl.store(scores + offs_b, old_score + tl.where(row, total, 0.0), mask=mb)
    moved = tl.where(row, moved, 0)
    t1 = t0 + moved
    tl.store(time + offs_b, t1, mask=mb)
    tl.store(symbols_at_frame + offs_b, tl.where(moved > 0, 0, symbols), mask=mb)
    still = (t1 < length) & mb
    tl.store(active + offs_b, still.to(tl.uint8), mask=mb)
    again = row & (~found) & still
    tl.store(searching + offs_b, again.to(tl.uint8), mask=mb)
    tl.store(flag, (tl.max(again.to(tl.int32), axis=0) > 0).to(tl.uint8))


@triton.jit
def emit_kernel(labels, time, lengths, active, emit, num_emitted, tokens, timestamps, step_duration,
                symbols_at_frame, flag, batch, capacity, max_symbols, BLOCK_B: tl.constexpr):
    b = tl.arange(0, BLOCK_B)
    m = b < batch
    rows = (tl.load(active + b, mask=m, other=0) != 0) & m
    count = tl.load(num_emitted + b, mask=m, other=0)
    t0 = tl.load(time + b, mask=m, other=0)
    label = tl.load(labels + b, mask=m, other=0)
    duration = tl.load(step_duration + b, mask=m, other=0)
    old_symbols = tl.load(symbols_at_frame + b, mask=m, other=0)
    length = tl.load(lengths + b, mask=m, other=0)
    tl.debug_barrier()  # every read first (``active`` is read and written)
    # as the torch stage: every row writes at its count (rows not emitting write past their end)
    tl.store(tokens + b * capacity + count, label, mask=m)
    tl.store(timestamps + b * capacity + count, t0, mask=m)
    tl.store(num_emitted + b, count + rows.to(tl.int64), mask=m)
    tl.store(emit + b, rows.to(tl.uint8), mask=m)
    moved = tl.where(rows, duration, 0)
    tl.store(step_duration + b, moved, mask=m)
    symbols = old_symbols + rows.to(tl.int64)
    symbols = tl.where(moved > 0, 0, symbols)
    forced = rows & (symbols >= max_symbols)
    t1 = t0 + moved + forced.to(tl.int64)
    tl.store(time + b, t1, mask=m)
    tl.store(symbols_at_frame + b, tl.where(forced, 0, symbols), mask=m)
    still = (t1 < length) & m
    tl.store(active + b, still.to(tl.uint8), mask=m)
    tl.store(flag, (tl.max(still.to(tl.int32), axis=0) > 0).to(tl.uint8))


@triton.jit
def select_kernel(emit,
                  d0, s0, n01, n02, d00, d01, d02, s00, s01, s02,
                  d1, s1, n11, n12, d10, d11, d12, s10, s11, s12,
                  d2, s2, n21, n22, d20, d21, d22, s20, s21, s22, LONGEST: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    slot = tl.program_id(1)                     # which of up to three tensors (of one dtype)
    dst, src, n1, n2, ds0, ds1, ds2, ss0, ss1, ss2 = d0, s0, n01, n02, d00, d01, d02, s00, s01, s02
    if slot == 1:
        dst, src, n1, n2, ds0, ds1, ds2, ss0, ss1, ss2 = d1, s1, n11, n12, d10, d11, d12, s10, s11, s12
    if slot == 2:
        dst, src, n1, n2, ds0, ds1, ds2, ss0, ss1, ss2 = d2, s2, n21, n22, d20, d21, d22, s20, s21, s22
    if tl.load(emit + b) != 0:
        for i0 in range(0, LONGEST, BLOCK):     # constant bounds (the interpreter needs them)
            i = i0 + tl.arange(0, BLOCK)
            m = i < n1 * n2
            i1 = i // n2
            i2 = i % n2
            value = tl.load(src + b * ss0 + i1 * ss1 + i2 * ss2, mask=m)
            tl.store(dst + b * ds0 + i1 * ds1 + i2 * ds2, value, mask=m)


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))                # in (0, 1]: no overflow for any x
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def lstm_cell_kernel(gates, stride_g, table, stride_t, labels, h, c, stride_h, stride_c, emit,
                     H: tl.constexpr, BLOCK_H: tl.constexpr, FIRST: tl.constexpr):
    """One LSTM layer's pointwise step for one utterance and block of units: the gates i, f, g, o (PyTorch's
    order) from the gate GEMM, in the first layer plus the label's row of the input table; the new cell and
    hidden state are written in place where the row emits (elsewhere the old state stays)."""
    b = tl.program_id(0)
    j = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m = j < H
    acc = table.dtype.element_ty
    row = gates + b * stride_g + j
    gi = tl.load(row, mask=m, other=0.0).to(acc)
    gf = tl.load(row + H, mask=m, other=0.0).to(acc)
    gg = tl.load(row + 2 * H, mask=m, other=0.0).to(acc)
    go = tl.load(row + 3 * H, mask=m, other=0.0).to(acc)
    if FIRST:
        tok = table + tl.load(labels + b) * stride_t + j
        gi += tl.load(tok, mask=m, other=0.0)
        gf += tl.load(tok + H, mask=m, other=0.0)
        gg += tl.load(tok + 2 * H, mask=m, other=0.0)
        go += tl.load(tok + 3 * H, mask=m, other=0.0)
    c_old = tl.load(c + b * stride_c + j, mask=m, other=0.0).to(acc)
    c_new = tl.sigmoid(gf) * c_old + tl.sigmoid(gi) * _tanh(gg)
    h_new = tl.sigmoid(go) * _tanh(c_new)
    write = m & (tl.load(emit + b) != 0)
    tl.store(c + b * stride_c + j, c_new.to(c.dtype.element_ty), mask=write)
    tl.store(h + b * stride_h + j, h_new.to(h.dtype.element_ty), mask=write)
