"""GreedyTransducerDecoder: greedy RNN-T / TDT decoding of any protocol-following transducer.

Algorithms: ``label_looping`` (RNN-T and TDT) and ``frame_looping`` (RNN-T, the classic baseline).
Graph modes for label-looping: ``full`` (one CUDA graph, loops as conditional WHILE nodes), ``partial``
(each loop body a graph, loops in Python reading one flag), ``off`` (eager) and ``auto`` (full, else
partial, else off; each fallback logged once with its reason; on CPU, off). Stage kernels: ``auto`` (the
fused Triton kernels for label-looping on CUDA when triton imports, else the torch stages; a Triton
failure at first use falls back to torch with a warning), ``torch`` or ``triton``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import workbench.decoding.cuda_graphs as cuda_graphs
import workbench.decoding.label_looping as label_looping
from workbench.decoding.frame_looping import run_frame_looping
from workbench.decoding.protocol import Hypothesis, hypotheses_from_buffers, module_dtype

logger = logging.getLogger("workbench.decoding")

ALGORITHMS = ("label_looping", "frame_looping")
GRAPH_MODES = ("auto", "full", "partial", "off")
DEFAULT_MAX_SYMBOLS = 10
# Frames per blank-skipping joint call: a wider window skips more blanks per inner iteration (the decoding
# bench's window-16 and window-1 rows record the inner iteration counts), and the joint over B x 16 rows is still a
# small matrix product, so each iteration costs about the same.
DEFAULT_BLANK_WINDOW = 16
# blank_window="auto" (see auto_blank_window): TDT with a float32/float64 joint takes this window from this many
# utterances on, where the joint's matrix product over batch x 16 rows (no tensor cores in exact fp32) outweighs
# the inner iterations a shorter window adds.
AUTO_TDT_FP32_WINDOW, AUTO_TDT_FP32_FROM_BATCH = 8, 33
_already_logged: set[str] = set()


def _log_once(level: int, message: str) -> None:
    if message not in _already_logged:
        _already_logged.add(message)
        logger.log(level, message)


def auto_blank_window(batch: int, *, tdt: bool, dtype: torch.dtype) -> int:
    """The frames per search step that ``blank_window="auto"`` takes for ``batch`` utterances (the buffers'
    capacity): 16; for TDT with a float32 or float64 joint, 8 from 33 utterances on. A TDT blank jumps up to
    max(durations) frames, so 8 frames still hold the next label of most searches, at half the joint's rows;
    an RNN-T blank moves one frame, and a half-precision joint runs on tensor cores, so they keep 16."""
    if tdt and dtype in (torch.float32, torch.float64) and batch >= AUTO_TDT_FP32_FROM_BATCH:
        return AUTO_TDT_FP32_WINDOW
    return DEFAULT_BLANK_WINDOW


def resolve_graph_mode(requested: str, *, algorithm: str, device_type: str, full_reason: str | None,
                       partial_reason: str | None) -> tuple[str, list[str]]:
    """The graph mode to use and the fallback notes that explain it (pure logic, no CUDA needed).

    A forced mode that cannot work raises RuntimeError; ``auto`` falls back full -> partial -> off.
    """
    if requested not in GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {GRAPH_MODES}, got {requested!r}")
    if algorithm == "frame_looping":
        if requested in ("full", "partial"):
            raise ValueError(f"cuda_graphs={requested!r} is for label_looping; frame_looping runs eagerly")
        return "off", ([] if requested == "off" else ["frame_looping has no graph mode: off"])
    if requested == "off":
        return "off", []
    if device_type != "cuda":
        if requested != "auto":
            raise RuntimeError(f"cuda_graphs={requested!r} needs a CUDA device, got {device_type}")
        return "off", [f"auto: inputs on {device_type}, CUDA graphs need CUDA: off"]
    if requested == "full":
        if full_reason:
            raise RuntimeError(f"cuda_graphs='full' is not supported here: {full_reason}")
        return "full", []
    if requested == "partial":
        if partial_reason:
            raise RuntimeError(f"cuda_graphs='partial' is not supported here: {partial_reason}")
        return "partial", []
    notes = []
    if not full_reason:
        return "full", notes
    notes.append(f"auto: full graph unavailable ({full_reason}): partial")
    if not partial_reason:
        return "partial", notes
    notes.append(f"auto: partial graphs unavailable ({partial_reason}): off")
    return "off", notes


@dataclass
class _CapturedDecode:
    """Graphs captured for one capacity (batch, frames), encoder width, dtype and device."""

    mode: str
    key: tuple
    buffers: label_looping.LoopBuffers
    graphs: Any
    keep_alive: list = field(default_factory=list)


class _TritonFailure(RuntimeError):
    """The fused kernels failed on their first run on a device (compile or launch), under kernels="auto"."""


class GreedyTransducerDecoder:
    """Greedy decoding; call with (enc[B, T, D], lengths[B]) -> one Hypothesis per utterance.

    ``durations=None`` is RNN-T; a list of frame counts (e.g. [0, 1, 2, 3, 4]) is TDT, whose joint
    output ends with one logit per duration. ``max_symbols`` bounds labels per frame (None -> 10).
    ``blank_window`` (label-looping, RNN-T and TDT): frames decided by one joint call while skipping
    blanks (the same decisions, fewer loop iterations); 1 looks at one frame per step; "auto" (default): 16, or
    fewer where the joint's rows cost more than the iterations saved (:func:`auto_blank_window`;
    ``window_used`` says which the last call took).
    ``kernels`` (label-looping): "triton": fused kernels around the joint's matrix product and the predictor
    step (an LSTM predictor's step as one gate GEMM and one cell kernel), with the same tokens and timestamps
    (scores summed in another order); "triton_cudnn": the same, the predictor through its own step();
    "torch": the torch stages;
    "auto" (default): triton_cudnn on CUDA when triton imports, else torch (``kernels_used`` and ``kernels_reason`` say
    which ran last and why; a Triton failure at first use falls back to torch with a warning).
    Computation runs in the joint's dtype. Captured graphs are kept for the largest batch and length
    seen and reused for smaller inputs; ``reset()`` releases them.
    """

    def __init__(self, predictor, joint, *, blank_id: int, durations: list[int] | None = None,
                 max_symbols: int | None = DEFAULT_MAX_SYMBOLS, algorithm: str = "label_looping",
                 cuda_graphs: str = "auto", blank_window: int | str = "auto", kernels: str = "auto"):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if cuda_graphs not in GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {GRAPH_MODES}, got {cuda_graphs!r}")
        if max_symbols is None:
            warnings.warn(f"max_symbols=None: using {DEFAULT_MAX_SYMBOLS} (graph decoding needs a bound)",
                          stacklevel=2)
            max_symbols = DEFAULT_MAX_SYMBOLS
        if int(max_symbols) != max_symbols or max_symbols < 1:
            raise ValueError(f"max_symbols must be an integer >= 1, got {max_symbols}")
        if durations is not None:
            durations = [int(d) for d in durations]
            if not durations or min(durations) < 0:
                raise ValueError(f"durations must be a non-empty list of frame counts >= 0, got {durations}")
            if algorithm == "frame_looping":
                raise ValueError("frame_looping decodes RNN-T only; use label_looping for TDT (durations given)")
        if blank_window != "auto" and (not isinstance(blank_window, (int, float)) or isinstance(blank_window, bool)
                                       or int(blank_window) != blank_window or blank_window < 1):
            raise ValueError(f"blank_window must be 'auto' or an integer >= 1, got {blank_window!r}")
        if kernels not in label_looping.KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {label_looping.KERNEL_CHOICES}, got {kernels!r}")
        if kernels in ("triton", "triton_cudnn") and algorithm == "frame_looping":
            raise ValueError(f"kernels={kernels!r} is for label_looping; frame_looping runs the torch ops")
        if blank_id < 0:
            raise ValueError(f"blank_id must be >= 0, got {blank_id}")
        if algorithm == "frame_looping" and cuda_graphs in ("full", "partial"):
            raise ValueError(f"cuda_graphs={cuda_graphs!r} is for label_looping; frame_looping runs eagerly")
        self.predictor, self.joint = predictor, joint
        self.blank_id, self.durations, self.max_symbols = blank_id, durations, int(max_symbols)
        self.algorithm, self.cuda_graphs = algorithm, cuda_graphs
        self.blank_window = blank_window if blank_window == "auto" else int(blank_window)  # as asked
        self.window_used: int | None = None      # the blank window of the last call (label-looping)
        self.kernels = kernels                   # as asked: one of label_looping.KERNEL_CHOICES
        self.kernels_used: str | None = None     # the stage kernels of the last call: one of fused.KERNELS
        self.kernels_reason: str | None = None   # why, in one line (e.g. "torch: inputs on cpu (...)")
        self.mode_used: str | None = None        # the mode of the last call
        self.last_stats: dict[str, int] = {}     # loop counts of the last eager / partial call
        self.captures = 0                        # graph captures so far (tests and benchmarks read it)
        self._captured: _CapturedDecode | None = None
        self._mode_cache: dict[str, str] = {}
        self._failed_modes: set[str] = set()
        self._kernel_cache: dict[str, tuple[str, str]] = {}  # device -> (kernels, reason)
        self._triton_ran: set[str] = set()       # devices where the fused kernels have run once

    def reset(self) -> None:
        """Release captured graphs and their buffers."""
        self._captured = None
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def stage_graph_nodes(self) -> dict[str, dict[str, int]] | None:
        """Nodes and kernels of each captured stage graph (start, find_label_first, find_label_again,
        emit_labels; the full graph runs these as child graphs plus one condition kernel per loop test), or
        None when nothing is captured."""
        captured = self._captured
        if captured is None or captured.mode not in ("full", "partial"):
            return None
        stages = captured.keep_alive[0] if captured.mode == "full" else captured.graphs
        return {name: cuda_graphs.graph_node_counts(graph) for name, graph in stages.items()}

    # -- calling ---------------------------------------------------------------------------------
    def __call__(self, enc: Tensor, lengths: Tensor) -> list[Hypothesis]:
        batch, frames = _check_inputs(enc, lengths)
        if batch == 0:
            return []
        with torch.inference_mode():
            dtype = module_dtype(self.joint, enc.dtype)
            enc = enc.to(dtype)
            lengths = lengths.to(device=enc.device, dtype=torch.long)
            self._choose_kernels(enc.device)
            try:
                return self._decode(enc, lengths)
            except _TritonFailure as e:
                self._fall_back_to_torch_kernels(enc.device, e.__cause__ or e)
                return self._decode(enc, lengths)

    def kernel_choice(self, device: torch.device | str) -> tuple[str, str]:
        """The stage kernels a call on ``device`` runs (one of fused.KERNELS) and why, in one line."""
        key = str(torch.device(device))
        if key not in self._kernel_cache:
            self._kernel_cache[key] = label_looping.resolve_kernels(self.kernels, device=torch.device(device),
                                                                    algorithm=self.algorithm)
        return self._kernel_cache[key]

    def _choose_kernels(self, device: torch.device) -> None:
        self.kernels_used, self.kernels_reason = self.kernel_choice(device)
        _log_once(logging.INFO, f"decoding kernels: {self.kernels_reason}")

    def _fall_back_to_torch_kernels(self, device: torch.device, error: BaseException) -> None:
        first_line = (str(error).splitlines() or [""])[0]
        message = (f"kernels='auto': the Triton kernels failed at first use ({type(error).__name__}: {first_line}): "
                   "torch")
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        _log_once(logging.WARNING, message)
        self._kernel_cache[str(device)] = ("torch", f"torch: {message}")
        self._captured = None
        self._choose_kernels(device)

    def _decode(self, enc: Tensor, lengths: Tensor) -> list[Hypothesis]:
        mode = self._choose_mode(enc.device)
        if mode in ("full", "partial"):
            try:
                return self._decode_with_graphs(mode, enc, lengths)
            except _TritonFailure:
                raise
            except Exception as e:
                if self.cuda_graphs != "auto":
                    raise RuntimeError(f"cuda_graphs={mode!r} failed: {e}") from e
                self._captured = None
                torch.cuda.synchronize()
                fallback = "partial" if mode == "full" else "off"
                _log_once(logging.WARNING, f"auto: {mode} graph failed ({type(e).__name__}: {e}): {fallback}")
                self._failed_modes.add(mode)
                return self._decode(enc, lengths)
        return self._decode_eager(enc, lengths)

    def _choose_mode(self, device: torch.device) -> str:
        key = f"{device}|{sorted(self._failed_modes)}"
        if key not in self._mode_cache:
            is_cuda = device.type == "cuda" and self.algorithm == "label_looping" and self.cuda_graphs != "off"
            full_reason = partial_reason = None
            if is_cuda:
                full_reason = ("an earlier full capture failed" if "full" in self._failed_modes
                               else cuda_graphs.full_graph_unsupported_reason(device))
                partial_reason = ("an earlier partial capture failed" if "partial" in self._failed_modes
                                  else cuda_graphs.partial_graph_unsupported_reason(device))
            mode, notes = resolve_graph_mode(self.cuda_graphs, algorithm=self.algorithm, device_type=device.type,
                                             full_reason=full_reason, partial_reason=partial_reason)
            for note in notes:
                _log_once(logging.INFO if device.type != "cuda" or "frame_looping" in note else logging.WARNING,
                          note)
            self._mode_cache[key] = mode
        self.mode_used = self._mode_cache[key]
        return self.mode_used

    def window_for(self, batch: int, dtype: torch.dtype) -> int:
        """The blank window of buffers for ``batch`` utterances in ``dtype``: as asked, or :func:`auto_blank_window`."""
        if self.blank_window != "auto":
            return self.blank_window
        return auto_blank_window(batch, tdt=self.durations is not None, dtype=dtype)

    def _new_buffers(self, batch: int, frames: int, enc: Tensor) -> label_looping.LoopBuffers:
        return label_looping.make_buffers(
            self.predictor, self.joint, batch_capacity=batch, frame_capacity=max(frames, 1),
            enc_dim=enc.shape[-1], dtype=enc.dtype, device=enc.device, blank_id=self.blank_id,
            durations=self.durations, max_symbols=self.max_symbols, window=self.window_for(batch, enc.dtype),
            kernels=self.kernel_choice(enc.device)[0])

    def _decode_eager(self, enc: Tensor, lengths: Tensor) -> list[Hypothesis]:
        batch, frames = enc.shape[0], enc.shape[1]
        buf = self._new_buffers(batch, frames, enc)
        self.window_used = None if self.algorithm == "frame_looping" else buf.window
        label_looping.load_inputs(buf, enc, lengths)
        if self.algorithm == "frame_looping":
            max_frames = int(lengths.max()) if frames else 0
            self.last_stats = run_frame_looping(buf, self.predictor, self.joint, max_frames)
        else:
            self.last_stats = self._run_eager(buf)
        return hypotheses_from_buffers(buf.tokens, buf.timestamps, buf.num_emitted, buf.scores, batch)

    def _decode_with_graphs(self, mode: str, enc: Tensor, lengths: Tensor) -> list[Hypothesis]:
        batch, frames = enc.shape[0], max(enc.shape[1], 1)
        captured = self._captured
        same_kind = (mode, enc.shape[-1], enc.dtype, enc.device)
        if (captured is None or captured.key[:4] != same_kind or captured.buffers.batch_capacity < batch
                or captured.buffers.frame_capacity < frames):
            if captured is not None and captured.key[:4] == same_kind:
                batch = max(batch, captured.buffers.batch_capacity)
                frames = max(frames, captured.buffers.frame_capacity)
            self._captured = None
            captured = self._capture(mode, batch, frames, enc, lengths)
            self._captured = captured
        buf = captured.buffers
        self.window_used = buf.window
        label_looping.load_inputs(buf, enc, lengths)
        if mode == "full":
            captured.graphs.replay()
        else:
            self.last_stats = _replay_partial(captured.graphs, buf)
        return hypotheses_from_buffers(buf.tokens, buf.timestamps, buf.num_emitted, buf.scores, enc.shape[0])

    def _capture(self, mode: str, batch: int, frames: int, enc: Tensor, lengths: Tensor) -> _CapturedDecode:
        buf = self._new_buffers(batch, frames, enc)
        label_looping.load_inputs(buf, enc, lengths)
        p, j = self.predictor, self.joint
        self._run_eager(buf)  # warm-up: library handles, workspaces and Triton kernels exist before capture
        torch.cuda.synchronize(enc.device)
        stages = {
            "start": lambda: label_looping.start(buf, p, j),
            "find_label_first": lambda: label_looping.find_label_first(buf, j),
            "find_label_again": lambda: label_looping.find_label_again(buf, j),
            "emit_labels": lambda: label_looping.emit_labels(buf, p, j),
        }
        graphs = cuda_graphs.capture_partial_graphs(stages, enc.device)
        keep: list = []
        if mode == "full":
            keep = [graphs]
            graphs = cuda_graphs.FullGraph(graphs, buf.active_any, buf.searching_any, enc.device)
        self.captures += 1
        key = (mode, enc.shape[-1], enc.dtype, enc.device, batch, frames)
        return _CapturedDecode(mode=mode, key=key, buffers=buf, graphs=graphs, keep_alive=keep)

    def _run_eager(self, buf: label_looping.LoopBuffers) -> dict[str, int]:
        """``label_looping.run_eager``; under kernels="auto" the first run of the fused kernels on a device is
        checked (synchronized), and a failure there raises ``_TritonFailure`` (the caller falls back to torch)."""
        device = buf.enc.device
        if buf.kernels != "triton" or self.kernels != "auto" or str(device) in self._triton_ran:
            return label_looping.run_eager(buf, self.predictor, self.joint)
        try:
            stats = label_looping.run_eager(buf, self.predictor, self.joint)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # an asynchronous failure shows here
        except Exception as e:  # noqa: BLE001 - any failure of the first fused run means the torch stages run
            raise _TritonFailure(f"{type(e).__name__}: {e}") from e
        self._triton_ran.add(str(device))
        return stats


def _replay_partial(graphs: dict[str, Any], buf: label_looping.LoopBuffers) -> dict[str, int]:
    graphs["start"].replay()
    outer = inner = 0
    while label_looping.read_flag(buf.active_any):
        graphs["find_label_first"].replay()
        while label_looping.read_flag(buf.searching_any):
            graphs["find_label_again"].replay()
            inner += 1
        graphs["emit_labels"].replay()
        outer += 1
    return {"outer_iterations": outer, "inner_iterations": inner}


def _check_inputs(enc: Tensor, lengths: Tensor) -> tuple[int, int]:
    """Validate shapes and lengths (one host sync); returns (batch, frames)."""
    if not isinstance(enc, Tensor) or enc.dim() != 3:
        raise ValueError(f"enc must be a [B, T, D] tensor, got {getattr(enc, 'shape', type(enc))}")
    if not enc.is_floating_point():
        raise ValueError(f"enc must be floating point, got {enc.dtype}")
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        raise ValueError(f"lengths must be a [B] tensor, got {getattr(lengths, 'shape', type(lengths))}")
    batch, frames = enc.shape[0], enc.shape[1]
    if lengths.shape[0] != batch:
        raise ValueError(f"lengths has {lengths.shape[0]} entries but enc has a batch of {batch}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be integers, got {lengths.dtype}")
    if batch:
        low, high = torch.stack([lengths.min(), lengths.max()]).tolist()
        if low < 0 or high > frames:
            bad = int(((lengths < 0) | (lengths > frames)).sum())
            raise ValueError(f"lengths must be in [0, {frames}] (T of enc); {bad} of {batch} are not "
                             f"(min {low}, max {high})")
    return batch, frames
