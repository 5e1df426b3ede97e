"""The OOMptimizer bench's --parts rnnt-chunked: the smoke run end to end, its ratios and target on given
numbers, the option's errors, and the record's lines in SUMMARY.md (a run stopped at its time limit too)."""

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from workbench.records import summary
from workbench.records import oomptimizer_chunked as chunked, oomptimizer as record
from workbench.units import GiB

REPO = Path(__file__).resolve().parents[2]
BUCKETS = [(10.0, 40.0), (20.0, 80.0), (40.0, 160.0)]


def test_ratios_and_target_met_only_when_every_bucket_is_at_least_2x():
    r = chunked.ratio_figures([100, 50, 10], [250, 100, 21], BUCKETS)
    assert r["ratios"] == [2.5, 2.0, 2.1] and (r["min"], r["median"], r["max"]) == (2.0, 2.1, 2.5)
    assert r["at_least_target"] == [0, 1, 2] and r["target_met"] and r["min_bucket"] == 1
    assert r["target_line"] == ("chunked >= 2x unchunked at every bucket: met "
                                "(smallest ratio 2.00x at bucket 1 (20 s, 80 tokens))")


def test_target_missed_says_by_how_much():
    r = chunked.ratio_figures([100, 50, 10], [150, 100, 30], BUCKETS)
    assert r["ratios"] == [1.5, 2.0, 3.0] and r["at_least_target"] == [1, 2] and not r["target_met"]
    assert r["target_line"] == ("chunked >= 2x unchunked at every bucket: missed (1 of 3 compared buckets below "
                                "2x; smallest ratio 1.50x at bucket 0 (10 s, 40 tokens), 0.50 short (25%))")


def test_buckets_one_search_did_not_reach_are_left_out_and_the_target_is_not_met():
    r = chunked.ratio_figures([None, 50, 10], [None, None, 30], BUCKETS)
    assert r["ratios"] == [None, None, 3.0] and r["compared"] == 1 and r["at_least_target"] == [2]
    assert not r["target_met"]
    assert r["target_line"] == ("chunked >= 2x unchunked at every bucket: missed (only 1 of 3 buckets with "
                                "both sizes; every compared bucket at >= 2x (smallest ratio 3.00x at bucket 2 "
                                "(40 s, 160 tokens)))")
    none = chunked.ratio_figures([None] * 3, [None] * 3, BUCKETS)
    assert not none["target_met"] and none["target_line"].endswith("not measured (no bucket with both sizes)")
    with pytest.raises(ValueError, match="one batch size per bucket: 2 unchunked, 3 chunked, 3 buckets"):
        chunked.ratio_figures([1, 2], [1, 2, 3], BUCKETS)


def test_ratio_figures_over_a_range_of_buckets_judge_only_those():
    r = chunked.ratio_figures([None, 50, 10], [None, 100, 30], BUCKETS, indices=range(1, 3))
    assert r["compared"] == 2 and r["considered"] == 2 and r["target_met"] and r["at_least_target"] == [1, 2]
    assert r["target_line"].startswith("chunked >= 2x unchunked at every bucket of 1-2: met (smallest ratio 2.00x "
                                       "at bucket 1")
    vs = chunked.ratio_figures([20, 50, None], [30, 100, 30], BUCKETS, against="oomptimizer.json's")
    assert vs["target_line"].startswith("chunked >= 2x oomptimizer.json's at every bucket: missed (only 2 of 3 "
                                        "buckets with both sizes; 1 of 2 compared buckets below 2x")


