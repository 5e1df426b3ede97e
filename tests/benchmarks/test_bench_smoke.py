"""The GPU benchmark scripts, end to end in --smoke mode on this machine (CPU stand-ins where CUDA is absent).

Each test runs a script's main exactly as the GPU run does, only with --smoke, and checks the JSON it
wrote: the keys the report and notebooks read, the smoke marking, and values that only a real run of
the real code path can produce (finite losses, probed batch sizes, sampler-drawn shapes).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def torch_cpu_settings_kept(two_threads):
    """The smoke mains turn oneDNN off and use one thread on a CPU (results.cpu_smoke_torch); they must put
    both back, or every test after them runs under their settings."""
    before = torch.backends.mkldnn.enabled, torch.get_num_threads()
    yield
    after = torch.backends.mkldnn.enabled, torch.get_num_threads()
    torch.backends.mkldnn.enabled, _ = before  # put back even when the check below fails
    torch.set_num_threads(before[1])
    assert after == before


def test_cpu_smoke_torch_sets_and_restores(two_threads):
    from benchmarks.harness import cpu_smoke_torch

    before = torch.backends.mkldnn.enabled, torch.get_num_threads()
    with pytest.raises(KeyError):
        with cpu_smoke_torch():
            assert not torch.backends.mkldnn.enabled and torch.get_num_threads() == 1
            raise KeyError("restored even when the run fails")
    assert (torch.backends.mkldnn.enabled, torch.get_num_threads()) == before
    with cpu_smoke_torch(active=False):
        assert (torch.backends.mkldnn.enabled, torch.get_num_threads()) == before


def read_result(path: Path) -> dict:
    assert path.exists(), f"{path} was not written"
    record = json.loads(path.read_text())
    for key in ("name", "what", "command", "git_commit", "device", "date", "params", "figures"):
        assert key in record, f"{path.name}: no {key!r}"
    assert record["figures"]["smoke"] is True and record["params"]["smoke"] is True
    if not torch.cuda.is_available():
        assert record["what"].startswith("SMOKE RUN"), record["what"]
    return record


def test_models_bench_smoke(tmp_path, capsys, torch_cpu_settings_kept):
    from benchmarks.models import run as models

    assert models.main(["--smoke", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "models.json")
    fig = record["figures"]
    assert fig["failures"] == []
    assert set(fig["parameters"]) == {"tiny-rnnt", "tiny-aed"} and all(v > 0 for v in fig["parameters"].values())
    steps = fig["steps"]
    assert len(steps) == 2 * len(models.SMOKE_SHAPES) * 2  # models x shapes x dtypes
    for row in steps:
        assert {"model", "batch_size", "duration_s", "num_tokens", "dtype", "step_s", "loss", "peak_bytes",
                "audio_s_per_s"} <= set(row)
        assert math.isfinite(row["loss"]) and row["loss"] > 0 and row["step_s"]["median"] > 0
        assert (row["peak_bytes"] is None) == (not torch.cuda.is_available())
    assert len(fig["bf16_vs_fp32"]) == 2 * len(models.SMOKE_SHAPES)
    loss = fig["rnnt_loss_vs_torchaudio"]
    assert len(loss["losses_ours"]) == models.SMOKE_LOSS_SHAPE[0] and all(map(math.isfinite, loss["losses_ours"]))
    assert "tiny-rnnt" in capsys.readouterr().out  # the table


def test_models_bench_smoke_refuses_the_results_folder(tmp_path):
    from benchmarks.models import run as models
    from workbench.records.results import RESULTS_DIR

    with pytest.raises(SystemExit):
        models.main(["--smoke", "--out", str(RESULTS_DIR)])


def test_oomptimizer_bench_smoke(tmp_path, torch_cpu_settings_kept):
    from benchmarks.oomptimizer import run as oomptimizer

    with pytest.raises(SystemExit):  # smoke JSON never goes to the default folder
        oomptimizer.main(["--smoke"])
    assert oomptimizer.main(["--smoke", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "oomptimizer.json")
    fig = record["figures"]
    rnnt, aed = fig["rnnt"], fig["aed"]
    assert rnnt["model"] == "tiny-rnnt" and aed["model"] == "tiny-aed"
    assert rnnt["bins_source"].startswith("estimate_2d_bins")  # the real bucketing path, not the fixed grid
    assert len(rnnt["buckets"]) == 4 and len(aed["buckets"]) == 2
    for run in (rnnt["predictive"], rnnt["bisect"], rnnt["ddp_accounting"], aed["predictive"], aed["bisect"]):
        assert {"batch_sizes", "probes", "ooms", "probes_per_bucket", "seconds", "all_returned_probed",
                "leftover_bytes", "probe_seconds", "trace"} <= set(run)
        assert run["all_returned_probed"] and all(b >= 1 for b in run["batch_sizes"])
    assert len(rnnt["predictive"]["batch_sizes"]) == 4
    assert rnnt["true_max"], "true maxima were not measured"
    for t in rnnt["true_max"].values():
        assert t["true_max"] >= 1 and t["predictive"] <= t["true_max"]
    assert rnnt["soak"]["steps"] == 2 * 4 and rnnt["soak"]["ooms"] == 0
    assert {"probes_bisect_over_predictive", "seconds_bisect_over_predictive"} <= set(rnnt["ratios"])
    assert len(rnnt["comparison"]["bucket_indices"]) >= 2  # a side-by-side needs more than one bucket
    assert "failures" in fig and "wall_seconds" in fig


def test_oomptimizer_bench_parts_write_their_own_files(tmp_path, torch_cpu_settings_kept):
    from benchmarks.oomptimizer import run as oomptimizer

    assert oomptimizer.main(["--smoke", "--parts", "aed", "--out", str(tmp_path)]) == 0
    fig = read_result(tmp_path / "oomptimizer_aed.json")["figures"]
    assert fig["part"] == "aed" and "skipped" in fig["rnnt"] and "predictive" not in fig["rnnt"]
    assert fig["aed"]["predictive"]["all_returned_probed"] and not (tmp_path / "oomptimizer.json").exists()
    assert oomptimizer.main(["--smoke", "--parts", "rnnt", "--budget-s", "1e-9", "--out", str(tmp_path)]) == 0
    fig = read_result(tmp_path / "oomptimizer.json")["figures"]
    assert "predictive" in fig["rnnt"]  # the profile search always runs
    assert fig["rnnt"]["ddp_accounting"] == {"skipped": "time limit"}
    assert "true maxima: not measured (time limit)" in fig["failures"]
    assert any(f.startswith("ddp accounting: not measured (time limit") for f in fig["failures"])  # not silent
    with pytest.raises(SystemExit):
        oomptimizer.main(["--smoke", "--parts", "aed", "--nproc", "2", "--out", str(tmp_path)])


def test_oomptimizer_bench_smoke_ddp_two_processes(tmp_path):
    """--nproc 2 relaunches under torchrun (gloo on a CPU): the path the two-GPU run takes."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.oomptimizer", "--smoke", "--nproc", "2",
                           "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = read_result(tmp_path / "oomptimizer_ddp.json")
    fig = record["figures"]
    assert fig["world_size"] == 2 and fig["model"] == "tiny-rnnt"
    assert fig["predictive"]["all_returned_probed"] and len(fig["predictive"]["batch_sizes"]) == len(fig["buckets"])


