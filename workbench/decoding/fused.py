"""Triton kernels for the label-looping stages (``kernels="triton"``): the same decisions, fewer launches.

Six kernels replace the chains of small torch ops around the joint and the predictor:

- :func:`gather_window`: the encoder projections of frames time..time+W-1 and the predictor projection,
  one row per (utterance, frame), ready for the joint (plain copies); for a joint that is
  output(relu(enc + pred)) (:func:`joint_output_for`), :func:`joint_hidden_window` writes the hidden rows
  relu(enc + pred) instead, so the joint's add and activation take no kernels of their own and only its
  output layer runs.
- :func:`search_epilogue`: after the joint (whose matrix product stays in cuBLAS): the log-softmax argmax
  over tokens (and durations) of every (utterance, frame) pair in one kernel, then in one more the
  blank-window scan and the masked update of time, label, duration, score, symbols, active and searching
  rows, and the inner-loop flag.
- :func:`emit_update` and :func:`select_rows`: the emit bookkeeping (tokens, timestamps, counts, frame
  moves, the max-symbols rule, active rows and the outer-loop flag) in one single-program kernel, and the
  masked keep of the new predictor projection (and state, for a predictor's own step) in one more.
- :func:`lstm_step`: an LSTM predictor's step as, per layer, one gate GEMM (cuBLAS) and one pointwise kernel
  (gates, new cell and hidden state, kept where a row did not emit), in place on the state; the embedding's
  contribution to the first layer's gates is a per-token table made once (:func:`lstm_step_for`).
  ``kernels="triton_cudnn"`` keeps the predictor's own step() (cuDNN for an nn.LSTM) instead.

Tokens and timestamps equal the torch stages' exactly with the predictor's own step; scores are the same sums
taken in another order. The fused LSTM step sums the gates in another order than cuDNN (values equal within
rounding), so its decisions can differ where two logits are within that rounding; every graph mode runs the
same step, so they agree with each other exactly.
On CPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1 before triton is imported; slow, for tests).
Whether they can run is asked once per setup (:func:`require_triton`, from ``make_buffers`` and
:func:`lstm_step_for`); the kernel functions then launch without asking again.
"""

from __future__ import annotations

import functools
import logging
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from workbench import triton_support

# "triton_cudnn": the "triton" kernels, but the predictor runs its own step() (for an nn.LSTM: cuDNN)
KERNELS = ("torch", "triton", "triton_cudnn")
LSTM_TABLE_LIMIT_BYTES = 256 << 20    # largest first-layer input table (tokens x 4 hidden) the fused step makes
logger = logging.getLogger("workbench.decoding")


def triton_unavailable_reason(device: torch.device) -> str | None:
    """Why these kernels cannot run on ``device`` (one line; None when they can; on CPU: the interpreter).
    See :func:`workbench.triton_support.triton_unavailable_reason`."""
    return triton_support.triton_unavailable_reason(device, kernels_module="workbench.decoding.fused_kernels")


@functools.cache
def _kernels() -> dict:
    """The jitted kernels by name."""
    from workbench.decoding import fused_kernels as k

    return {"gather": k.gather_window_kernel, "decide": k.decide_kernel, "scan": k.scan_kernel,
            "emit": k.emit_kernel, "select": k.select_kernel, "lstm": k.lstm_cell_kernel}


def require_triton(device: torch.device | str) -> None:
    """Raise RuntimeError("kernels='triton': <why>") if these kernels cannot run on ``device``. Asked once per
    decode setup (:func:`workbench.decoding.label_looping.make_buffers`, :func:`lstm_step_for`), never per
    launch: the kernel functions below run on buffers made that way."""
    reason = triton_unavailable_reason(torch.device(device))
    if reason:
        raise RuntimeError(f"kernels='triton': {reason}")


def _k(name: str):
    """The jitted kernel ``name`` (its device was checked when the buffers were made)."""
    return _kernels()[name]


def _fused_buffers(buf) -> None:
    if buf.kernels != "triton":
        raise ValueError(f"the fused kernels need loop buffers made with kernels='triton' or 'triton_cudnn', "
                         f"not {buf.kernels!r}")


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _bytes(flag: Tensor) -> Tensor:
    """A bool tensor as uint8 (the same memory), which every Triton backend stores to."""
    return flag.view(torch.uint8)


