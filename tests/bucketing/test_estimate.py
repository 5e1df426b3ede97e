import numpy as np
import pytest
from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

from bucketing_helpers import corpus
from workbench.bucketing import estimate_2d_bins, estimate_duration_bins, running_total_boundaries
from workbench.bucketing.reference import loop_2d, loop_boundaries
from workbench.data import cuts_from_arrays


# ---- 1D -------------------------------------------------------------------------------------------

def test_exact_small_case():
    # total 21, 7 per bucket: the total before 5 is 10 > 7, so 5 starts bucket 2; nothing else exceeds.
    assert estimate_duration_bins([6, 5, 4, 3, 2, 1], 3) == [5.0, 6.0]


def test_tie_at_threshold_is_not_a_boundary():
    # 4 per bucket; before the first 2.0 the total is exactly 4 (not > 4), so the second 2.0 is the boundary
    assert estimate_duration_bins([1, 1, 1, 1, 2, 2], 2) == [2.0, 2.0]


def test_all_equal_durations_repeat_the_bound():
    assert estimate_duration_bins([2.0] * 10, 5) == [2.0, 2.0, 2.0, 2.0]


def test_one_utterance():
    assert estimate_duration_bins([3.5], 1) == [3.5]
    with pytest.raises(ValueError, match="num_buckets=2 is more than the 1 utterances"):
        estimate_duration_bins([3.5], 2)


@pytest.mark.parametrize("kind", ["gamma", "rounded", "skewed", "equal"])
@pytest.mark.parametrize("num_buckets", [2, 7, 30])
def test_matches_lhotse_estimate_duration_buckets(kind, num_buckets):
    d, _ = corpus(400, seed=num_buckets, kind=kind)
    lhotse_bins = estimate_duration_buckets(cuts_from_arrays(d), num_buckets=num_buckets)
    assert estimate_duration_bins(d, num_buckets) == [float(b) for b in lhotse_bins] + [float(d.max())]


def test_matches_plain_loop_on_many_random_corpora():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 2000))
        d = np.round(rng.lognormal(1.5, 0.8, n), int(rng.integers(0, 4))) + 0.01
        nb = int(rng.integers(1, min(n, 50) + 1))
        s = np.sort(d)
        assert estimate_duration_bins(d, nb) == [float(s[i]) for i in loop_boundaries(s, nb)] + [float(s[-1])]


def test_running_total_large_array_window_growth():
    rng = np.random.default_rng(2)
    v = np.sort(rng.pareto(1.2, 200_000) + 0.01)  # heavy tail: groups of very different lengths
    for parts in (1, 3, 64):
        assert running_total_boundaries(v, parts).tolist() == loop_boundaries(v, parts)
    ints = np.sort(rng.integers(0, 50, 10_000))
    assert running_total_boundaries(ints, 9).tolist() == loop_boundaries(ints.tolist(), 9)


def test_equal_count():
    d = np.arange(1, 101, dtype=float)
    assert estimate_duration_bins(d, 4, equal_count=True) == [26.0, 51.0, 76.0, 100.0]
    assert estimate_duration_bins([5.0], 1, equal_count=True) == [5.0]


def test_one_million_is_fast():
    import time

    d, t = corpus(1_000_000, seed=3)
    t0 = time.perf_counter()
    estimate_duration_bins(d, 30)
    estimate_2d_bins(d, t, 30, 2)
    assert time.perf_counter() - t0 < 6.0  # well under 2 s on an idle machine; shared CI is noisy


# ---- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ([1.0, float("nan"), 2.0], "1 NaN or infinite"),
    ([1.0, float("inf"), float("inf")], "2 NaN or infinite"),
    ([1.0, 0.0, 2.0], "1 zero or negative"),
    ([-1.0, -2.0, 2.0], "2 zero or negative"),
    ([], "empty"),
])
def test_bad_durations(values, message):
    with pytest.raises(ValueError, match=message):
        estimate_duration_bins(values, 1)
    with pytest.raises(ValueError, match=message):
        estimate_2d_bins(values, [1] * len(values), 1, 1)


