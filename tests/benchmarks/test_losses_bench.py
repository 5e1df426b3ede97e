"""The losses bench end to end in --smoke mode (CPU stand-ins without CUDA), and its record's readings."""

import json
import math

import pytest
import torch

from workbench.records import losses as losses_record


def test_losses_bench_smoke(tmp_path, capsys, two_threads):
    from benchmarks.losses import run

    before = torch.backends.mkldnn.enabled, torch.get_num_threads()
    assert run.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert (torch.backends.mkldnn.enabled, torch.get_num_threads()) == before
    result = json.loads((tmp_path / "losses.json").read_text())
    for key in ("name", "what", "command", "git_commit", "device", "date", "params", "figures"):
        assert key in result
    fig = result["figures"]
    assert fig["smoke"] is True and result["params"]["smoke"] is True and fig["failures"] == []
    ours = [r for r in fig["runs"] if r["impl"].startswith("ours")]
    # per compare shape: rnnt fp32, rnnt bf16, tdt; then the large shape
    assert len(ours) == 3 * len(run.SMOKE_COMPARE_SHAPES) + 1
    assert all([w["kernel"] for w in r["kernel_work"]] == ["normalize", "lattice", "grad"] for r in ours)
    for r in ours:
        assert r["error"] is None and math.isfinite(r["loss_sum"]) and r["loss_sum"] > 0 and r["time_s"]["median"] > 0
        assert r["backend"].startswith("triton" if torch.cuda.is_available() else "torch: logits on cpu")
    theirs = [r for r in fig["runs"] if r["impl"] == "torchaudio-rnnt"]
    assert len(theirs) == len(run.SMOKE_COMPARE_SHAPES) + 1 and theirs[-1]["in_subprocess"] is True
    assert theirs[-1]["shape"] == run.SMOKE_LARGE_SHAPE
    steps = fig["chunked"]
    assert [(s["joint_loss"], s["joint_chunk_size"]) for s in steps] == [tuple(x) for x in run.SMOKE_STEP_SETTINGS]
    assert all(s["error"] is None for s in steps)
    for s in steps:  # one more step profiled: its activities ranked, shares of their summed time
        assert s["kernels"]["top"] and s["kernels"]["total_s"] > 0
        assert 0 < s["host_s"]["median"] and s["host_s"]["n"] == 2  # on a CPU the launch is the step
        assert 0 < sum(k["share"] for k in s["kernels"]["top"]) <= 1 + 1e-9
    for step in steps[1:]:  # neither chunks nor the fused joint and loss change the loss
        assert step["loss"] == pytest.approx(steps[0]["loss"], rel=1e-5)
    assert len(fig["ratios"]["chunked_over_whole"]) == 1 and len(fig["ratios"]["tdt_over_rnnt"]) == 2
    assert len(fig["ratios"]["fused_over_whole"]) == 1
    joint = fig["joint"]  # the joint + loss alone: materialized, fused, torchaudio (absent here: its error)
    assert [r["impl"] for r in joint] == ["materialized", "fused", "torchaudio"]
    for r in joint[:2]:
        assert r["error"] is None and math.isfinite(r["loss"]) and r["loss"] > 0 and r["time_s"]["median"] > 0
    assert joint[1]["loss"] == pytest.approx(joint[0]["loss"], rel=1e-5) and joint[1]["max_rel_grad_diff"] < 1e-4
    from workbench.models import build_model

    hidden = build_model(run.SMOKE_JOINT_SHAPES[0][0]).joint.out.in_features
    gemms = {"materialized": 3, "fused": 4, "torchaudio": 3}  # the fused path makes the logits again
    for r in joint:  # the output layer's GEMMs over every node; one rate per shape
        assert r["gemm_flops"] == pytest.approx(gemms[r["impl"]] * 2.0 * r["logit_elements"] * hidden)
        same_shape = [x for x in joint if (x["batch_size"], x["duration_s"]) == (r["batch_size"], r["duration_s"])]
        assert {x["gemm_flops_per_s"] for x in same_shape} == {r["gemm_flops_per_s"]} and r["gemm_flops_per_s"] > 0
    out = capsys.readouterr().out
    assert "ours rnnt" in out and "joint_chunk_size=2" in out and "joint_loss=fused" in out


