"""The throughput study: its pieces on exact small cases, and the whole study end to end on a CPU (smoke)."""

import json
import math

import pytest

from workbench.records import throughput as tp
from benchmarks.throughput.corpus import repeated_cuts
from benchmarks.throughput.run import main, record_name
from workbench.data.tone_corpus import write_tone_corpus


def _records(rows):
    return [{"step": i, "batch_size": b, "audio_s": a, "data_s": d, "step_s": s, "input_padding": pin,
             "output_padding": 0.1, "loss": 5.0 - i} for i, (b, a, d, s, pin) in enumerate(rows)]


def test_run_figures_leave_out_warmup_and_read_rates_padding_and_buckets():
    records = _records([(2, 10.0, 5.0, 5.0, 0.0),    # warm-up: slow, left out
                        (4, 40.0, 0.5, 1.5, 0.5),    # padded 80 s -> longest cut 20 s
                        (8, 16.0, 1.0, 1.0, 0.2)])   # padded 20 s -> longest cut 2.5 s
    f = tp.run_figures({"peak_allocated_bytes": 7}, records, [5.0, 30.0], warmup=1)
    assert f["steps"] == 3
    assert f["audio_seconds_per_second"] == pytest.approx(56.0 / 4.0)
    assert f["padded_audio_seconds_per_second"] == pytest.approx(100.0 / 4.0)
    assert f["audio_seconds_per_second_per_step"]["median"] == pytest.approx((20.0 + 8.0) / 2)
    assert f["data_wait_share"] == pytest.approx(1.5 / 4.0)
    assert f["mean_batch_size"] == 6 and f["input_padding"] == pytest.approx(0.35)
    assert f["longest_cut_s"]["max"] == pytest.approx(20.0) and f["longest_cut_s"]["min"] == pytest.approx(2.5)
    # the warm-up step counts for the buckets: padded 10 s / 2 cuts = 5 s -> first bucket
    assert f["batch_size_by_bucket"] == [{"upper_s": 5.0, "steps": 2, "mean_batch_size": 5.0},
                                         {"upper_s": 30.0, "steps": 1, "mean_batch_size": 4.0}]
    assert f["loss_curve"]["wall_s"] == pytest.approx([10.0, 12.0, 14.0])
    assert f["loss_curve"]["audio_s"] == pytest.approx([10.0, 50.0, 66.0])
    assert f["time_split_s"]["forward_backward"] is None and f["time_split_s"]["data_wait"] == pytest.approx(0.75)


def test_loss_curve_keeps_at_most_the_cap_and_the_last_step():
    curve = tp.loss_curve(_records([(1, 1.0, 0.0, 1.0, 0.0)] * 450))
    assert len(curve["step"]) <= tp.MAX_CURVE_POINTS and curve["step"][-1] == 449 and curve["step"][0] == 0


def test_checks_and_targets_name_what_failed():
    run = {"audio_seconds_per_second": 100.0, "ooms": 0}
    figures = {"model": "xl-aed", "prepare": {"baseline": {"pass": {"exceeding": 1}}},
               "steps": {"runs": {"baseline": run, "1d": {**run, "audio_seconds_per_second": 200.0},
                                  "2d": {**run, "audio_seconds_per_second": 150.0}}}}
    assert tp.checks(figures) == {"baseline_pass_within_probed_worst_case": False, "steps_baseline_no_oom": True,
                                  "steps_1d_no_oom": True, "steps_2d_no_oom": True,
                                  "every_sampler_trained": False}  # the record does not say it is complete
    figures["complete"] = True
    assert tp.checks(figures)["every_sampler_trained"] is True
    assert tp.targets(figures) == ["steps: 2D / baseline = 1.50x (target >= 1.8x: missed by 0.30x)",
                                   "steps: 2D / 1D = 0.75x (target >= 1.1x: missed by 0.35x)"]
    # with a same-wall-time part, the target is judged there and the same-steps line only lists its ratio
    figures["seconds"] = figures["steps"]
    assert tp.targets(figures)[0] == "steps: 2D / baseline = 1.50x (the target is judged at the same wall time)"
    assert tp.targets(figures)[2] == "seconds: 2D / baseline = 1.50x (target >= 1.8x: missed by 0.30x)"
    del figures["seconds"]
    figures["steps"]["runs"]["2d"] = {"ooms": 1, "error": "CUDA out of memory"}
    assert not tp.checks(figures)["steps_2d_no_oom"] and tp.ratio(figures, "steps", "2d", "1d") is None


