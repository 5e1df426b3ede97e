import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from workbench.bucketing.profile import BucketProfile  # noqa: E402
from workbench.oomptimizer import SyntheticMemory, demo_buckets, search_batch_sizes  # noqa: E402
from workbench.oomptimizer.plots import plot_batch_sizes, plot_probe_trace, plot_strategy_comparison  # noqa: E402
from workbench.oomptimizer.run import profile_buckets  # noqa: E402


def test_profile_buckets_2d_and_1d():
    assert profile_buckets(BucketProfile([[5.0, 40], [10.0, 90]])) == [(5.0, 40.0), (10.0, 90.0)]
    assert profile_buckets(BucketProfile([2.0, 4.5], max_tps=[8.0, 10.0])) == [(2.0, 16.0), (4.5, 45.0)]
    assert profile_buckets(BucketProfile([3.0], max_tps=7.5)) == [(3.0, 23.0)]  # ceil(22.5)


def test_plots_accept_results_and_json_figures():
    memory = SyntheticMemory(kind="step")
    buckets = demo_buckets(4, 2)
    result = search_batch_sizes(buckets, memory.probe, budget_bytes=memory.budget_bytes)
    as_json = {"batch_sizes": result.batch_sizes,
               "trace": [[p.bucket_index, p.batch_size, p.peak_bytes, p.predicted_bytes] for p in result.probes]}
    fig = plot_batch_sizes(buckets, result.batch_sizes)
    assert len(fig.axes) == 3  # bars, heat map, colour bar
    assert len(plot_batch_sizes([(b[0], 0.0) for b in demo_buckets(5, 1)], [5, 4, 3, 2, 1]).axes) == 1
    for r in (result, as_json):
        ax = plot_probe_trace(r, buckets, memory.budget_bytes).axes[0]
        assert len(ax.lines) >= len(buckets) and ax.get_title() == "probes: peak memory vs batch size"
        few = plot_probe_trace(r, buckets, memory.budget_bytes, max_buckets=3).axes[0]
        assert few.get_title().endswith(f"(3 of {len(buckets)} buckets, the longest)")
        bars = plot_strategy_comparison({"a": r, "b": r}).axes[1].patches
        assert [p.get_height() for p in bars[:2]] == [len(result.probes)] * 2


def test_soak_needs_batch_sizes():
    from workbench.oomptimizer.run import soak

    with pytest.raises(ValueError, match="bucket_batch_size"):
        soak(None, BucketProfile([[5.0, 40]]))


def test_describe_soak_reads_needs_from_allocated_bytes():
    from workbench.oomptimizer.run import describe_soak

    gib = 2**30
    report = {"steps": 60, "ooms": 0, "seconds": 50.2, "memory_fraction": 1.0, "search_memory_fraction": 0.9,
              "peak_allocated_bytes": 90 * gib, "peak_reserved_bytes": 99 * gib, "budget_bytes": 100 * gib}
    line = describe_soak(report)
    assert "60 steps, 0 OOMs" in line and "of 100.0 GiB" in line
    assert "allocated / search budget (90%) = 1.000" in line  # 90 GiB of 0.9 x 100 GiB
    cpu = {**report, "peak_allocated_bytes": None, "peak_reserved_bytes": None, "budget_bytes": None}
    assert describe_soak(cpu).endswith("(no GPU: peaks not measured)")
    assert describe_soak({"error": "RuntimeError: soak: OOM at step 5"}).startswith("soak failed: RuntimeError")


def test_compare_strategies_and_their_table():
    from workbench.oomptimizer.plots import strategy_table
    from workbench.oomptimizer.search import search_batch_sizes
    from workbench.oomptimizer.synthetic import SyntheticMemory, compare_strategies, demo_buckets

    memory = SyntheticMemory(kind="quadratic")
    buckets = demo_buckets(4, 2)
    results = compare_strategies(memory, buckets, rel_gap=0.05, budget_known=False)
    assert list(results) == ["predictive", "bisect"]
    alone = search_batch_sizes(buckets, memory.probe, rel_gap=0.05, strategy="bisect")  # no budget given
    assert results["bisect"].batch_sizes == alone.batch_sizes and results["bisect"].num_probes == alone.num_probes
    known = compare_strategies(memory, buckets, rel_gap=0.05, budget_known=True)["predictive"]
    given = search_batch_sizes(buckets, memory.probe, rel_gap=0.05, budget_bytes=memory.budget_bytes)
    assert known.batch_sizes == given.batch_sizes and known.num_probes == given.num_probes
    assert known.num_probes != results["predictive"].num_probes  # the budget changes the search
    true_max = [memory.true_max(b) for b in buckets]
    table = strategy_table(results, true_max=true_max)
    with pytest.raises(ValueError, match="3 true maxima for 8 buckets"):
        strategy_table(results, true_max=true_max[:3])
    with pytest.raises(ValueError, match="no 'trace'"):
        strategy_table({"old": {"batch_sizes": [1]}})
    for name, r in results.items():
        assert table.loc[name, "probes"] == r.num_probes and table.loc[name, "OOMs"] == r.num_ooms
        assert table.loc[name, "probes/bucket"] == round(r.probes_per_bucket, 3)
        worst = max((t - b) / t for t, b in zip(true_max, r.batch_sizes))
        assert table.loc[name, "worst % below true max"] == round(100 * worst, 3)
    # committed figures (JSON) read the same way, with their seconds
    committed = {"batch_sizes": [10, 20], "seconds": 3.5,
                 "trace": [[0, 8, 1e9, None], [0, 16, None, 2e9], [0, 10, 1.5e9, 1.4e9], [1, 20, 1e9, None]]}
    row = strategy_table({"gpu": committed}).loc["gpu"]
    # worked by hand: bucket 0 keeps 10 of a true 12, bucket 1 all 20 -> the worst is 2/12 below
    assert strategy_table({"gpu": committed}, true_max=[12, 20]).loc["gpu", "worst % below true max"] == 16.667
    assert (row["buckets"], row["probes"], row["OOMs"], row["seconds"]) == (2, 4, 1, 3.5)