def test_losses_bench_smoke_refuses_the_results_folder():
    from benchmarks.losses import run
    from workbench.records.results import RESULTS_DIR

    with pytest.raises(SystemExit):
        run.main(["--smoke", "--out", str(RESULTS_DIR)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_losses_bench_refuses_to_run_without_cuda_or_smoke(tmp_path, capsys):
    from benchmarks.losses import run

    with pytest.raises(SystemExit) as stop:
        run.main(["--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "needs a CUDA GPU (or --smoke)" in capsys.readouterr().err and not list(tmp_path.iterdir())


def _run(impl, shape, dtype="float32", ms=None, peak=None, error=None):
    b, t, u, v = shape
    time_s = None if ms is None else {"median": ms / 1e3, "min": ms / 1e3, "max": ms / 1e3, "n": 1}
    return losses_record.LossRun(impl=impl, shape=shape, dtype=dtype, backend="x", logit_elements=b * t * (u + 1) * (v + 1),
                                 time_s=time_s, peak_above_inputs_bytes=peak, error=error)


def test_ratios_and_targets_read_from_the_record():
    small, large = [16, 188, 120, 1024], [128, 188, 120, 1024]
    rec = losses_record.LossesRecord(smoke=False, runs=[
        _run("ours-rnnt", small, ms=8.0, peak=2 * 2**30), _run("torchaudio-rnnt", small, ms=10.0, peak=3 * 2**30),
        _run("ours-tdt", small, ms=12.0), _run("ours-rnnt", large, ms=80.0, peak=2**33),
        _run("torchaudio-rnnt", large, error="RuntimeError: CUDA error: an illegal memory access")])
    rec.chunked = [losses_record.ChunkedStep("large-rnnt", 64, 15.0, 120, "bfloat16", 0,
                                             step_s={"median": 0.3}, peak_bytes=40 * 2**30),
                   losses_record.ChunkedStep("large-rnnt", 64, 15.0, 120, "bfloat16", 8,
                                             step_s={"median": 0.33}, peak_bytes=20 * 2**30,
                                             kernels={"total_s": 0.165, "top": []}, host_s={"median": 0.32})]
    fig = rec.to_figures()
    r = fig["ratios"]
    small_ratio = next(x for x in r["ours_over_torchaudio"] if x["shape"] == small)
    assert small_ratio == {"shape": small, "time": pytest.approx(0.8), "memory": pytest.approx(2 / 3)}
    assert next(x for x in r["ours_over_torchaudio"] if x["shape"] == large)["time"] is None  # torchaudio failed
    assert r["tdt_over_rnnt"] == [{"shape": small, "time": pytest.approx(1.5)}]
    assert r["chunked_over_whole"][0]["peak_memory"] == pytest.approx(0.5)
    assert r["chunked_over_whole"][0]["time"] == pytest.approx(1.1)
    assert fig["targets"] == {"rnnt_time_at_most_torchaudio": True, "rnnt_memory_at_most_torchaudio": True,
                              "tdt_within_1.3x_rnnt": False, "ours_past_2_31_elements": True,
                              "torchaudio_past_2_31_elements": False, "fused_joint_memory_at_most_tenth": None,
                              "fused_joint_time_at_most_half": None}
    lines = losses_record.summary_lines(fig)
    assert any("torchaudio-rnnt float32 B=128" in line and "illegal memory access" in line for line in lines)
    assert "joint_chunk_size=8: 330.0 ms, peak 20.00 GiB; GPU kernels 165.0 ms (50%); host 320.0 ms to launch" \
        in "\n".join(lines)
    assert "joint_chunk_size=0: 300.0 ms, peak 40.00 GiB\n" in "\n".join(lines) + "\n"  # no profile, no share
    text = losses_record.table(fig)
    assert "16,188,120,1024" in text and "8.00 ms" in text and "0.67" in text and "kernels:" not in text
    fig["runs"][2]["kernels"] = {"total_s": 0.004, "top": [
        {"name": "_grad_kernel", "self_s": 0.003, "share": 0.75, "calls": 1},
        {"name": "_lattice_kernel", "self_s": 0.001, "share": 0.25, "calls": 1}]}
    assert ("ours-tdt float32 16,188,120,1024 kernels: _grad_kernel 3.000 ms (75%), _lattice_kernel 1.000 ms (25%)"
            in losses_record.table(fig).splitlines())


def _joint(impl, ms, gib, error=None, batch_size=64):
    return losses_record.JointLossRun(impl=impl, model="large-rnnt", batch_size=batch_size, duration_s=15.0,
                                      num_tokens=120, frames=188, outputs=1025, logit_elements=1_490_000_000,
                                      dtype="bfloat16", time_s=None if ms is None else {"median": ms / 1e3, "min": ms / 1e3,
                                                                                         "max": ms / 1e3, "n": 1},
                                      peak_above_inputs_bytes=None if gib is None else int(gib * 2**30), error=error)


def test_joint_loss_ratios_and_targets_read_from_the_record():
    rec = losses_record.LossesRecord(smoke=False)
    rec.joint = [_joint("materialized", 40.0, 10.0), _joint("fused", 36.0, 0.8), _joint("torchaudio", 120.0, 24.0),
                 _joint("materialized", 50.0, 12.0, batch_size=8), _joint("fused", None, None, "OutOfMemoryError: x",
                                                                          batch_size=8)]
    rec.joint[1].max_rel_loss_diff, rec.joint[1].max_rel_grad_diff = 2e-6, 3e-3
    fig = rec.to_figures()
    ratios = fig["ratios"]["joint_over_materialized"]
    assert [(x["impl"], x["batch_size"]) for x in ratios] == [("fused", 64), ("torchaudio", 64)]  # the failed run: none
    assert ratios[0]["time"] == pytest.approx(0.9) and ratios[0]["memory"] == pytest.approx(0.08)
    assert ratios[1]["time"] == pytest.approx(3.0) and ratios[1]["memory"] == pytest.approx(2.4)
    assert fig["targets"]["fused_joint_memory_at_most_tenth"] is True
    assert fig["targets"]["fused_joint_time_at_most_half"] is False
    text = "\n".join(losses_record.summary_lines(fig))
    assert ("joint + loss fused large-rnnt bfloat16 B=64 15 s U=120 (1.49e+09 logits): 36.00 ms (36.00-36.00), "
            "0.80 GiB above inputs; time 0.90x, memory 0.08x the materialized path's; loss differs by 2.0e-06 "
            "(relative), gradients by 3.0e-03 of their largest") in text
    assert "joint + loss fused large-rnnt bfloat16 B=8 15 s U=120 (1.49e+09 logits): OutOfMemoryError: x" in text
    assert "TFLOP of output-layer GEMMs" not in text  # a record without the GEMMs' figures
    for run in rec.joint:
        run.gemm_flops, run.gemm_flops_per_s = (4 if run.impl == "fused" else 3) * 1.9e12, 500e12
    rec.joint[1].kernels = {"total_s": 0.03, "top": [{"name": "_logits_grad_kernel", "self_s": 0.005, "share": 0.17,
                                                      "calls": 32}]}
    fig = rec.to_figures()
    fused = fig["ratios"]["joint_over_materialized"][0]
    assert fused["gemm_floor"] == pytest.approx(4 * 1.9 / 500 / 0.040)  # 15.2 ms of the materialized 40 ms
    text = "\n".join(losses_record.summary_lines(fig))
    assert ("the materialized path's; loss differs by 2.0e-06 (relative), gradients by 3.0e-03 of their largest; "
            "its 7.60 TFLOP of output-layer GEMMs take at least 15.20 ms at 500 TFLOP/s (0.38x the materialized "
            "path's time)") in text
    assert "5.70 TFLOP of output-layer GEMMs take at least 11.40 ms at 500 TFLOP/s\n" in text + "\n"  # materialized
    for run in rec.joint:  # a rate whose GEMMs would take longer than the runs took: no floor, and it says so
        run.gemm_flops_per_s = 100e12
    fig = rec.to_figures()
    assert fig["ratios"]["joint_over_materialized"][0]["gemm_floor"] is None  # 76 ms against the fused 36 ms
    text = "\n".join(losses_record.summary_lines(fig))
    assert text.count("take at least") == 1  # torchaudio's 120 ms: 57 ms of GEMMs is a floor there
    assert ("gradients by 3.0e-03 of their largest; its 7.60 TFLOP of output-layer GEMMs ran faster than the "
            "100 TFLOP/s measured beside it, so that rate gives no floor") in text
    assert ("fused bfloat16 joint + loss large-rnnt B=64 15 s U=120 kernels: _logits_grad_kernel 5.000 ms (17%)"
            in losses_record.table(fig).splitlines())
    assert "joint + loss torchaudio" in losses_record.table(fig)


def test_kernel_work_counts_the_bytes_and_steps_of_a_tiny_lattice():
    """B=1, T=2, U=1, V=3: 4 nodes of 4 (RNN-T) or 7 (TDT, durations 0-2) classes; 3 diagonals of 2 nodes."""
    from benchmarks.losses.cost import kernel_work

    normalize, lattice, grad = kernel_work([1, 2, 1, 3])
    assert (normalize.programs, normalize.read_bytes, normalize.written_bytes) == (4, 4 * 4 * 4, 4 * 4 + 4 * 2 * 4)
    assert (lattice.programs, lattice.sequential_steps, lattice.edges_per_node) == (2, 3, 2)
    assert lattice.read_bytes == 2 * (2 * 4 * 2 * 2 * 3) and lattice.written_bytes == 2 * 3 * 2 * 4
    assert lattice.sectors_per_step == 4 and lattice.exps_per_node == 2
    assert grad.written_bytes == 64 and grad.read_bytes == 64 + 16 + 4 * 4 * (1 + 2)
    normalize, lattice, grad = kernel_work([1, 2, 1, 3], 3, logit_bytes=2, durations=(0, 1, 2))
    assert normalize.read_bytes == grad.written_bytes == 4 * 7 * 2
    assert normalize.written_bytes == 4 * (4 + 3 * 4) + 4 * 2 * 3 * 4
    assert lattice.edges_per_node == 5 and lattice.sectors_per_step == 10  # 2 blank (d > 0) + 3 label edges
    assert kernel_work([1, 2, 1, 3], 3)[1].edges_per_node == 6  # all durations > 0 when not given


def test_rows_comparison_alternates_one_row_and_the_default_tile(monkeypatch):
    """compare_rows times one call at a time, one node per program and the default tile in turn (who goes
    first alternates), and reads the ratio of the medians."""
    from benchmarks.losses import worker
    from workbench.models import losses_triton

    active = []

    def timer(fn, *, repeat, warmup):
        assert (repeat, warmup) == (1, 0)
        fn()
        active.append(losses_triton._rows_setting)
        seconds = 0.004 if losses_triton._rows_setting == 1 else 0.001 * (1 + len(active) % 2)
        return {"median": seconds}

    monkeypatch.setattr(worker, "timer_for", lambda device: timer)
    c = worker.compare_rows([2, 3, 2, 5], torch.device("cpu"), repeat=3, warmup=1, sweep=())
    assert c.error is None and c.default_rows == losses_triton.node_rows(6) > 1
    assert active == [1, None, None, 1, 1, None, None, 1]  # the warm-up round, then 3 timed rounds
    assert c.one_row_s["n"] == c.default_rows_s["n"] == 3 and c.one_row_s["median"] == pytest.approx(0.004)
    assert c.default_over_one_row == pytest.approx(c.default_rows_s["median"] / 0.004)
    assert c.by_rows_s == {"1": c.one_row_s, str(c.default_rows): c.default_rows_s}
    assert c.backend.startswith("triton" if torch.cuda.is_available() else "torch: logits on cpu")
    active.clear()
    other = next(rows for rows in (2, 4, 8) if rows != c.default_rows)
    c = worker.compare_rows([2, 3, 2, 5], torch.device("cpu"), repeat=1, warmup=0, sweep=(1, other, c.default_rows))
    assert active == [1, other, None]
    assert sorted(c.by_rows_s, key=int) == sorted(["1", str(other), str(c.default_rows)], key=int)


def test_rows_comparisons_in_the_smoke_run_and_the_summary(tmp_path):
    from benchmarks.losses import run

    assert run.main(["--smoke", "--parts", "rows", "--out", str(tmp_path)]) == 0
    fig = json.loads((tmp_path / "losses.json").read_text())["figures"]
    assert [(c["shape"], c["dtype"]) for c in fig["rows"]] == [
        (shape, str(dtype).removeprefix("torch.")) for shape, dtype in run.SMOKE_ROWS_SHAPES]
    for c in fig["rows"]:
        assert c["error"] is None and c["one_row_s"]["n"] == c["default_rows_s"]["n"] == 2
        assert c["default_over_one_row"] == pytest.approx(c["default_rows_s"]["median"] / c["one_row_s"]["median"])
    assert all(sorted(c["by_rows_s"], key=int) == sorted({"1", "2", "4", "8", str(c["default_rows"])}, key=int)
               for c in fig["rows"])
    one, four = {"median": 0.02, "min": 0.019, "max": 0.021}, {"median": 0.005, "min": 0.005, "max": 0.006}
    comparison = {**fig["rows"][0], "one_row_s": one, "default_rows_s": four, "default_rows": 4,
                  "by_rows_s": {"1": one, "2": {"median": 0.01, "min": 0.01, "max": 0.01}, "4": four},
                  "default_over_one_row": 0.25, "backend": "triton: CUDA logits and triton importable"}
    line = ("ours-rnnt rows per program float32 B=2 T=6 U=3 V=8: 1 row 20.00 ms (19.00-21.00), 4 rows (default) "
            "5.00 ms (5.00-6.00), 4 rows / 1 row 0.25; other rows 2: 10.00 ms (10.00-10.00) "
            "(triton: CUDA logits and triton importable)")
    fig["rows"] = [comparison, {**comparison, "error": "OutOfMemoryError: CUDA out of memory"}]
    assert f"- {line}" in losses_record.summary_lines(fig) and line in losses_record.table(fig).splitlines()
    assert ("- ours-rnnt rows per program float32 B=2 T=6 U=3 V=8: failed (OutOfMemoryError: CUDA out of memory)"
            in losses_record.summary_lines(fig))
    del fig["rows"]  # a record from before the comparison still renders
    assert not any("rows per program" in line for line in losses_record.summary_lines(fig))


def test_the_output_layer_rate_is_timed_on_aligned_padded_outputs(monkeypatch):
    """1025 outputs give logits rows of 2050 bytes, which Hopper's GEMMs read slowly: the rate that bounds the
    joint's GEMMs is timed on the training layout's padded width, and counts that width's FLOPs."""
    from benchmarks.losses import joint as joint_bench
    from workbench import timing
    from workbench.models.transducer import padded_width

    shapes = []

    def fake_timer(device):
        def time(fn):
            shapes.append(tuple(fn().shape))
            return {"median": 0.5}
        return time

    monkeypatch.setattr(timing, "timer_for", fake_timer)
    rate = joint_bench.output_layer_gemm_flops_per_s(64, 32, 1025, torch.device("cpu"), torch.float32)
    assert shapes == [(64, padded_width(1025))] and padded_width(1025) % 8 == 0
    assert rate == pytest.approx(2.0 * 64 * 32 * padded_width(1025) / 0.5)
