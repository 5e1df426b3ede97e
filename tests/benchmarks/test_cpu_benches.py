"""The CPU benches (manifest reading, bucketing) on the harness: smoke runs, parts, records as their readers read them."""

import json

import pytest

from benchmarks.bucketing import run as bucketing
from benchmarks.harness import Run, bench_parser
from benchmarks.manifest_reading import run as manifest_reading
from workbench.records import bucketing as bucketing_record
from workbench.records import manifest_reading as manifest_record
from workbench.records.results import RESULTS_DIR


def test_manifest_reading_smoke_agrees_with_lhotse_and_writes_the_record(tmp_path):
    assert manifest_reading.main(["--smoke", "--repeat", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "manifest_reading.json").read_text())
    f = record["figures"]
    assert record["params"]["num_cuts"] == manifest_reading.SMOKE_NUM_CUTS and f["failures"] == [] and f["smoke"]
    assert f["workbench_read_cut_arrays_s"]["n"] == 1 and f["cuts_per_s"] > 0 and f["target_s"] == 10.0
    assert manifest_record.summary_lines(f)


def test_bucketing_parts_write_only_their_records(tmp_path):
    out = tmp_path / "out"
    argv = ["--smoke", "--out", str(out), "--work", str(tmp_path / "work"), "--repeat", "1", "--parts", "tokenized"]
    assert bucketing.main(argv) == 0
    assert [p.name for p in out.iterdir()] == ["bucketing_bins_1m_tokenizer.json"]  # no record of the run itself
    record = json.loads((out / "bucketing_bins_1m_tokenizer.json").read_text())
    assert record["params"] == {"num_cuts": bucketing.SMOKE_NUM_CUTS, "manifest": "synthetic seed 0", "buckets": 30,
                                "sub_buckets": 2, "tps_threshold": 4.0, "repeat": 1}
    assert record["figures"]["utterances"] == bucketing.SMOKE_NUM_CUTS and "SMOKE" in record["what"]
    assert bucketing_record.summary_lines(record["figures"])


def test_a_failed_part_and_a_false_check_are_failures(tmp_path):
    args = bench_parser("x", parts=("a", "b")).parse_args(["--out", str(tmp_path)])
    run = Run(name="x", what="x", args=args, checks=lambda f: {"positive": f.get("n", 0) > 0})
    with run.part("a"):
        raise ValueError("broken\nsecond line")
    with run.part("b"):
        run.figures["n"] = 0
    figures = json.loads((tmp_path / "x.json").read_text())["figures"]
    assert figures["checks"] == {"positive": False}
    assert figures["failures"] == ["a: ValueError: broken", "positive"] and run.finish() == 1
    run.figures["n"] = 1
    assert run.all_failures() == ["a: ValueError: broken"]


def test_a_run_without_a_name_writes_nothing(tmp_path):
    run = Run(name="", what="x", args=bench_parser("x").parse_args(["--out", str(tmp_path)]))
    with run.part("a"):
        raise RuntimeError("no")
    assert run.save() is None and run.finish() == 1 and not list(tmp_path.iterdir())


@pytest.mark.parametrize("bench", [bucketing, manifest_reading])
def test_smoke_results_stay_out_of_the_results_folder(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--smoke", "--out", str(RESULTS_DIR)])
    assert "--out must not be" in capsys.readouterr().err


def test_corpus_smoke_writes_both_corpora_and_the_references(tmp_path):
    import shutil

    from benchmarks.corpus import run as corpus_bench
    from workbench.records import corpus as corpus_record

    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    assert corpus_bench.main(["--smoke", "--utterances", "4", "--workers", "1", "--out", str(tmp_path)]) == 0
    f = json.loads((tmp_path / "corpus.json").read_text())["figures"]
    assert f["failures"] == [] and set(f["corpora"]) == {"plain", "realistic"}
    assert all(c["utterances"] == 4 and c["tokens_per_s"]["p10"] > 0 for c in f["corpora"].values())
    assert f["corpora"]["realistic"]["leading_silence_s"]["p10"] >= 0.04 > f["corpora"]["plain"]["leading_silence_s"]["p90"]
    assert all(r["source"] for r in f["references"]) and len(corpus_record.summary_lines(f)) == 3
