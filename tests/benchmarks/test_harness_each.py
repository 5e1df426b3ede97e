"""The harness's Run measuring model by model (Run.each), its smoke note and a smoke run's enforced checks."""

import json

from benchmarks.harness import bench_parser, start


def _run(tmp_path, *options):
    return start(bench_parser("a test bench"), ["--out", str(tmp_path), *options], name="each", what="each test",
                 needs_cuda=False)


def test_each_records_entries_errors_and_failed_checks(tmp_path):
    run = _run(tmp_path)
    run.failures.append("earlier: failed")

    def measure(name):
        if name == "bad":
            raise ValueError("broken\nsecond line")
        return {"n": len(name)}, [f"{name}: slow"] if name == "bb" else []

    entries = run.each(["a", "bad", "bb"], measure, spec_of=str.upper)
    assert entries == {"a": {"n": 1}, "bad": {"spec": "BAD", "error": "ValueError: broken"}, "bb": {"n": 2}}
    assert run.failures == ["earlier: failed", "bad: ValueError: broken", "bb: slow"]
    saved = json.loads((tmp_path / "each.json").read_text())["figures"]
    assert saved["models"] == entries and saved["failures"] == run.failures


def test_each_starts_no_model_once_the_budget_is_spent(tmp_path):
    run = _run(tmp_path, "--budget-s", "1e-9")
    entries = run.each(["a", "b"], lambda name: ({}, []))
    assert entries == {} and [f.split(":")[0] for f in run.failures] == ["a", "b"]
    assert all("not run" in f for f in run.failures)


def test_a_smoke_runs_note_and_checks_it_enforces(tmp_path):
    run = _run(tmp_path, "--smoke")
    run.smoke_note = " (SMOKE: modeled)"
    run.failures.append("a check: failed")
    assert run.finish() == 0 and run.finish(enforce_smoke=True) == 1
    assert json.loads((tmp_path / "each.json").read_text())["what"] == "each test (SMOKE: modeled)"
