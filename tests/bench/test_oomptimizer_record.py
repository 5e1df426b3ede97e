"""The OOMptimizer records' readers on the committed records."""

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from workbench.bench.oomptimizer import record  # noqa: E402
from workbench.bench.results import RESULTS_DIR  # noqa: E402


def _load(name):
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())


def test_committed_one_gpu_record_gives_its_tables_figures_and_lines():
    gpu = _load("oomptimizer")
    part = gpu["figures"]["rnnt"]
    tables = record.rnnt_tables(gpu)
    searches = tables["searches"]
    assert list(searches.index) == ["predictive, all buckets", "predictive, compared buckets",
                                    "bisect, compared buckets"]
    assert searches.loc["predictive, all buckets", "buckets"] == len(part["buckets"])
    assert len(tables) == 2 and len(next(iter(list(tables.values())[1:]))) == len(part["true_max"])
    titles = [f.axes[0].get_title() for f in record.rnnt_figures(gpu)]
    assert len(set(titles)) == 3  # no two figures share a title
    n = len(part["comparison"]["bucket_indices"])
    assert titles[2].endswith(f"{n} of {len(part['buckets'])} buckets")
    assert record.rnnt_lines(gpu)[0] == part["model"] and record.rnnt_lines(gpu)[1].startswith("soak:")
    assert record.search_budget_bytes(gpu) == gpu["params"]["memory_fraction"] * gpu["device"]["gpu_memory_bytes"]
    plt.close("all")


def test_aed_part_comes_from_its_own_record_when_there_is_one():
    gpu, aed = _load("oomptimizer"), _load("oomptimizer_aed")
    line, table, fig = record.aed_outputs(gpu, aed)
    assert line.startswith(aed["figures"]["aed"]["model"]) and list(table.index) == ["predictive", "bisect"]
    assert record.aed_outputs(None, None) is None
    plt.close("all")


def test_ddp_lines_set_the_two_gpu_run_beside_the_one_gpu_accounting():
    ddp, gpu = _load("oomptimizer_ddp"), _load(record.BEFORE_LEAN_STEP_RECORDS["rnnt"])  # the one-GPU run of its day
    lines = record.ddp_lines(ddp, gpu)
    assert lines[0].startswith(f"{ddp['figures']['model']} on {ddp['figures']['world_size']} GPUs")
    assert lines[1] == f"one GPU with DDP accounting: {gpu['figures']['rnnt']['ddp_accounting']['batch_sizes']}"
    assert record.ddp_lines(ddp, None) == lines[:1]


def _sizes_record(commit, part, buckets, sizes):
    return {"git_commit": commit, "figures": {part: {"model": "m", "buckets": buckets,
                                                     "predictive": {"batch_sizes": sizes}},
                                              "aed" if part == "rnnt" else "rnnt": {"skipped": "not run"}}}


def test_growth_sets_each_buckets_profile_size_against_an_older_record():
    buckets = [[3.0, 10.0], [3.0, 40.0], [20.0, 200.0]]
    before = _sizes_record("aaaaaaa111", "rnnt", buckets, [100, 50, 10])
    after = _sizes_record("bbbbbbb222", "rnnt", buckets, [150, 100, 31])
    rows = record.growth_rows(before, after)
    assert [(r["bucket"], r["before"], r["after"], r["after_over_before"]) for r in rows] == [
        (0, 100, 150, 1.5), (1, 50, 100, 2.0), (2, 10, 31, 3.1)]
    assert record.growth_lines(before, after) == [
        "- rnnt profile batch sizes at bbbbbbb222 / at aaaaaaa111 over 3 buckets: min 1.50x, median 2.00x, "
        "max 3.10x; >= 2x at 2 of 3"]
    table = record.growth_table(before, after)
    assert list(table.columns) == ["bucket", "duration s", "tokens", "before (aaaaaaa)", "after (bbbbbbb)",
                                   "after / before"]
    assert list(table["after / before"]) == [1.5, 2.0, 3.1]
    other = _sizes_record("ccccccc333", "rnnt", buckets[:2], [1, 2])
    assert record.growth_rows(before, other) == [] and record.growth_table(before, other).empty
    assert record.growth_lines(before, other) == [
        "- rnnt profile batch sizes at ccccccc333 / at aaaaaaa111: not comparable (other buckets)"]
    aed = _sizes_record("ddddddd444", "aed", buckets, [1, 2, 3])
    assert record.growth_lines(before, aed) == []  # no part searched in both


def test_committed_records_show_the_growth_since_the_lean_step():
    for part, name in record.BEFORE_LEAN_STEP_RECORDS.items():
        current = _load("oomptimizer" if part == "rnnt" else "oomptimizer_aed")
        rows = record.growth_rows(_load(name), current, part)
        assert rows and all(r["after"] and r["before"] for r in rows)