def test_repeated_cuts_interleave_copies_and_drop_long_ones(tmp_path):
    from lhotse import CutSet

    source = write_tone_corpus(tmp_path / "c", 4, seed=0, min_letters=3, max_letters=10)
    original = CutSet.from_file(source).to_eager()
    limit = sorted(c.duration for c in original)[-1] - 1e-3  # drops the longest
    kept = [c.id for c in original if c.duration <= limit]
    assert 0 < len(kept) < len(original)
    cuts = CutSet.from_file(repeated_cuts(source, tmp_path / "r.jsonl.gz", 3, max_duration=limit)).to_eager()
    assert [c.id for c in cuts] == kept + [i + "-r1" for i in kept] + [i + "-r2" for i in kept]
    assert all(c.duration <= limit for c in cuts)
    with pytest.raises(ValueError, match="no cut of at most"):
        repeated_cuts(source, tmp_path / "none.jsonl.gz", 1, max_duration=0.01)


def test_throughput_smoke_runs_every_part_on_cpu_and_writes_the_record(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["--model", "large-rnnt", "--smoke", "--out", str(out), "--workdir",
                 str(tmp_path / "work"), "--utterances", "24", "--repeat", "3", "--steps", "4", "--train-s", "2",
                 "--warmup-steps", "1", "--warmup-records", "1", "--buckets-1d", "3", "--buckets-2d", "2"])
    assert code == 0
    record = json.loads((out / f"{record_name('large-rnnt')}.json").read_text())
    f = record["figures"]
    assert f["model"] == "tiny-rnnt" and f["failures"] == [] and "SMOKE" in record["what"]
    prep = f["prepare"]
    assert prep["corpus"]["num_cuts"] == 72 and prep["corpus"]["preset"] == "realistic"
    rates = prep["corpus"]["tokens_per_second"]
    assert 0 < rates["p10"] <= rates["p50"] <= rates["p90"] <= rates["max"]
    assert sum(prep["corpus"]["tokens_per_second_histogram"]["utterances"]) == 24  # each utterance once
    assert all(b > 0 for kind in tp.PROFILES for b in prep["profiles"][kind]["bucket_batch_size"])
    # 2D at 1D's duration bins (3 x 2 sub-buckets) and at 1D's bucket count (3 // 2 = 1 duration bucket x 2)
    assert prep["profiles"]["2d"]["duration_buckets"] == 2 and prep["profiles"]["2d_equal"]["duration_buckets"] == 1
    base = prep["baseline"]
    # the baseline's max_duration lets no lhotse bucket form a batch beyond its probed size
    assert all(math.floor(base["max_duration"] / b["shortest_s"]) <= b["max_batch_size"] for b in base["buckets"])
    assert base["pass"]["batches"] > 0 and base["pass"]["exceeding"] == 0
    assert f["steps"]["budget"] == {"steps": 4} and f["seconds"]["budget"] == {"seconds": 2.0}
    assert f["complete"] is True and f["samplers"] == list(tp.SAMPLERS)
    settings = {s: f["seconds"]["runs"][s]["allocator_settings"] for s in tp.SAMPLERS}
    assert settings["2d_plain_allocator"] == {"expandable_segments": False, "settings": None,
                                              "env": "expandable_segments:False"}
    assert settings["2d"]["expandable_segments"] is True and settings["2d"]["env"] is None  # no CUDA: untouched
    assert f["seconds"]["runs"]["2d"]["allocator"] is None  # no CUDA counters on a CPU
    for sampler in tp.SAMPLERS:
        run = f["steps"]["runs"][sampler]
        assert run["steps"] == 4 and run["ooms"] == 0 and 0 < run["mfu"] < 1
        assert run["audio_seconds_per_second"] > 0 and 0 <= run["input_padding"] < 1
        assert len(run["loss_curve"]["loss"]) == 4
        whole = f["seconds"]["runs"][sampler]
        # one run per sampler: the same-steps view is the first 4 of its steps, the same-time view all of them
        assert whole["steps"] >= 4 and whole["mfu"] > 0
        early = dict(zip(run["loss_curve"]["step"], run["loss_curve"]["loss"]))
        shared = [(s, loss) for s, loss in zip(whole["loss_curve"]["step"], whole["loss_curve"]["loss"]) if s in early]
        assert shared and all(early[s] == loss for s, loss in shared)
    profile_sizes = f["steps"]["runs"]["2d"]["batch_size"]
    assert profile_sizes["max"] <= max(prep["profiles"]["2d"]["bucket_batch_size"])
    lines = tp.summary_lines(f)
    assert any("baseline max_duration" in line for line in lines) and lines[-1] == "- checks all passed"
    table = tp.runs_table(record)
    assert len(table) == 2 * len(tp.SAMPLERS) and set(table["OOMs"]) == {0}
    for draw in (tp.throughput_bars, tp.loss_curves, tp.batch_size_by_bucket_plot, tp.step_time_split,
                 tp.tokens_per_second_histogram):
        assert draw(record).axes
    assert tp.allocator_curves(record) is None and tp.allocator_table(record).empty
    assert "not compared" in tp.allocator_meaning(f) and tp.corpus_meaning(f).startswith("Tokens per second: p10")
    assert "At the 1D profile's number of buckets" in tp.throughput_meaning(f)
    # a variant beside the study: its own record, the study's profiles, none of the study's runs
    study = out / f"{record_name('large-rnnt')}.json"
    assert main(["--model", "large-rnnt", "--smoke", "--parts", "train", "--from", str(study), "--out", str(out),
                 "--workdir", str(tmp_path / "work_nice"), "--samplers", "1d", "--steps", "2", "--train-s", "2",
                 "--warmup-steps", "1", "--warmup-records", "1", "--worker-niceness", "3", "--tag", "nice3"]) == 0
    variant = json.loads((out / f"{record_name('large-rnnt')}_nice3.json").read_text())["figures"]
    assert variant["samplers"] == ["1d"] and set(variant["seconds"]["runs"]) == {"1d"}
    assert variant["seconds"]["runs"]["1d"]["worker_niceness"] == 3
    assert variant["prepare"] == prep and json.loads(study.read_text())["figures"]["samplers"] == list(tp.SAMPLERS)


