"""Sampler factory: lhotse's DynamicBucketingSampler driven by a bucket profile (bins + batch sizes).

Every batch comes from one bucket and holds at most that bucket's batch size. Utterances that fit no
bucket (too long, too many tokens, tokens per second over the bucket's limit) are filtered at sampling
time and counted in ``sampler.unfit_report`` with examples; the first of each kind is logged.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from lhotse import CutSet
from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler

from workbench.bucketing.constraint import BucketBatchSizeConstraint, cut_num_tokens
from workbench.bucketing.fit import FITS, REASONS, make_fitter
from workbench.bucketing.profile import BucketProfile, validate_profile
from workbench.options import check_int

log = logging.getLogger(__name__)
NO_TOKEN_COUNT = "no_token_count"  # num_tokens_fn failed on the cut
UNFIT_REASONS = [*REASONS.values(), NO_TOKEN_COUNT]


@dataclass
class UnfitReport:
    """Counts of utterances seen by the sampler and of those that fit no bucket, with a few examples."""

    seen: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {name: 0 for name in UNFIT_REASONS})
    examples: dict[str, list[dict]] = field(default_factory=lambda: {name: [] for name in UNFIT_REASONS})
    max_examples: int = 5
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def total_unfit(self) -> int:
        return sum(self.counts.values())

    def record(self, cut_id: str, duration: float, num_tokens: int | None, reason: str) -> None:
        with self._lock:
            first = self.counts[reason] == 0
            self.counts[reason] += 1
            if len(self.examples[reason]) < self.max_examples:
                self.examples[reason].append({"id": cut_id, "duration": duration, "num_tokens": num_tokens})
        if first:
            log.warning("utterance %r fits no bucket (%s: %.3f s, %s tokens); it is skipped, and every such "
                        "utterance is counted in sampler.unfit_report", cut_id, reason, duration, num_tokens)

    def summary(self) -> str:
        if not self.total_unfit:
            return f"all {self.seen} utterances seen fit a bucket"
        parts = [f"{n} {reason}" for reason, n in self.counts.items() if n]
        ex = next(e for r in self.examples.values() for e in r)
        return (f"{self.total_unfit} of {self.seen} utterances fit no bucket ({', '.join(parts)}); "
                f"e.g. {ex['id']} ({ex['duration']:.2f} s, {ex['num_tokens']} tokens)")

    def to_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "unfit": dict(self.counts), "examples": {k: list(v) for k, v in self.examples.items()}}


@dataclass
class FitFilter:
    """Sampler filter: True for cuts that fit a bucket; records the others in ``report``."""

    constraint: BucketBatchSizeConstraint
    report: UnfitReport

    def __call__(self, cut) -> bool:
        fitter = self.constraint.fitter
        tokens = None
        if fitter.needs_tokens:
            try:
                tokens = self.constraint.num_tokens_fn(cut)
            except Exception:  # noqa: BLE001
                # raising here would kill lhotse's concurrent filling thread and hang the sampler
                self.report.seen += 1
                self.report.record(cut.id, float(cut.duration), None, NO_TOKEN_COUNT)
                return False
        _, reason = fitter.select(cut.duration, tokens)
        self.report.seen += 1
        if reason == FITS:
            return True
        self.report.record(cut.id, float(cut.duration), tokens, REASONS[reason])
        return False


def make_sampler(cuts: CutSet, profile: BucketProfile, *, world_size: int = 1, rank: int = 0,
                 concurrent: bool = True, shuffle: bool = True, seed: int = 0,
                 num_tokens_fn: Callable[[Any], int] | None = None, buffer_size: int = 20000,
                 strict_2d: bool = True, drop_last: bool = False) -> DynamicBucketingSampler:
    """A DynamicBucketingSampler yielding CutSet batches of at most ``profile.bucket_batch_size[b]`` cuts,
    all from bucket ``b``.

    1D or 2D bins from the profile; ``profile.max_tps`` (one value or one per bucket) applied to each cut
    while sampling. Token counts come from ``num_tokens_fn(cut)`` (default: ``cut.custom["num_tokens"]``).
    ``sampler.unfit_report`` counts what was skipped. Concurrent bucketing (a background thread fills
    the buckets) is on by default; call :func:`close_sampler` when leaving an epoch early.

    Dynamic batch shapes want the CUDA allocator's expandable segments: call
    ``workbench.memory.configure_allocator()`` before CUDA starts (``workbench train`` does).
    """
    if not isinstance(profile, BucketProfile):
        raise TypeError(f"profile: expected a BucketProfile (workbench.bucketing.load_profile reads one), got "
                        f"{type(profile).__name__}")
    validate_profile(profile)
    for name, value, minimum in (("buffer_size", buffer_size, 1), ("seed", seed, 0)):
        check_int(value, name, minimum)
    if profile.bucket_batch_size is None:
        raise ValueError("profile has no 'bucket_batch_size': run the OOMptimizer or set one batch size per bucket")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    bins = [tuple(b) for b in profile.bucket_duration_bins] if profile.is_2d else list(profile.bucket_duration_bins)
    fitter = make_fitter(bins, profile.max_tps, strict_2d=strict_2d)
    constraint = BucketBatchSizeConstraint(fitter=fitter, batch_sizes=list(profile.bucket_batch_size),
                                           num_tokens_fn=num_tokens_fn or cut_num_tokens)
    if fitter.needs_tokens:  # fail now on a corpus without token counts, not in the filling thread
        first = next(iter(cuts), None)
        if first is not None:
            constraint.num_tokens_fn(first)
    sampler = DynamicBucketingSampler(cuts, constraint=constraint, duration_bins=bins, shuffle=shuffle,
                                      drop_last=drop_last, buffer_size=buffer_size, world_size=world_size,
                                      rank=rank, seed=seed, concurrent=concurrent)
    report = UnfitReport()
    sampler.filter(FitFilter(constraint, report))
    sampler.unfit_report = report
    sampler.profile = profile
    return sampler


STATE_KEY = "workbench_profile"  # the profile a sampler state was saved with (checked on resume)


def _profile_fields(profile: BucketProfile) -> dict[str, Any]:
    """What sampling depends on (not the metadata), in the profile file's own form."""
    fields = profile.to_dict()
    return {name: fields.get(name) for name in ("bucket_duration_bins", "bucket_batch_size", "max_tps")}


