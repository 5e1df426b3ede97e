import numpy as np
import pytest

from workbench.oomptimizer import merge_equal_buckets
from workbench.oomptimizer.memory_model import fit_base_and_costs, fit_shape_model, shape_features


def test_merge_1d_keeps_larger_bound():
    bins, bs, tps = merge_equal_buckets([2.0, 4.0, 6.0, 8.0, 10.0], [90, 60, 60, 60, 30])
    assert bins == [2.0, 8.0, 10.0] and bs == [90, 60, 30] and tps is None


def test_merge_2d_only_inside_a_duration_group():
    bins = [[5.0, 20], [5.0, 40], [10.0, 50], [10.0, 80], [15.0, 90]]
    out, bs, tps = merge_equal_buckets(bins, [40, 40, 40, 30, 30], [4.0, 8.0, 5.0, 8.0, 6.0])
    # (5, 40) and (10, 50) have equal sizes but different durations: not merged; (10, 80) and (15, 90) neither.
    assert out == [[5.0, 40], [10.0, 50], [10.0, 80], [15.0, 90]]
    assert bs == [40, 40, 30, 30]
    assert tps == [8.0, 5.0, 8.0, 6.0]


def test_merge_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="batch_sizes"):
        merge_equal_buckets([1.0, 2.0], [3])


def test_fit_recovers_base_and_costs():
    base, costs = 5e9, {0: 2e8, 1: 5e7}
    points = [(b, n, base + n * costs[b]) for b, n in [(0, 10, ), (0, 30), (1, 100)]]
    fit = fit_base_and_costs(points)
    assert fit.base_known
    assert fit.base_bytes == pytest.approx(base, rel=1e-6)
    assert fit.per_item_bytes[0] == pytest.approx(2e8, rel=1e-6)
    assert fit.per_item_bytes[1] == pytest.approx(5e7, rel=1e-6)


def test_fit_without_two_sizes_assumes_zero_base():
    fit = fit_base_and_costs([(0, 10, 3e9), (1, 20, 3e9)])
    assert not fit.base_known and fit.base_bytes == 0
    assert fit.per_item_bytes == {0: pytest.approx(3e8), 1: pytest.approx(1.5e8)}


def test_shape_model_finds_quadratic_cost():
    buckets = [(d, 6 * d) for d in (2.0, 5.0, 9.0, 14.0, 20.0, 30.0)]
    feats = shape_features(buckets, (30.0, 180.0))
    d = np.array([b[0] for b in buckets])
    costs = 4e7 * d + 1e6 * d * d
    weights = fit_shape_model(feats, costs)
    assert np.allclose(feats @ weights, costs, rtol=1e-6)
    assert np.all(weights >= 0)