def test_throughput_later_part_without_prepare_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--model", "xl-aed", "--parts", "train", "--smoke", "--out", str(tmp_path), "--workdir",
              str(tmp_path / "w"), "--utterances", "8", "--repeat", "1"])
    assert "--parts train: no prepared profiles" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "xl-aed", "--parts", "train", "--smoke", "--out", str(tmp_path), "--steps", "0"])
    assert "--steps: must be >= 1" in capsys.readouterr().err
    for bad, message in ((["--tag", "a/b", "--parts", "train"], "--tag: letters, digits and _ only"),
                         (["--tag", "x"], "--tag: a variant trains on the study's prepared profiles"),
                         (["--worker-niceness", "20", "--parts", "train"], "--worker-niceness: must be at most 19")):
        with pytest.raises(SystemExit):
            main(["--model", "xl-aed", "--smoke", "--out", str(tmp_path), *bad])
        assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written


def test_views_take_the_fewest_steps_reached_and_keep_an_oom_apart():
    import argparse

    from benchmarks.throughput.training import views

    prep = {"baseline": {"lhotse_bins": [5.0], "buckets": [{"longest_s": 30.0}]},
            "profiles": {"1d": {"bucket_duration_bins": [5.0, 30.0]}}}

    def trained(n):
        records = _records([(2, 10.0, 0.5, 1.0, 0.1)] * n)
        for i, r in enumerate(records):
            r["peak_allocated_bytes"] = 100 * (i + 1)
        return {"summary": {"peak_allocated_bytes": 100 * n}, "records": records, "settings": {}}

    oom = {"ooms": 1, "error": "CUDA out of memory", "settings": {}}
    out = views(argparse.Namespace(steps=10, warmup_records=0), prep, {"baseline": trained(12), "1d": trained(6), "2d": oom})
    # k = 6: the shorter run bounds the same-steps view; the same-time view keeps every step
    assert out["steps"]["baseline"]["steps"] == 6 and out["seconds"]["baseline"]["steps"] == 12
    assert out["steps"]["1d"]["steps"] == out["seconds"]["1d"]["steps"] == 6
    # record k-2's peak covers the first k steps (read after step k was launched); the whole run's is the summary's
    assert out["steps"]["baseline"]["peak_allocated_bytes"] == 500
    assert out["seconds"]["baseline"]["peak_allocated_bytes"] == 1200
    assert out["steps"]["2d"] == out["seconds"]["2d"] == oom and out["steps"]["2d"] is not out["seconds"]["2d"]