def test_allocator_bench_smoke(tmp_path, capsys):
    from benchmarks.allocator import run as allocator

    assert allocator.main(["--smoke", "--out", str(tmp_path)]) == 0
    record = read_result(tmp_path / "allocator.json")
    fig, params = record["figures"], record["params"]
    assert params["model"] == "workbench.models tiny-rnnt"  # the real model, not the stand-in
    assert params["shape_source"].startswith("lhotse DynamicBucketingSampler")  # the real sampler, no fallback
    assert len(params["shapes"]) == 4 and all(d <= 3.0 for _, d, _ in params["shapes"])
    assert fig["rounds_run"] == 1 and params["passes"] == 1 and set(fig["headrooms"]) == {"0.08"}
    assert params["memory_fractions"] == {"0.08": 0.0}  # no limit in a smoke run
    block = fig["headrooms"]["0.08"]
    order = ["static_plain", "dynamic_expandable", "static_expandable", "dynamic_plain"]
    assert [o["blocks"] for o in params["run_order"]] == ["PEEP"]  # one subprocess, the allocator switched per block
    (blocks,) = params["block_settings"]["0.08"]
    assert [b["allocator"] for b in blocks] == ["plain", "expandable", "expandable", "plain"]
    assert all(f"expandable_segments:{b['allocator'] == 'expandable'}" in b["settings"] for b in blocks)
    for name in order:
        summary = block[name]
        assert {"steps", "median_step_s", "device_allocs_per_step", "ooms", "step_time_s", "total_time_s",
                "settings", "round_median_step_s", "allocation_events"} <= set(summary)
        assert summary["steps"] == 8 and summary["total_time_s"] > 0  # 4 shapes x 1 measured pass x 2 blocks
        assert summary["ooms"] == 0  # a smoke run sets no memory limit
        if not torch.cuda.is_available():
            assert summary["allocation_events"] == []
        for event in summary["allocation_events"]:  # on a GPU: each says what it was and why
            assert {"shape", "previous_shape", "reason", "block", "repeat"} <= set(event), event
            assert event["repeat"] is name.startswith("static"), event
        assert len(params["series"]["0.08"][name]["time_s"]) == 8  # first block: warm-up pass + measured pass
    assert set(block["paired_time_ratios"]) == {"dynamic_expandable/static_plain",
                                                "dynamic_expandable/static_expandable",
                                                "dynamic_plain/static_plain", "static_expandable/static_plain"}
    assert block["paired_time_ratios"]["dynamic_plain/static_plain"]["n"] == 1
    assert block["time_target"]["conclusive"] is False  # one round is never conclusive
    assert {"targets_met", "targets_enforced", "failures", "warnings"} <= set(fig)
    assert fig["targets_enforced"] is (not fig["smoke"])
    out = capsys.readouterr().out
    assert "dynamic_expandable" in out and "paired per round" in out  # the table