def sampler_state_dict(sampler: DynamicBucketingSampler, *, batches_consumed: int | None = None,
                       epoch: int | None = None) -> dict[str, Any]:
    """Where a :func:`make_sampler` sampler is in its epoch (epoch, batches so far, seed, ...), for a
    training checkpoint; plain types only (``torch.save`` or JSON).

    lhotse's own ``state_dict()`` refuses samplers with a custom constraint, since it cannot rebuild one;
    ours is rebuilt from the profile by ``make_sampler``, so this saves lhotse's state without it, plus
    the profile, which :func:`load_sampler_state_dict` checks. A plain lhotse sampler (no profile) gives
    its own ``state_dict()``.

    ``batches_consumed``: the batches of the current epoch that training has used. A DataLoader's
    workers draw ahead of training; with this count the state resumes after the last batch trained on,
    so batches in flight at save time are neither lost nor repeated. ``epoch``: the epoch those batches
    belong to, when the sampler has drawn ahead into a later one (default: its current epoch); the state
    then resumes in that epoch, and the later epochs are drawn again after it."""
    if not hasattr(sampler, "profile"):
        state = sampler.state_dict()
    else:
        constraint, sampler.constraint = sampler.constraint, None
        try:
            state = sampler.state_dict()
        finally:
            sampler.constraint = constraint
        state[STATE_KEY] = _profile_fields(sampler.profile)
    if epoch is not None:
        if batches_consumed is None:
            raise ValueError("epoch: give batches_consumed too (the batches of that epoch trained on)")
        current = state["diagnostics"]["current_epoch"]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= current:
            raise ValueError(f"epoch must be an integer in [0, {current}] (the sampler's epoch), got {epoch!r}")
    if batches_consumed is not None:
        _rewind_to(state, batches_consumed, epoch)
    return state


def _rewind_to(state: dict[str, Any], batches_consumed: int, epoch: int | None = None) -> None:
    """Make a lhotse sampler state count ``batches_consumed`` batches in ``epoch`` (default: its current
    epoch), and make that epoch the current one (resuming fast-forwards past exactly that many)."""
    diagnostics = dict(state["diagnostics"])
    epoch = diagnostics["current_epoch"] if epoch is None else epoch
    per_epoch = {e: stats for e, stats in diagnostics["stats_per_epoch"].items() if int(e) <= epoch}
    stats = dict(per_epoch.get(epoch, {"epoch": epoch, "kept_cuts": 0, "discarded_cuts": 0, "kept_batches": 0,
                                       "discarded_batches": 0}))
    drawn = stats["kept_batches"] + stats["discarded_batches"]
    if not 0 <= batches_consumed <= drawn:
        raise ValueError(f"batches_consumed is {batches_consumed}, but the sampler drew {drawn} this epoch")
    stats["kept_batches"], stats["discarded_batches"] = batches_consumed, 0
    per_epoch[epoch] = stats
    diagnostics["stats_per_epoch"] = per_epoch
    diagnostics["current_epoch"] = epoch
    state["diagnostics"] = diagnostics
    state["epoch"] = epoch