def test_a_record_cut_short_says_so_and_still_renders():
    record = {"model": "xl-aed", "complete": False,
              "seconds": {"runs": {"baseline": {"ooms": 1, "error": "CUDA out of memory"}},
                          "matmul": {"flops_per_s": 1e15, "dtype": "bfloat16"}, "budget": {"seconds": 60.0}}}
    assert tp.checks(record)["every_sampler_trained"] is False
    lines = tp.summary_lines({**record, "failures": ["every_sampler_trained"]})
    assert any(line.endswith("1D profile: not run") for line in lines)
    assert lines[-1] == "- checks FAILED: every_sampler_trained"


def _run(median, p25, p75, batch, wait, loss_end=2.0):
    return {"audio_seconds_per_second": median, "mean_batch_size": batch, "data_wait_share": wait, "ooms": 0,
            "audio_seconds_per_second_per_step": {"median": median, "p25": p25, "p75": p75},
            "loss_curve": {"loss": [5.0, loss_end], "audio_s": [0.0, 7200.0], "wall_s": [0.0, 60.0]}}


def test_meaning_sentences_come_from_the_runs():
    runs = {"baseline": _run(1000, 900, 1100, 50, 0.01), "1d": _run(1500, 1200, 1800, 150, 0.02),
            "2d": _run(1800, 1000, 2000, 160, 0.004)}
    figures = {"model": "xl-aed", "seconds": {"runs": runs}, "steps": {"runs": runs}}
    assert tp.throughput_meaning(figures) == ("In the same wall time, the 2D profile trains 1.80x the audio of "
                                              "lhotse's best max_duration (target >= 1.8x: met), and 1.20x the 1D "
                                              "profile's (target >= 1.1x: met).")
    assert "1D profile stands clear of lhotse's" in tp.spread_meaning(figures)  # 2D's p25 1000 < baseline p75
    assert "the 1D profile's is 3.0x as large and the 2D profile's is 3.2x" in tp.batch_size_meaning(figures)
    assert tp.step_time_meaning(figures).startswith("Data wait is at most 2.0 % of a step (1D profile)")
    assert "2D profile 2.00 after 2.0 h of audio" in tp.loss_meaning(figures, "steps")
    runs["2d"]["loss_curve"]["audio_s"][-1], runs["baseline"]["loss_curve"]["loss"][-1] = 9000.0, 1.5
    assert tp.loss_meaning(figures).endswith("The 2D profile saw the most audio and the lhotse max_duration reached "
                                             "the lowest loss; the right-hand plot shows the loss per hour of audio seen.")
    runs["2d"] = {"ooms": 1}
    assert tp.throughput_meaning(figures).startswith("A sampler ran out of memory")


def _cuda_records(allocs, retries, ooms, step_s):
    return [{"step": i, "num_device_alloc": a, "num_alloc_retries": r, "num_ooms": o, "step_s": s,
             "reserved_bytes": 100 * i} for i, (a, r, o, s) in enumerate(zip(allocs, retries, ooms, step_s))]


def test_allocator_figures_count_each_steps_increase_after_warmup():
    records = _cuda_records(allocs=[40, 45, 45, 47, 47], retries=[0, 1, 1, 1, 3], ooms=[0, 0, 0, 0, 1],
                            step_s=[9.0, 1.0, 2.0, 3.0, 4.0])
    a = tp.allocator_figures(records, warmup=2)
    # steps 2..4 against the record before each: allocs +0 +2 +0, retries +0 +0 +2, OOMs +0 +0 +1
    assert a["steps"] == 3 and a["device_allocs"] == 2 and a["device_allocs_per_step"] == pytest.approx(2 / 3)
    assert a["steps_with_device_alloc"] == 1 and a["alloc_retries"] == 2 and a["steps_with_retry"] == 1
    assert a["cuda_ooms"] == 1 and a["step_s"]["median"] == 3.0 and a["max_reserved_bytes"] == 400
    assert a["curve"] == {"step": [0, 1, 2, 3, 4], "num_device_alloc": [0, 5, 5, 7, 7],
                          "num_alloc_retries": [0, 1, 1, 1, 3]}
    assert tp.allocator_figures(_records([(1, 1.0, 0.0, 1.0, 0.0)] * 3)) is None  # a CPU run has no counters
    assert tp.allocator_figures(records[:1]) is None