def test_oomptimizer_bench_keeps_going_and_writes_the_json_when_a_part_raises(tmp_path, monkeypatch):
    from benchmarks.harness import report_failures
    from benchmarks.oomptimizer import probes, run as oomptimizer

    def broken_build(name):
        raise RuntimeError(f"cannot build {name}")

    monkeypatch.setattr(probes, "build", broken_build)
    assert oomptimizer.main(["--smoke", "--out", str(tmp_path)]) == 0  # smoke: reported, not enforced
    fig = read_result(tmp_path / "oomptimizer.json")["figures"]
    assert fig["complete"] is True
    assert any("cannot build tiny-rnnt" in f for f in fig["failures"])
    assert any("cannot build tiny-aed" in f for f in fig["failures"])
    assert report_failures(fig["failures"]) == 1  # the GPU run would exit non-zero


def test_decoding_bench_smoke(tmp_path, capsys):
    from benchmarks.decoding import run as decoding

    assert decoding.main(["--smoke", "--kernel-profile", "--out", str(tmp_path)]) == 0
    result = read_result(tmp_path / "decoding.json")
    fig = result["figures"]
    rows = [r for r in fig["rows"] if "time_s" in r]
    cuda = torch.cuda.is_available()
    # --kernel-profile: the fp32 rows of the profiled method (CPU: the eager torch stages) at B in {1, 3}
    profiled_method = decoding.profiled_method(decoding.bench_device()).label
    profiled = [r for r in rows if "kernel_profile" in r]
    assert sorted((r["model"], r["batch"]) for r in profiled) == [("rnnt", 1), ("rnnt", 3), ("tdt", 1), ("tdt", 3)]
    assert result["params"]["kernel_profile"]["batches"] == [1, 3]
    for r in profiled:
        p = r["kernel_profile"]
        assert r["dtype"] == "float32" and r["method"] == p["method"] == profiled_method
        assert p["equal_to_reference"] is True and p["outer_iterations"] == r["outer_iterations"]
        if p["kernels"] or not cuda:  # on CUDA an empty profile is recorded as such
            assert sum(k["share"] for k in p["kernels"]) == pytest.approx(1.0)
        else:
            assert "empty" in p
    reference = decoding.default_method(torch.device("cuda" if cuda else "cpu"), "full" if cuda else "off")
    # 2 dtypes x 2 batch sizes x (RNN-T: frame-looping + label-looping off; TDT: label-looping off); on a
    # GPU the partial/full rows (and window 1 in fp32) come on top.
    assert len(rows) >= 12
    for r in rows:
        assert r["time_s"]["median"] > 0 and r["audio_s_per_s"] > 0
        assert f"{r['model']} {r['dtype']} B={r['batch']} T={r['frames']}" in fig["calibration"]
        if r["dtype"] == "float32" or r["method"].startswith("label"):
            assert r["equal_to_reference"], r  # fp32: every method gives the same tokens
            assert r["reference_method"] == reference  # what the default decoder runs
        else:
            assert 0.0 <= r["token_disagreement"] <= 1.0
    assert fig["targets"]["rnnt_full_s"] is None  # no full-graph row without CUDA: the target is not faked
    assert not [f for f in fig["failures"] if "raised" in f or "differ" in f], fig["failures"]
    assert "frame-looping off" in capsys.readouterr().out


