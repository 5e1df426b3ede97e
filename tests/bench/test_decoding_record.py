"""The decoding record's readers compute every ratio from the record."""

import json

import matplotlib

matplotlib.use("Agg")

from workbench.bench.decoding import record as plots  # noqa: E402
from workbench.bench.results import RESULTS_DIR  # noqa: E402


def _record(ours_rnnt, ours_tdt, speedup):
    nemo = {"source": "DESIGN.md", "rnnt_full_graph_s": 0.05, "tdt_full_graph_s": 0.02,
            "rnnt_frame_looping_no_graphs_s": 0.6}
    return {"figures": {"nemo_reference": nemo,
                        "targets": {"rnnt_full_s": ours_rnnt, "tdt_full_s": ours_tdt,
                                    "full_speedup_vs_frame_looping_off_rnnt": speedup, "goal": "the goal"}}}


def test_targets_table_and_speedup_line_come_from_the_record():
    record = _record(0.025, 0.04, 16.0)
    table = plots.targets_table(record).set_index("what")
    assert table.loc["RNN-T full graph (s)", "NeMo / ours"] == 2.0  # 0.05 / 0.025
    assert table.loc["TDT full graph (s)", "NeMo / ours"] == 0.5
    line = plots.frame_looping_speedup_line(record)
    assert "16.0x faster" in line and "NeMo 3.0.0: 12.0x faster" in line and "the goal" in line  # 0.6 / 0.05
    assert "not measured" in plots.frame_looping_speedup_line(_record(None, None, None))


def _row(model, batch, method, ms):
    t = {"median": ms / 1e3, "p25": ms / 1e3, "p75": ms / 1e3}
    return {"model": model, "dtype": "float32", "batch": batch, "audio_seconds": 12.0, "method": method, "time_s": t,
            "audio_s_per_s": batch * 12.0 / t["median"]}


def test_speed_pivot_puts_batch_sizes_in_columns_at_three_significant_digits():
    rows = [_row("rnnt", 1, "label-looping off", 1.23456), _row("rnnt", 16, "label-looping off", 12.3456),
            _row("rnnt", 1, "frame-looping off", 98765.4), _row("tdt", 16, "label-looping off", 0.0123456)]
    pivot = plots.speed_pivot(plots.speed_table({"figures": {"rows": rows}}))
    assert list(pivot.columns) == ["B=1", "B=16"]
    assert pivot.loc[("rnnt", "float32", 12.0, "label-looping off")].tolist() == [1.23, 12.3]
    assert pivot.loc[("rnnt", "float32", 12.0, "frame-looping off"), "B=1"] == 98800.0
    assert pivot.loc[("tdt", "float32", 12.0, "label-looping off"), "B=16"] == 0.0123
    assert pivot.loc[("tdt", "float32", 12.0, "label-looping off"), "B=1"] != pivot.loc[
        ("tdt", "float32", 12.0, "label-looping off"), "B=1"]  # not measured: NaN
    # frame-looping sorts before label-looping (METHOD_ORDER), not alphabetically by accident
    assert [m for model, _, _, m in pivot.index if model == "rnnt"] == ["frame-looping off", "label-looping off"]


def test_summary_says_faster_than():
    line = plots.summary_lines({"targets": {"rnnt_full_s": 0.025, "tdt_full_s": 0.01, "speedup_vs_nemo_full_rnnt": 1.88,
                                            "speedup_vs_nemo_full_tdt": 2.1,
                                            "full_speedup_vs_frame_looping_off_rnnt": 20.0},
                                "rows": [], "empty_while_iteration": {"seconds_per_iteration": 1e-6},
                                "failures": [], "skipped_for_time": []})[0]
    assert "(1.88x faster than NeMo's full graph)" in line and "(2.10x faster than NeMo's)" in line


def test_every_committed_decoding_record_renders():
    for path in sorted(RESULTS_DIR.glob("decoding*.json")):
        record = json.loads(path.read_text())
        table = plots.speed_table(record)
        assert not plots.speed_pivot(table).empty and plots.summary_lines(record["figures"])
        assert plots.table_lines(record["figures"])[-1].startswith("empty while iteration")
