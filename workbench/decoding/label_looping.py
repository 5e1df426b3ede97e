"""Batched label-looping greedy decoding for RNN-T and TDT, as fixed-shape stages with no host sync.

The loop runs over labels, not frames: each outer step finds, for every utterance at once, the next
non-blank label (an inner loop skips blanks frame by frame), then advances the predictor once for the
whole batch; rows that emitted nothing keep their state through masks. Every stage reads and writes
only the tensors of :class:`LoopBuffers` (in place), so the same stages run eagerly, as separate CUDA
graphs (``partial``) or inside one graph with conditional while-nodes (``full``).

RNN-T is TDT with fixed durations: blank -> 1 frame, label -> 0 frames.

Blank skipping looks at ``window`` frames per search step: the predictor does not change while a row
skips blanks, so one joint call over frames t..t+W-1 decides them all. RNN-T takes the first label in
the window; TDT follows its blank jumps through the window (a jump table composed log2(W) times).
Either way the tokens, timestamps and scores are those of one frame per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

import workbench.decoding.fused as fused

KERNEL_CHOICES = ("auto", *fused.KERNELS)


@dataclass
class LoopBuffers:
    """Persistent decode state for up to ``batch_capacity`` utterances of up to ``frame_capacity`` frames.

    Rows at or beyond the real batch get length 0 and stay inactive. ``time`` is the current frame
    (0-based); a row is active while ``time < length`` (the length is exclusive).
    """

    batch_capacity: int
    frame_capacity: int
    max_symbols: int
    blank_id: int
    num_token_outputs: int      # V + 1: the joint's outputs before the TDT duration logits
    window: int                 # frames looked at per search step (1: one frame at a time)
    jump_doublings: int         # TDT: squarings of the jump table; 2 ** jump_doublings >= window
    durations: Tensor | None    # [K] long, TDT only
    enc: Tensor                 # [Bc, Tc, D] encoder output, joint dtype
    lengths: Tensor             # [Bc] long
    enc_proj: Tensor            # [Bc, Tc, J]
    batch_index: Tensor         # [Bc] arange
    window_offsets: Tensor      # [W] arange
    beyond_offsets: Tensor      # TDT: [max(durations, 1)] offsets W.. a jump can land on past the window
    time: Tensor                # [Bc] long
    active: Tensor              # [Bc] bool: time < length
    searching: Tensor           # [Bc] bool: active and still on a blank in this outer step
    labels: Tensor              # [Bc] long: argmax token of the latest decision per row
    step_duration: Tensor       # [Bc] long: frames the latest decision moves
    symbols_at_frame: Tensor    # [Bc] long: labels emitted at the current frame
    num_emitted: Tensor         # [Bc] long
    tokens: Tensor              # [Bc, Lc] long
    timestamps: Tensor          # [Bc, Lc] long
    scores: Tensor              # [Bc] float (float32, or float64 for a float64 joint)
    pred_state: tuple[Tensor, ...]
    pred_proj: Tensor           # [Bc, J]
    active_any: Tensor          # [] bool: loop condition of the outer loop
    searching_any: Tensor       # [] bool: loop condition of the inner loop
    kernels: str = "torch"      # "torch": the stages below; "triton": workbench.decoding.fused's kernels
    emit: Tensor | None = None  # triton: [Bc] bool, the rows that emitted in this outer step
    lstm: fused.LstmStep | None = None  # triton: the fused LSTM step (pred_state contiguous), else predictor.step
    # triton: (the joint, its output layer) when that joint is output(relu(enc + pred)) (fused.joint_output_for)
    joint_output: tuple[object, torch.nn.Linear] | None = None


def resolve_kernels(requested: str, *, device: torch.device, algorithm: str = "label_looping") -> tuple[str, str]:
    """Which stage kernels run on ``device`` (one of fused.KERNELS) and a one-line reason, for logs.

    "auto": the fused Triton kernels for label-looping on CUDA when triton imports ("triton_cudnn": an LSTM
    predictor's step stays in cuDNN, whose tokens NeMo's decoders give too), else the torch stages;
    "torch", "triton" and "triton_cudnn" are taken as asked (a Triton choice that cannot run fails in
    :func:`make_buffers`, in one line).
    """
    if requested not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {requested!r}")
    if requested != "auto":
        return requested, f"{requested}: asked for"
    if algorithm != "label_looping":
        return "torch", f"torch: {algorithm} runs the torch ops"
    if torch.device(device).type != "cuda":  # decided without importing triton
        return "torch", f"torch: inputs on {torch.device(device).type} (the Triton kernels run on CUDA)"
    problem = fused.triton_unavailable_reason(torch.device(device))
    if problem:
        return "torch", f"torch: {problem}"
    return "triton_cudnn", "triton_cudnn: CUDA inputs and triton importable (the LSTM step through cuDNN)"


def make_buffers(predictor, joint, *, batch_capacity: int, frame_capacity: int, enc_dim: int,
                 dtype: torch.dtype, device: torch.device, blank_id: int, durations: list[int] | None,
                 max_symbols: int, window: int = 1, kernels: str = "auto") -> LoopBuffers:
    """Allocate buffers; runs the predictor and joint once on a dummy batch to learn their shapes.
    ``kernels``: "torch"; "triton" (the same decisions through fewer, fused kernels; an LSTM predictor's step
    fused too, see :func:`fused.lstm_step_for`); "triton_cudnn" (the same, the predictor through its step());
    or "auto" (see :func:`resolve_kernels`). A Triton choice is checked here, once for these buffers
    (:func:`fused.require_triton`): the loop's kernel launches do not ask again."""
    kernels = resolve_kernels(kernels, device=device)[0]
    if kernels != "torch":
        fused.require_triton(device)
    bc, tc = batch_capacity, frame_capacity
    enc = torch.zeros(bc, tc, enc_dim, dtype=dtype, device=device)
    enc_proj = joint.project_encoder(enc[:, :1])
    blank = torch.full((bc,), blank_id, dtype=torch.long, device=device)
    try:
        out, state = predictor.step(blank, predictor.init_state(bc))
        pred_proj = joint.project_predictor(out)
        logits = joint.joint_after_projection(enc_proj[:, 0], pred_proj)
    except IndexError as e:
        raise ValueError(f"the predictor does not accept blank_id={blank_id} as a label: {e}") from e
    num_token_outputs = logits.shape[-1] - len(durations or [])
    if num_token_outputs <= blank_id or num_token_outputs < 1:
        raise ValueError(f"joint gives {logits.shape[-1]} outputs: too few for blank_id={blank_id} "
                         f"and {len(durations or [])} durations")
    capacity = tc * max_symbols + 1
    window = max(1, int(window))
    longest_jump = max([1, *(durations or [])])
    long = dict(dtype=torch.long, device=device)
    lstm = fused.lstm_step_for(predictor, blank_id=blank_id, tokens=num_token_outputs) if kernels == "triton" else None
    score_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return LoopBuffers(
        batch_capacity=bc, frame_capacity=tc, max_symbols=max_symbols, blank_id=blank_id,
        num_token_outputs=num_token_outputs, window=window, jump_doublings=(window - 1).bit_length(),
        durations=None if durations is None else torch.tensor(durations, **long),
        enc=enc, lengths=torch.zeros(bc, **long),
        enc_proj=torch.zeros(bc, tc, enc_proj.shape[-1], dtype=enc_proj.dtype, device=device),
        batch_index=torch.arange(bc, **long),
        window_offsets=torch.arange(window, **long),
        beyond_offsets=torch.arange(window, window + longest_jump, **long),
        time=torch.zeros(bc, **long),
        active=torch.zeros(bc, dtype=torch.bool, device=device),
        searching=torch.zeros(bc, dtype=torch.bool, device=device),
        labels=blank.clone(), step_duration=torch.zeros(bc, **long),
        symbols_at_frame=torch.zeros(bc, **long), num_emitted=torch.zeros(bc, **long),
        tokens=torch.zeros(bc, capacity, **long), timestamps=torch.zeros(bc, capacity, **long),
        scores=torch.zeros(bc, dtype=score_dtype, device=device),
        # the predictor's own layout (its step() then copies nothing); contiguous for the fused LSTM step
        pred_state=tuple(torch.zeros_like(s) if lstm is None else torch.zeros(s.shape, dtype=s.dtype, device=device)
                         for s in state),
        pred_proj=torch.zeros_like(pred_proj),
        active_any=torch.zeros((), dtype=torch.bool, device=device),
        searching_any=torch.zeros((), dtype=torch.bool, device=device),
        kernels="torch" if kernels == "torch" else "triton", lstm=lstm,
        joint_output=None if kernels == "torch" or (out := fused.joint_output_for(joint)) is None else (joint, out),
        emit=None if kernels == "torch" else torch.zeros(bc, dtype=torch.bool, device=device),
    )