def test_token_disagreement_is_an_edit_distance():
    from benchmarks.decoding.checks import token_disagreement

    assert token_disagreement([[1, 2, 3]], [[1, 2, 3]]) == 0
    assert token_disagreement([[1, 3]], [[1, 2, 3]]) == pytest.approx(1 / 3)       # one deletion
    assert token_disagreement([[1, 2, 4, 3], [5]], [[1, 2, 3], [6]]) == pytest.approx(2 / 5)  # over the longer
    assert token_disagreement([[1, 2, 3]], [[]]) == 1.0 and token_disagreement([[]], [[]]) == 0.0
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        token_disagreement([[1], [2]], [[1]])


def test_committed_summary_matches_the_committed_results():
    from workbench.records.summary import render

    committed = (REPO / "benchmarks" / "SUMMARY.md").read_text()
    assert committed == render(), "benchmarks/SUMMARY.md is stale: run `make summary`"


def test_summary_renders_every_kind_of_result():
    from workbench.records import summary
    from workbench.records.results import RESULTS_DIR

    names = {p.stem for p in RESULTS_DIR.glob("*.json")}
    assert all(summary.section_for(n) for n in names), [n for n in names if not summary.section_for(n)]
    assert summary.section_for("allocator_headroom15") is summary.SECTIONS["allocator"]
    assert summary.section_for("nothing_known") is None
    page = summary.render()
    assert "(no summary for this file)" not in page
    for name in names:  # a heading and at least one figure line under it
        section = page.split(f"## {name}.json\n", 1)[1].split("\n## ", 1)[0]
        assert "\n- " in section, name


def test_summary_out_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from workbench.records import summary

    out = tmp_path / "SUMMARY.md"
    assert summary.main(["--out", str(out)]) == 0 and out.read_text() == summary.render()
    monkeypatch.setattr(summary, "render", lambda: (_ for _ in ()).throw(KeyError("broken record")))
    with pytest.raises(KeyError):
        summary.main(["--out", str(out)])
    assert out.read_text().startswith("# Benchmark summary")  # the old page stays


def test_bucketing_bench_bins_equal_the_plain_loop_on_a_small_corpus(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bucketing", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), "--num-cuts", "3000", "--repeat", "1", "--parts",
                           "bins"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fig = json.loads((tmp_path / "out" / "bucketing_bins_1m.json").read_text())["figures"]
    assert fig["bins_equal"] is True and fig["num_bins"] > 0 and fig["utterances"] == 3000
    assert fig["lhotse_total_s"] > 0 and fig["workbench_bins_end_to_end_s"]["median"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
@pytest.mark.parametrize("bench", ["models", "decoding", "oomptimizer", "allocator"])
def test_gpu_benches_refuse_to_run_without_cuda_or_smoke(bench, tmp_path, capsys):
    import importlib

    module = importlib.import_module(f"benchmarks.{bench}.run")
    try:
        code = module.main(["--out", str(tmp_path)])
    except SystemExit as stop:  # the harness's start() exits
        code = stop.code
    assert code == 2
    assert "needs a CUDA GPU (or --smoke)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_smoke_results_never_go_to_the_results_folder():
    import argparse

    from benchmarks.harness import check_smoke_out
    from workbench.records.results import RESULTS_DIR

    parser = argparse.ArgumentParser()
    for out in (None, str(RESULTS_DIR)):
        with pytest.raises(SystemExit):
            check_smoke_out(parser, out)
    check_smoke_out(parser, str(RESULTS_DIR / "elsewhere"))  # any other folder is fine
