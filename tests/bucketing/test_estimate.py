import numpy as np
import pytest
from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

from bucketing_helpers import KINDS, corpus
from workbench.bucketing import estimate_2d_bins, estimate_duration_bins, make_fitter, running_total_boundaries
from workbench.bucketing.fit import FITS, TPS_OVER_LIMIT
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


@pytest.mark.parametrize("threshold", [0, 0.0, -1.0, float("nan"), "4", None, True])
def test_bad_tps_threshold(threshold):
    # 0 would keep only the utterances at or below their group's mean; -1 can keep none
    with pytest.raises(ValueError, match=r"tps_threshold must be a number > 0 \(a tokens-per-second z-score\), got"):
        estimate_2d_bins([1.0, 2.0, 3.0], [1, 2, 9], 1, 1, tps_threshold=threshold)
    from workbench.bucketing import profile_from_arrays

    with pytest.raises(ValueError, match="tps_threshold must be a number > 0"):
        profile_from_arrays([1.0, 2.0, 3.0], [1, 2, 9], num_buckets=1, tps_threshold=threshold)


def test_tps_threshold_inf_keeps_everything():
    est = estimate_2d_bins([1.0, 1.0, 1.0, 1.0], [1, 1, 1, 100], 1, 1, tps_threshold=float("inf"))
    assert est.bins == [(1.0, 100)] and not est.outliers.any()


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
    # durations: 18 s per bucket; the total before 7 is 21 > 18, so the 1D bounds are [7, 8]. The
    # utterance at the bound belongs to its group (d <= 7), as the sampler puts it: [1..7] | [8].
    # (Before, it started the next group, NeMo's way: [1..6] | [7, 8].)
    # group 1 tokens 2..14 (sum 56, 18.67 per sub-bucket): the total before 10 is 20 > 18.67 -> bound 10,
    # restart at 10; before 14 it is 22 > 18.67 -> bound 14; the last bin is the largest, 14 again
    # group 2 tokens [16]: one value, no boundary -> its last bin only
    assert est.bins == [(7.0, 10), (7.0, 14), (7.0, 14), (8.0, 16)]
    assert est.max_tps == [2.0] * 4
    assert [(g.start, g.stop, g.num_subbuckets) for g in est.groups] == [(0, 7, 3), (7, 8, 3)]


def test_2d_minimal_tied_case_fits_its_own_corpus():
    # A tied case: 2 duration buckets, the 1D bounds are [1, 2] (the total before the sixth
    # 1.0 is 5 > 4). NeMo's rule starts group 2 at that utterance, giving [(1, 2), (2, 5)] with
    # max_tps [2, 5], which reject (1 s, 5 tokens). Ours: group 1 holds every 1 s utterance.
    d, t = [1, 1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 2, 5, 2]
    assert estimate_duration_bins(d, 2) == [1.0, 2.0]
    est = estimate_2d_bins(d, t, 2, 1)
    # group 1: tps [1, 1, 1, 1, 2, 5], mean 11/6, std 1.46: z of 5 is 2.17 <= 4, so all are kept
    assert est.bins == [(1.0, 5), (2.0, 2)]
    assert est.max_tps == [5.0, 1.0]
    assert not est.outliers.any()
    assert make_fitter(est.bins, est.max_tps).assign(d, t)[0].tolist() == [0, 0, 0, 0, 0, 0, 1]
    assert make_fitter([(1.0, 2), (2.0, 5)], [2.0, 5.0]).select(1.0, 5) == (-1, TPS_OVER_LIMIT)


def test_2d_two_durations_every_kept_utterance_fits():
    # 20k utterances of 1 s and 15 s, 30 x 2 buckets: every 1D bound is 1.0 or 15.0, all ties
    rng = np.random.default_rng(12)
    d = np.where(rng.random(20_000) < 0.5, 1.0, 15.0)
    t = (d * rng.uniform(1, 5, d.shape[0])).astype(np.int64) + (rng.random(d.shape[0]) < 0.01) * 50
    est = estimate_2d_bins(d, t, 30, 2)
    assert [g.max_duration for g in est.groups] == [1.0, 15.0]
    assert sum(g.num_merged for g in est.groups) == len(estimate_duration_bins(d, 30))
    _, reason = make_fitter(est.bins, est.max_tps).assign(d, t)
    assert est.outliers.sum() > 0
    assert ((reason == TPS_OVER_LIMIT) == est.outliers).all() and ((reason == FITS) == ~est.outliers).all()


@pytest.mark.parametrize("kind", KINDS)
def test_2d_guarantee_on_many_random_corpora(kind):
    """Every utterance the estimator did not flag fits a bucket in strict (and lenient) mode, and every
    flagged one is over its bucket's TPS limit; the groups are the distinct 1D bounds."""
    rng = np.random.default_rng(100 + KINDS.index(kind))
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        d, t = corpus(n, seed=1000 + trial, kind=kind)
        if trial % 3 == 1:  # tokens from a few values only: ties in the second dimension too
            t = rng.choice([0, 3, 7, 40], n)
        nb = int(rng.integers(1, min(n, 40) + 1))
        ns = int(rng.integers(1, 5))
        thr = float(rng.choice([0.5, 1.0, 2.5, 4.0]))
        est = estimate_2d_bins(d, t, nb, ns, tps_threshold=thr)
        bounds = estimate_duration_bins(d, nb)
        assert [g.max_duration for g in est.groups] == sorted(set(bounds))
        assert [g.num_merged for g in est.groups] == [bounds.count(b) for b in sorted(set(bounds))]
        assert int(est.outliers.sum()) == sum(g.num_outliers for g in est.groups)
        for strict in (True, False):
            idx, reason = make_fitter(est.bins, est.max_tps, strict_2d=strict).assign(d, t)
            assert (reason[~est.outliers] == FITS).all(), (kind, trial, strict)
            assert (reason[est.outliers] == TPS_OVER_LIMIT).all(), (kind, trial, strict)


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


@pytest.mark.parametrize("kind", KINDS)
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