def load_inputs(buf: LoopBuffers, enc: Tensor, lengths: Tensor) -> None:
    """Copy a batch into the buffers (outside any graph; the fused LSTM step's weights are refreshed here if the
    predictor's parameters changed). Needs B <= batch and T <= frame capacity."""
    if buf.lstm is not None:
        fused.refresh_lstm_step(buf.lstm)
    b, t = enc.shape[0], enc.shape[1]
    buf.enc[:b, :t].copy_(enc)
    buf.lengths.zero_()
    buf.lengths[:b].copy_(lengths)


def decide(buf: LoopBuffers, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Greedy decision per row: (token, frames to move, log-probability of the decision).

    The argmax of the log-softmax is the argmax of the logits (ties: the lowest index); one fused
    softmax kernel gives both the token and its log-probability.
    """
    v1 = buf.num_token_outputs
    score, token = torch.log_softmax(logits[:, :v1].to(buf.scores.dtype), dim=-1).max(dim=-1)
    if buf.durations is None:
        return token, (token == buf.blank_id).long(), score
    score_d, index_d = torch.log_softmax(logits[:, v1:].to(buf.scores.dtype), dim=-1).max(dim=-1)
    duration = buf.durations[index_d]
    duration = duration.masked_fill_((token == buf.blank_id) & (duration == 0), 1)  # a blank always moves
    return token, duration, score + score_d


def _joint_at_current_frame(buf: LoopBuffers, joint) -> Tensor:
    frame = buf.time.clamp(max=buf.frame_capacity - 1)
    return joint.joint_after_projection(buf.enc_proj[buf.batch_index, frame], buf.pred_proj)


def start(buf: LoopBuffers, predictor, joint) -> None:
    """Project the encoder, reset the loop state, run the predictor on the start symbol."""
    buf.enc_proj.copy_(joint.project_encoder(buf.enc))
    for t in (buf.time, buf.symbols_at_frame, buf.num_emitted, buf.scores):
        t.zero_()
    buf.labels.fill_(buf.blank_id)
    torch.lt(buf.time, buf.lengths, out=buf.active)
    if buf.lstm is not None:
        for dst, src in zip(buf.pred_state, predictor.init_state(buf.batch_capacity)):
            dst.copy_(src)
        buf.emit.fill_(True)
        out = fused.lstm_step(buf.lstm, buf.labels, buf.pred_state, buf.emit)
    else:
        out, state = predictor.step(buf.labels, predictor.init_state(buf.batch_capacity))
        for dst, src in zip(buf.pred_state, state):
            dst.copy_(src)
    buf.pred_proj.copy_(joint.project_predictor(out))
    torch.any(buf.active, out=buf.active_any)


def _take_decision(buf: LoopBuffers, joint, rows: Tensor, first: bool) -> None:
    token, duration, score = decide(buf, _joint_at_current_frame(buf, joint))
    if first:
        buf.labels.copy_(token)
        buf.step_duration.copy_(duration)
    else:
        torch.where(rows, token, buf.labels, out=buf.labels)
        torch.where(rows, duration, buf.step_duration, out=buf.step_duration)
    buf.scores.add_(score.masked_fill_(~rows, 0))
    blank_rows = rows & (token == buf.blank_id)
    buf.time.add_(duration.masked_fill_(~blank_rows, 0))
    buf.symbols_at_frame.masked_fill_(blank_rows, 0)
    torch.lt(buf.time, buf.lengths, out=buf.active)
    torch.logical_and(blank_rows, buf.active, out=buf.searching)
    torch.any(buf.searching, out=buf.searching_any)


def _window_decisions(buf: LoopBuffers, joint) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Decisions at frames time..time+W-1 of every row with its current predictor output.

    Returns (token, frames to move, score, valid), each [B, W]; ``valid``: the frame is below the
    row's length (frames at or beyond it never count).
    """
    bc, w = buf.batch_capacity, buf.window
    frames = buf.time.unsqueeze(1) + buf.window_offsets                       # [B, W]
    enc = buf.enc_proj[buf.batch_index.unsqueeze(1), frames.clamp(max=buf.frame_capacity - 1)]
    pred = buf.pred_proj.unsqueeze(1).expand(bc, w, buf.pred_proj.shape[-1])
    logits = joint.joint_after_projection(enc.reshape(bc * w, -1), pred.reshape(bc * w, -1))
    token, duration, score = decide(buf, logits)
    return token.view(bc, w), duration.view(bc, w), score.view(bc, w), frames < buf.lengths.unsqueeze(1)


def _finish_search(buf: LoopBuffers, rows: Tensor, moved: Tensor, found: Tensor, label: Tensor,
                   label_duration: Tensor, score: Tensor) -> None:
    """Apply one search step to ``rows``: move ``moved`` frames, take the label where ``found``."""
    found = rows & found
    torch.where(found, label, buf.labels, out=buf.labels)
    torch.where(found, label_duration, buf.step_duration, out=buf.step_duration)
    buf.scores.add_(score.masked_fill_(~rows, 0))
    moved = moved.masked_fill_(~rows, 0)
    buf.time.add_(moved)
    buf.symbols_at_frame.masked_fill_(moved > 0, 0)
    torch.lt(buf.time, buf.lengths, out=buf.active)
    torch.logical_and(rows & ~found, buf.active, out=buf.searching)
    torch.any(buf.searching, out=buf.searching_any)


def _search_window_rnnt(buf: LoopBuffers, joint, rows: Tensor) -> None:
    """RNN-T: every blank moves one frame, so a row moves to its first label in the window (or past
    the whole window when it holds only blanks)."""
    token, _, score, valid = _window_decisions(buf, joint)
    is_label = (token != buf.blank_id) & valid
    found = is_label.any(dim=1)
    first = is_label.to(torch.int32).argmax(dim=1, keepdim=True)              # first label (0 if none)
    skipped = torch.where(found, first.squeeze(1), buf.window)                # blank frames passed
    decided = (buf.window_offsets <= skipped.unsqueeze(1)) & valid             # blanks + the label
    score = torch.where(decided, score, 0).sum(dim=1)
    _finish_search(buf, rows, skipped, found, token.gather(1, first).squeeze(1),
                   torch.zeros_like(skipped), score)


def _search_window_tdt(buf: LoopBuffers, joint, rows: Tensor) -> None:
    """TDT: follow the blank jumps from offset 0 to the first label, the row's end, or past the window.

    Jump table over offsets 0..W-1+max(durations): a valid blank at k leads to k + its duration (>= 1);
    labels, frames at or beyond the length and offsets past the window lead to themselves. Squaring the
    table ``jump_doublings`` times (with the blank scores summed along) makes W or more moves, which
    reach the end of every chain because each move is at least one frame.
    """
    token, duration, score, valid = _window_decisions(buf, joint)
    bc = buf.batch_capacity
    moves = (token == buf.blank_id) & valid
    jump = torch.cat([torch.where(moves, buf.window_offsets + duration, buf.window_offsets),
                      buf.beyond_offsets.expand(bc, -1)], dim=1)              # [B, W + max jump]
    gained = torch.nn.functional.pad(torch.where(moves, score, 0), (0, buf.beyond_offsets.shape[0]))
    for _ in range(buf.jump_doublings):
        gained = gained + gained.gather(1, jump)
        jump = jump.gather(1, jump)
    stop = jump[:, :1]                                                        # where the chain from 0 ends
    at_stop = stop.clamp(max=buf.window - 1)
    found = ((stop < buf.window) & valid.gather(1, at_stop)).squeeze(1)       # stopped on a label
    label_score = score.gather(1, at_stop).squeeze(1).masked_fill_(~found, 0)
    _finish_search(buf, rows, stop.squeeze(1), found, token.gather(1, at_stop).squeeze(1),
                   duration.gather(1, at_stop).squeeze(1), gained[:, 0] + label_score)


def _search_fused(buf: LoopBuffers, joint, rows: Tensor) -> None:
    """One search step through the fused kernels: gather the window (with the joint's hidden layer when
    ``buf.joint_output`` is this joint's), the joint, the epilogue (any window; with window 1 the same decisions as
    :func:`_take_decision`)."""
    if buf.joint_output is not None and buf.joint_output[0] is joint:
        out = buf.joint_output[1]  # the joint's add and activation in the gather kernel, its output layer as it is
        logits = out(fused.joint_hidden_window(buf))
    else:
        logits = joint.joint_after_projection(*fused.gather_window(buf))
    fused.search_epilogue(buf, logits, rows)


def _search(buf: LoopBuffers, joint, rows: Tensor, first: bool) -> None:
    if buf.kernels == "triton":
        _search_fused(buf, joint, rows)
    elif buf.window == 1:
        _take_decision(buf, joint, rows, first=first)
    elif buf.durations is None:
        _search_window_rnnt(buf, joint, rows)
    else:
        _search_window_tdt(buf, joint, rows)


def find_label_first(buf: LoopBuffers, joint) -> None:
    """First decision of an outer step for every active row; blanks move their row's frame."""
    _search(buf, joint, buf.active if buf.kernels == "triton" else buf.active.clone(), first=True)


def find_label_again(buf: LoopBuffers, joint) -> None:
    """Inner-loop step: a new decision for rows still on a blank (``searching``)."""
    _search(buf, joint, buf.searching if buf.kernels == "triton" else buf.searching.clone(), first=False)


def emit_labels(buf: LoopBuffers, predictor, joint) -> None:
    """Emit the found label of every active row, advance the predictor there, move frames."""
    if buf.kernels == "triton":
        fused.emit_update(buf, buf.emit)
        out, keep = fused_predictor_step(buf, predictor)
        fused.select_rows(buf.emit, [*keep, (buf.pred_proj, joint.project_predictor(out))])
        return
    emit = buf.active
    buf.tokens[buf.batch_index, buf.num_emitted] = buf.labels       # rows not emitting write past their end
    buf.timestamps[buf.batch_index, buf.num_emitted] = buf.time
    buf.num_emitted.add_(emit)
    advance_predictor(buf, predictor, joint, buf.labels, emit)
    moved = buf.step_duration.masked_fill_(~emit, 0)
    buf.time.add_(moved)
    symbols = (buf.symbols_at_frame + emit).masked_fill_(moved > 0, 0)
    forced = emit & (symbols >= buf.max_symbols)                   # max_symbols labels at this frame
    buf.time.add_(forced)
    buf.symbols_at_frame.copy_(symbols.masked_fill_(forced, 0))
    torch.lt(buf.time, buf.lengths, out=buf.active)
    torch.any(buf.active, out=buf.active_any)


def fused_predictor_step(buf: LoopBuffers, predictor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """kernels="triton": the predictor on ``buf.labels`` -> (out [B, H], the (state, new state) pairs still to keep
    where ``buf.emit``). The fused LSTM step keeps the state itself (in place: no pairs); else predictor.step."""
    if buf.lstm is not None:
        return fused.lstm_step(buf.lstm, buf.labels, buf.pred_state, buf.emit), []
    out, state = predictor.step(buf.labels, buf.pred_state)
    return out, list(zip(buf.pred_state, state))


def advance_predictor(buf: LoopBuffers, predictor, joint, labels: Tensor, emit: Tensor) -> None:
    """Run the predictor on ``labels`` for the whole batch; keep the new state and projection only in the
    rows that ``emit`` (in place, so graphs can capture it)."""
    out, state = predictor.step(labels, buf.pred_state)
    for dst, src in zip(buf.pred_state, state):
        torch.where(emit.view(-1, *([1] * (src.dim() - 1))), src, dst, out=dst)
    torch.where(emit.unsqueeze(1), joint.project_predictor(out), buf.pred_proj, out=buf.pred_proj)


def read_flag(flag: Tensor) -> bool:
    """The one host sync of a Python-driven loop: read a loop condition (a [] bool tensor)."""
    return bool(flag)


def run_eager(buf: LoopBuffers, predictor, joint) -> dict[str, int]:
    """The whole decode with Python loops (one host sync per loop test); returns iteration counts."""
    start(buf, predictor, joint)
    outer = inner = 0
    while read_flag(buf.active_any):
        find_label_first(buf, joint)
        while read_flag(buf.searching_any):
            find_label_again(buf, joint)
            inner += 1
        emit_labels(buf, predictor, joint)
        outer += 1
    return {"outer_iterations": outer, "inner_iterations": inner}