def _allocator_run(per_step, retries, step, audio, ooms=0):
    return {"audio_seconds_per_second": audio, "ooms": ooms,
            "allocator": {"steps": 10, "device_allocs_per_step": per_step, "steps_with_device_alloc": int(10 * per_step),
                          "alloc_retries": retries, "cuda_ooms": 0, "max_reserved_bytes": 0,
                          "step_s": {"median": step, "p25": step, "p75": step},
                          "curve": {"step": [0, 1], "num_device_alloc": [0, 1], "num_alloc_retries": [0, 0]}}}


def test_the_plain_allocator_run_is_set_against_the_2d_run_and_its_ooms_are_no_failure():
    runs = {"2d": _allocator_run(0.0, 0, 1.0, 200.0), "2d_plain_allocator": _allocator_run(0.5, 3, 1.1, 180.0, ooms=2)}
    figures = {"model": "xl-aed", "samplers": ["2d", "2d_plain_allocator"], "complete": True,
               "seconds": {"runs": runs}}
    assert tp.checks(figures) == {"seconds_2d_no_oom": True, "every_sampler_trained": True}
    text = tp.allocator_meaning(figures)
    assert "0.00 times per step (0 of 10 steps), retried 0 allocations and trained 0 steps in parts" in text
    assert "0.50 times per step (5 of 10), 3 retries and 2 steps in parts" in text
    assert text.endswith("took 1.10x as long without them, and the run trained 0.90x the audio per second.")
    assert tp.allocator_lines(figures)[1].startswith("2D profile, plain allocator (expandable segments off): 0.50 "
                                                     "cudaMalloc per step (5 of 10 steps after warm-up), 3 retries")
    record = {"figures": figures}
    assert list(tp.allocator_table(record)["expandable segments"]) == ["on", "off"]
    assert tp.allocator_curves(record).axes
    runs["2d_plain_allocator"] = {"ooms": 1, "error": "CUDA out of memory"}
    assert tp.allocator_meaning(figures).startswith("Without expandable segments the 2D profile's run ended out of")
    del runs["2d_plain_allocator"]
    assert tp.allocator_meaning(figures).endswith("not measured yet.")
    assert tp.checks(figures)["every_sampler_trained"] is False  # asked for, not trained


def test_the_equal_bucket_2d_profile_is_listed_beside_the_headline():
    run = {"audio_seconds_per_second": 100.0, "ooms": 0}
    runs = {"baseline": run, "1d": {**run, "audio_seconds_per_second": 150.0},
            "2d": {**run, "audio_seconds_per_second": 180.0}, "2d_equal": {**run, "audio_seconds_per_second": 165.0}}
    figures = {"model": "large-rnnt", "seconds": {"runs": runs}}
    assert tp.targets(figures) == ["seconds: 2D / baseline = 1.80x (target >= 1.5x: met)", "seconds: 2D / 1D = 1.20x",
                                   "seconds: 2D at equal buckets = 1.65x baseline and 1.10x 1D (beside the "
                                   "headline, no target)"]
    assert "1D profile" in tp.headline_note() and "equal-bucket" in tp.headline_note()


def test_a_record_that_trained_the_first_three_samplers_says_the_others_are_not_measured_yet():
    from workbench.reporting import committed_result

    record = committed_result(record_name("xl-aed"))
    f = record["figures"]
    f["samplers"] = ["baseline", "1d", "2d"]
    for part in ("steps", "seconds"):
        for sampler in ("2d_equal", "2d_plain_allocator"):
            f[part]["runs"].pop(sampler, None)
    f["prepare"]["corpus"].pop("tokens_per_second_histogram", None)  # a corpus without its rates measured
    lines = tp.summary_lines(f)
    assert "  - 2D profile, equal buckets: not measured yet" in lines
    assert "  - 2D profile, plain allocator: not measured yet" in lines
    assert tp.checks(f)["every_sampler_trained"] is True  # it was asked for the first three only
    assert tp.allocator_meaning(f).endswith("not measured yet.")
    assert tp.corpus_rates(f) is None and tp.corpus_meaning(f).endswith("not measured yet.")
    assert tp.throughput_bars(record, "seconds").axes and tp.loss_curves(record).axes
    assert tp.loss_meaning(f).startswith("At the end of the same wall")


def test_loss_at_audio_averages_the_last_tenth_before_the_audio_given():
    curve = {"audio_s": [0.0, 50.0, 91.0, 95.0, 100.0, 120.0], "loss": [9.0, 5.0, 3.0, 2.0, 1.0, 0.5]}
    assert tp.loss_at_audio(curve, 100.0) == pytest.approx(2.0)  # 91, 95, 100
    assert tp.loss_at_audio(curve, 60.0) == pytest.approx(5.0)  # none in 54..60: the nearest point, 50


