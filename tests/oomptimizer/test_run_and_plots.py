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
