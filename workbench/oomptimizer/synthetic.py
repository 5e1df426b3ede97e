"""Synthetic memory models: probes with a known answer, shared by the tests and the notebook.

Each model gives the peak bytes of one training step at ``(bucket, batch_size)``; its probe raises
``torch.OutOfMemoryError`` when the peak exceeds the budget, like the GPU. Shapes:
- ``linear``: base + n * (a * duration + b * tokens + c)
- ``quadratic``: base + n * (a * duration + q * duration^2 + j * duration * tokens) (attention, joint)
- ``noisy``: quadratic with a deterministic jitter of +-``jitter`` on every peak (the OOM follows it)
- ``step``: quadratic rounded up to coarse blocks, plus a workspace jump above a batch size, like
  allocator rounding and a kernel that switches algorithm.

``SplitBatchMemory`` is a transducer whose first layer splits a large batch into chunks (like NeMo's
conv subsampling): linear in the batch size within a bucket, with an upward step at each split level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from workbench.oomptimizer.search import search_batch_sizes
from workbench.units import GiB

MODEL_KINDS = ("linear", "quadratic", "noisy", "step")


@dataclass
class SyntheticMemory:
    kind: str = "quadratic"  # one of MODEL_KINDS
    budget_bytes: float = 80 * GiB  # peaks above this raise OOM
    base_bytes: float = 6 * GiB  # weights, gradients, optimizer state
    per_second: float = 40e6  # bytes per item per second of audio
    per_second_sq: float = 1.0e6  # bytes per item per second^2 (attention)
    per_second_token: float = 0.25e6  # bytes per item per (second * token) (transducer joint)
    per_token: float = 2e6  # bytes per item per token (linear model)
    per_item: float = 50e6  # bytes per item, fixed (linear model)
    jitter: float = 0.02  # relative amplitude of the noise (noisy)
    block_bytes: float = 256 * (1 << 20)  # rounding block (step)
    jump_batch_size: int = 64  # above this batch size a workspace of jump_bytes appears (step)
    jump_bytes: float = 1.5 * GiB
    seed: int = 0

    def __post_init__(self):
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind: must be one of {MODEL_KINDS}, got {self.kind!r}")

    def peak(self, bucket: tuple[float, float], batch_size: int) -> float:
        """Peak bytes of one step at the bucket's worst case (duration s, tokens) and batch size."""
        d, u = float(bucket[0]), float(bucket[1])
        n = int(batch_size)
        if self.kind == "linear":
            return self.base_bytes + n * (self.per_second * d + self.per_token * u + self.per_item)
        act = n * (self.per_second * d + self.per_second_sq * d * d + self.per_second_token * d * u)
        if self.kind == "noisy":
            return (self.base_bytes + act) * (1.0 + self.jitter * (2.0 * self._hash(d, u, n) - 1.0))
        if self.kind == "step":
            act = math.ceil(act / self.block_bytes) * self.block_bytes
            return self.base_bytes + act + (self.jump_bytes if n > self.jump_batch_size else 0.0)
        return self.base_bytes + act

    def probe(self, bucket: tuple[float, float], batch_size: int) -> float:
        """Like a GPU probe: the peak, or torch.OutOfMemoryError above the budget."""
        return _probe(self.peak(bucket, batch_size), self.budget_bytes)

    def true_max(self, bucket: tuple[float, float], limit: int = 1 << 16) -> int:
        """The largest batch size n such that every size 1..n fits (0 if 1 does not)."""
        return _largest_fitting(lambda n: self.peak(bucket, n), self.budget_bytes, limit)

    def _hash(self, d: float, u: float, n: int) -> float:
        """A uniform number in [0, 1) that depends on (bucket, batch size, seed) only (splitmix64)."""
        x = (int(d * 1000) * 0x9E3779B97F4A7C15 + int(u) * 0xBF58476D1CE4E5B9 + n * 0x94D049BB133111EB
             + self.seed) & 0xFFFFFFFFFFFFFFFF
        for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFFFFFFFFFF
        return ((x ^ (x >> 31)) >> 11) / float(1 << 53)


