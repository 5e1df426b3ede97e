"""The decoding notebook's readers of decoding.json compute every ratio from the record."""

import matplotlib

matplotlib.use("Agg")

from workbench.decoding import plots  # noqa: E402


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
    assert "16.0x" in line and "NeMo 3.0.0: 12.0x" in line and "the goal" in line  # 0.6 / 0.05
    assert "not measured" in plots.frame_looping_speedup_line(_record(None, None, None))
