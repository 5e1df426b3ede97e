"""The bench's model sizes and decoding methods (workbench.decoding.methods.DecoderMethod)."""

from __future__ import annotations

import torch

from workbench.decoding import label_looping
from workbench.decoding.greedy import DEFAULT_BLANK_WINDOW, auto_blank_window
from workbench.decoding.methods import AUTO_WINDOW, DecoderMethod
from workbench.decoding.speed import FRAME_S  # noqa: F401 (the bench's frame length)

VOCAB, PRED, JOINT, ENC = 1024, 640, 640, 512  # the sizes of the NeMo comparison
BLANK = VOCAB
TDT_DURATIONS = [0, 1, 2, 3, 4]
W = AUTO_WINDOW  # the decoder's default blank window (greedy.auto_blank_window); rows say which window it took
W16 = DEFAULT_BLANK_WINDOW


def ours(mode: str, kernels: str = "torch", window: int | str = W) -> DecoderMethod:
    """Our label-looping decoder."""
    return DecoderMethod("label_looping", mode, kernels, window)


def nemo(mode: str) -> DecoderMethod:
    """NeMo's label-looping decoder."""
    return DecoderMethod("nemo", mode, "nemo")


FRAME_LOOPING_OFF = DecoderMethod("frame_looping", "off")
# Window 1 (one frame per search step) runs in fp32 only, to show what the window buys; window 16 runs only where
# "auto" takes another, to show what that choice buys. Kernels "triton" (the LSTM step fused too) sum in another
# order than cuDNN's: their rows are checked like frame-looping's.
METHODS = [FRAME_LOOPING_OFF, ours("off"), ours("partial"), ours("full"), ours("full", window=1),
           ours("off", "triton_cudnn"), ours("partial", "triton_cudnn"), ours("full", "triton_cudnn"),
           ours("full", "triton")]
# --nemo: ours and NeMo's label-looping decoders in each graph mode, on NeMo's modules. First pass, every size:
# what the targets need (the default kernels' full graph, NeMo's full graph and its partial graphs where the
# full one fails) and the partial graphs (their loop counts give the full graph's per-iteration figures);
# NeMo's full graph itself runs after every other row (grid.deferred_methods).
NEMO_TARGET_METHODS = [ours("full", "triton_cudnn"), ours("partial", "triton_cudnn"), nemo("full"), nemo("partial")]
# Second pass, while the budget lasts: the torch stages' full graph at every size; the eager modes and the torch
# stages' partial graphs (the slow ones) at Grid.breakdown_batches only.
NEMO_BREAKDOWN_EVERYWHERE = [ours("full"), ours("full", "triton"), ours("full", "triton_cudnn", W16)]
NEMO_BREAKDOWN_METHODS = [ours("off"), ours("partial"), ours("off", "triton_cudnn"), nemo("off")]
NEMO_METHODS = [*NEMO_TARGET_METHODS, *NEMO_BREAKDOWN_EVERYWHERE, *NEMO_BREAKDOWN_METHODS]
# The reference of each size, when the default method has no row there: the first of these that has one.
REFERENCE_ORDER = [ours("full", "triton_cudnn"), ours("off"), ours("partial", "triton_cudnn"), ours("full"),
                   ours("partial"), ours("off", "triton_cudnn")]


def default_decoder(device: torch.device, mode: str = "full") -> DecoderMethod:
    """What ``GreedyTransducerDecoder`` runs by default on ``device`` in graph ``mode``: the kernels that
    ``kernels="auto"`` picks (the fused ones on CUDA with Triton, else the torch stages)."""
    return ours(mode, label_looping.resolve_kernels("auto", device=device)[0])


def default_method(device: torch.device, mode: str = "full") -> str:
    """The label of :func:`default_decoder`."""
    return default_decoder(device, mode).label


def profiled_method(device: torch.device) -> DecoderMethod:
    """What --kernel-profile profiles: the default kernels' partial graphs on CUDA (the host runs the loop, so
    every iteration's kernels are traced), their eager mode elsewhere."""
    return default_decoder(device, "partial" if device.type == "cuda" else "off")


def window_runs_here(window, batch: int, tdt: bool, dtype: torch.dtype) -> bool:
    """Whether a method of blank ``window`` runs at this size: the default always, an explicit window only where
    "auto" takes another (else its row would repeat the default's)."""
    return window == W or window != auto_blank_window(batch, tdt=tdt, dtype=dtype)
