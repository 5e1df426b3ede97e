"""The plan_calibration bench on the CPU (a modeled peak against the plan) and its record's summary lines."""

import json

from workbench.bench.plan_calibration import record
from workbench.bench.plan_calibration.run import main


def test_smoke_run_compares_the_plan_with_the_search(tmp_path):
    assert main(["--smoke", "--out", str(tmp_path)]) == 0  # smoke: targets reported, not enforced
    figures = json.loads((tmp_path / "plan_calibration.json").read_text())["figures"]
    entry = figures["models"]["tiny-rnnt"]
    buckets = figures["buckets"]
    assert len(entry["plan"]["sizes"]) == len(entry["search"]["sizes"]) == len(entry["from_plan"]["sizes"]) == \
        len(buckets)
    assert entry["planned_over_searched"] == [p / s for p, s in zip(entry["plan"]["sizes"], entry["search"]["sizes"])]
    for row in entry["probes"]:  # the plan's line at every probe; an error only where a peak was measured
        assert row["planned_bytes"] > 0
        assert (row["error"] is None) == (row["measured_bytes"] is None)
    measured = [r for r in entry["probes"] if r["measured_bytes"]]
    assert entry["largest_peak_error"] == max(abs(r["planned_bytes"] / r["measured_bytes"] - 1) for r in measured)
    assert sum(entry["from_plan"]["probes_per_bucket"]) == round(entry["from_plan"]["mean_probes_per_bucket"]
                                                                 * len(buckets))
    # the modeled probe is not the plan's memory: the sizes that do not fit are found and said
    assert entry["planned_fits"] == [p <= s for p, s in zip(entry["plan"]["sizes"], entry["search"]["sizes"])]
    lines = record.summary_lines(figures)
    assert lines[0].startswith("- tiny-rnnt: planned / searched batch size ")
    assert any(line.startswith("- target missed: tiny-rnnt: planned sizes OOM") for line in lines)


def test_summary_line_of_a_model_that_failed():
    figures = {"models": {"x": {"error": "RuntimeError: boom"}}, "failures": ["x: RuntimeError: boom"]}
    assert record.summary_lines(figures) == ["- x: not measured: RuntimeError: boom"]