def gather_window(buf) -> tuple[Tensor, Tensor]:
    """Joint inputs of frames time..time+W-1 (clamped to the buffer) for every row: (enc [B*W, J],
    pred [B*W, J])."""
    _fused_buffers(buf)
    bc, w = buf.batch_capacity, buf.window
    j = buf.enc_proj.shape[-1]
    enc = buf.enc_proj.new_empty(bc * w, j)
    pred = buf.pred_proj.new_empty(bc * w, j)
    _launch_gather(buf, enc, pred, relu=False)
    return enc, pred


def joint_hidden_window(buf) -> Tensor:
    """The joint's hidden rows relu(enc + pred) of frames time..time+W-1 for every row ([B*W, J]), in one
    kernel: what :func:`gather_window` and then the joint's add and activation give, for a joint whose
    output layer :func:`joint_output_for` found."""
    _fused_buffers(buf)
    hidden = buf.enc_proj.new_empty(buf.batch_capacity * buf.window, buf.enc_proj.shape[-1])
    _launch_gather(buf, hidden, hidden, relu=True)  # with relu the kernel writes its first output only
    return hidden


def _launch_gather(buf, enc_out: Tensor, pred_out: Tensor, *, relu: bool) -> None:
    bc, w = buf.batch_capacity, buf.window
    j = buf.enc_proj.shape[-1]
    if buf.enc_proj.stride(-1) != 1 or buf.pred_proj.stride() != (j, 1):
        raise ValueError("fused kernels need the encoder and predictor projections contiguous in their last dim")
    _k("gather")[(bc * w,)](buf.enc_proj, buf.pred_proj, buf.time, enc_out, pred_out, buf.frame_capacity,
                           buf.enc_proj.stride(0), buf.enc_proj.stride(1),
                           J=j, W=w, BLOCK_J=min(1024, _pow2(j)), RELU=relu)


def search_epilogue(buf, logits: Tensor, rows: Tensor) -> None:
    """One search step for ``rows`` ([B] bool, read before anything is written) from the joint's logits of
    the window ([B*W, outputs]): one kernel decides every (row, frame) pair, one more scans each row's
    window and updates the loop state as the torch stages do, and ``searching_any``."""
    _fused_buffers(buf)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    k = 0 if buf.durations is None else buf.durations.shape[0]
    tdt = buf.durations is not None
    v1, n = buf.num_token_outputs, logits.shape[0]
    token, duration = buf.time.new_empty(n), buf.time.new_empty(n)
    score = buf.scores.new_empty(n)
    _k("decide")[(n,)](logits, logits.stride(0), buf.durations if tdt else buf.time, token, duration, score,
                       buf.blank_id, v1, K=max(k, 1), TDT=tdt, BLOCK_V=_pow2(v1), BLOCK_K=_pow2(max(k, 1)))
    _k("scan")[(1,)](token, duration, score, _bytes(rows), buf.time, buf.lengths, buf.labels,
                     buf.step_duration, buf.scores, buf.symbols_at_frame, _bytes(buf.active),
                     _bytes(buf.searching), _bytes(buf.searching_any), buf.blank_id, buf.batch_capacity,
                     W=buf.window, TDT=tdt, BLOCK_B=_pow2(buf.batch_capacity), BLOCK_W=_pow2(buf.window))


def emit_update(buf, emit: Tensor) -> None:
    """Write every row's label and frame at its count; in the active rows (copied to ``emit``) count it and
    move the frame as the torch stage does; update ``active`` and ``active_any``."""
    _fused_buffers(buf)
    _k("emit")[(1,)](buf.labels, buf.time, buf.lengths, _bytes(buf.active), _bytes(emit), buf.num_emitted,
                     buf.tokens, buf.timestamps, buf.step_duration, buf.symbols_at_frame,
                     _bytes(buf.active_any), buf.batch_capacity, buf.tokens.shape[1], buf.max_symbols,
                     BLOCK_B=_pow2(buf.batch_capacity))


def select_rows(emit: Tensor, pairs: list[tuple[Tensor, Tensor]]) -> None:
    """``dst[b] = src[b]`` where ``emit[b]``, for each (dst, src) pair (in place; batch on dim 0, up to 3 dims,
    any strides): up to three pairs of one dtype per launch; a pair of other shapes or dtypes falls back to
    ``torch.where``. The device is the fused buffers' (checked when they were made)."""
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
        _k("select")[(emit.shape[0], len(group))](_bytes(emit), *args, LONGEST=longest, BLOCK=block)


