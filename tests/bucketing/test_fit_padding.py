import pytest

from bucketing_helpers import corpus
from workbench.bucketing import estimate_2d_bins, estimate_duration_bins, make_fitter, padding_comparison, padding_waste
from workbench.bucketing.fit import FITS, TOO_LONG, TOO_MANY_TOKENS, TPS_OVER_LIMIT


def test_1d_upper_bounds_are_inclusive():
    f = make_fitter([1.0, 2.0, 3.0])
    idx, reason = f.assign([0.5, 1.0, 1.0001, 2.0, 3.0, 3.1])
    assert idx.tolist() == [0, 0, 1, 1, 2, -1]
    assert reason.tolist() == [FITS] * 5 + [TOO_LONG]
    assert f.select(1.0) == (0, FITS)


def test_2d_strict_and_not_strict():
    bins = [(10.0, 5), (10.0, 10), (20.0, 12), (20.0, 18)]
    strict, loose = make_fitter(bins), make_fitter(bins, strict_2d=False)
    cases = [(8.0, 11), (8.0, 5), (8.0, 6), (15.0, 18), (15.0, 19), (21.0, 1)]
    assert [strict.select(*c) for c in cases] == [(-1, TOO_MANY_TOKENS), (0, FITS), (1, FITS), (3, FITS),
                                                  (-1, TOO_MANY_TOKENS), (-1, TOO_LONG)]
    assert [loose.select(*c)[0] for c in cases] == [2, 0, 1, 3, -1, -1]


def test_tps_limit_per_group():
    f = make_fitter([(2.0, 10), (2.0, 20), (4.0, 30)], max_tps=[6.0, 6.0, 5.0])
    assert f.select(2.0, 12) == (1, FITS)  # 6 tokens per second: at the limit, inclusive
    assert f.select(2.0, 13) == (-1, TPS_OVER_LIMIT)
    assert f.select(3.0, 16) == (-1, TPS_OVER_LIMIT)
    assert f.select(4.0, 20) == (2, FITS)


@pytest.mark.parametrize("strict", [True, False])
def test_vectorized_assign_agrees_with_select(strict):
    d, t = corpus(3000, seed=5, kind="rounded")
    est = estimate_2d_bins(d[:2000], t[:2000], 8, 3, tps_threshold=2.0)  # the rest may fit nowhere
    for bins, tps in [(est.bins, est.max_tps), (estimate_duration_bins(d[:2000], 8), 9.0)]:
        f = make_fitter(bins, tps, strict_2d=strict)
        idx, reason = f.assign(d, t)
        pairs = [f.select(float(a), int(b)) for a, b in zip(d, t)]
        assert idx.tolist() == [p[0] for p in pairs]
        assert reason.tolist() == [p[1] for p in pairs]
        assert (reason != FITS).any() and (reason == FITS).any()


def test_bad_bins():
    with pytest.raises(ValueError, match="sorted"):
        make_fitter([2.0, 1.0])
    with pytest.raises(ValueError, match="max_tps has 2 entries but there are 3"):
        make_fitter([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="empty"):
        make_fitter([])


def test_padding_exact_small_case():
    table = padding_waste([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 8], [2.0, 4.0])
    # bucket 0: 1+2 s padded to 2 s each -> 1 of 4 padded; bucket 1: 3+4 padded to 4 -> 1 of 8
    assert table.loc[0, "padded_input_share"] == pytest.approx(0.25)
    assert table.loc[1, "padded_input_share"] == pytest.approx(1 / 8)
    assert table.loc["all", "padded_input_share"] == pytest.approx(2 / 12)
    # 1D: tokens pad to the bucket's longest: bucket 0 (1, 2) -> 1 of 4; bucket 1 (3, 8) -> 5 of 16
    assert table.loc[1, "padded_output_share"] == pytest.approx(5 / 16)
    assert table.loc["all", "padded_output_share"] == pytest.approx(6 / 20)
    none = padding_waste([1.0, 2.0, 3.0, 4.0], None)
    assert none.loc["all", "padded_input_share"] == pytest.approx(6 / 16)


def test_padding_expected_batch_max():
    # batch of 2 drawn from {1, 3}: max is 3 unless both are 1 (prob 1/4) -> E[max] = 2.5
    table = padding_waste([1.0, 3.0], None, [3.0], batch_size=2)
    assert table.loc["all", "padded_input_share"] == pytest.approx((2 * 2.5 - 4) / 5)


def test_padding_2d_beats_1d_beats_none_and_counts_unfit():
    d, t = corpus(20_000, seed=7)
    est = estimate_2d_bins(d, t, 10, 3)
    table = padding_comparison(d, t, {"none": None, "1D": estimate_duration_bins(d, 10),
                                      "2D": (est.bins, est.max_tps)})
    assert table.loc["none", "padded_input_share"] > table.loc["1D", "padded_input_share"]
    assert table.loc["1D", "padded_output_share"] > table.loc["2D", "padded_output_share"]
    outliers = sum(g.num_outliers for g in est.groups)  # kept <=> fits, except utterances tied at a bound
    assert outliers > 0 and abs(int(table.loc["2D", "unfit"]) - outliers) <= len(est.groups)
    assert table.loc["2D", "utterances"] + table.loc["2D", "unfit"] == 20_000
