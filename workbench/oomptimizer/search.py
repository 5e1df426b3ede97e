"""Per-bucket batch-size search over a probe: pure logic, runs on CPU against any probe.

``probe(bucket, batch_size)`` runs one training step at that bucket's worst case and returns its peak
memory in bytes, or raises ``torch.OutOfMemoryError``. For each bucket the search returns the largest
batch size it found that fits; every returned size was probed successfully.

Two strategies:
- ``bisect``: largest bucket first, each bucket starting from the previous result; double until the
  first OOM (halve while the start fails), then bisect until
  (smallest OOM - largest fit) / smallest OOM <= rel_gap.
- ``predictive``: fits peak = base + batch_size * per_item_cost(bucket) (memory_model.py) to every
  successful probe (per-item cost measured per bucket, predicted for a new bucket from its shape),
  jumps to the predicted maximum, and stops when the bracket closes to rel_gap, where the upper end is
  the smallest OOM, or the first size whose predicted peak exceeds the budget (a fraction of rel_gap
  only, since a prediction is weaker than an OOM). The budget is the given one until an OOM is
  predicted below it (on a GPU steps fail a little before the limit), then it is learned from the
  OOMs; with no budget given it is learned from OOMs alone. Noisy peaks (the fit's residual) make the
  proof use an optimistic reading. Buckets run largest first.
  Peaks may be piecewise linear in the batch size (a model that splits a large batch into chunks, a
  kernel that switches workspace): a peak that rises above its bucket's line beyond the fit's noise
  starts a new piece, and the fit keeps only each bucket's top piece. An OOM the model did not predict
  is a step it missed: the next size assumes the largest step seen so far (or splits the bracket).

A plan (``prior``: :class:`PlannedPeaks`, from ``workbench oomptimize --plan``) gives every bucket's per-item
cost before any probe: the predictive search scales it by what the buckets probed so far measured (the
ratio of measured to planned cost, as it varies with the bucket's shape: ``plan_ratio``) and aims each
bucket's first probe just below the largest size that fits, so that a good plan needs about one probe per
bucket.

``stop()`` (optional) is asked between buckets: once it returns True no new bucket starts, and the
buckets not searched keep batch size None (``SearchResult.not_searched``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from workbench.oomptimizer.memory_model import MemoryFit, fit_base_and_costs, fit_shape_model, shape_features
from workbench.options import check_int

Bucket = tuple[float, float]  # (max duration in seconds, max tokens) of one bucket
Probe = Callable[[Bucket, int], float]
STRATEGIES = ("predictive", "bisect")
NOT_SEARCHED = "not searched"  # stop reason of a bucket the search stopped before
# A peak above its bucket's line by more than this share of rel_gap (and 3x the fit's noise) starts a new
# linear piece. Tuned on the synthetic models: 0.6 lets the notebook's +-2 % jitter start pieces (more
# probes), 0.8 misses steps of 4 % of the per-item cost (SplitBatchMemory at 8 KiB per frame).
DEPARTURE_GAP_SHARE = 0.7
# How far below a plan's predicted largest size the first probe of the first bucket aims: the plan's peaks
# were within 6 % of the H200's measured ones for the models calibrated (benchmarks/results/plan_calibration.json).
PLAN_FIRST_MARGIN = 0.08
PLAN_BASE_SHARE = 0.8  # a plan's base is used for a bucket's first line only below this share of its peak


@dataclass
class PlannedPeaks:
    """A plan's peak memory per bucket (in the search's bucket order): base_bytes + n x per_item_bytes[i]
    (bytes; None for a bucket the plan has no cost for)."""
    base_bytes: float
    per_item_bytes: list[float | None]


@dataclass
class ProbeRecord:
    bucket_index: int  # index into the caller's bucket list
    batch_size: int
    peak_bytes: float | None  # None when the step ran out of memory
    predicted_bytes: float | None  # the model's expectation before the probe (predictive only)
    seconds: float  # wall time of the probe

    @property
    def oom(self) -> bool:
        return self.peak_bytes is None


@dataclass
class SearchResult:
    buckets: list[Bucket]
    batch_sizes: list[int | None]  # one per bucket, in the caller's order, each probed successfully;
    # None for a bucket not searched (``stop`` said so before it started)
    probes: list[ProbeRecord]  # the trace, in the order run
    strategy: str
    rel_gap: float
    budget_bytes: float | None
    seconds: float
    fit: MemoryFit | None = None  # the final memory model (predictive)
    budget_bounds: tuple[float, float] | None = None  # what the search knows of the budget (bytes)
    # per bucket: "gap", "budget", "max_batch_size", "exhausted", or NOT_SEARCHED
    stop_reasons: list[str] = field(default_factory=list)

    @property
    def not_searched(self) -> list[int]:
        """Indices of the buckets the search stopped before (batch size None); empty for a full search."""
        return [i for i, b in enumerate(self.batch_sizes) if b is None]

    @property
    def num_searched(self) -> int:
        return len(self.buckets) - len(self.not_searched)

    @property
    def num_probes(self) -> int:
        return len(self.probes)

    @property
    def probes_per_bucket(self) -> float:
        """Probes per bucket searched."""
        return len(self.probes) / max(self.num_searched, 1)

    @property
    def num_ooms(self) -> int:
        return sum(p.oom for p in self.probes)

    def profile_batch_sizes(self) -> list[int]:
        """Every bucket's batch size, for a profile; ValueError when the search stopped before some bucket
        (a profile with a bucket left out would be wrong, not short)."""
        missing = self.not_searched
        if missing:
            raise ValueError(f"search stopped after {self.num_searched} of {len(self.buckets)} buckets "
                             f"(not searched: {missing}): no profile from a partial search")
        return list(self.batch_sizes)


def search_batch_sizes(buckets, probe: Probe, *, budget_bytes: float | None = None, rel_gap: float = 0.05,
                       start_batch_size: int = 32, strategy: str = "predictive",
                       max_batch_size: int = 1 << 20, max_probes_per_bucket: int = 40,
                       on_probe: Callable[[ProbeRecord], None] | None = None,
                       on_bucket: Callable[[int, int, list[ProbeRecord]], None] | None = None,
                       stop: Callable[[], bool] | None = None,
                       prior: PlannedPeaks | None = None) -> SearchResult:
    """The largest batch size per bucket that fits, found with few probes.

    ``buckets``: list of ``(duration_seconds, num_tokens)``, any order. ``budget_bytes``: the memory limit
    the probe's peaks are measured against (an upper bound; OOMs below it are learned), or None to learn
    it from OOMs alone. ``max_batch_size``: no size above it is probed. ``rel_gap``: stop once
    (smallest OOM - largest fit) / smallest OOM <= rel_gap. ``on_probe(record)`` after every probe;
    ``on_bucket(index, batch_size, records)`` when a bucket is done. ``stop()`` is asked after each
    bucket but the last: True starts no further bucket (those get batch size None and stop reason
    NOT_SEARCHED), so a stopped search has searched at least the largest bucket. ``prior``: a plan's
    peaks for these buckets (predictive only; module doc). Raises ValueError on bad input and RuntimeError
    when a bucket does not fit even at batch size 1.
    """
    buckets = [_check_bucket(i, b) for i, b in enumerate(buckets)]
    if not buckets:
        raise ValueError("buckets: need at least 1 bucket, got 0")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: must be one of {STRATEGIES}, got {strategy!r}")
    if not 0 < rel_gap < 1:
        raise ValueError(f"rel_gap: must be in (0, 1), got {rel_gap}")
    for name, value in (("start_batch_size", start_batch_size), ("max_batch_size", max_batch_size),
                        ("max_probes_per_bucket", max_probes_per_bucket)):
        check_int(value, name, 1)
    if budget_bytes is not None and not budget_bytes > 0:
        raise ValueError(f"budget_bytes: must be positive or None, got {budget_bytes}")
    _check_prior(prior, len(buckets), strategy)
    state = _SearchState(buckets, probe, budget_bytes, rel_gap, int(start_batch_size), int(max_batch_size),
                         max_probes_per_bucket, on_probe, prior)
    t0 = time.perf_counter()
    order = largest_first(buckets)
    result: list[int | None] = [None] * len(buckets)
    reasons = [NOT_SEARCHED] * len(buckets)
    previous = int(start_batch_size)
    for k, i in enumerate(order):
        if k > 0 and stop is not None and stop():
            break
        if strategy == "bisect":
            result[i], reasons[i] = state.bisect_bucket(i, previous)
            previous = result[i]
        else:
            result[i], reasons[i] = state.predictive_bucket(i)
        if on_bucket is not None:
            on_bucket(i, result[i], [p for p in state.records if p.bucket_index == i])
    fit = state.fit() if strategy == "predictive" else None
    bounds = state.budget_bounds(fit) if fit is not None else None
    return SearchResult(buckets, result, state.records, strategy, rel_gap, budget_bytes,
                        time.perf_counter() - t0, fit, bounds, reasons)


def largest_first(buckets) -> list[int]:
    """The indices of ``buckets`` in the order the search takes them: longest duration first, then most tokens."""
    return sorted(range(len(buckets)), key=lambda i: (buckets[i][0], buckets[i][1]), reverse=True)


def _check_bucket(i: int, b) -> Bucket:
    try:
        d, u = (float(b[0]), float(b[1] or 0.0)) if isinstance(b, (tuple, list)) else (float(b), 0.0)
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"buckets[{i}] = {b!r}: must be (duration_seconds, num_tokens)") from None
    if not (d > 0 and u >= 0 and math.isfinite(d) and math.isfinite(u)):
        raise ValueError(f"buckets[{i}] = {b!r}: duration must be > 0 and tokens >= 0")
    return (d, u)


def _check_prior(prior: PlannedPeaks | None, num_buckets: int, strategy: str) -> None:
    if prior is None:
        return
    if strategy != "predictive":
        raise ValueError(f"prior: a plan guides the predictive search only, not strategy {strategy!r}")
    if len(prior.per_item_bytes) != num_buckets:
        raise ValueError(f"prior: the plan has {len(prior.per_item_bytes)} buckets, the search {num_buckets}")
    costs = [c for c in prior.per_item_bytes if c is not None]
    if not (math.isfinite(prior.base_bytes) and prior.base_bytes >= 0
            and all(math.isfinite(c) and c > 0 for c in costs)):
        raise ValueError("prior: base_bytes must be finite and >= 0, every per-item cost finite and > 0")


class _SearchState:
    """Probes run so far and what they say; the per-bucket loops of both strategies."""

    def __init__(self, buckets, probe, budget, rel_gap, start, max_bs, max_probes, on_probe, prior=None):
        self.buckets, self.probe, self.budget, self.rel_gap = buckets, probe, budget, rel_gap
        self.start, self.max_bs, self.max_probes, self.on_probe = start, max_bs, max_probes, on_probe
        self.prior = prior
        self.records: list[ProbeRecord] = []
        self.scale = (max(b[0] for b in buckets), max(max(b[1] for b in buckets), 1.0))
        self.shape_errors: list[float] = []  # relative errors of the shape model on new buckets
        self.segment_start: dict[int, int] = {}  # bucket -> smallest batch size of its top linear piece
        self.step_ratios: list[float] = []  # per-item cost of a new piece over its predecessor's, per step

    # ---- probing -------------------------------------------------------------------------------
    def run(self, i: int, n: int, predicted: float | None = None) -> float | None:
        t0 = time.perf_counter()
        try:
            peak: float | None = float(self.probe(self.buckets[i], n))
        except torch.OutOfMemoryError:
            peak = None
        rec = ProbeRecord(i, n, peak, predicted, time.perf_counter() - t0)
        self.records.append(rec)
        if self.on_probe is not None:
            self.on_probe(rec)
        return peak

    def bracket(self, i: int) -> tuple[int | None, float | None, int | None]:
        """(largest fit below the smallest OOM, its peak, smallest OOM) for bucket i."""
        mine = [r for r in self.records if r.bucket_index == i]
        ooms = [r.batch_size for r in mine if r.oom]
        upper = min(ooms) if ooms else None
        fits = [r for r in mine if not r.oom and (upper is None or r.batch_size < upper)]
        best = max(fits, key=lambda r: r.batch_size) if fits else None
        return (best.batch_size, best.peak_bytes, upper) if best else (None, None, upper)

    def gap_closed(self, lower: int | None, upper: int | None) -> bool:
        return (lower is not None and upper is not None
                and (upper - lower <= 1 or (upper - lower) / upper <= self.rel_gap))

    def finish(self, i: int, lower: int | None, reason: str) -> tuple[int, str]:
        if lower is None:
            d, u = self.buckets[i]
            raise RuntimeError(f"bucket {i} ({d:g} s, {u:g} tokens) does not fit in memory even at batch "
                               f"size 1")
        return lower, reason

    # ---- bisect ----------------------------------------------------------------------------------
    def bisect_bucket(self, i: int, start: int) -> tuple[int, str]:
        n = max(1, min(start, self.max_bs))
        for _ in range(self.max_probes):
            self.run(i, n)
            lower, _, upper = self.bracket(i)
            if self.gap_closed(lower, upper):
                return self.finish(i, lower, "gap")
            if upper is None:
                if lower >= self.max_bs:
                    return self.finish(i, lower, "max_batch_size")
                n = min(2 * lower, self.max_bs)
            elif lower is None:
                if upper == 1:
                    return self.finish(i, None, "exhausted")
                n = max(1, upper // 2)
            else:
                n = (lower + upper) // 2
        return self.finish(i, self.bracket(i)[0], "exhausted")

    # ---- predictive ------------------------------------------------------------------------------
    def fit(self) -> MemoryFit:
        """The memory model over every bucket's top linear piece (probes below a step are left out)."""
        return fit_base_and_costs([(r.bucket_index, r.batch_size, r.peak_bytes) for r in self.records
                                   if not r.oom and r.batch_size >= self.segment_start.get(r.bucket_index, 0)])

    def note_departure(self, i: int, n: int, peak: float | None, fit: MemoryFit) -> None:
        """Start a new linear piece for bucket i at n when its peak rises above the bucket's own line.

        Peaks are piecewise linear in the batch size where a model keeps more above some size (a batch
        split into chunks, another kernel's workspace): a rise beyond the fit's noise means the probes
        below n lie on a lower piece, which would bias the shared fit and inflate its noise. Records the
        step as the ratio of the new per-item cost (through the base) to the line's.
        """
        own = fit.per_item_bytes.get(i)
        if peak is None or not own or not fit.base_known:
            return
        expected = fit.base_bytes + n * own
        if peak - expected > max(3 * fit.noise, DEPARTURE_GAP_SHARE * self.rel_gap) * expected:
            self.segment_start[i] = n
            self.step_ratios.append((peak - fit.base_bytes) / (expected - fit.base_bytes))

    def budget_bounds(self, fit: MemoryFit) -> tuple[float, float]:
        """(low, high) bytes: where the search believes the usable budget lies.

        High: the given budget, lowered to the predicted peak of any OOM in a bucket whose cost is
        measured (on a GPU a step fails before its peak reaches the limit: fragmentation, one large
        request). Low: the given budget while no OOM says otherwise, else the largest peak that fitted.
        """
        fits = [r.peak_bytes for r in self.records if not r.oom]
        largest_fit = max(fits) if fits else 0.0
        high = self.budget if self.budget is not None else math.inf
        learned = False
        for r in self.records:
            if r.oom and r.bucket_index in fit.per_item_bytes and fit.base_known:
                predicted = fit.base_bytes + r.batch_size * fit.per_item_bytes[r.bucket_index]
                if largest_fit < predicted < high:  # a prediction below a measured fit is noise
                    high, learned = predicted, True
        if self.budget is not None and not learned:
            return high, high
        low = min(largest_fit, high)
        return low, high

    def predict_cost(self, i: int, fit: MemoryFit) -> float | None:
        """Per-item bytes of bucket i: the plan's, scaled by :meth:`plan_ratio` (1 before any bucket is
        measured); without a plan, the shape model over the measured buckets."""
        planned = self.prior.per_item_bytes[i] if self.prior is not None else None
        if planned:
            return planned * self.plan_ratio(i, fit)
        known = sorted(fit.per_item_bytes)
        known = [k for k in known if fit.per_item_bytes[k] > 0]
        if not known:
            return None
        feats = shape_features([self.buckets[k] for k in known], self.scale)
        costs = np.array([fit.per_item_bytes[k] for k in known])
        weights = fit_shape_model(feats, costs)
        pred = float(shape_features([self.buckets[i]], self.scale)[0] @ weights)
        return pred if pred > 0 else None

    def plan_ratio(self, i: int, fit: MemoryFit) -> float:
        """Measured over planned per-item cost expected at bucket i. A plan's error varies with the bucket's
        shape (a decoder's share grows with the tokens per second): from three measured buckets on, a
        least-squares line in (1, log duration, tokens per second), kept within the measured ratios; with
        fewer, their mean (two buckets cannot tell a shape's trend from noise)."""
        known = [k for k, cost in fit.per_item_bytes.items() if cost > 0 and self.prior.per_item_bytes[k]]
        if not known or not fit.base_known:
            return 1.0
        ratios = np.array([fit.per_item_bytes[k] / self.prior.per_item_bytes[k] for k in known])
        top_rate = max(max(b[1] / b[0] for b in self.buckets), 1.0)

        def features(k: int) -> list[float]:
            duration, tokens = self.buckets[k]
            return [1.0, math.log(duration), tokens / duration / top_rate]
        if len(known) < 3:
            return float(ratios.mean())
        weights, *_ = np.linalg.lstsq(np.array([features(k) for k in known]), ratios, rcond=None)
        return float(np.clip(np.array(features(i)) @ weights, ratios.min(), ratios.max()))

    def margin(self, i: int) -> float:
        """How far below the predicted largest size the first probe of a bucket aims: with a plan scaled by
        measured buckets, into the middle of the window the budget proof accepts (a miss either way costs
        one probe); with a plan alone, by its calibrated error; else by the shape model's recent errors
        (15 % before any)."""
        if self.prior is not None:
            return self.proof_gap() / 2 if self.plan_scaled(i) else PLAN_FIRST_MARGIN
        if not self.shape_errors:
            return 0.15
        return float(min(1.5 * np.median(self.shape_errors[-5:]), 0.3))

    def plan_scaled(self, i: int) -> bool:
        """Whether a plan's cost for bucket i is scaled by a measured bucket (another's probe fitted)."""
        return self.prior is not None and any(r.bucket_index != i and not r.oom for r in self.records)

    def proof_gap(self) -> float:
        """How close below a predicted bound (relative) a fit is accepted without an OOM above it: half the
        gap when the budget is bounded by OOMs only or a plan aims the probes, else a quarter."""
        return self.rel_gap / (4 if self.budget is not None and self.prior is None else 2)

    def predictive_bucket(self, i: int) -> tuple[int, str]:
        fit = self.fit()
        predicted_cost = self.predict_cost(i, fit) if fit.base_known or self.prior is not None else None
        first = True
        for _ in range(self.max_probes):
            lower, lower_peak, upper = self.bracket(i)
            fit = self.fit()
            low_b, high_b = self.budget_bounds(fit)
            own = self.own_cost(i, fit, lower, lower_peak)
            if lower is not None and own and fit.base_known:
                if lower >= self.max_bs:
                    return self.finish(i, lower, "max_batch_size")
                # First size whose predicted peak (from this bucket's own measurement) exceeds the budget.
                if math.isfinite(high_b):
                    # With noisy peaks, this reading may be high: prove from an optimistic reading.
                    peak_low = max(lower_peak * (1 - 2 * fit.noise), fit.base_bytes + 1e-9 * lower_peak)
                    own_low = (peak_low - fit.base_bytes) / lower if fit.noise > 0 else own
                    proven = lower + max(1, math.floor((high_b - peak_low) / own_low) + 1)
                    # A predicted bound is weaker than an OOM: accept it only within a fraction of the gap.
                    if proven == lower + 1 or (proven - lower) / proven <= self.proof_gap():
                        return self.finish(i, lower, "budget")
            if self.gap_closed(lower, upper):
                return self.finish(i, lower, "gap")
            if upper == 1:
                return self.finish(i, None, "exhausted")
            n, expected = self.next_size(i, fit, lower, lower_peak, upper, own, predicted_cost, low_b,
                                         high_b, first)
            first = False
            self.note_departure(i, n, self.run(i, n, expected), fit)
            if predicted_cost is not None and fit.base_known:
                now = self.fit().per_item_bytes.get(i)
                if now:  # how wrong the shape model was for this bucket, to size later margins
                    self.shape_errors.append(abs(predicted_cost - now) / now)
                    predicted_cost = None
        return self.finish(i, self.bracket(i)[0], "exhausted")

    def into_proof_window(self, n: int, depth: float) -> int:
        """A size in the window the budget proof accepts below a predicted largest size ``n``, ``depth`` of
        the way down it, but no lower than the window's first size (at small n it holds one or two sizes)."""
        aimed = math.floor(n * (1 - self.proof_gap() * depth))
        return max(aimed, min(math.ceil((n + 1) * (1 - self.proof_gap())), n))

    def own_cost(self, i: int, fit: MemoryFit, lower: int | None, lower_peak: float | None) -> float | None:
        """Bucket i's measured bytes per item, or None. Before the base is known the fit's line runs through
        zero and overestimates it (the next probe would stop short of the budget): a plan's base, clearly below
        the peak of ``lower`` (a base near it would give a cost near zero and a probe far too large), gives the
        line through that peak instead."""
        own = fit.per_item_bytes.get(i)
        if (own and not fit.base_known and self.prior is not None and lower
                and 0 < self.prior.base_bytes <= PLAN_BASE_SHARE * lower_peak):
            return (lower_peak - self.prior.base_bytes) / lower
        return own

    def base_guess(self, fit: MemoryFit) -> float:
        """Bytes that do not grow with the batch: the fit's once known, else the plan's (else 0)."""
        if fit.base_known or self.prior is None:
            return fit.base_bytes
        return self.prior.base_bytes

    def step_guess(self, lower: int, lower_peak: float, upper: int, base: float, budget: float) -> int | None:
        """The size where the budget (bytes) is reached if the per-item cost of ``lower`` (through the base)
        rose by the largest step seen so far, but no higher than the smallest size that closes the gap to
        ``upper`` if it fits; None when no step was seen or the guess is not inside (lower, upper)."""
        ratio = max(self.step_ratios, default=1.0)
        if ratio <= 1.0:
            return None
        guess = math.floor((budget - base) / ((lower_peak - base) / lower * ratio))
        if not lower < guess < upper:
            return None
        return max(min(guess, math.ceil(upper * (1 - self.rel_gap))), lower + 1)

    def next_size(self, i, fit, lower, lower_peak, upper, own, predicted_cost, low_b, high_b, first):
        """The next batch size to probe in bucket i, strictly inside the bracket, and its expected peak.

        ``own``: this bucket's bytes per item (an overestimate while the base is not known), or None.
        """
        lo = lower if lower is not None else 0
        hi = upper if upper is not None else self.max_bs + 1
        if own and fit.noise > 0 and fit.base_known:  # aim from an optimistic reading of noisy peaks
            lower_peak = max(lower_peak * (1 - fit.noise), fit.base_bytes + 1e-9 * lower_peak)
            own = (lower_peak - fit.base_bytes) / lower
        room = (lambda budget: math.floor((budget - lower_peak) / own) + lower) if own else None
        if lower is not None and upper is not None:
            # The prediction already overshot once in this bucket. Where the model (a new piece since)
            # puts the smallest OOM above the budget, aim at its maximum; else the OOM is a step the model
            # missed or a budget lower than thought: guess from the steps seen; after the bucket's first
            # OOM, aim just below the largest peak that fitted anywhere (no higher than what closes the
            # bracket); else split the bracket, leaning on the model.
            n = (lo + hi) // 2
            if own and math.isfinite(high_b):
                explained = lower_peak + (hi - lo) * own > high_b * (1 + max(2 * fit.noise, 0.005))
                guess = None if explained else self.step_guess(lo, lower_peak, hi, fit.base_bytes, high_b)
                proven = low_b * (1 - max(2 * fit.noise, 0.005))
                first_oom = sum(r.oom for r in self.records if r.bucket_index == i) == 1
                if explained:
                    n = room(high_b)
                elif guess is not None:
                    n = guess
                elif first_oom and proven > lower_peak and n < room(proven) < hi:
                    n = min(room(proven), math.ceil(hi * (1 - self.rel_gap)))  # closes the bracket if it fits
                else:
                    n = min(n, room(high_b))
        elif own and math.isfinite(high_b):
            # Aim at the top of what the budget allows; without a known budget, at the middle of its bounds.
            target = high_b if (high_b - low_b) <= own else (low_b + high_b) / 2
            n = room(target)
            if self.prior is not None:  # a plan's search aims into the budget proof's window, not at its edge:
                # near its top, since this bucket's own line is measured (and the proof reads its peaks
                # optimistically by their noise, which raises the bound it proves)
                n = self.into_proof_window(n, depth=0.25)
            if sum(not r.oom for r in self.records if r.bucket_index == i) >= 2:
                # Creeping up in small steps means the model is off here: step by half the gap at least.
                n = max(n, lower + math.ceil(lower * self.rel_gap / 2))
        elif own:  # no upper bound on the budget yet: grow geometrically
            n = 2 * lo
        elif lower is None and upper is not None:
            # Overshot without a fit yet: back off clearly below the OOM, twice as far after each OOM
            # beyond the second (the shape model is off here by more than its margin said).
            ooms = sum(r.oom for r in self.records if r.bucket_index == i)
            back_off = min(max(2 * self.margin(i), self.rel_gap / 3) * 2 ** max(ooms - 2, 0), 0.5)
            n = math.floor(upper * (1 - back_off)) if predicted_cost else upper // 2
        elif predicted_cost and (low_b > self.base_guess(fit)):
            n = math.floor((low_b - self.base_guess(fit)) / predicted_cost)
            if first:
                m = self.margin(i)
                if self.plan_scaled(i):
                    n = self.into_proof_window(n, depth=0.5)
                elif m * n >= 1:
                    n = math.floor(n * (1 - m))
        elif lower is None:
            n = self.start
        else:
            n = 2 * lo
        n = int(min(max(n, lo + 1, 1), hi - 1, self.max_bs))
        cost = own or predicted_cost
        if cost and fit.base_known:
            expected = fit.base_bytes + n * cost
        else:  # before the base is known, only a plan's line says what to expect
            expected = self.base_guess(fit) + n * predicted_cost if self.prior and predicted_cost and not own else None
        return n, expected