@dataclass
class SplitBatchMemory:
    """A transducer whose subsampling splits a large batch: peak = base + n * cost(bucket) + n * step(bucket)
    * split_level(n), with cost = per_second * d + per_second_token * d * u (bytes per item).

    Like NeMo's ConvSubsampling: once the input [n, 1, frames, features] holds more than ``split_elements``
    elements, the batch runs in 2**p chunks (p = ceil(log2(elements / split_elements)), the split level)
    whose outputs are concatenated; each level keeps ``step_bytes_per_frame`` more per item and input frame.
    The concatenated copy alone (256 channels x frames/8 x 10 mels in bf16: 640 bytes per input frame) is
    0.3-0.5 % of the per-item cost, too small to mislead a search; the default, 24 KiB, adds about two copies
    of the first convolution's bf16 output (256 x 40 mels at half the frames: 10 KiB per input frame),
    a step of 12-18 % of the per-item cost. The defaults put the true maxima of the H200 FastConformer
    RNN-T buckets (``H200_RNNT_BUCKETS``) at or above the sizes its search found there, below 1.1x them.
    """

    budget_bytes: float = 126 * GiB  # peaks above this raise OOM
    base_bytes: float = 6 * GiB  # weights, gradients, optimizer state
    per_second: float = 11.9e6  # bytes per item per second of audio
    per_second_token: float = 0.106e6  # bytes per item per (second * token) (transducer joint)
    frames_per_second: float = 100.0  # input feature frames per second
    features: int = 80  # mel bins per frame
    split_elements: float = 2**31 / 256 * 4  # input elements above which the batch is split in two
    step_bytes_per_frame: float = 24 * 1024  # bytes per item and input frame added at each split level

    def split_level(self, duration: float, batch_size: int) -> int:
        """p: the batch runs in 2**p chunks (0: not split)."""
        elements = batch_size * round(duration * self.frames_per_second) * self.features
        return 0 if elements <= self.split_elements else math.ceil(math.log2(elements / self.split_elements))

    def peak(self, bucket: tuple[float, float], batch_size: int) -> float:
        """Peak bytes of one step at the bucket's worst case (duration s, tokens) and batch size."""
        d, u = float(bucket[0]), float(bucket[1])
        n = int(batch_size)
        frames = round(d * self.frames_per_second)
        step = self.step_bytes_per_frame * frames * self.split_level(d, n)
        return self.base_bytes + n * (self.per_second * d + self.per_second_token * d * u + step)

    def probe(self, bucket: tuple[float, float], batch_size: int) -> float:
        """Like a GPU probe: the peak, or torch.OutOfMemoryError above the budget."""
        return _probe(self.peak(bucket, batch_size), self.budget_bytes)

    def true_max(self, bucket: tuple[float, float], limit: int = 1 << 16) -> int:
        """The largest batch size n such that every size 1..n fits (0 if 1 does not)."""
        return _largest_fitting(lambda n: self.peak(bucket, n), self.budget_bytes, limit)


# (max duration s, max tokens) of the FastConformer RNN-T buckets searched on the H200
H200_RNNT_BUCKETS = [(5.93, 17.0), (5.93, 57.0), (9.76, 33.0), (9.76, 119.0), (14.68, 51.0), (14.68, 153.0),
                     (24.99, 80.0), (24.99, 221.0)]


def _probe(peak: float, budget_bytes: float) -> float:
    """The peak, or torch.OutOfMemoryError when it exceeds the budget (bytes)."""
    if peak > budget_bytes:
        raise torch.OutOfMemoryError(f"synthetic OOM: {peak / GiB:.2f} GiB > {budget_bytes / GiB:.2f} GiB")
    return peak


def _largest_fitting(peak, budget_bytes: float, limit: int) -> int:
    """The largest n <= limit such that peak(1..n) all fit in the budget (0 if peak(1) does not)."""
    n = 0
    while n < limit and peak(n + 1) <= budget_bytes:
        n += 1
    return n


def demo_buckets(num_durations: int = 15, num_subbuckets: int = 2, max_duration: float = 40.0,
                 tokens_per_second: float = 6.0) -> list[tuple[float, float]]:
    """A 2D grid of (max duration s, max tokens) like estimate_2d_bins gives: durations spread up to
    ``max_duration``, ``num_subbuckets`` token bounds per duration."""
    out = []
    for k in range(1, num_durations + 1):
        d = round(max_duration * (k / num_durations) ** 1.3, 2)
        for s in range(1, num_subbuckets + 1):
            out.append((d, float(math.ceil(d * tokens_per_second * (0.6 + 0.6 * s / num_subbuckets)))))
    return out


def compare_strategies(memory: SyntheticMemory, buckets, *, rel_gap: float = 0.05, budget_known: bool = True,
                       strategies=("predictive", "bisect")) -> dict:
    """Each search strategy from scratch on the same ``buckets`` of ``memory``: {strategy: SearchResult}.
    The search is given the budget only when ``budget_known`` (else it learns it from OOMs)."""
    return {strategy: search_batch_sizes(buckets, memory.probe, rel_gap=rel_gap, strategy=strategy,
                                         budget_bytes=memory.budget_bytes if budget_known else None)
            for strategy in strategies}