def _parameter_layout(module) -> tuple | None:
    """What a check of ``module`` depends on: train or eval mode, and its parameters (which tensors, their names,
    shapes, dtypes and devices: a layer replaced by a new one is checked again); None for a non-module."""
    params = getattr(module, "named_parameters", None)
    if not params:
        return None
    return (getattr(module, "training", None), tuple((n, id(p), p.shape, p.dtype, p.device) for n, p in params()))


def _checked_once(cache: "weakref.WeakKeyDictionary", module, key, make, why_not: str):
    """``make()`` for ``module``, once per ``key``, kept in ``cache`` (a module that cannot be weakly referenced
    is checked every time); a str result is the reason it does not apply, logged once after ``why_not``."""
    try:
        cached = cache.get(module)
    except TypeError:
        cached = None
    if cached is not None and cached[0] == key:
        return cached[1]
    result = make()
    if isinstance(result, str):
        logger.info(f"{why_not}: {result}")
    try:
        cache[module] = (key, result)
    except TypeError:
        pass
    return result


# -- the joint's hidden layer -----------------------------------------------------------------------------------

_JOINT_OUTPUTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # joint -> (key, nn.Linear or reason)


def _declared_output(joint) -> torch.nn.Linear | str:
    """The output layer a joint declares through ``activation_and_output()`` (see
    :class:`workbench.decoding.protocol.JointProtocol`) if its activation is ReLU, else why not."""
    declare = getattr(joint, "activation_and_output", None)
    if declare is None:
        return f"{type(joint).__name__} has no activation_and_output()"
    parts = declare()
    if parts is None:
        return f"{type(joint).__name__}.activation_and_output() gives None"
    if not isinstance(parts, tuple) or len(parts) != 2:
        return f"{type(joint).__name__}.activation_and_output() gives {type(parts).__name__}, not (activation, layer)"
    activation, out = parts
    if activation != "relu":
        return f"its activation is {activation!r} (only relu is applied in the gather kernel)"
    if not isinstance(out, torch.nn.Linear):
        return f"its output layer is a {type(out).__name__}, not an nn.Linear"
    return out


def _output_matches_joint(joint, out: torch.nn.Linear) -> str | None:
    """None if out(relu(enc + pred)) gives the joint's joint_after_projection on random inputs, else what differs."""
    weight = out.weight
    g = torch.Generator().manual_seed(0)
    enc, pred = (torch.randn(4, out.in_features, generator=g).to(device=weight.device, dtype=weight.dtype)
                 for _ in range(2))
    expected = joint.joint_after_projection(enc, pred)
    mine = torch.nn.functional.linear(torch.relu(enc + pred), weight, out.bias)
    tol = 2e-2 if weight.dtype in (torch.float16, torch.bfloat16) else 1e-5
    if expected.shape != mine.shape or not torch.allclose(expected.float(), mine.float(), rtol=tol, atol=tol):
        return "its joint_after_projection differs from output(relu(enc + pred))"
    return None


def joint_output_for(joint) -> torch.nn.Linear | None:
    """The joint's output layer when its joint_after_projection(enc, pred) is output(relu(enc + pred)), as declared
    by ``activation_and_output()`` and checked once per joint and parameter layout on random inputs; the fused
    search then computes the hidden rows in its gather kernel (:func:`joint_hidden_window`) and calls the output
    layer alone (the same matrix product in cuBLAS). Else None, logged once with the reason (the search calls
    joint_after_projection). Checked again when the joint switches train/eval mode or a parameter is replaced.""" 
    def make():
        try:
            result = _declared_output(joint)
            if isinstance(result, str):
                return result
            with torch.inference_mode(False), torch.no_grad():
                return _output_matches_joint(joint, result) or result
        except Exception as e:  # noqa: BLE001 - a joint the check cannot run on keeps its own joint_after_projection
            return f"checking it raised {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"

    result = _checked_once(_JOINT_OUTPUTS, joint, _parameter_layout(joint), make,
                           "kernels='triton': the joint runs its own joint_after_projection after the gather")
    return None if isinstance(result, str) else result


# -- the LSTM predictor's step ---------------------------------------------------------------------------------


