"""One vocabulary for the decoder choice: which loop, CUDA-graph mode, stage kernels and blank window a decoder
runs, the label that tables and records show for it, and the ``GreedyTransducerDecoder`` options that build it."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Any

AUTO_WINDOW = "auto"  # the decoder's default blank window (greedy.auto_blank_window)
GRAPH_MODES = ("off", "partial", "full")  # GreedyTransducerDecoder's cuda_graphs
# label-looping's stage kernels (fused.KERNELS) and the word a label gives them
KERNEL_WORDS = {"torch": "", "triton_cudnn": " fused", "triton": " fused+lstm"}
NEMO_LABELS = {"off": "NeMo no graphs", "partial": "NeMo partial graphs", "full": "NeMo full graph"}


@dataclass(frozen=True)
class DecoderMethod:
    """A decoder choice. ``algorithm`` "nemo" is NeMo's own greedy decoder (a peer the bench runs); its
    ``kernels`` are NeMo's ("nemo")."""
    algorithm: str  # "frame_looping", "label_looping" or "nemo"
    graph_mode: str  # "off", "partial" or "full" (cuda_graphs)
    kernels: str = "torch"  # "torch" (PyTorch stages), "triton_cudnn" (fused, cuDNN LSTM), "triton" (LSTM fused too)
    blank_window: int | str = AUTO_WINDOW  # frames a label-looping search step covers; "auto": the decoder picks

    @property
    def label(self) -> str:
        """The name in tables and records: "label-looping fused full window 16", "NeMo partial graphs", ..."""
        if self.algorithm == "nemo":
            return NEMO_LABELS[self.graph_mode]
        loop = "frame-looping" if self.algorithm == "frame_looping" else "label-looping"
        window = "" if self.blank_window == AUTO_WINDOW else f" window {self.blank_window}"
        return f"{loop}{KERNEL_WORDS[self.kernels]} {self.graph_mode}{window}"

    @property
    def fused(self) -> bool:
        """Whether it runs the fused Triton kernels (CUDA with Triton only)."""
        return self.kernels in ("triton", "triton_cudnn")

    @property
    def own_window(self) -> bool:
        """Whether its blank window is given explicitly instead of the decoder's default."""
        return self.blank_window != AUTO_WINDOW

    def decoder_options(self) -> dict[str, Any]:
        """The ``GreedyTransducerDecoder`` keyword arguments that run it (not for "nemo")."""
        return {"algorithm": self.algorithm, "cuda_graphs": self.graph_mode, "kernels": self.kernels,
                "blank_window": self.blank_window}

    @classmethod
    def of_label(cls, label: str) -> DecoderMethod | None:
        """The method a table or record names ``label`` (a lookup in :data:`BY_LABEL`); None for another
        decoder (torchaudio's beam search)."""
        return BY_LABEL.get(label)


def known_methods(windows: tuple = (AUTO_WINDOW, 1, 16)) -> list[DecoderMethod]:
    """Every method of blank window in ``windows``, in a stable order."""
    ours = [DecoderMethod("frame_looping", mode) for mode in GRAPH_MODES]
    ours += [DecoderMethod("label_looping", mode, kernels, window)
             for kernels, mode, window in product(KERNEL_WORDS, GRAPH_MODES, windows)]
    return ours + [DecoderMethod("nemo", mode, "nemo") for mode in GRAPH_MODES]


BY_LABEL = {m.label: m for m in known_methods()}  # label -> method: how a written record's strings are read
