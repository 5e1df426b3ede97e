"""The models bench's MFU, GPU busy share and profile-sized shapes: the formulas on given numbers, the
shapes read from OOMptimizer records, and how the record (old and new) reads them."""

import json

import pytest

from benchmarks.mfu import busy_share, convolution_backward_flops, step_flops, utilization
from benchmarks.models import rows
from workbench.records import models as record
from workbench.records.results import RESULTS_DIR


@pytest.mark.parametrize("groups", [1, 8])
def test_a_convolutions_gradients_count_twice_its_forward_grouped_or_not(groups):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv1d(8, 8, 5, groups=groups)
    x = torch.randn(2, 8, 100, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        conv(x)
    mapping = {torch.ops.aten.convolution_backward: convolution_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=mapping) as step:
        conv(x).sum().backward()
    assert step.get_total_flops() == 3 * forward.get_total_flops()


def test_step_flops_counts_the_depthwise_convolutions_once_per_gradient():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.models import build_model

    model = build_model("tiny-rnnt", depthwise="torch", time_depthwise="torch")
    counted = step_flops(model, 2, 1.0, 4, smoke=True)
    with FlopCounterMode(display=False) as torchs:  # torch's own formula: each depthwise weight gradient C times
        model.training_step(model.make_batch(2, 1.0, 4, "cpu"), dtype=torch.float32)
    model.zero_grad(set_to_none=True)
    assert counted < torchs.get_total_flops()


def test_step_flops_of_the_fused_joint_and_loss_are_the_model_flops():
    """The fused path makes each tile's logits again in its backward: FLOPs it runs but the model does not
    need. MFU counts the model's: the step with the logits built, whatever the model runs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from workbench.models import build_model

    torch.manual_seed(0)
    materialized = build_model("tiny-rnnt", depthwise="torch", time_depthwise="torch")
    fused = build_model("tiny-rnnt", depthwise="torch", time_depthwise="torch", joint_loss="fused")
    counted = step_flops(fused, 2, 1.0, 4, smoke=True)
    assert fused.config.joint_loss == "fused"  # restored after counting
    assert counted == step_flops(materialized, 2, 1.0, 4, smoke=True)
    with FlopCounterMode(display=False) as as_run:
        fused.training_step(fused.make_batch(2, 1.0, 4, "cpu"), dtype=torch.float32)
    with FlopCounterMode(display=False) as as_built:
        materialized.training_step(materialized.make_batch(2, 1.0, 4, "cpu"), dtype=torch.float32)
    assert as_run.get_total_flops() > as_built.get_total_flops()  # the recomputed logits


def test_models_bench_refuses_the_fused_joint_loss_for_a_model_that_is_not_a_transducer(tmp_path, capsys):
    from benchmarks.models import run as models

    with pytest.raises(SystemExit) as e:
        models.main(["--smoke", "--models", "tiny-rnnt", "tiny-aed", "--joint-loss", "fused",
                     "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --joint-loss fused: applies to the reference transducers (rnnt, tdt) only, not to --models tiny-aed")
    assert not (tmp_path / "o").exists()


def test_models_bench_builds_the_transducers_with_the_joint_loss_asked_for(tmp_path, monkeypatch, cpu_settings_kept):
    import json

    from benchmarks.models import rows, run as models

    built, real = [], rows.build_model

    def build_model(name, **kw):
        built.append((name, kw.get("joint_loss")))
        return real(name, **kw)

    monkeypatch.setattr(rows, "build_model", build_model)
    monkeypatch.setattr(models, "SMOKE_SHAPES", models.SMOKE_SHAPES[:1])
    assert models.main(["--smoke", "--models", "tiny-rnnt", "--joint-loss", "fused", "--out", str(tmp_path)]) == 0
    assert built == [("tiny-rnnt", "fused")]
    result = json.loads((tmp_path / "models.json").read_text())
    assert result["params"]["joint_loss"] == "fused" and "joint and loss fused" in result["what"]
    assert all(r["flops"] > 0 and r["loss"] > 0 for r in result["figures"]["steps"])


def test_utilization_and_busy_share_from_given_numbers():
    assert utilization(2e12, 0.5, 8e12) == 0.5  # 4 TFLOP/s of an 8 TFLOP/s matmul rate
    assert utilization(3e9, 0.01, 1e12) == pytest.approx(0.3)
    assert busy_share(0.03, 0.12) == 0.25
    assert busy_share(0.0, 0.1) == 0.0
    with pytest.raises(ValueError, match="step_seconds"):
        utilization(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="flops_per_s"):
        utilization(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="step_seconds"):
        busy_share(1.0, -1.0)


def test_add_utilization_fills_the_row_and_leaves_none_where_unmeasured():
    from benchmarks.models.rows import add_utilization

    row = {"step_s": {"median": 0.2}}
    add_utilization(row, 1.6e13, 4e14, 0.05)
    assert row == {"step_s": {"median": 0.2}, "flops": 1.6e13, "mfu": pytest.approx(0.2), "kernel_s": 0.05,
                   "gpu_busy": 0.25}
    cpu_row = {"step_s": {"median": 0.2}}
    add_utilization(cpu_row, None, 4e14, None)
    assert cpu_row["mfu"] is None and cpu_row["gpu_busy"] is None and cpu_row["flops"] is None


def _oomptimizer_record(path, parts):
    path.write_text(json.dumps({"name": "oomptimizer", "figures": {"smoke": False, **parts}}))
    return path


RNNT_PART = {"model": "tiny-rnnt", "buckets": [[1.0, 4.0], [1.0, 9.0], [2.0, 6.0]],
             "predictive": {"batch_sizes": [3, 2, 1]}}


def test_read_profile_shapes_takes_the_chosen_buckets_of_the_model(tmp_path):
    from benchmarks.models.shapes import read_profile_shapes

    path = _oomptimizer_record(tmp_path / "oom.json", {
        "rnnt": RNNT_PART, "aed": {"model": "tiny-aed", "buckets": [[1.0, 4.0]], "skipped": "--part rnnt"}})
    assert read_profile_shapes(path, "tiny-rnnt", (0, -1)) == [
        {"batch_size": 3, "duration_s": 1.0, "num_tokens": 4, "bucket_index": 0, "record": "oom.json"},
        {"batch_size": 1, "duration_s": 2.0, "num_tokens": 6, "bucket_index": 2, "record": "oom.json"}]
    assert [s["bucket_index"] for s in read_profile_shapes(path, "tiny-rnnt", (1, -2, 1))] == [1]
    ddp = tmp_path / "ddp.json"  # a DDP record keeps its search at the top of the figures
    ddp.write_text(json.dumps({"figures": {"world_size": 2, **RNNT_PART}}))
    assert read_profile_shapes(ddp, "tiny-rnnt", (1,))[0]["batch_size"] == 2


def test_read_profile_shapes_errors_name_the_file_and_what_is_missing(tmp_path):
    from benchmarks.models.shapes import ModelNotInRecord, ProfileShapeError, read_profile_shapes

    path = _oomptimizer_record(tmp_path / "oom.json", {
        "rnnt": RNNT_PART, "aed": {"model": "tiny-aed", "buckets": [[1.0, 4.0]], "skipped": "--part rnnt"}})
    with pytest.raises(ModelNotInRecord) as e:
        read_profile_shapes(path, "tiny-aed")
    assert str(e.value) == f"--profile-shapes {path}: no OOMptimizer profile of model 'tiny-aed' (it holds: tiny-rnnt)"
    with pytest.raises(ProfileShapeError, match=r"--profile-buckets 3: oom.json has 3 buckets for tiny-rnnt"):
        read_profile_shapes(path, "tiny-rnnt", (3,))
    short = _oomptimizer_record(tmp_path / "short.json", {"rnnt": {**RNNT_PART, "predictive": {"batch_sizes": [3]}}})
    with pytest.raises(ProfileShapeError, match="3 buckets but 1 batch sizes"):
        read_profile_shapes(short, "tiny-rnnt")
    (tmp_path / "bad.json").write_text("{not json")
    for bad in (tmp_path / "bad.json", tmp_path / "absent.json"):
        with pytest.raises(ProfileShapeError, match=f"--profile-shapes {bad}: not a readable OOMptimizer record"):
            read_profile_shapes(bad, "tiny-rnnt")


def test_profile_shapes_for_skips_or_refuses_a_model_in_no_record(tmp_path):
    from benchmarks.models.shapes import ModelNotInRecord, profile_shapes_for

    other = _oomptimizer_record(tmp_path / "aed.json", {"aed": {"model": "tiny-aed", "buckets": [[2.0, 5.0]],
                                                                 "predictive": {"batch_sizes": [7]}}})
    rnnt = _oomptimizer_record(tmp_path / "rnnt.json", {"rnnt": RNNT_PART})
    found, missing = profile_shapes_for(["tiny-rnnt", "tiny-aed", "tiny-ctc"], [other, rnnt], (0,), strict=False)
    assert {m: [s["batch_size"] for s in shapes] for m, shapes in found.items()} == {"tiny-rnnt": [3], "tiny-aed": [7]}
    assert found["tiny-rnnt"][0]["record"] == "rnnt.json"
    assert missing == {"tiny-ctc": "in no OOMptimizer record (aed.json, rnnt.json)"}
    with pytest.raises(ModelNotInRecord, match="'tiny-ctc'"):
        profile_shapes_for(["tiny-rnnt", "tiny-ctc"], [rnnt], (0,), strict=True)
    # given records: a model in the second one is found (the first one lacking it is no refusal)
    strict, _ = profile_shapes_for(["tiny-rnnt"], [other, rnnt], (0,), strict=True)
    assert strict["tiny-rnnt"] == found["tiny-rnnt"]


def test_a_model_in_no_record_takes_its_stand_ins_shapes_marked(tmp_path, monkeypatch):
    from benchmarks.models import shapes as models

    rnnt = _oomptimizer_record(tmp_path / "rnnt.json", {"rnnt": RNNT_PART})
    monkeypatch.setattr(models, "STAND_INS", {"tiny-tdt": "tiny-rnnt", "tiny-ctc": "tiny-aed"})
    found, missing = models.profile_shapes_for(["tiny-rnnt", "tiny-tdt", "tiny-ctc"], [rnnt], (0, -1), strict=False)
    assert found["tiny-tdt"] == [{**shape, "stand_in": "tiny-rnnt"} for shape in found["tiny-rnnt"]]
    assert missing == {"tiny-ctc": "in no OOMptimizer record (rnnt.json)"}  # its stand-in is in no record either
    alone, _ = models.profile_shapes_for(["tiny-tdt"], [rnnt], (0, -1), strict=False)  # stand-in not asked for
    assert alone == {"tiny-tdt": found["tiny-tdt"]}
    shape, _ = models.row_shapes([], found["tiny-tdt"][:1])[0]
    assert shape["profile_bucket"] == {"record": "rnnt.json", "index": 0, "model": "tiny-rnnt"}
    row = {"model": "tiny-tdt", "dtype": "bf16", **shape, "step_s": {"median": 0.5}, "peak_bytes": None, "mfu": 0.2}
    assert record.shape_text(row).endswith("(tiny-rnnt's profile rnnt.json #0)")
    line, = record.mfu_target_lines({"parameters": {"tiny-tdt": 1}, "matmul": {}, "steps": [row]},
                                    targets={"tiny-tdt": 0.25})
    assert line.startswith("tiny-tdt MFU target >= 25 % at profile shapes (at tiny-rnnt's profile shapes: tiny-tdt "
                           "has no OOMptimizer record): 20.0 % (B=")


def test_the_committed_records_give_profile_shapes_for_large_rnnt_and_xl_aed():
    from benchmarks.models.run import MODELS
    from benchmarks.models.shapes import PROFILE_RECORDS, profile_shapes_for

    found, missing = profile_shapes_for(MODELS, PROFILE_RECORDS, strict=False)
    assert sorted(found) == ["large-rnnt", "large-tdt", "xl-aed"] and sorted(missing) == ["large-aed"]
    assert found["large-tdt"] == [{**shape, "stand_in": "large-rnnt"} for shape in found["large-rnnt"]]
    committed = json.loads((RESULTS_DIR / "oomptimizer_aed.json").read_text())["figures"]["aed"]
    assert found["xl-aed"][-1]["batch_size"] == committed["predictive"]["batch_sizes"][-1]
    assert [s["record"] for s in found["large-rnnt"]] == ["oomptimizer.json"] * 2


def test_models_bench_refuses_a_given_record_that_lacks_a_model(tmp_path, capsys):
    from benchmarks.models import run as models

    path = _oomptimizer_record(tmp_path / "oom.json", {"rnnt": RNNT_PART})
    with pytest.raises(SystemExit) as e:
        models.main(["--smoke", "--models", "tiny-aed", "--profile-shapes", str(path), "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"error: --profile-shapes {path}: no OOMptimizer profile of model 'tiny-aed' (it holds: "
                        "tiny-rnnt)")
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_models_bench_smoke_measures_profile_shapes_with_mfu(tmp_path, capsys, cpu_settings_kept):
    import torch

    from benchmarks.models import run as models

    path = _oomptimizer_record(tmp_path / "oom.json", {"rnnt": {**RNNT_PART, "predictive": {"batch_sizes": [2, 1, 1]}}})
    args = ["--smoke", "--models", "tiny-rnnt", "--profile-shapes", str(path), "--profile-buckets", "-1",
            "--out", str(tmp_path)]
    assert models.main(args) == 0
    result = json.loads((tmp_path / "models.json").read_text())
    fig, on_cuda = result["figures"], torch.cuda.is_available()
    profile_rows = [r for r in fig["steps"] if r["shape_source"] == "profile"]
    assert [(r["dtype"], r["batch_size"], r["duration_s"], r["num_tokens"], r["profile_bucket"]) for r in profile_rows] \
        == [("bf16", 1, 2.0, 6, {"record": "oom.json", "index": 2})]
    assert len(fig["steps"]) == 2 * len(models.SMOKE_SHAPES) + 1 and len(fig["bf16_vs_fp32"]) == len(models.SMOKE_SHAPES)
    for r in fig["steps"]:
        assert r["flops"] > 0 and r["mfu"] == pytest.approx(r["flops"] / r["step_s"]["median"]
                                                            / fig["matmul"]["flops_per_s"])
        assert (r["gpu_busy"] is not None) == on_cuda and (r["kernel_s"] is not None) == on_cuda
    same_shape = [r["flops"] for r in fig["steps"] if r["shape_source"] == "fixed" and r["batch_size"] == 2]
    assert len(same_shape) == 2 and same_shape[0] == same_shape[1]  # counted once per shape
    assert (fig["gpu_busy_note"] is None) == on_cuda
    assert result["params"]["warmup_steps"] == models.SMOKE_WARMUP and result["params"]["profile_buckets"] == [-1]
    assert fig["profile_shapes"] == {"shapes": {"tiny-rnnt": [{"batch_size": 1, "duration_s": 2.0, "num_tokens": 6,
                                                              "bucket_index": 2, "record": "oom.json"}]},
                                     "skipped": {}}
    out = capsys.readouterr().out
    assert "profile shapes (OOMptimizer batch sizes):" in out and record.row_line(profile_rows[0]) in out
    assert ("top_kernels" in profile_rows[0]) == on_cuda  # the profiled step's kernels, where MFU is judged
    assert not any("top_kernels" in r for r in fig["steps"] if r["shape_source"] == "fixed")
    summary = record.summary_lines(fig)
    assert any(line.startswith("  - tiny-rnnt bf16 B=1 2 s U=6 (profile oom.json #2): ") and ", MFU " in line
               for line in summary)


@pytest.mark.gpu
def test_gpu_models_bench_smoke_measures_gpu_busy(tmp_path, capsys, cpu_settings_kept):
    test_models_bench_smoke_measures_profile_shapes_with_mfu(tmp_path, capsys, cpu_settings_kept)
    fig = json.loads((tmp_path / "models.json").read_text())["figures"]
    assert fig["matmul"]["dtype"] == "bfloat16"
    for r in fig["steps"]:
        assert 0 < r["kernel_s"] and 0 < r["gpu_busy"] < 2 and 0 < r["mfu"] < 1
    profile_row, = [r for r in fig["steps"] if r["shape_source"] == "profile"]
    top = profile_row["top_kernels"]
    assert 0 < len(top) <= rows.ROW_KERNELS and all(k["self_s"] > 0 and k["calls"] > 0 for k in top)
    assert record.row_kernel_lines(profile_row)[0].endswith(record._short(top[0]["name"]))


def test_row_kernel_lines_show_share_time_calls_and_name():
    row = {"top_kernels": [{"name": "k" * 70, "self_s": 0.012345, "share": 0.312, "calls": 96},
                           {"name": "elementwise", "self_s": 0.001, "share": 0.05, "calls": 3}]}
    assert record.row_kernel_lines(row) == [" 31.2%    12.345 ms    96x  " + "k" * 57 + "...",
                                            "  5.0%     1.000 ms     3x  elementwise"]
    assert record.row_kernel_lines({"model": "m"}) == []


def _row(model, dtype, b, s, u, median, **extra):
    return {"model": model, "dtype": dtype, "batch_size": b, "duration_s": s, "num_tokens": u,
            "step_s": {"median": median, "min": median, "max": median, "n": 5}, "peak_bytes": None,
            "shape_source": "fixed", **extra}


def test_row_line_and_mfu_targets_from_given_rows():
    profile = {"shape_source": "profile", "profile_bucket": {"record": "oomptimizer_aed.json", "index": 7}}
    rows = [_row("xl-aed", "bf16", 66, 40.0, 288, 1.32, mfu=0.312, gpu_busy=0.9, **profile),
            _row("xl-aed", "bf16", 961, 2.68, 20, 1.0, mfu=0.46, gpu_busy=None, **profile),
            _row("large-rnnt", "bf16", 24, 40.0, 499, 0.5, mfu=0.3, **profile),
            _row("large-rnnt", "bf16", 16, 15.0, 120, 0.1, mfu=0.01, shape_source="fixed")]
    assert record.row_line(rows[0]) == ("xl-aed bf16 B=66 40 s U=288 (profile oomptimizer_aed.json #7): 1320.0 ms, "
                                        "peak -, 2000 audio s/s, MFU 31.2 %, GPU busy 90.0 %")
    assert record.row_line({"model": "m", "dtype": "fp32", "batch_size": 2, "duration_s": 1.0, "num_tokens": 3,
                            "oom": True}) == "m fp32 B=2 1 s U=3: OOM"
    figures = {"parameters": {"xl-aed": 1, "large-rnnt": 1, "large-tdt": 1, "large-aed": 1}, "steps": rows,
               "profile_shapes": {"skipped": {"large-tdt": "in no OOMptimizer record (oomptimizer.json)"}}}
    assert record.mfu_target_lines(figures) == [
        "xl-aed MFU target >= 45 % at profile shapes: 31.2 % (B=66 x 40 s), 46.0 % (B=961 x 2.68 s): "
        "missed at 1 of 2 (13.8 points short at worst)",
        "large-rnnt MFU target >= 25 % at profile shapes: 30.0 % (B=24 x 40 s): met",
        "large-tdt MFU target >= 25 % at profile shapes: not judged (in no OOMptimizer record (oomptimizer.json))"]


def test_mfu_targets_not_judged_without_a_profile_row():
    fixed_only = {"parameters": {"xl-aed": 1}, "matmul": {}, "steps": [_row("xl-aed", "bf16", 8, 30.0, 240, 0.2)]}
    assert record.mfu_target_lines(fixed_only) == [
        "xl-aed MFU target >= 45 % at profile shapes: not judged (this record has no profile-sized row with MFU)"]


def test_before_after_rows_pair_shapes_and_keep_rows_only_one_record_has():
    before = {"steps": [_row("large-rnnt", "bf16", 16, 15.0, 120, 0.08), _row("large-rnnt", "fp32", 16, 15.0, 120, 0.12),
                        {"model": "xl-aed", "dtype": "bf16", "batch_size": 8, "duration_s": 30.0, "num_tokens": 240,
                         "oom": True}]}
    after = {"steps": [{**_row("large-rnnt", "bf16", 16, 15.0, 120, 0.1, mfu=0.05, shape_source="fixed"),
                        "peak_bytes": 3 << 30},
                       _row("large-rnnt", "bf16", 24, 40.0, 499, 0.5, mfu=0.3, shape_source="profile")]}
    got = record.before_after_rows(before, after)
    assert got[0] == {"model": "large-rnnt", "dtype": "bf16", "shape_source": "fixed", "batch_size": 16,
                      "duration_s": 15.0, "num_tokens": 120, "before_step_s": 0.08, "before_audio_s_per_s": 3000.0,
                      "before_mfu": None, "before_peak_bytes": None, "after_step_s": 0.1, "after_audio_s_per_s": 2400.0,
                      "after_mfu": 0.05, "after_peak_bytes": 3 << 30, "before_over_after_time": pytest.approx(0.8)}
    assert (got[1]["shape_source"], got[1]["before_step_s"], got[1]["after_mfu"], got[1]["before_over_after_time"]) \
        == ("profile", None, 0.3, None)
    assert (got[2]["dtype"], got[2]["after_step_s"], got[2]["before_step_s"]) == ("fp32", None, 0.12)
    assert len(got) == 3  # the OOM row has no time in either
    table = record.compared_table(before, after, ("old", "new")).data
    assert list(table["old step (ms)"].fillna(-1)) == [80.0, -1, 120.0]
    assert list(table["new MFU (%)"].fillna(-1)) == [5.0, 30.0, -1]
    paired = record.before_after_rows(before, after, paired_only=True)
    assert [(r["dtype"], r["batch_size"]) for r in paired] == [("bf16", 16)]
    assert len(record.compared_table(before, after, ("old", "new"), paired_only=True).data) == 1


def test_models_bench_only_profile_shapes_measures_the_profile_rows(tmp_path, cpu_settings_kept):
    from benchmarks.models import run as models

    path = _oomptimizer_record(tmp_path / "oom.json", {"rnnt": {**RNNT_PART, "predictive": {"batch_sizes": [2, 1, 1]}}})
    args = ["--smoke", "--models", "tiny-rnnt", "--profile-shapes", str(path), "--profile-buckets", "0", "-1",
            "--only-profile-shapes", "--out", str(tmp_path)]
    assert models.main(args) == 0
    fig = json.loads((tmp_path / "models.json").read_text())["figures"]
    assert [(r["shape_source"], r["batch_size"]) for r in fig["steps"]] == [("profile", 2), ("profile", 1)]
    assert fig["bf16_vs_fp32"] == []


def test_models_bench_only_profile_shapes_refuses_when_no_model_has_them(tmp_path, capsys):
    from benchmarks.models import run as models

    with pytest.raises(SystemExit) as e:
        models.main(["--smoke", "--models", "tiny-aed", "--only-profile-shapes", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--only-profile-shapes: no model asked for has profile shapes")
    assert not (tmp_path / "o").exists()


def _timed(model, batch, seconds, step_s, mfu):
    return {"model": model, "dtype": "bf16", "shape_source": "profile", "batch_size": batch, "duration_s": seconds,
            "num_tokens": 10, "step_s": {"median": step_s}, "mfu": mfu, "peak_bytes": None}


def test_compared_table_and_its_meaning_name_the_two_settings():
    torch_rows = {"steps": [_timed("large-rnnt", 100, 3.3424375, 0.60, 0.20), _timed("large-rnnt", 8, 39.9875, 0.20, 0.24)]}
    triton_rows = {"steps": [_timed("large-rnnt", 100, 3.3424375, 0.50, 0.24), _timed("large-rnnt", 8, 39.9875, 0.25, 0.19)]}
    html = record.compared_table(torch_rows, triton_rows, ("torch", "Triton")).to_html()
    assert "torch step (ms)" in html and "Triton MFU (%)" in html and ">1.20<" in html and ">600<" in html
    assert record.meaning_of_comparison(torch_rows, triton_rows, ("torch", "Triton")) == (
        "Triton is faster at 1 of 2 shapes (torch / Triton step time 0.80x to 1.20x); at large-rnnt B=8 x 40 s "
        "torch is the faster (0.80x). MFU at the profile shapes with Triton: large-rnnt 19-24 % (target 25 %).")
    level = {"steps": [_timed("large-rnnt", 100, 3.3424375, 0.50, 0.24), _timed("large-rnnt", 8, 39.9875, 0.201, 0.24)]}
    assert "the two are level (within 2 %)" in record.meaning_of_comparison(torch_rows, level, ("torch", "Triton"))
    assert record.meaning_of_comparison({"steps": []}, triton_rows, ("a", "b")) == (
        "The two records share no timed shape, so a and b are not compared.")