def load_sampler_state_dict(sampler: DynamicBucketingSampler, state: dict[str, Any], *,
                            batch_size_changes: list[tuple[int, int, int]] = ()) -> None:
    """Resume a sampler from :func:`sampler_state_dict`: make it with ``make_sampler`` (or lhotse, without
    a profile) on the same cuts, profile, seed and world size, then call this; iteration continues the saved epoch after the batches
    already seen (lhotse re-draws and skips them: no audio is read).

    With ``concurrent=False`` the following batches are exactly those of the uninterrupted run. With
    concurrent bucketing (the default) the same number of batches is skipped, but which bucket each
    batch comes from depends on the filling thread's timing, so the rest of the epoch may differ.

    ``batch_size_changes``: ``(batch, bucket, batch_size)`` for each :func:`set_bucket_batch_size` made during
    the saved epoch, in effect from that batch of the epoch on (0-based, counting the batches drawn). Set
    the sizes in effect at the epoch's start first; the changes are replayed while the batches already seen
    are drawn again, so those are the same batches, and are all in effect afterwards.
    Raises ValueError naming the field when the state does not match this sampler."""
    state = dict(state)
    saved = state.pop(STATE_KEY, None)
    if not hasattr(sampler, "profile"):  # a plain lhotse sampler
        if saved is not None:
            raise ValueError("sampler state: saved with a bucket profile, but this sampler has none: resume with "
                             "the same profile")
        if batch_size_changes:
            raise ValueError("sampler state: batch size changes need a sampler made by make_sampler")
        saved = current = {}
    elif saved is None:
        raise ValueError(f"sampler state: no '{STATE_KEY}' field (not written by sampler_state_dict)")
    else:
        current = _profile_fields(sampler.profile)
    for name in current:
        if saved.get(name) != current[name]:
            raise ValueError(f"sampler state: '{name}' differs from this sampler's profile "
                             f"(saved {saved.get(name)!r}, now {current[name]!r}): resume with the same profile")
    for name in ("world_size", "seed"):
        if state.get(name) != getattr(sampler, name):
            raise ValueError(f"sampler state: '{name}' is {state.get(name)!r}, this sampler has "
                             f"{getattr(sampler, name)!r}: resume with the same {name}")
    diagnostics = dict(state["diagnostics"])  # JSON turns the per-epoch keys into strings: back to ints
    diagnostics["stats_per_epoch"] = {int(k): v for k, v in diagnostics["stats_per_epoch"].items()}
    state["diagnostics"] = diagnostics
    seen = _batches_seen(state)
    replayed = sorted(c for c in batch_size_changes if c[0] < seen)
    if replayed:
        _rewind_to(state, replayed[0][0])
    sampler.load_state_dict(state)  # lhotse re-draws the batches the state counts
    for i, (batch, bucket, size) in enumerate(replayed):
        set_bucket_batch_size(sampler, bucket, size)
        until = replayed[i + 1][0] if i + 1 < len(replayed) else seen
        for _ in range(until - batch):
            next(sampler)
    if replayed:
        sampler._just_restored_state = True  # as lhotse's own fast-forward leaves it: iter() continues the epoch
    for batch, bucket, size in sorted(batch_size_changes):
        if batch >= seen:
            set_bucket_batch_size(sampler, bucket, size)


def _batches_seen(state: dict[str, Any]) -> int:
    """Batches of its current epoch that a lhotse sampler state counts."""
    diagnostics = state["diagnostics"]
    stats = diagnostics["stats_per_epoch"].get(diagnostics["current_epoch"])
    return 0 if stats is None else stats["kept_batches"] + stats["discarded_batches"]


def batches_drawn(sampler: DynamicBucketingSampler) -> int:
    """Batches the sampler has drawn in its current epoch (a DataLoader's workers draw ahead of training)."""
    return sampler.diagnostics.current_epoch_stats.total_batches


def set_bucket_batch_size(sampler: DynamicBucketingSampler, bucket: int, batch_size: int) -> None:
    """From the next batch the sampler draws on, bucket ``bucket`` gives batches of at most ``batch_size``
    cuts (``sampler.profile`` keeps the file's sizes). ValueError naming the bucket or the size."""
    constraint = getattr(sampler, "constraint", None)
    if not isinstance(constraint, BucketBatchSizeConstraint):
        raise ValueError("set_bucket_batch_size: the sampler was not made by make_sampler (no per-bucket sizes)")
    if not isinstance(bucket, int) or not 0 <= bucket < len(constraint.batch_sizes):
        raise ValueError(f"set_bucket_batch_size: bucket {bucket!r} is not in [0, {len(constraint.batch_sizes)})")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"set_bucket_batch_size: batch_size must be a positive integer, got {batch_size!r}")
    constraint.batch_sizes[bucket] = batch_size  # lhotse copies the constraint per batch, sharing this list


def close_sampler(sampler: DynamicBucketingSampler) -> None:
    """End the current epoch's iteration now (stops the concurrent filling thread)."""
    it = getattr(sampler, "cuts_iter", None)
    if it is not None and hasattr(it, "close"):
        it.close()