def test_training_processes_get_the_allocator_by_environment_and_the_budget_splits_evenly(monkeypatch):
    import argparse

    from benchmarks.throughput import training

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert "PYTORCH_ALLOC_CONF" not in training.worker_env(True)
    env = training.worker_env(False)
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert env["PYTHONPATH"].split(":")[0] == str(training.REPO)

    class FakeRun:
        args = argparse.Namespace(budget_s=500.0, train_s=75.0)

        def seconds(self):
            return 40.0

    assert training.train_seconds(FakeRun(), 5, 60.0) == 40.0  # (500 - 40 - 60) / 5 - 40 s of start-up
    FakeRun.args.budget_s = 0
    assert training.train_seconds(FakeRun(), 5, 60.0) == 75.0


def test_views_count_the_steps_trained_in_parts():
    import argparse

    from benchmarks.throughput.training import views

    prep = {"profiles": {"2d": {"bucket_duration_bins": [[5.0, 10], [30.0, 90]]}}}
    records = _records([(2, 10.0, 0.5, 1.0, 0.1)] * 8)
    t = {"summary": {"out_of_memory": [{"step": 1}, {"step": 6}]}, "records": records, "settings": {},
         "allocator": {"expandable_segments": False}}
    out = views(argparse.Namespace(steps=4, warmup_records=0), prep, {"2d_plain_allocator": t})
    assert out["seconds"]["2d_plain_allocator"]["ooms"] == 2 and out["steps"]["2d_plain_allocator"]["ooms"] == 1
    assert out["seconds"]["2d_plain_allocator"]["allocator_settings"] == {"expandable_segments": False}


def test_a_train_part_on_profiles_of_another_corpus_is_refused(tmp_path, capsys):
    from workbench.reporting import committed_result

    record = committed_result(record_name("xl-aed"))
    prepare = record["figures"]["prepare"]
    prepare["corpus"].pop("preset", None)  # a record from before the presets: prepared on the plain corpus,
    prepare["profiles"].pop("2d_equal", None)  # without the equal-bucket profile
    previous = tmp_path / "prev.json"
    previous.write_text(json.dumps(record))
    with pytest.raises(SystemExit):
        main(["--model", "xl-aed", "--parts", "train", "--smoke", "--from", str(previous), "--out", str(tmp_path / "o")])
    assert "prepared on the plain corpus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "xl-aed", "--parts", "train", "--smoke", "--from", str(previous), "--corpus-preset", "plain",
              "--out", str(tmp_path / "o")])
    assert "the record has no 2d_equal profile" in capsys.readouterr().err


def test_a_train_part_on_another_kind_of_gpu_is_refused(monkeypatch):
    from types import SimpleNamespace

    from benchmarks.throughput import run as runner

    monkeypatch.setattr(runner, "device_memory_mib", lambda: 81559)
    with pytest.raises(ValueError, match="searched on a GPU of 143771 MiB, this one has 81559 MiB"):
        runner.train_part(SimpleNamespace(figures={"prepare": {"device_memory_mib": 143771}}))


def test_a_sampler_whose_process_fails_is_recorded_and_the_others_still_train(monkeypatch):
    import argparse
    from types import SimpleNamespace

    from benchmarks.throughput import run as runner

    def train(run, prep, sampler, train_s):
        if sampler == "1d":
            raise RuntimeError("1d: the training process exited with code 1: boom")
        return {"summary": {}, "records": _records([(2, 10.0, 0.5, 1.0, 0.1)] * 3), "settings": {}}

    monkeypatch.setattr(runner, "device_memory_mib", lambda: None)
    monkeypatch.setattr(runner, "make_corpus", lambda args: ({"cuts": "c", "tokenizer": "t"}, None))
    monkeypatch.setattr(runner, "train_sampler", train)
    monkeypatch.setattr(runner, "views", lambda args, prep, trained: {"seconds": dict(trained), "steps": dict(trained)})
    monkeypatch.setattr(runner, "matmul_flops_per_second", lambda smoke: {"flops_per_s": 1.0})
    monkeypatch.setattr(runner, "add_mfu", lambda *a: None)
    fake = SimpleNamespace(figures={"prepare": {"corpus": {}}}, failures=[], smoke=True, seconds=lambda: 0.0,
                           save=lambda: None, args=argparse.Namespace(samplers=["baseline", "1d", "2d"], budget_s=0,
                                                                      train_s=5.0, steps=3))
    runner.train_part(fake)
    assert fake.failures == ["train: 1d: RuntimeError: 1d: the training process exited with code 1: boom"]
    assert set(fake.figures["seconds"]["runs"]) == {"baseline", "2d"} and fake.figures["complete"] is False


