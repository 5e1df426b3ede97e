"""Triton kernels for the label-looping stages (``kernels="triton"``): the same decisions, fewer launches.

Five kernels replace the chains of small torch ops around the joint and the predictor:

- :func:`gather_window`: the encoder projections of frames time..time+W-1 and the predictor projection,
  one row per (utterance, frame), ready for the joint (plain copies).
- :func:`search_epilogue`: after the joint (whose matrix product stays in cuBLAS): the log-softmax argmax
  over tokens (and durations) of every (utterance, frame) pair in one kernel, then in one more the
  blank-window scan and the masked update of time, label, duration, score, symbols, active and searching
  rows, and the inner-loop flag.
- :func:`emit_update` and :func:`select_rows`: the emit bookkeeping (tokens, timestamps, counts, frame
  moves, the max-symbols rule, active rows and the outer-loop flag) in one single-program kernel, and the
  masked keep of the new predictor state and projection in one more.

Tokens and timestamps equal the torch stages' exactly; scores are the same sums taken in another order.
On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1 before triton is imported; slow, for tests).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

KERNELS = ("torch", "triton")


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None when they can; on CPU: the interpreter)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        return f"triton is not importable ({type(e).__name__}: {e})"
    if device.type == "cpu" and not _interpreting():
        return "on CPU the Triton kernels need its interpreter: set TRITON_INTERPRET=1 before triton is imported"
    if device.type not in ("cuda", "cpu"):
        return f"Triton kernels run on CUDA (or the CPU interpreter), not {device.type}"
    return None


def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (chosen when triton.language is first imported)."""
    import triton
    import triton.language as tl

    return bool(triton.knobs.runtime.interpret) and type(tl.max).__name__ == "InterpretedFunction"


@functools.cache
def _kernels() -> dict:
    """The jitted kernels by name."""
    from workbench.decoding import fused_kernels as k

    return {"gather": k.gather_window_kernel, "decide": k.decide_kernel, "scan": k.scan_kernel,
            "emit": k.emit_kernel, "select": k.select_kernel}


def _k(name: str, t: Tensor):
    reason = triton_unavailable_reason(t.device)
    if reason:
        raise RuntimeError(f"kernels='triton': {reason}")
    return _kernels()[name]


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _bytes(flag: Tensor) -> Tensor:
    """A bool tensor as uint8 (the same memory), which every Triton backend stores to."""
    return flag.view(torch.uint8)


def gather_window(buf) -> tuple[Tensor, Tensor]:
    """Joint inputs of frames time..time+W-1 (clamped to the buffer) for every row: (enc [B*W, J],
    pred [B*W, J])."""
    bc, w = buf.batch_capacity, buf.window
    j = buf.enc_proj.shape[-1]
    if buf.enc_proj.stride(-1) != 1 or buf.pred_proj.stride() != (j, 1):
        raise ValueError("fused kernels need the encoder and predictor projections contiguous in their last dim")
    enc = buf.enc_proj.new_empty(bc * w, j)
    pred = buf.pred_proj.new_empty(bc * w, j)
    _k("gather", enc)[(bc * w,)](buf.enc_proj, buf.pred_proj, buf.time, enc, pred, buf.frame_capacity,
                                buf.enc_proj.stride(0), buf.enc_proj.stride(1),
                                J=j, W=w, BLOCK_J=min(1024, _pow2(j)))
    return enc, pred


def search_epilogue(buf, logits: Tensor, rows: Tensor) -> None:
    """One search step for ``rows`` ([B] bool, read before anything is written) from the joint's logits of
    the window ([B*W, outputs]): one kernel decides every (row, frame) pair, one more scans each row's
    window and updates the loop state as the torch stages do, and ``searching_any``."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    k = 0 if buf.durations is None else buf.durations.shape[0]
    tdt = buf.durations is not None
    v1, n = buf.num_token_outputs, logits.shape[0]
    token, duration = buf.time.new_empty(n), buf.time.new_empty(n)
    score = buf.scores.new_empty(n)
    _k("decide", logits)[(n,)](logits, logits.stride(0), buf.durations if tdt else buf.time, token, duration, score,
                               buf.blank_id, v1, K=max(k, 1), TDT=tdt, BLOCK_V=_pow2(v1), BLOCK_K=_pow2(max(k, 1)))
    _k("scan", logits)[(1,)](token, duration, score, _bytes(rows), buf.time, buf.lengths, buf.labels,
                             buf.step_duration, buf.scores, buf.symbols_at_frame, _bytes(buf.active),
                             _bytes(buf.searching), _bytes(buf.searching_any), buf.blank_id, buf.batch_capacity,
                             W=buf.window, TDT=tdt, BLOCK_B=_pow2(buf.batch_capacity), BLOCK_W=_pow2(buf.window))


def emit_update(buf, emit: Tensor) -> None:
    """Write every row's label and frame at its count; in the active rows (copied to ``emit``) count it and
    move the frame as the torch stage does; update ``active`` and ``active_any``."""
    _k("emit", emit)[(1,)](buf.labels, buf.time, buf.lengths, _bytes(buf.active), _bytes(emit), buf.num_emitted,
                           buf.tokens, buf.timestamps, buf.step_duration, buf.symbols_at_frame,
                           _bytes(buf.active_any), buf.batch_capacity, buf.tokens.shape[1], buf.max_symbols,
                           BLOCK_B=_pow2(buf.batch_capacity))


def select_rows(emit: Tensor, pairs: list[tuple[Tensor, Tensor]]) -> None:
    """``dst[b] = src[b]`` where ``emit[b]``, for each (dst, src) pair (in place; batch on dim 0, up to 3 dims,
    any strides): up to three pairs of one dtype per launch; a pair of other shapes or dtypes falls back to
    ``torch.where``."""
    slots = []
    for dst, src in pairs:
        if dst.shape != src.shape or dst.dim() > 3 or dst.dtype != src.dtype or dst.device != src.device:
            torch.where(emit.view(-1, *([1] * (src.dim() - 1))), src.to(dst.dtype), dst, out=dst)
            continue
        size = list(dst.shape[1:]) + [1] * (3 - dst.dim())
        slots.append((dst, src, size[0], size[1], *(list(dst.stride()) + [0] * (3 - dst.dim())),
                      *(list(src.stride()) + [0] * (3 - src.dim()))))
    by_dtype: dict = {}
    for slot in slots:
        by_dtype.setdefault(slot[0].dtype, []).append(slot)
    groups = [same[i:i + 3] for same in by_dtype.values() for i in range(0, len(same), 3)]
    for group in groups:
        longest = max(s[2] * s[3] for s in group)
        block = min(1024, _pow2(longest))
        padded = group + [group[0]] * (3 - len(group))        # unused slots: never run (grid stops short)
        args = [a for slot in padded for a in slot]
        _k("select", emit)[(emit.shape[0], len(group))](_bytes(emit), *args, LONGEST=longest, BLOCK=block)