# committed-figures form: [bucket, batch size, peak bytes or None (OOM), predicted bytes or None]
_FAST = {"batch_sizes": [10, 20], "seconds": 3.4,
         "trace": [[0, 8, 80.0, None], [0, 10, 100.0, 99.0], [1, 20, 200.0, 190.0], [1, 24, None, 210.0]]}
_SLOW = {"batch_sizes": [9, 20], "seconds": 9.6,
         "trace": [[0, 4, 40.0, None], [0, 8, 80.0, None], [0, 16, None, None], [0, 9, 90.0, None],
                   [1, 16, 160.0, None], [1, 32, None, None], [1, 20, 200.0, None], [1, 24, None, None]]}


def test_bucket_labels_round_to_what_they_carry():
    from workbench.oomptimizer.plots import bucket_label

    assert bucket_label((39.9875, 145.0)) == "40 s / 145 tok"
    assert bucket_label((3.3424375, 11.0)) == "3.3 s / 11 tok"
    assert bucket_label((12.0, 0.0)) == "12 s"


def test_meaning_of_search_says_probes_ooms_and_the_shortfall():
    from workbench.oomptimizer.plots import meaning_of_search

    results = {"predictive": _FAST, "bisect": _SLOW}
    assert meaning_of_search(results) == ("The predictive search needed 2.0 probes per bucket against bisection's "
                                          "4.0, with 1 OOM against 3.")
    # true maxima 12 and 20: predictive keeps 10 (16.7 % below), bisect 9 (25.0 % below)
    assert meaning_of_search(results, [12, 20]).endswith(
        "; its worst bucket is 16.7 % below the true maximum (bisection's 25.0 %).")
    assert meaning_of_search(results, [10, 20]).endswith(
        "; it found every bucket's true maximum, where bisection's worst bucket is 10.0 % below it.")


def test_styled_strategy_table_has_human_columns_and_no_index():
    from workbench.oomptimizer.plots import styled_strategy_table

    html = styled_strategy_table({"predictive": _FAST, "bisect": _SLOW}, true_max=[12, 20]).to_html()
    for column in ("probes per bucket", "search time (s)", "worst bucket below its true max (%)"):
        assert column in html
    assert "probes/bucket" not in html and ">16.7<" in html and ">2.0<" in html and ">10<" in html


def test_meaning_of_batch_sizes_and_of_the_trace():
    from workbench.oomptimizer.plots import meaning_of_batch_sizes, meaning_of_trace, prediction_errors

    buckets = [(3.3424375, 11.0), (3.3424375, 44.0), (39.9875, 145.0)]
    assert meaning_of_batch_sizes(buckets, [300, 200, 10], merged=3) == (
        "Batch size falls from 300 at the shortest bucket (3.3 s / 11 tok) to 10 at the longest (40 s / 145 tok), "
        "30x fewer utterances per step; no two sub-buckets came out equal, so all 3 buckets stay.")
    assert meaning_of_batch_sizes(buckets, [300, 300, 10], merged=2).endswith(
        "; merging equal sub-buckets leaves 2 of 3 buckets.")
    assert prediction_errors(_FAST) == [0.01, 0.05]
    assert meaning_of_trace(_FAST) == (
        "The predictive search made 4 probes, 1 of them out of memory; where it predicted a probe's peak before "
        "running it, the median miss was 3.0 % of the measured peak (worst 5.0 %).")
    assert meaning_of_trace(_SLOW, "bisection").endswith("no probe that fitted had a prediction to check.")


def test_draw_synthetic_search_draws_both_strategies_and_returns_their_table():
    import matplotlib.pyplot as plt

    from workbench.oomptimizer.plots import draw_synthetic_search

    plt.close("all")
    table = draw_synthetic_search("linear", True, 0.05, 3, 2, budget_gib=40.0, seed=1).data
    assert sorted(table["search"]) == ["bisect", "predictive"]
    assert (table["probes per bucket"] >= 1).all() and (table["worst bucket below its true max (%)"] <= 5).all()
    assert len(plt.get_fignums()) == 2  # the batch sizes of both, the predictive search's probe trace
    plt.close("all")