@dataclass
class LstmStep:
    """An LSTM predictor's step as, per layer, one gate GEMM (cuBLAS) and one pointwise kernel that also keeps
    the state of the rows that did not emit. Made from the module's weights by :func:`lstm_step_for`;
    :func:`refresh_lstm_step` recomputes it in place when they change.

    table: [tokens, 4H] the first layer's input gates of every token, embedding @ W_ih^T + b_ih + b_hh, in the
    accumulation dtype (float32; float64 for a float64 module), so the first layer's GEMM is h_prev @ W_hh^T
    and the pointwise kernel adds the label's row. weights / biases: layers 1.., [W_ih | W_hh] ([4H, 2H]) and
    b_ih + b_hh, the GEMM over [layer below's new h | h_prev].
    """

    embedding: torch.nn.Embedding
    lstm: torch.nn.LSTM
    table: Tensor
    weights: list[Tensor]
    biases: list[Tensor]
    versions: tuple = ()


def _lstm_parameters(embedding, lstm) -> list[Tensor]:
    return [embedding.weight, *lstm.parameters()]


def _versions(params: list[Tensor]) -> tuple:
    """What changes when a parameter is written in place (its version) or replaced (its memory)."""
    out = []
    for p in params:
        try:
            out.append((p.data_ptr(), p._version))
        except RuntimeError:                    # an inference tensor keeps no version: its memory only
            out.append((p.data_ptr(), None))
    return tuple(out)


def _prepared_weights(embedding, lstm) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """(table, weights, biases) of :class:`LstmStep`, computed from the module's current parameters."""
    def bias(layer: int, like: Tensor) -> Tensor:
        if not lstm.bias:
            return torch.zeros(like.shape[0], dtype=like.dtype, device=like.device)
        return getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")

    w_ih = lstm.weight_ih_l0
    acc = torch.float64 if w_ih.dtype == torch.float64 else torch.float32
    table = torch.nn.functional.linear(embedding.weight.double(), w_ih.double(), bias(0, w_ih).double()).to(acc)
    weights = [torch.cat([getattr(lstm, f"weight_ih_l{n}"), getattr(lstm, f"weight_hh_l{n}")], dim=1)
               for n in range(1, lstm.num_layers)]
    biases = [bias(n, weights[n - 1]) for n in range(1, lstm.num_layers)]
    return table, weights, biases


def refresh_lstm_step(step: LstmStep) -> None:
    """Recompute the prepared weights in place (captured graphs keep reading them) if a parameter changed since."""
    params = _lstm_parameters(step.embedding, step.lstm)
    versions = _versions(params)
    if versions == step.versions:
        return
    with torch.inference_mode(False), torch.no_grad():
        table, weights, biases = _prepared_weights(step.embedding, step.lstm)
        for dst, src in zip([step.table, *step.weights, *step.biases], [table, *weights, *biases]):
            dst.copy_(src)
    step.versions = versions