def _train_part_with_earlier_runs(monkeypatch, earlier_train_s, earlier_steps):
    """train_part on a record whose earlier call trained 2d_equal and 2d_plain_allocator (for
    ``earlier_train_s`` seconds, the first ``earlier_steps`` steps), asked now for baseline, 1d and 2d."""
    import argparse
    from types import SimpleNamespace

    from benchmarks.throughput import run as runner

    def train(run, prep, sampler, train_s):
        return {"summary": {}, "records": _records([(2, 10.0, 0.5, 1.0, 0.1)] * 3), "settings": {}}

    monkeypatch.setattr(runner, "device_memory_mib", lambda: None)
    monkeypatch.setattr(runner, "make_corpus", lambda args: ({"cuts": "c", "tokenizer": "t"}, None))
    monkeypatch.setattr(runner, "train_sampler", train)
    monkeypatch.setattr(runner, "views", lambda args, prep, trained: {
        view: {s: {"audio_seconds_per_second": 1.0, "call": t["call"]} for s, t in trained.items()}
        for view in ("seconds", "steps")})
    monkeypatch.setattr(runner, "matmul_flops_per_second", lambda smoke: {"flops_per_s": 1.0})
    monkeypatch.setattr(runner, "add_mfu", lambda *a: None)
    earlier_run = {"audio_seconds_per_second": 2.0, "call": {"git_commit": "earlier"}}
    figures = {"prepare": {"corpus": {}, "baseline": {"pass": {"exceeding": 0}}},
               "seconds": {"runs": {"2d": earlier_run, "2d_equal": earlier_run, "2d_plain_allocator": earlier_run},
                           "budget": {"seconds": earlier_train_s}},
               "steps": {"runs": {"2d": earlier_run, "2d_equal": earlier_run, "2d_plain_allocator": earlier_run},
                         "budget": {"steps": earlier_steps}}}
    fake = SimpleNamespace(figures=figures, failures=[], smoke=True, seconds=lambda: 0.0, save=lambda: None,
                           params={}, args=argparse.Namespace(samplers=["baseline", "1d", "2d"], budget_s=0,
                                                             train_s=5.0, steps=3))
    runner.train_part(fake)
    return fake.figures


def test_a_later_train_call_keeps_the_earlier_runs_of_samplers_it_does_not_train(monkeypatch):
    figures = _train_part_with_earlier_runs(monkeypatch, 5.0, 3)
    assert figures["samplers"] == list(tp.SAMPLERS) and figures["complete"] is True
    for view in ("seconds", "steps"):
        runs = figures[view]["runs"]
        assert runs["2d_equal"]["call"] == runs["2d_plain_allocator"]["call"] == {"git_commit": "earlier"}
        assert runs["2d"]["call"]["git_commit"] != "earlier"  # trained now: this call's run replaces it
        assert runs["baseline"]["call"] == runs["2d"]["call"]
    assert tp.checks(figures)["every_sampler_trained"]
    assert tp.calls_lines(figures) == [
        "trained over several calls: lhotse max_duration, 1D profile, 2D profile at commit "
        f"{figures['seconds']['runs']['2d']['call']['git_commit'][:12]} ({figures['seconds']['runs']['2d']['call']['date']}); "
        "2D profile, equal buckets, 2D profile, plain allocator at commit earlier (?)"]


@pytest.mark.parametrize("train_s, steps", [(4.0, 3), (5.0, 2)])
def test_earlier_runs_of_another_window_are_not_kept(monkeypatch, train_s, steps):
    figures = _train_part_with_earlier_runs(monkeypatch, train_s, steps)
    assert figures["samplers"] == ["baseline", "1d", "2d"]
    assert set(figures["seconds"]["runs"]) == set(figures["steps"]["runs"]) == {"baseline", "1d", "2d"}
    assert tp.calls_lines(figures) == []  # one call trained them all


