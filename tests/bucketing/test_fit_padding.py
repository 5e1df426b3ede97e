import numpy as np
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


EDITED_BINS = [(5.0, 10), (5.0, 20), (10.0, 15), (10.0, 30)]
EDITED_TPS = [4.0, 12.0, 3.0, 3.0]  # an edited profile: the limits differ inside a duration group


def test_strict_tps_check_uses_the_chosen_bucket():
    # 2.0 s and 20 tokens (10 tokens/s) goes to bucket 1 (limit 12), as in NeMo; the group's
    # first bucket's limit (4) does not apply to it
    f = make_fitter(EDITED_BINS, EDITED_TPS)
    assert f.select(2.0, 20) == (1, FITS)
    assert f.assign([2.0], [20])[0].tolist() == [1]
    assert f.select(2.0, 8) == (0, FITS)  # 4 tokens/s: bucket 0, at its limit
    assert f.select(2.0, 9) == (-1, TPS_OVER_LIMIT)  # bucket 0 is chosen, 4.5 > 4 (bucket 1 allows 12)
    assert f.select(8.0, 25) == (-1, TPS_OVER_LIMIT)  # bucket 3, 3.125 > 3
    # no sub-bucket holds 25 tokens at 2 s: its group's last limit (12) decides TPS outlier or not
    assert f.select(2.0, 25) == (-1, TPS_OVER_LIMIT)  # 12.5 tokens/s
    assert f.select(4.0, 25) == (-1, TOO_MANY_TOKENS)  # 6.25 tokens/s


def test_lenient_tps_check_uses_the_own_duration_group():
    # NeMo's lenient mode checks no TPS limit; ours checks the same limit as strict mode
    strict, loose = make_fitter(EDITED_BINS, EDITED_TPS), make_fitter(EDITED_BINS, EDITED_TPS, strict_2d=False)
    assert loose.select(2.0, 20) == strict.select(2.0, 20) == (1, FITS)  # what strict accepts, in the same bucket
    assert loose.select(2.0, 9) == (-1, TPS_OVER_LIMIT)
    assert loose.select(2.0, 25) == (-1, TPS_OVER_LIMIT)  # NeMo's lenient mode would give bucket 3
    # 6.25 tokens/s is within its group's limit (12): promoted to bucket 3; bucket 3's own limit (3) is for
    # 5-10 s utterances and is not applied
    assert loose.select(4.0, 25) == (3, FITS)
    assert loose.select(4.0, 31) == (-1, TOO_MANY_TOKENS)
    d, t = corpus(3000, seed=11, kind="integer")
    bins = [(4.0, 12), (4.0, 16), (9.0, 30), (9.0, 40), (20.0, 60), (20.0, 90)]
    limits = [3.0, 4.5, 2.5, 4.0, 3.5, 4.2]
    s_idx, _ = make_fitter(bins, limits).assign(d, t)
    l_idx, _ = make_fitter(bins, limits, strict_2d=False).assign(d, t)
    assert ((l_idx == s_idx) | (s_idx < 0)).all()  # lenient accepts every strict fit, in the same bucket
    assert ((l_idx >= 0) & (s_idx < 0)).any()  # and some that strict rejects


@pytest.mark.parametrize("strict", [True, False])
def test_vectorized_assign_agrees_with_select(strict):
    d, t = corpus(3000, seed=5, kind="rounded")
    est = estimate_2d_bins(d[:2000], t[:2000], 8, 3, tps_threshold=2.0)  # the rest may fit nowhere
    edited = np.asarray(est.max_tps) * np.random.default_rng(1).uniform(0.5, 1.5, len(est.max_tps))
    for bins, tps in [(est.bins, est.max_tps), (est.bins, edited.tolist()),
                      (estimate_duration_bins(d[:2000], 8), 9.0)]:
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
    # the bins' own corpus: exactly the TPS outliers fit no bucket (an utterance tied at a duration bound
    # belongs to the group below it, so it fits)
    outliers = int(est.outliers.sum())
    assert outliers > 0 and int(table.loc["2D", "unfit"]) == outliers
    assert table.loc["2D", "utterances"] + table.loc["2D", "unfit"] == 20_000