def lstm_step(step: LstmStep, labels: Tensor, state: tuple[Tensor, Tensor], emit: Tensor) -> Tensor:
    """Advance the LSTM on ``labels`` ([B] long) where ``emit`` ([B] bool), in place on ``state`` = (h, c), each
    [B, layers, H] contiguous; the other rows keep their state. Returns the top layer's h ([B, H], a view).
    ``step`` comes from :func:`lstm_step_for`, which checked that the kernels run on its device."""
    h, c = state
    batch, layers, hidden = h.shape
    if h.stride() != (layers * hidden, hidden, 1) or c.stride() != h.stride():
        raise ValueError("the fused LSTM step needs the state (h, c) contiguous as [batch, layers, hidden]")
    block = min(1024, _pow2(hidden))
    grid = (batch, -(-hidden // block))
    for n in range(layers):
        if n == 0:
            gates = torch.mm(h[:, 0], step.lstm.weight_hh_l0.t())
        else:       # [h of layer n-1, just written | h of layer n] is one [B, 2H] view of the state
            gates = torch.addmm(step.biases[n - 1], h[:, n - 1:n + 1].reshape(batch, 2 * hidden),
                                step.weights[n - 1].t())
        _k("lstm")[grid](gates, gates.stride(0), step.table, step.table.stride(0), labels, h[:, n], c[:, n],
                        h.stride(0), c.stride(0), _bytes(emit), H=hidden, BLOCK_H=block, FIRST=n == 0)
    return h[:, layers - 1]


def lstm_parts(predictor) -> tuple[torch.nn.Embedding, torch.nn.LSTM] | str:
    """The embedding and LSTM of a predictor made of exactly one of each (any nesting, as ours and NeMo's
    RNNTDecoder behind its adapter), or why it is not one: another module with parameters, a projection, a
    bidirectional or non-LSTM recurrence, an embedding with max_norm, a table over the size limit."""
    if not isinstance(predictor, torch.nn.Module):
        return f"{type(predictor).__name__} is not a torch.nn.Module"
    embeddings = [m for m in predictor.modules() if isinstance(m, torch.nn.Embedding)]
    lstms = [m for m in predictor.modules() if isinstance(m, torch.nn.LSTM)]
    if len(embeddings) != 1 or len(lstms) != 1:
        return f"it holds {len(embeddings)} nn.Embedding and {len(lstms)} nn.LSTM modules, not one of each"
    (embedding,), (lstm,) = embeddings, lstms
    known = {id(p) for p in _lstm_parameters(embedding, lstm)}
    others = [name for name, p in predictor.named_parameters() if id(p) not in known]
    if others:
        return f"it has parameters outside its embedding and LSTM ({', '.join(others[:3])})"
    if lstm.proj_size or lstm.bidirectional or lstm.input_size != embedding.embedding_dim:
        return "its LSTM has a projection, two directions or an input size other than the embedding's"
    if embedding.max_norm is not None:
        return "its embedding renormalizes rows (max_norm)"
    table_bytes = embedding.num_embeddings * 4 * lstm.hidden_size * (8 if lstm.weight_ih_l0.dtype == torch.float64 else 4)
    if table_bytes > LSTM_TABLE_LIMIT_BYTES:
        return f"the first layer's input table would take {table_bytes >> 20} MiB"
    return embedding, lstm


def _step_matches_module(predictor, step: LstmStep, blank_id: int, tokens: int) -> str | None:
    """None if the fused step gives the predictor's own step() (output and state, within rounding) on a few
    labels and a random state; else what differs."""
    lstm = step.lstm
    ref = lstm.weight_hh_l0
    labels = torch.tensor(sorted({blank_id, 0, tokens - 1, tokens // 2}), device=ref.device)
    shape = (labels.shape[0], lstm.num_layers, lstm.hidden_size)
    init = predictor.init_state(labels.shape[0])
    if len(init) != 2 or any(tuple(s.shape) != shape for s in init):
        return f"its state is not (h, c) of shape [batch, {lstm.num_layers}, {lstm.hidden_size}]"
    g = torch.Generator().manual_seed(0)
    state = tuple((0.5 * torch.randn(shape, generator=g)).to(device=ref.device, dtype=ref.dtype) for _ in range(2))
    out, (h, c) = predictor.step(labels, tuple(s.clone() for s in state))
    mine = tuple(s.clone().contiguous() for s in state)
    mine_out = lstm_step(step, labels, mine, torch.ones(labels.shape[0], dtype=torch.bool, device=ref.device))
    tol = 5e-2 if ref.dtype in (torch.float16, torch.bfloat16) else 1e-3
    for name, a, b in (("output", mine_out, out), ("h", mine[0], h), ("c", mine[1], c)):
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), rtol=tol, atol=tol):
            return f"its step() differs from an LSTM step in {name}"
    return None


_LSTM_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # predictor -> (key, LstmStep or reason)


def _make_lstm_step(predictor, blank_id: int, tokens: int) -> LstmStep | str:
    parts = lstm_parts(predictor)
    if isinstance(parts, str):
        return parts
    embedding, lstm = parts
    if embedding.num_embeddings < tokens:
        return f"its embedding has {embedding.num_embeddings} rows for {tokens} label ids"
    with torch.inference_mode(False), torch.no_grad():
        params = _lstm_parameters(embedding, lstm)
        step = LstmStep(embedding, lstm, *_prepared_weights(embedding, lstm), versions=_versions(params))
        reason = _step_matches_module(predictor, step, blank_id, tokens)
    return step if reason is None else reason


def lstm_step_for(predictor, *, blank_id: int, tokens: int) -> LstmStep | None:
    """The fused step of ``predictor`` if it is an LSTM predictor whose step() the fused step reproduces (checked
    once per predictor and parameter layout), refreshed to its current weights; else None, logged once with the
    reason (the decoder then calls predictor.step). ``tokens``: how many label ids the decoder can feed it.
    Raises :func:`require_triton`'s error if the kernels cannot run on the predictor's device."""
    params = getattr(predictor, "named_parameters", None)
    named = list(params()) if params else []
    if named:
        require_triton(named[0][1].device)
    result = _checked_once(_LSTM_STEPS, predictor, (blank_id, tokens, _parameter_layout(predictor)),
                           lambda: _make_lstm_step(predictor, blank_id, tokens),
                           "kernels='triton': the predictor runs its own step(), not the fused LSTM step")
    if isinstance(result, str):
        return None
    refresh_lstm_step(result)
    return result