def test_run_figures_keep_each_steps_device_and_host_times_and_split_the_slow_steps():
    # steps of 8 audio s unpadded (16 s padded) at 0.4 s, two at 0.9 s and 1.0 s; one with twice the audio
    # at 0.8 s keeps the pace of the fast ones, so it is not slow
    records = _records([(2, 10.0, 0.0, 0.4, 0.0)] + [(4, a, 0.0, t, 0.5) for a, t in
                                                     ((8.0, 0.4), (8.0, 0.4), (8.0, 0.9), (16.0, 0.8), (8.0, 1.0))])
    host = [(0.05, 0.05, 0), (0.05, 0.05, 0), (0.06, 0.06, 1), (0.88, 0.3, 40), (0.1, 0.1, 2), (0.97, 0.5, 60)]
    for r, (host_s, cpu_s, preemptions) in zip(records, host):
        r.update(host_s=host_s, host_cpu_s=cpu_s, host_preemptions=preemptions)
    f = tp.run_figures({}, records, [30.0], warmup=1)
    assert f["step_times"] == {"step_s": [0.4, 0.4, 0.9, 0.8, 1.0], "host_s": [0.05, 0.06, 0.88, 0.1, 0.97],
                               "padded_audio_s": [16.0, 16.0, 16.0, 32.0, 16.0]}
    assert f["time_split_s"]["host"] == pytest.approx(0.1)
    thinned = tp.step_times(records * 100)["step_s"]  # 600 steps with host times, thinned evenly
    assert len(thinned) == tp.MAX_CURVE_POINTS and set(thinned) <= {0.4, 0.8, 0.9, 1.0}
    split = f["slow_steps"]
    assert split["threshold_s_per_padded_audio_s"] == pytest.approx(1.3 * 0.025)
    assert split["slow"] == pytest.approx({"steps": 2, "step_s": 0.95, "host_s": 0.925, "host_cpu_s": 0.4,
                                           "host_preemptions": 50.0, "pinned_allocs": None,
                                           "pinned_alloc_ms": None})  # no pinned-memory counters logged
    assert split["others"]["steps"] == 3 and split["others"]["host_preemptions"] == pytest.approx(1.0)
    assert tp.slow_steps_line(f) == ("2 of 5 steps over 1.3x the run's p25 pace; those: device 0.950 s, host "
                                     "queueing 0.925 s (CPU 0.400 s, 50.0 preemptions); the others: device 0.533 s, "
                                     "host queueing 0.070 s (CPU 0.070 s, 1.0 preemptions)")
    # pinned-memory blocks made (cumulative counters): 3 in the first slow step (30 ms), 2 in the second
    for r, (blocks, us) in zip(records, [(0, 0), (0, 0), (0, 0), (3, 30e3), (3, 30e3), (5, 50e3)]):
        r.update(num_host_alloc=blocks, host_alloc_us=us)
    pinned = tp.run_figures({}, records, [30.0], warmup=1)["slow_steps"]
    assert (pinned["slow"]["pinned_allocs"], pinned["slow"]["pinned_alloc_ms"]) == pytest.approx((2.5, 25.0))
    assert (pinned["others"]["pinned_allocs"], pinned["others"]["pinned_alloc_ms"]) == (0, 0)
    assert tp.slow_steps_line({"slow_steps": pinned}).endswith(
        "preemptions), 0.0 pinned-memory blocks made (0.0 ms)")
    assert "preemptions), 2.5 pinned-memory blocks made (25.0 ms); the others" in tp.slow_steps_line(
        {"slow_steps": pinned})
    from benchmarks.gpu_clocks import clock_figures
    clocks = [{"sm_mhz": mhz, "max_sm_mhz": 1980.0, "power_w": 600.0, "utilization_pct": util}
              for mhz, util in ((1980.0, 99.0), (1200.0, 99.0), (1980.0, 99.0), (1200.0, 99.0), (345.0, 0.0))]
    assert tp.gpu_clocks_line({**f, "gpu_clocks": clock_figures(clocks, 500)}) == (
        "SM clock median 1590 MHz (p25-p75 1200-1980, min 1200, the card's maximum 1980), power median 600 W "
        "(max 600), over 4 busy samples of 5 (whole run)")
    assert tp.gpu_clocks_line(f) is None
    # records without host times (a run before they were logged): no split, no line, empty step times
    for r in records:
        for key in ("host_s", "host_cpu_s", "host_preemptions"):
            del r[key]
    old = tp.run_figures({}, records, [30.0], warmup=1)
    assert old["slow_steps"] is None and tp.slow_steps_line(old) is None and old["time_split_s"]["host"] is None
    assert old["step_times"] == {"step_s": [], "host_s": [], "padded_audio_s": []}