def test_across_runs_sets_the_unchunked_sizes_against_the_committed_record():
    reference = {"git_commit": "0123456789abcdef", "date": "2026-11-30T08:26:23+00:00",
                 "figures": {"rnnt": {"buckets": [list(b) for b in BUCKETS],
                                      "predictive": {"batch_sizes": [80, 40, 10]}}}}
    a = chunked.across_runs([100, None, 15], BUCKETS, reference)
    assert a["ratios"] == [1.25, None, 1.5] and (a["min"], a["median"], a["max"]) == (1.25, 1.375, 1.5)
    assert a["label"].startswith("across runs: this run's unchunked ")
    assert "commit 0123456789ab, 2026-11-30" in a["label"]
    c = chunked.across_runs([160, 120, None], BUCKETS, reference, "chunked")
    assert c["ratios"] == [2.0, 3.0, None] and c["label"].startswith("across runs: this run's chunked batch sizes")
    assert chunked.across_runs([1, 1, 1], BUCKETS, None) == {"skipped": "unchunked: no oomptimizer.json committed"}
    other = {"figures": {"rnnt": {"buckets": [[1.0, 2.0]], "predictive": {"batch_sizes": [5]}}}}
    assert chunked.across_runs([1, 1, 1], BUCKETS, other)["skipped"].startswith("unchunked: buckets differ")
    assert chunked.across_runs([1, 1, 1], BUCKETS, other, "chunked")["skipped"].startswith("chunked: buckets differ")


def test_committed_record_buckets_are_the_bins_the_bench_makes():
    """The runs compare across records only because rnnt_bins() rebuilds the committed record's buckets."""
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    committed = json.loads((REPO / "benchmarks/results/oomptimizer.json").read_text())["figures"]["rnnt"]
    buckets, source = buckets_.rnnt_bins()
    assert buckets == [tuple(b) for b in committed["buckets"]] and source == committed["bins_source"]


