"""The allocator record's readers: the committed records and the rounds/headroom layout."""

import json

import pytest

import matplotlib

matplotlib.use("Agg")

from workbench.bench.allocator.record import (allocation_events_table, blocks as allocator_blocks,  # noqa: E402
                                              paired_ratio_table, reference_caveats, step_time_table, summary_lines,
                                              table_lines)
from workbench.bench.results import RESULTS_DIR  # noqa: E402
from workbench.memory.plots import plot_device_allocs, plot_memory_curves  # noqa: E402


def test_committed_record_gives_its_blocks_tables_and_curves():
    path = RESULTS_DIR / "allocator.json"
    record = json.loads(path.read_text())
    blocks = allocator_blocks(record)
    assert list(blocks) == [f"{h:g}" for h in record["params"]["headrooms"]]
    for block in blocks.values():
        assert block["rounds"] == record["figures"]["rounds_run"] >= 1
        table = step_time_table(block["figures"])
        assert set(table.index) == {"dynamic_plain", "dynamic_expandable", "static_plain", "static_expandable"}
        assert table.loc["static_plain", "paired time ratio vs static_plain"] == 1.0
        paired = paired_ratio_table(block["figures"])
        assert not paired.empty
        assert (paired["rounds"] == block["rounds"]).all()
        plot_memory_curves(block["series"], warmup_steps=block["warmup_steps"])


def test_record_without_headrooms_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="headrooms"):
        allocator_blocks({"params": {}, "figures": {"static_plain": {}}})


def test_rounds_record_gives_a_block_per_headroom_with_paired_ratios_and_events(monkeypatch, tmp_path, capsys):
    from test_allocator_bench import run_bench_with

    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys,
                                      args=["--rounds", "2", "--headroom", "0.08", "0.2"], dyn_exp_allocs=2)
    blocks = allocator_blocks(record)
    assert list(blocks) == ["0.08", "0.2"] and blocks["0.2"]["rounds"] == 2
    figures = blocks["0.08"]["figures"]
    paired = paired_ratio_table(figures)
    assert paired.loc["dynamic_plain/static_plain", "median"] == 1.3
    assert paired.loc["dynamic_plain/static_plain", "rounds"] == 2
    events = allocation_events_table(figures)
    assert set(events["config"]) == {"dynamic_expandable", "dynamic_plain"}  # the plain one re-allocates per shape
    mine = events[events["config"] == "dynamic_expandable"]
    assert list(mine["round"]) == [1, 1, 2, 2] and list(mine["block"]) == [1, 2, 1, 2]
    assert events["reason"].str.startswith("cache miss").all()
    assert step_time_table(figures).loc["static_plain", "rounds"] == 2
    plot_device_allocs(blocks["0.2"]["series"], warmup_steps=blocks["0.2"]["warmup_steps"])


def test_a_reference_that_oomed_is_named_beside_targets_met(monkeypatch, tmp_path, capsys):
    from test_allocator_bench import run_bench_with

    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"], static_plain_oom=True)
    figures = record["figures"]
    assert rc == 0 and figures["targets_met"]
    assert reference_caveats(figures) == ["headroom 0.08: static_plain had 4 OOM(s), so the time target uses "
                                          "dynamic_expandable/static_expandable"]
    assert summary_lines(figures)[0] == ("- rounds run: 2; targets met (caveat: headroom 0.08: static_plain had 4 "
                                         "OOM(s), so the time target uses dynamic_expandable/static_expandable)")
    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"])
    assert reference_caveats(record["figures"]) == [] and summary_lines(record["figures"])[0].endswith("targets met")


def test_every_committed_allocator_record_renders():
    for path in sorted(RESULTS_DIR.glob("allocator*.json")):
        record = json.loads(path.read_text())
        assert summary_lines(record["figures"]) and table_lines(record)[0].startswith("model: ")
