"""Which sizes a run measures and which methods run at each: the grid, the two passes, the rows run last."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from benchmarks.decoding.cases import Case
from benchmarks.decoding.methods import (
    METHODS,
    NEMO_BREAKDOWN_EVERYWHERE,
    NEMO_BREAKDOWN_METHODS,
    NEMO_TARGET_METHODS,
    nemo,
    window_runs_here,
)
from workbench.decoding import fused
from workbench.decoding.methods import DecoderMethod

NEMO_FULL_GRAPH_LAST_FROM_B = 128  # NeMo's full graph at this B or more runs after its other sizes' (it has failed there)


@dataclass
class Grid:
    """What one run measures: batch sizes, encoder frames per utterance, dtypes; --nemo runs its breakdown
    methods (the eager modes, the torch stages' partial graphs) at ``breakdown_batches`` only; --kernel-profile
    profiles the fp32 sizes of ``profile_batches`` (those in the grid) at ``profile_frames``."""
    batches: list[int]
    frame_counts: list[int]
    dtypes: list[torch.dtype]
    breakdown_batches: list[int] = field(default_factory=lambda: [16])
    profile_batches: list[int] = field(default_factory=lambda: [1, 16, 128])
    profile_frames: int = 150

    @classmethod
    def of(cls, quick: bool, smoke: bool) -> "Grid":
        if smoke:  # CPU dry run of every code path (off modes only): seconds
            return cls([1, 3], [20], [torch.float32, torch.bfloat16], breakdown_batches=[1, 3],
                       profile_batches=[1, 3], profile_frames=20)
        if quick:
            return cls([1, 16], [150], [torch.float32])
        return cls([1, 16, 64, 128], [150, 375], [torch.float32, torch.bfloat16])

    def cells(self) -> list[tuple[torch.dtype, str, int, int]]:
        """(dtype, model, frames, batch) in the order they run: fp32 first, then bf16."""
        return [(dtype, model, frames, batch) for dtype in self.dtypes for model in ("rnnt", "tdt")
                for frames in self.frame_counts for batch in self.batches]

    def profiled(self, dtype: torch.dtype, frames: int, batch: int) -> bool:
        """Whether --kernel-profile profiles this size."""
        return dtype == torch.float32 and frames == self.profile_frames and batch in self.profile_batches


def methods_for(case: Case) -> list[DecoderMethod]:
    """The case's methods that apply: frame-looping is RNN-T only, graphs need CUDA, window 1 runs in fp32, window
    16 where the default window is another, the fused kernels run on CUDA with Triton (not in the CPU smoke run:
    Triton's interpreter is far too slow)."""
    fused_reason = "CPU" if case.device.type != "cuda" else fused.triton_unavailable_reason(case.device)
    return [m for m in case.methods
            if not ((m.algorithm == "frame_looping" and case.durations is not None)
                    or (m.fused and fused_reason is not None)
                    or (case.device.type != "cuda" and m.graph_mode != "off")
                    or (m.blank_window == 1 and case.dtype != torch.float32)
                    or not window_runs_here(m.blank_window, case.batch, case.durations is not None, case.dtype))]


def plan_methods(nemo: bool, batch: int, grid: Grid) -> tuple[list, list]:
    """(first pass, second pass) methods of a size: without --nemo every method in one pass; with it, what the
    targets need first, and the breakdown after every size's first pass (its eager modes and the torch stages'
    partial graphs at ``grid.breakdown_batches`` only)."""
    if not nemo:
        return list(METHODS), []
    later = NEMO_BREAKDOWN_EVERYWHERE + (NEMO_BREAKDOWN_METHODS if batch in grid.breakdown_batches else [])
    return list(NEMO_TARGET_METHODS), list(later)


def deferred_methods(case: Case, methods: list[DecoderMethod]) -> list[DecoderMethod]:
    """The group that runs again after every other row when NeMo's full graph is among ``methods``: the
    full-graph methods. NeMo's runs only there; ours also run in the pass, so they keep a row if NeMo's fails."""
    if nemo("full") in methods:
        return [m for m in methods if m.graph_mode == "full"]
    return []
