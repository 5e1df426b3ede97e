"""The predictive search started from a plan: about one probe per bucket when the plan is good, and never a
size above the true maximum when it is not."""

import numpy as np
import pytest

from workbench.oomptimizer.search import PlannedPeaks, search_batch_sizes
from workbench.oomptimizer.synthetic import SyntheticMemory, demo_buckets
from workbench.units import GiB


def _plan(memory: SyntheticMemory, buckets, *, cost_scale: float, base_bytes: float, error: float, seed: int = 0):
    """A plan of ``memory``: every per-item cost scaled by ``cost_scale`` (a bias the measured buckets correct)
    and by a random factor in [1 - error, 1 + error] per bucket."""
    rng = np.random.default_rng(seed)
    costs = [(memory.peak(b, 1) - memory.base_bytes) * cost_scale * (1 + rng.uniform(-error, error))
             for b in buckets]
    return PlannedPeaks(base_bytes, costs)


def _check_sizes(result, memory, buckets, rel_gap=0.05):
    for i, b in enumerate(buckets):
        best = memory.true_max(b)
        assert result.batch_sizes[i] <= best, (i, result.batch_sizes[i], best)
        assert result.batch_sizes[i] >= (1 - rel_gap) * best - 1, (i, result.batch_sizes[i], best)


@pytest.mark.parametrize("kind", ["linear", "quadratic"])
def test_a_good_plan_needs_at_most_1_3_probes_per_bucket(kind):
    memory = SyntheticMemory(kind=kind)
    buckets = demo_buckets()  # 30 buckets
    prior = _plan(memory, buckets, cost_scale=0.9, base_bytes=5 * GiB, error=0.002)
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    _check_sizes(result, memory, buckets)
    assert result.probes_per_bucket <= 1.3, [p.batch_size for p in result.probes]
    without = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes)
    assert result.num_probes < without.num_probes


def test_a_plan_whose_error_follows_the_bucket_shape_is_corrected_per_bucket():
    """A plan that overestimates what grows with the tokens (a decoder's share), by up to 5 % more at the
    highest rate of tokens per second than at the lowest: scaled per bucket, still about one probe each."""
    memory = SyntheticMemory(kind="linear")
    buckets = demo_buckets()
    top_rate = max(tokens / duration for duration, tokens in buckets)
    costs = [(memory.peak(b, 1) - memory.base_bytes) * (0.97 + 0.05 * b[1] / b[0] / top_rate) for b in buckets]
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes,
                                prior=PlannedPeaks(memory.base_bytes, costs))
    _check_sizes(result, memory, buckets)
    assert result.probes_per_bucket <= 1.3, [p.batch_size for p in result.probes]


def test_small_batch_sizes_aim_into_the_window_the_budget_proof_accepts():
    """Batch sizes of 20-300 (a large model on a small GPU): the 2.5 % window below the largest size holds one
    or two sizes, so a first probe aimed mid-window by rounding down would fall below it and cost a second."""
    memory = SyntheticMemory(kind="linear", per_second=60e6, per_token=2e6, per_item=200e6)
    buckets = demo_buckets(num_durations=8, max_duration=30.0)
    prior = _plan(memory, buckets, cost_scale=0.95, base_bytes=memory.base_bytes, error=0.002)
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    assert 20 <= min(result.batch_sizes) and max(result.batch_sizes) <= 300, result.batch_sizes
    _check_sizes(result, memory, buckets)
    assert result.probes_per_bucket <= 1.1, [(p.bucket_index, p.batch_size, p.oom) for p in result.probes]


@pytest.mark.parametrize("cost_scale", [0.95, 1.0, 1.04])
def test_the_first_bucket_takes_two_probes_with_the_plans_base(cost_scale):
    """The first bucket has no measured bucket to scale the plan: its first probe keeps a margin below the plan,
    and its second follows the line through that probe's peak and the plan's base (the line through zero
    overestimates the cost by the base's share and stops short of the window the budget proof accepts)."""
    memory = SyntheticMemory(kind="linear", base_bytes=12 * GiB, per_second=30e6, per_token=1e6, per_item=100e6)
    buckets = demo_buckets(num_durations=8, max_duration=30.0)
    prior = _plan(memory, buckets, cost_scale=cost_scale, base_bytes=memory.base_bytes * 0.97, error=0.0)
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    first = [p for p in result.probes if p.bucket_index == result.probes[0].bucket_index]
    assert len(first) == 2 and not any(p.oom for p in first), [(p.batch_size, p.oom) for p in first]
    _check_sizes(result, memory, buckets)


def test_a_plan_base_near_the_first_peak_does_not_send_the_second_probe_far_too_high():
    """A plan whose base is far too high (over 80 % of the first probe's peak) would give a per-item cost near
    zero through that peak and a second probe far above the budget: the first bucket keeps the line through
    zero then, and none of its probes runs out of memory."""
    memory = SyntheticMemory(kind="linear", base_bytes=12 * GiB, per_second=30e6, per_token=1e6, per_item=100e6)
    buckets = demo_buckets(num_durations=8, max_duration=30.0)
    prior = _plan(memory, buckets, cost_scale=1.0, base_bytes=40 * GiB, error=0.0)  # first peak: 48 GiB
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    first = [p for p in result.probes if p.bucket_index == result.probes[0].bucket_index]
    assert not any(p.oom for p in first), [(p.batch_size, p.oom) for p in first]
    _check_sizes(result, memory, buckets)


@pytest.mark.parametrize("error", [0.03, 0.1])
def test_a_rough_plan_costs_probes_not_correctness(error):
    memory = SyntheticMemory(kind="quadratic")
    buckets = demo_buckets()
    prior = _plan(memory, buckets, cost_scale=1.3, base_bytes=10 * GiB, error=error, seed=1)
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    _check_sizes(result, memory, buckets)
    assert result.probes_per_bucket <= 3.0


def test_a_plan_with_buckets_it_has_no_cost_for():
    memory = SyntheticMemory(kind="linear")
    buckets = demo_buckets(num_durations=5)
    prior = _plan(memory, buckets, cost_scale=1.0, base_bytes=memory.base_bytes, error=0.0)
    prior.per_item_bytes[3] = None
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes, prior=prior)
    _check_sizes(result, memory, buckets)


@pytest.mark.parametrize("prior, strategy, message", [
    (PlannedPeaks(0.0, [1.0]), "predictive", "the plan has 1 buckets, the search 2"),
    (PlannedPeaks(0.0, [1.0, 1.0]), "bisect", "predictive search only"),
    (PlannedPeaks(float("nan"), [1.0, 1.0]), "predictive", "base_bytes must be finite"),
    (PlannedPeaks(0.0, [1.0, -2.0]), "predictive", "per-item cost finite and > 0"),
])
def test_a_plan_that_does_not_match_is_refused(prior, strategy, message):
    with pytest.raises(ValueError, match=message):
        search_batch_sizes([(10.0, 100.0), (5.0, 50.0)], lambda b, n: 1.0, budget_bytes=10.0, strategy=strategy,
                           prior=prior)