def test_returned_peaks_are_the_probes_at_the_returned_sizes():
    search = {"batch_sizes": [4, None, 2],
              "trace": [[0, 8, None, None], [0, 4, 400.0, None], [2, 2, 300.0, 310.0], [2, 3, None, 350.0]]}
    assert chunked.returned_peaks(search) == [400.0, None, 300.0]
    assert record.max_returned_peak_bytes(search) == 400.0
    assert record.max_returned_peak_bytes({"batch_sizes": [None], "trace": []}) is None


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_joint_chunk_size_below_1_is_refused_in_one_line(value, tmp_path, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    with pytest.raises(SystemExit):
        run.main(["--smoke", "--parts", "rnnt-chunked", "--joint-chunk-size", value, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # argparse: the usage, then the one error line
    assert "error: argument --joint-chunk-size: must be" in err and value in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_joint_chunk_size_belongs_to_the_chunked_part(tmp_path, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    with pytest.raises(SystemExit):
        run.main(["--smoke", "--parts", "rnnt", "--joint-chunk-size", "4", "--out", str(tmp_path)])
    assert "--joint-chunk-size belongs to --parts rnnt-chunked" in capsys.readouterr().err


def _smoke(tmp_path, *extra, name=record.CHUNKED_NAME):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    assert run.main(["--smoke", "--parts", "rnnt-chunked", *extra, "--out", str(tmp_path)]) == 0
    path = tmp_path / f"{name}.json"
    rec = json.loads(path.read_text())
    assert rec["name"] == name and rec["figures"]["smoke"] and rec["what"].startswith("SMOKE RUN")
    for key in ("command", "git_commit", "device", "date", "params"):
        assert key in rec
    return rec


def test_smoke_runs_both_searches_on_the_rnnt_part_bins(tmp_path, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    rec = _smoke(tmp_path)
    fig = rec["figures"]
    assert fig["complete"] and fig["joint_chunk_size"] == run.SMOKE_JOINT_CHUNK_SIZE and fig["model"] == "tiny-rnnt"
    assert fig["buckets"] == [list(b) for b in buckets_.rnnt_buckets(argparse.Namespace(smoke=True))[0]]
    whole, chunks = fig["unchunked"], fig["chunked"]
    assert (whole["joint_chunk_size"], chunks["joint_chunk_size"]) == (0, run.SMOKE_JOINT_CHUNK_SIZE)
    for s in (whole, chunks):
        assert s["all_returned_probed"] and all(b >= 1 for b in s["batch_sizes"]) and "stopped" not in s
        assert s["probes"] == len(s["trace"]) and s["probe_seconds"]["n"] == s["probes"]
        assert s["probe"] == "ModeledMemoryProbe" and s["budget_bytes"] > 0
    # each search keeps its own probe's budget: the chunked model has the same weights, so the same budget here
    assert whole["budget_bytes"] == chunks["budget_bytes"]
    assert not {"probe", "budget_bytes", "comparison"} & set(fig)  # nothing overwritten or derived at the top
    assert not {"max_peak_bytes", "returned_peak_bytes"} & set(whole)
    # a chunk of 2 runs in every probe that fitted: the smallest returned batch size is above it
    assert min(chunks["batch_sizes"]) > run.SMOKE_JOINT_CHUNK_SIZE
    comp = record.chunked_comparison(fig)
    assert comp["ratios"] == [c / u for u, c in zip(whole["batch_sizes"], chunks["batch_sizes"])]
    assert comp["compared"] == len(fig["buckets"])
    assert fig["across_runs"]["skipped"].startswith("unchunked: buckets differ")  # smoke buckets are not the record's
    assert fig["failures"] == []
    assert "target: chunked >= 2x unchunked at every bucket" in capsys.readouterr().out


def test_a_run_stopped_at_its_time_limit_keeps_what_finished_and_renders(tmp_path):
    rec = _smoke(tmp_path, "--budget-s", "1e-9")
    fig = rec["figures"]
    n = len(fig["buckets"])
    for s in (fig["unchunked"], fig["chunked"]):  # one bucket each (the largest), then the stop
        assert [b is not None for b in s["batch_sizes"]] == [False] * (n - 1) + [True]
        assert s["stopped"] == f"time limit: 1 of {n} buckets searched"
    comp = record.chunked_comparison(fig)
    assert comp["compared"] == 1 and not comp["target_met"]
    assert f"unchunked predictive: time limit: 1 of {n} buckets searched" in fig["failures"]
    lines = summary.section_for(tmp_path.joinpath(f"{record.CHUNKED_NAME}.json").stem)(fig)
    assert lines == record.chunked_summary_lines(fig)
    assert lines[0].startswith(f"- tiny-rnnt predictive, joint whole: 1 of {n} buckets") and "(stopped: " in lines[0]
    assert f", peak {record.max_returned_peak_bytes(fig['unchunked']) / GiB:.1f} GiB" in lines[0]
    assert any(line.startswith("- target: ") and f"only 1 of {n} buckets" in line for line in lines)
    text = summary.render(tmp_path)
    assert f"## {record.CHUNKED_NAME}.json" in text and lines[1] in text


def test_summary_lines_of_a_search_that_failed():
    fig = {"part": record.CHUNKED_PART, "model": "m", "joint_chunk_size": 16, "buckets": [[1.0, 2.0]],
           "unchunked": {"error": "RuntimeError: no fit\nmore", "joint_chunk_size": 0},
           "across_runs": {"skipped": "x"}, "failures": ["m unchunked predictive search: RuntimeError: no fit"]}
    lines = summary.section_for(record.CHUNKED_NAME)(fig)
    assert lines[:2] == ["- m predictive, joint whole: failed (RuntimeError: no fit)",
                         "- m predictive, joint_chunk_size 16: not run"]
    assert lines[2] == "- target: chunked >= 2x unchunked at every bucket: not measured (no bucket with both sizes)"


def test_the_gpu_script_knows_the_stage():
    out = subprocess.run(["bash", str(REPO / "scripts/gpu_run.sh"), "--help"], capture_output=True, text=True)
    assert " oomptimizer-rnnt-chunked " in out.stdout and " oomptimizer-rnnt-fused " in out.stdout
    assert "--parts rnnt-chunked" in (REPO / "benchmarks/stages.toml").read_text()


def test_smoke_chunked_search_runs_the_chunked_joint_and_the_unchunked_one_never(tmp_path, monkeypatch):
    """On CPU both searches return the same sizes, so the ratios cannot show which ran chunked: count the calls."""
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401
    from workbench.models import model as model_module

    calls, real = [], model_module.chunked_joint_loss
    phase = {"chunk": None}
    real_build = probes.build

    def build(name, joint_chunk_size=0, joint_loss="materialized"):
        phase["chunk"] = joint_chunk_size
        return real_build(name, joint_chunk_size, joint_loss)

    def counted(joint, enc, pred, nll_of, chunk, **kw):
        calls.append((phase["chunk"], chunk))
        return real(joint, enc, pred, nll_of, chunk, **kw)

    monkeypatch.setattr(probes, "build", build)
    monkeypatch.setattr(model_module, "chunked_joint_loss", counted)
    _smoke(tmp_path)
    assert calls and {c for c in calls} == {(run.SMOKE_JOINT_CHUNK_SIZE, run.SMOKE_JOINT_CHUNK_SIZE)}
    assert probes.build("tiny-rnnt", 2).config.joint_chunk_size == 2


def test_smoke_fused_search_runs_the_fused_joint_and_loss_under_its_own_record(tmp_path, monkeypatch, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401
    from workbench.models import model as model_module

    calls, real = [], model_module.fused_joint_loss
    built, real_build = [], probes.build

    def build(name, joint_chunk_size=0, joint_loss="materialized"):
        built.append((joint_chunk_size, joint_loss))
        return real_build(name, joint_chunk_size, joint_loss)

    def counted(*args, **kw):
        calls.append(built[-1])
        return real(*args, **kw)

    monkeypatch.setattr(probes, "build", build)
    monkeypatch.setattr(model_module, "fused_joint_loss", counted)
    rec = _smoke(tmp_path, "--joint-loss", "fused", name=record.FUSED_NAME)
    fig = rec["figures"]
    assert built == [(0, "materialized"), (0, "fused")] and calls and set(calls) == {(0, "fused")}
    assert fig["joint_loss"] == "fused" and fig["joint_chunk_size"] == 0 and "joint and loss fused" in rec["what"]
    assert (fig["unchunked"]["joint_loss"], fig["chunked"]["joint_loss"]) == ("materialized", "fused")
    assert all(b >= 1 for b in fig["chunked"]["batch_sizes"]) and fig["failures"] == []
    assert fig["chunked_across_runs"]["skipped"].startswith("fused: buckets differ")
    assert not (tmp_path / f"{record.CHUNKED_NAME}.json").exists()
    assert summary.section_for(record.FUSED_NAME) is record.chunked_summary_lines
    lines = record.chunked_summary_lines(fig)
    assert lines[1].startswith("- tiny-rnnt predictive, joint and loss fused: ")
    target = next(line for line in lines if line.startswith("- target: "))
    assert target.startswith("- target: fused >= 1.5x unchunked at every bucket from 10 s")
    assert "target: fused >= 1.5x unchunked" in capsys.readouterr().out
    assert record.chunked_records(tmp_path) == []  # the chunked union reads chunked records only


def test_the_fused_target_judges_the_buckets_from_10_s_up():
    fig = {"part": record.CHUNKED_PART, "model": "m", "joint_chunk_size": 0, "joint_loss": "fused",
           "buckets": [[5.0, 20.0], *map(list, BUCKETS)], "unchunked": {"batch_sizes": [400, 100, 50, 10]},
           "chunked": {"batch_sizes": [410, 160, 75, 16]}}
    comp = record.chunked_comparison(fig)
    assert comp["considered"] == comp["compared"] == 3 and comp["at_least_target"] == [1, 2, 3] and comp["target_met"]
    assert comp["target_line"] == ("fused >= 1.5x unchunked at every bucket from 10 s: met (smallest ratio 1.50x "
                                   "at bucket 2 (20 s, 80 tokens))")
    fig["chunked"]["batch_sizes"][3] = 14
    comp = record.chunked_comparison(fig)
    assert not comp["target_met"] and comp["min_bucket"] == 3
    assert comp["name"] == "fused" and comp["target_line"].startswith("fused >= 1.5x unchunked at every bucket "
                                                                     "from 10 s: missed (1 of 3 compared buckets")
    fig["bucket_range"] = [0, 2]  # only buckets 0-1 searched: bucket 1 alone is judged, and the line says so
    comp = record.chunked_comparison(fig)
    assert comp["considered"] == 1 and comp["at_least_target"] == [1]
    assert comp["target_line"].startswith("fused >= 1.5x unchunked at every bucket from 10 s of 0-1: met")


def test_joint_loss_fused_belongs_to_the_chunked_part_without_a_chunk_size(tmp_path, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    with pytest.raises(SystemExit):
        run.main(["--smoke", "--parts", "rnnt", "--joint-loss", "fused", "--out", str(tmp_path)])
    assert "--joint-loss belongs to --parts rnnt-chunked" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--smoke", "--parts", "rnnt-chunked", "--joint-loss", "fused", "--joint-chunk-size", "4",
                  "--out", str(tmp_path)])
    assert "--joint-chunk-size does not apply" in capsys.readouterr().err
    for model in ("tiny-aed", "benchmarks.oomptimizer.probes:build"):  # not a reference transducer: refused first
        with pytest.raises(SystemExit):
            run.main(["--smoke", "--parts", "rnnt-chunked", "--joint-loss", "fused", "--rnnt", model,
                      "--out", str(tmp_path)])
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
            f"--joint-loss fused: applies to the reference transducers (rnnt, tdt) only, not to --rnnt {model}")
    assert not list(tmp_path.iterdir())


def test_too_many_probes_is_a_failure_unless_the_search_stopped_early():
    from benchmarks.oomptimizer.probes import too_many_probes

    assert too_many_probes("rnnt", {"probes_per_bucket": 3.0}) == []
    assert too_many_probes("rnnt", {"probes_per_bucket": 3.5}) == ["rnnt predictive: 3.50 probes per bucket > 3"]
    assert too_many_probes("rnnt", {"probes_per_bucket": 3.5, "stopped": "time limit"}) == []


def test_bucket_range_reads_slice_bounds_and_names_what_is_wrong():
    from benchmarks.oomptimizer.buckets import bucket_range

    assert bucket_range(None, 30) == (0, 30)
    assert bucket_range("0:16", 30) == (0, 16) and bucket_range(":4", 30) == (0, 4)
    assert bucket_range("20:", 30) == (20, 30)
    for bad, words in (("16", "START:STOP"), ("a:3", "integer"), ("3:3", "0 <= START < STOP <= 30"),
                       ("0:31", "<= 30"), ("-1:4", "0 <= START")):
        with pytest.raises(ValueError, match=words):
            bucket_range(bad, 30)


def test_a_bucket_range_searches_only_those_buckets_under_its_own_record_name(tmp_path, capsys):
    from benchmarks.oomptimizer import buckets as buckets_, probes, run  # noqa: F401

    rec = _smoke(tmp_path, "--buckets", "1:3", name=f"{record.CHUNKED_NAME}_1_3")
    fig = rec["figures"]
    assert fig["bucket_range"] == [1, 3] and len(fig["buckets"]) == 4 and "buckets 1-2 (of 4)" in rec["what"]
    for key in ("unchunked", "chunked"):
        sizes = fig[key]["batch_sizes"]
        assert len(sizes) == 4 and sizes[0] is None and sizes[3] is None and sizes[1] >= 1 and sizes[2] >= 1
        assert {i for i, *_ in fig[key]["trace"]} == {1, 2}  # the trace keeps the full list's indices
        assert fig[key]["all_returned_probed"] and "stopped" not in fig[key]
    comp = record.chunked_comparison(fig)
    assert comp["compared"] == comp["considered"] == 2 and not comp["target_met"]
    assert comp["target_line"].startswith("chunked >= 2x unchunked at every bucket of 1-2: missed (2 of 2 compared")
    assert fig["chunked_across_runs"]["skipped"].startswith("chunked: buckets differ")
    lines = record.chunked_summary_lines(fig)
    assert lines[0].startswith("- tiny-rnnt predictive, joint whole: 2 of 2 buckets (1-2 of 4), ")
    assert not (tmp_path / f"{record.CHUNKED_NAME}.json").exists()
    assert summary.section_for(f"{record.CHUNKED_NAME}_1_3") is record.chunked_summary_lines
    assert run.main(["--smoke", "--parts", "rnnt-chunked", "--buckets", "3:9", "--out", str(tmp_path)]) == 2
    assert "--buckets: need 0 <= START < STOP <= 4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--smoke", "--parts", "rnnt", "--buckets", "0:2", "--out", str(tmp_path)])
    assert "--buckets belongs to --parts rnnt-chunked" in capsys.readouterr().err


def _chunked_record(name, date, unchunked, chunked_sizes, reference=None, buckets=BUCKETS):
    fig = {"model": "m", "joint_chunk_size": 16, "buckets": [list(b) for b in buckets],
           "unchunked": {"batch_sizes": unchunked},
           "chunked": {"batch_sizes": chunked_sizes}, "across_runs": {}}
    if reference is not None:
        fig["across_runs"] = {"reference_batch_sizes": reference}
    return {"name": name, "date": date, "git_commit": f"{name}-commit", "figures": fig}


def test_chunked_union_takes_each_bucket_from_one_run_that_searched_it_both_ways(tmp_path):
    newer = _chunked_record(f"{record.CHUNKED_NAME}_0_2", "2026-12-02", [100, 80, None], [110, 200, None], [50, 40, 5])
    older = _chunked_record(record.CHUNKED_NAME, "2026-12-01", [90, 70, 20], [None, 150, 60], [50, 40, 10])
    other = _chunked_record(f"{record.CHUNKED_NAME}_x", "2026-11-01", [1], [2], buckets=BUCKETS[:1])
    for r in (newer, older, other):
        (tmp_path / f"{r['name']}.json").write_text(json.dumps(r))
    found = record.chunked_records(tmp_path)
    assert [r["name"] for r in found] == [newer["name"], older["name"], other["name"]]  # newest first
    union = record.chunked_union(found)
    rows = union["rows"]
    # bucket 0: only the newer run searched it both ways; bucket 1: the newer run wins; bucket 2: the older,
    # with the older run's reference size (10, not the newer record's 5)
    assert [(r["unchunked"], r["chunked"], r["reference"], r["record"]) for r in rows] == [
        (100, 110, 50, newer["name"]), (80, 200, 40, newer["name"]), (20, 60, 10, older["name"])]
    assert [r["chunked_over_unchunked"] for r in rows] == [1.1, 2.5, 3.0]
    assert [r["chunked_over_reference"] for r in rows] == [2.2, 5.0, 6.0]
    assert union["left_out"] == [f"{other['name']} (other buckets)"] and union["comparison"]["compared"] == 3
    assert not union["comparison"]["target_met"] and union["reference"]["target_met"]
    assert "1.10x at bucket 0" in union["comparison"]["target_line"]
    table = record.chunked_styled(union).data
    assert list(table["chunked / whole (x)"]) == [1.1, 2.5, 3.0] and list(table["joint whole"]) == [100, 80, 20]
    assert list(table["max tokens"]) == [40, 80, 160]
    with pytest.raises(ValueError, match="no chunked record"):
        record.chunked_union([])


def test_chunked_union_leaves_out_records_of_another_joint_chunk_size():
    k16 = _chunked_record(record.CHUNKED_NAME, "2026-12-02", [100, 80, 20], [200, 160, 60])
    k8 = _chunked_record(f"{record.CHUNKED_NAME}_0_1", "2026-12-01", [1, None, None], [9, None, None])
    k8["figures"]["joint_chunk_size"] = 8
    union = record.chunked_union([k16, k8])
    assert union["records"] == [record.CHUNKED_NAME] and union["left_out"] == [f"{k8['name']} (other joint_chunk_size)"]
    assert [r["record"] for r in union["rows"]] == [record.CHUNKED_NAME] * 3


def test_chunked_union_of_one_stopped_run_leaves_the_unsearched_buckets_empty():
    stopped = _chunked_record(record.CHUNKED_NAME, "2026-12-01", [None, 70, 20], [None, None, 60])
    union = record.chunked_union([stopped])
    assert [r["record"] for r in union["rows"]] == [None, None, record.CHUNKED_NAME]
    assert union["comparison"]["compared"] == 1 and union["reference"]["compared"] == 0
    assert "only 1 of 3 buckets with both sizes" in union["comparison"]["target_line"]
    assert "not searched" in record.chunked_styled(union).to_html()
