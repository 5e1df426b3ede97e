"""The table of benches and GPU stages (benchmarks/stages.toml) against the code it names."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.stages import expand, prelude_line, shell_line, stage_budget
from workbench.records.stages import Stage, bench_of_record, load_table
from workbench.reporting import bench_name

REPO = Path(__file__).resolve().parents[2]
BENCHES, STAGES = load_table()


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_bench_has_a_runner_a_reader_and_measured_code(name):
    bench = BENCHES[name]
    assert (REPO / "benchmarks" / name / "__main__.py").is_file()
    reader = importlib.import_module(f"workbench.records.{name}")
    for function in bench.records.values():
        assert callable(getattr(reader, function)), f"workbench.records.{name}.{function}"
    for path in bench.measures:
        assert (REPO / path).exists(), path


def test_every_committed_record_has_its_bench_and_a_summary():
    for path in sorted((REPO / "benchmarks/results").glob("*.json")):
        found = bench_of_record(path.stem)
        assert found is not None, path.name
        assert bench_name(json.loads(path.read_text())) == found[0].name, path.name


def test_the_longest_record_name_wins():
    assert bench_of_record("oomptimizer_rnnt_chunked_0_16")[1] == "chunked_summary_lines"
    assert bench_of_record("oomptimizer_aed")[1] == "summary_lines"
    assert bench_of_record("allocator_headroom15")[0].name == "allocator"
    assert bench_of_record("nothing_known") is None


class Parsed(Exception):
    """Raised by the stand-in for the harness's start(): the options parsed."""


@pytest.mark.parametrize("name", sorted(STAGES))
def test_each_stage_runs_a_bench_whose_parser_takes_its_options(name, monkeypatch, tmp_path):
    stage = STAGES[name]
    words = expand(stage, str(tmp_path), 100 if stage.budget else None, {})
    assert words[0].startswith("benchmarks."), stage.run
    runner = importlib.import_module(f"{words[0]}.run")

    def parse_only(parser, argv, **_):
        raise Parsed(parser.parse_args(argv))
    monkeypatch.setattr(runner, "start", parse_only)
    with pytest.raises(Parsed):
        runner.main(words[1:])
    assert bench_of_record(stage.writes) is not None, f"stage {name} writes {stage.writes}: no bench reads it"


def test_a_budget_is_cut_to_the_seconds_left_and_skips_when_too_few_are():
    stage = Stage("s", "benchmarks.x --budget-s {budget} --out {results}", 300, "x", budget=(60, 60, 250, 0))
    assert stage_budget(stage, 1000) == 250
    assert stage_budget(stage, 200) == 140
    assert stage_budget(stage, 100) is None
    assert shell_line(stage, "/r", 100) is None
    assert stage_budget(Stage("s", "", 1, "x", budget=(60, 60, 0, 30)), 500) == 410


def test_placeholders_fill_from_the_results_folder_and_the_environment(tmp_path):
    stage = Stage("t-x", "benchmarks.x {from} {env:ARGS} {env:RANGE:--buckets} --out {results}", 300, "rec")
    assert expand(stage, str(tmp_path), None, {}) == ["benchmarks.x", "--out", str(tmp_path)]
    (tmp_path / "rec.json").write_text("{}")
    words = expand(stage, str(tmp_path), None, {"ARGS": "--models a b", "RANGE": "1:3"})
    assert words == ["benchmarks.x", "--from", str(tmp_path / "rec.json"), "--models", "a", "b",
                     "--buckets", "1:3", "--out", str(tmp_path)]


def test_a_nemo_stage_gets_nemo_on_its_path_and_its_first_step_before_its_budget():
    stage = STAGES["byo-models"]
    assert prelude_line(stage, {}).startswith("nemo_site; run_before byo_models ")
    assert prelude_line(stage, {"SKIP_BEFORE": "1"}) == "nemo_site"
    assert prelude_line(STAGES["models"], {}) == ""
    line = shell_line(stage, "/r d", 600, {})
    assert line.startswith('run_stage byo_models 400 "${NEMO_ENV[@]}" python3 -m benchmarks.byo_models --budget-s 340')
    assert line.endswith("--out '/r d'")
    script = (REPO / "scripts/gpu_run.sh").read_text()
    assert script.index("benchmarks.stages prelude") < script.index("benchmarks.stages shell")


def test_the_gpu_script_offers_every_stage_of_the_table():
    out = subprocess.run(["bash", str(REPO / "scripts/gpu_run.sh"), "--help"], capture_output=True, text=True,
                         timeout=60)
    offered = out.stdout.split("stages:")[-1].split()
    assert set(STAGES) | {"flow", "tests", "tests-allocator"} == set(offered)
