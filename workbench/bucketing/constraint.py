"""A lhotse SamplingConstraint with one fixed batch size per bucket, for 1D or 2D (duration, tokens) bins.

lhotse's DynamicBucketer calls ``select_bucket`` to place each incoming cut in a bucket queue, then
fills a batch from one queue with ``add`` until ``close_to_exceeding``; so the batch size of a batch is
the batch size of the bucket its cuts came from. Bucket choice follows :mod:`workbench.bucketing.fit`
(upper bounds inclusive). Cuts that fit no bucket must be filtered out before (see ``make_sampler``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from lhotse.dataset.sampling.base import SamplingConstraint

from workbench.bucketing.fit import REASONS, BucketFitter


def cut_num_tokens(cut) -> int:
    """Token count of a cut: ``cut.custom["num_tokens"]`` (``workbench corpus tokenizer --add-counts`` or
    ``workbench.data.tokenizer.add_token_counts`` writes it)."""
    custom = getattr(cut, "custom", None) or {}
    if "num_tokens" in custom:
        return int(custom["num_tokens"])
    raise ValueError(f"cut {cut.id!r} has no custom['num_tokens']: pass num_tokens_fn to count its tokens")


@dataclass
class BucketBatchSizeConstraint(SamplingConstraint):
    """Batch of at most ``batch_sizes[b]`` cuts, all from bucket ``b`` (1D or 2D bins)."""

    fitter: BucketFitter
    batch_sizes: list[int]
    num_tokens_fn: Callable[[Any], int] = cut_num_tokens
    current_bucket: int | None = None
    num_cuts: int = 0

    def __post_init__(self) -> None:
        if len(self.batch_sizes) != self.fitter.num_buckets:
            raise ValueError(f"batch_sizes has {len(self.batch_sizes)} entries but there are "
                             f"{self.fitter.num_buckets} buckets")
        bad = [b for b in self.batch_sizes if not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(f"batch_sizes has {len(bad)} values that are not positive integers: {bad[:5]}")

    def measure_length(self, example) -> float | tuple[float, int]:
        """Seconds (1D) or (seconds, tokens) (2D)."""
        if self.fitter.is_2d:
            return example.duration, self.num_tokens_fn(example)
        return example.duration

    def select_bucket(self, buckets: Any = None, example: Any = None, example_len: Any = None) -> int:
        """Index of the bucket for ``example`` (or ``example_len``); ValueError if it fits none."""
        if example_len is None:
            tokens = self.num_tokens_fn(example) if self.fitter.needs_tokens else None
            duration = example.duration
        elif isinstance(example_len, tuple):
            duration, tokens = example_len
        else:
            duration, tokens = example_len, None
        bucket, reason = self.fitter.select(duration, tokens)
        if bucket < 0:
            name = getattr(example, "id", example_len)
            raise ValueError(f"utterance {name!r} fits no bucket ({REASONS[reason]}): filter it before sampling")
        return bucket

    def add(self, example) -> None:
        bucket = self.select_bucket(example=example)
        if self.current_bucket is None:
            self.current_bucket = bucket
        elif bucket != self.current_bucket:
            raise ValueError(f"cut {example.id!r} belongs to bucket {bucket}, but this batch is from bucket "
                             f"{self.current_bucket}")
        self.num_cuts += 1

    def exceeded(self) -> bool:
        return self.current_bucket is not None and self.num_cuts > self.batch_sizes[self.current_bucket]

    def close_to_exceeding(self) -> bool:
        return self.current_bucket is not None and self.num_cuts >= self.batch_sizes[self.current_bucket]

    def reset(self) -> None:
        self.current_bucket = None
        self.num_cuts = 0