def test_bad_counts_and_tokens():
    with pytest.raises(ValueError, match="num_buckets"):
        estimate_duration_bins([1.0, 2.0], 0)
    with pytest.raises(ValueError, match="num_buckets=4 is more than the 3"):
        estimate_2d_bins([1.0, 2.0, 3.0], [1, 2, 3], 4, 1)
    with pytest.raises(ValueError, match="num_subbuckets"):
        estimate_2d_bins([1.0, 2.0], [1, 2], 1, 0)
    with pytest.raises(ValueError, match="num_tokens has 2 entries but durations has 3"):
        estimate_2d_bins([1.0, 2.0, 3.0], [1, 2], 1, 1)
    with pytest.raises(ValueError, match="num_tokens has 1 negative"):
        estimate_2d_bins([1.0, 2.0], [1, -2], 1, 1)
    with pytest.raises(ValueError, match="num_tokens has 1 non-integer"):
        estimate_2d_bins([1.0, 2.0], [1, 2.5], 1, 1)
    with pytest.raises(ValueError, match="1-D"):
        estimate_duration_bins([[1.0, 2.0]], 1)


# ---- 2D -------------------------------------------------------------------------------------------

def test_2d_merges_groups_with_equal_bounds():
    # 1D boundary at index 3 (2.0) equals the max 2.0: one group of 2 merged buckets, 2 sub-buckets.
    est = estimate_2d_bins([1, 1, 2, 2], [1, 2, 3, 4], 2, 1)
    assert est.bins == [(2.0, 4), (2.0, 4)]
    assert est.max_tps == [2.0, 2.0]
    assert [(g.num_merged, g.num_subbuckets) for g in est.groups] == [(2, 2)]


def test_2d_exact_case_two_groups():
    d = [1, 2, 3, 4, 5, 6, 7, 8]
    t = [2, 4, 6, 8, 10, 12, 14, 16]  # 2 tokens per second everywhere: zero spread
    est = estimate_2d_bins(d, t, 2, 3)
    # durations: 18 s per bucket; the total before 7 is 21 > 18, so 7 starts group 2: [1..6] | [7, 8]
    # group 1 tokens 2..12 (sum 42, 14 per sub-bucket): the total before 10 is 20 > 14 -> bound 10
    # group 2 tokens 14, 16 (sum 30, 10 per sub-bucket): the total before 16 is 14 > 10 -> bound 16
    assert est.bins == [(7.0, 10), (7.0, 12), (8.0, 16), (8.0, 16)]
    assert est.max_tps == [2.0] * 4
    assert [(g.start, g.stop, g.num_subbuckets) for g in est.groups] == [(0, 6, 3), (6, 8, 3)]


def test_2d_zero_tps_spread_keeps_everything():
    d = np.array([1.0, 2.0, 3.0, 4.0])
    est = estimate_2d_bins(d, d * 5, 1, 2, tps_threshold=0.0)
    assert est.max_tps == [5.0, 5.0]
    assert est.groups[0].num_outliers == 0
    assert est.bins[-1] == (4.0, 20)


def test_2d_tps_outlier_removed_from_its_group_only():
    d = np.full(50, 2.0)
    t = np.full(50, 8)
    t[:25] = 6
    t[-1] = 200  # 100 tokens per second: far above the group
    est = estimate_2d_bins(d, t, 1, 2, tps_threshold=3.0)
    assert est.groups[0].num_outliers == 1
    assert est.max_tps[0] == 4.0
    assert est.bins[-1] == (2.0, 8)
    est_all = estimate_2d_bins(d, t, 1, 2, tps_threshold=100.0)
    assert est_all.bins[-1] == (2.0, 200)


@pytest.mark.parametrize("kind", ["gamma", "rounded", "skewed", "equal"])
def test_2d_matches_plain_loop(kind):
    rng = np.random.default_rng(len(kind))
    for trial in range(25):
        n = int(rng.integers(1, 1500))
        d, t = corpus(n, seed=trial, kind=kind)
        nb = int(rng.integers(1, min(n, 40) + 1))
        ns = int(rng.integers(1, 5))
        thr = float(rng.choice([1.0, 2.5, 4.0]))
        est = estimate_2d_bins(d, t, nb, ns, tps_threshold=thr)
        bins, tps = loop_2d(d, t, nb, ns, thr)
        assert est.bins == bins
        assert est.max_tps == tps
        assert len(est.bins) == len(est.max_tps)
        assert est.bins == sorted(est.bins)
