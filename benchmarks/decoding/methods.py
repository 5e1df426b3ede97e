"""The bench's model sizes and decoding methods: (algorithm, graph mode, blank window) tuples and their names."""

from __future__ import annotations

import torch

from workbench.decoding import label_looping
from workbench.decoding.greedy import DEFAULT_BLANK_WINDOW, auto_blank_window
from workbench.decoding.speed import AUTO_WINDOW, FRAME_S, FUSED, FUSED_LSTM, method_name  # noqa: F401 (the bench's names)

VOCAB, PRED, JOINT, ENC = 1024, 640, 640, 512  # the sizes of the NeMo comparison
BLANK = VOCAB
TDT_DURATIONS = [0, 1, 2, 3, 4]
W = AUTO_WINDOW  # the decoder's default blank window (greedy.auto_blank_window); rows say which window it took
W16 = DEFAULT_BLANK_WINDOW
# (algorithm, graph mode, blank window); the window applies to label-looping (RNN-T and TDT). Window 1
# (one frame per search step) runs in fp32 only, to show what the window buys; window 16 runs only where "auto"
# takes another, to show what that choice buys.
# FUSED, FUSED_LSTM: workbench.decoding.speed (the fused LSTM step sums in another order than cuDNN's: its rows
# are checked like frame-looping's).
METHODS = [("frame_looping", "off", W), ("label_looping", "off", W), ("label_looping", "partial", W),
           ("label_looping", "full", W), ("label_looping", "full", 1),
           (FUSED, "off", W), (FUSED, "partial", W), (FUSED, "full", W), (FUSED_LSTM, "full", W)]
# --nemo: ours and NeMo's label-looping decoders in each graph mode, on NeMo's modules. First pass, every size:
# what the targets need (the default kernels' full graph, NeMo's full graph and its partial graphs where the
# full one fails) and the partial graphs (their loop counts give the full graph's per-iteration figures);
# NeMo's full graph itself runs after every other row (grid.deferred_methods).
NEMO_TARGET_METHODS = [(FUSED, "full", W), (FUSED, "partial", W), ("nemo", "full", W), ("nemo", "partial", W)]
# Second pass, while the budget lasts: the torch stages' full graph at every size; the eager modes and the torch
# stages' partial graphs (the slow ones) at Grid.breakdown_batches only.
NEMO_BREAKDOWN_EVERYWHERE = [("label_looping", "full", W), (FUSED_LSTM, "full", W), (FUSED, "full", W16)]
NEMO_BREAKDOWN_METHODS = [("label_looping", "off", W), ("label_looping", "partial", W), (FUSED, "off", W),
                          ("nemo", "off", W)]
NEMO_METHODS = [*NEMO_TARGET_METHODS, *NEMO_BREAKDOWN_EVERYWHERE, *NEMO_BREAKDOWN_METHODS]
# The reference of each size, when the default method has no row there: the first of these that has one.
REFERENCE_ORDER = [(FUSED, "full", W), ("label_looping", "off", W), (FUSED, "partial", W), ("label_looping", "full", W),
                   ("label_looping", "partial", W), (FUSED, "off", W)]


def default_algorithm(device: torch.device) -> str:
    """The bench's name for what ``GreedyTransducerDecoder`` runs by default on ``device``: the fused kernels
    (``FUSED``) where ``kernels="auto"`` picks them (CUDA, triton importable), else the torch stages."""
    return "label_looping" if label_looping.resolve_kernels("auto", device=device)[0] == "torch" else FUSED


def default_method(device: torch.device, mode: str = "full") -> str:
    """The method that ``GreedyTransducerDecoder`` runs by default on ``device`` in graph ``mode``."""
    return method_name(default_algorithm(device), mode)


def profiled_method(device: torch.device) -> tuple[str, str, int | str]:
    """(algorithm, mode, window) that --kernel-profile profiles: the default kernels' partial graphs on CUDA
    (the host runs the loop, so every iteration's kernels are traced), their eager mode elsewhere."""
    return default_algorithm(device), "partial" if device.type == "cuda" else "off", W


def own_window(method: str) -> bool:
    """Whether the method (by name) runs a blank window given explicitly instead of the decoder's default."""
    return " window " in method


def window_runs_here(window, batch: int, tdt: bool, dtype: torch.dtype) -> bool:
    """Whether a method of blank ``window`` runs at this size: the default always, an explicit window only where
    "auto" takes another (else its row would repeat the default's)."""
    return window == W or window != auto_blank_window(batch, tdt=tdt, dtype=dtype)
