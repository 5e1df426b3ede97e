"""Real cuts -> batches; the tiny models learn the tone corpus; the `workbench train` recipe end to end."""

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet

from workbench.bucketing import BucketProfile, save_profile
from workbench.cli import main
from workbench.data.tokenizer import load_tokenizer
from workbench.models import build_model
from workbench.training.collate import collate_cuts
from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus
from workbench.training.recipe import load_checkpoint


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tones")
    cuts_path = write_tone_corpus(root, 12, seed=0, min_letters=3, max_letters=6)
    tokenizer_path = train_letter_tokenizer(root / "letters")
    return cuts_path, tokenizer_path


def test_collate_cuts_loads_audio_and_tokenizes_text(corpus):
    cuts_path, tokenizer_path = corpus
    tokenizer = load_tokenizer(tokenizer_path)
    cuts = CutSet.from_file(cuts_path).subset(first=3)
    batch = collate_cuts(cuts, tokenizer)
    for i, cut in enumerate(cuts):
        samples, rate = sf.read(cut.recording.sources[0].source, dtype="float32")
        assert rate == 16000
        n = int(batch["audio_lens"][i])
        assert n == len(samples)
        np.testing.assert_allclose(batch["audio"][i, :n].numpy(), samples, atol=1e-4)
        assert float(batch["audio"][i, n:].abs().sum()) == 0
        ids = tokenizer.encode(cut.supervisions[0].text)
        assert batch["tokens"][i, :len(ids)].tolist() == ids and int(batch["token_lens"][i]) == len(ids)
    with pytest.raises(ValueError, match="0 cuts"):
        collate_cuts([], tokenizer)


@pytest.mark.parametrize("head", ["rnnt", "tdt", "ctc", "aed"])
def test_tiny_models_learn_the_tone_corpus(corpus, head):
    cuts_path, tokenizer_path = corpus
    tokenizer = load_tokenizer(tokenizer_path)
    batch = collate_cuts(CutSet.from_file(cuts_path).subset(first=8), tokenizer)
    torch.manual_seed(0)
    model = build_model(f"tiny-{head}", vocab_size=tokenizer.vocab_size())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        losses.append(float(model.training_step(batch)))
        optimizer.step()
        optimizer.zero_grad()
    print(f"{head}: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert all(np.isfinite(losses)) and losses[0] > 0.5
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])


def test_train_recipe_without_profile_saves_a_loadable_checkpoint(corpus, tmp_path):
    cuts_path, tokenizer_path = corpus
    code = main(["train", "--cuts", str(cuts_path), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path),
                 "--model", "tiny-ctc", "--steps", "3", "--max-duration", "6", "--num-buckets", "2",
                 "--dtype", "fp32", "--device", "cpu", "--log-every", "1"])
    assert code == 0
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2]
    assert all(r["audio_s"] <= 6.0 + 1e-6 and np.isfinite(r["loss"]) for r in log)
    model = load_checkpoint(tmp_path / "model.pt")
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert model.config.name == "tiny-ctc" and model.vocab_size == load_tokenizer(tokenizer_path).vocab_size()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved["state_dict"].items())


def test_train_recipe_with_a_profile_respects_its_batch_sizes(corpus, tmp_path):
    cuts_path, tokenizer_path = corpus
    profile = tmp_path / "profile.yaml"
    save_profile(profile, BucketProfile(bucket_duration_bins=[1.5, 10.0], bucket_batch_size=[3, 2]))
    code = main(["train", "--cuts", str(cuts_path), "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "run"),
                 "--model", "tiny-aed", "--steps", "4", "--profile", str(profile), "--dtype", "fp32",
                 "--device", "cpu"])
    assert code == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 4 and all(r["batch_size"] <= 3 for r in log)


def test_train_recipe_reports_user_errors_in_one_line(tmp_path, capsys):
    code = main(["train", "--cuts", str(tmp_path / "missing.jsonl.gz"), "--tokenizer", str(tmp_path / "t.model"),
                 "--out", str(tmp_path), "--device", "cpu"])
    assert code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    assert err.startswith("workbench train: error:") and "missing.jsonl.gz" in err and "Traceback" not in err


def _train_args(corpus, out, *extra):
    """`workbench train` on the tone corpus; batches of 2 s from lhotse's sampler unless ``extra`` has --profile."""
    cuts_path, tokenizer_path = corpus
    batches = [] if "--profile" in extra else ["--max-duration", "2", "--num-buckets", "2"]
    return ["train", "--cuts", str(cuts_path), "--tokenizer", str(tokenizer_path), "--out", str(out),
            "--model", "tiny-ctc", *batches, "--dtype", "fp32", "--device", "cpu", "--warmup-steps", "2", *extra]


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _crash_then_resume(corpus, tmp_path, monkeypatch, stop, *extra):
    """Train 9 steps straight; train again, crash after the checkpoint at step ``stop``, resume; both logs."""
    from workbench.training import recipe

    assert main(_train_args(corpus, tmp_path / "straight", "--steps", "9", *extra)) == 0
    calls, one_step = [], recipe.train_one_step

    def crash_after_checkpoint(run, host_batch, **kw):
        calls.append(1)
        if len(calls) > stop:
            raise RuntimeError("simulated crash")
        return one_step(run, host_batch, **kw)

    monkeypatch.setattr(recipe, "train_one_step", crash_after_checkpoint)
    args = _train_args(corpus, tmp_path / "split", "--steps", "9", "--save-every", str(stop), *extra)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(args)
    monkeypatch.setattr(recipe, "train_one_step", one_step)
    assert main([*args, "--resume"]) == 0
    return _log(tmp_path / "straight"), _log(tmp_path / "split")


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("stop", [3, 7])
def test_train_resumes_after_a_crash_as_if_never_stopped(corpus, tmp_path, monkeypatch, stop, workers):
    # 12 cuts of 0.5-1 s in batches of <= 2 s: 7 batches an epoch, so step 3 is mid-epoch, step 7 ends the
    # epoch, and step 9 is in the second epoch. With 2 workers prefetching 4 batches each, the whole epoch
    # has been drawn from the sampler by the time step 3 is saved: those batches must not be lost.
    straight, split = _crash_then_resume(corpus, tmp_path, monkeypatch, stop, "--num-workers", workers,
                                         "--log-cut-ids")
    assert [r["step"] for r in split] == list(range(9))
    assert len({r["batch_size"] for r in straight[3:7]}) > 1  # batches differ, so a wrong position shows
    # The same batches (the sampler fast-forwarded past the batches trained on), weights, optimizer moments
    # and schedule: the losses after the resume are those of the uninterrupted run.
    assert [r["cut_ids"] for r in split] == [r["cut_ids"] for r in straight]
    np.testing.assert_allclose([r["loss"] for r in split], [r["loss"] for r in straight], rtol=1e-5)
    a, b = (torch.load(tmp_path / d / "model.pt", weights_only=True)["state_dict"] for d in ("straight", "split"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_train_resume_refuses_other_settings_in_one_line(corpus, tmp_path, capsys):
    assert main(_train_args(corpus, tmp_path, "--steps", "2", "--save-every", "1")) == 0
    capsys.readouterr()
    assert main(_train_args(corpus, tmp_path, "--steps", "4", "--seed", "1", "--resume")) == 2
    err = capsys.readouterr().err
    assert "--resume: seed is 1 but" in err and "trained with 0" in err and "Traceback" not in err
    assert main(_train_args(corpus, tmp_path / "fresh", "--steps", "2", "--resume")) == 2
    assert "train with --save-every first" in capsys.readouterr().err


def test_train_with_a_profile_resumes_too(corpus, tmp_path, monkeypatch):
    profile = tmp_path / "profile.yaml"
    save_profile(profile, BucketProfile(bucket_duration_bins=[0.8, 10.0], bucket_batch_size=[2, 1]))
    straight, split = _crash_then_resume(corpus, tmp_path, monkeypatch, 3, "--profile", str(profile),
                                         "--no-concurrent")
    assert [r["audio_s"] for r in split] == [r["audio_s"] for r in straight]
    np.testing.assert_allclose([r["loss"] for r in split], [r["loss"] for r in straight], rtol=1e-5)


def _train_error(capsys, *args) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workbench train: error:") and "Traceback" not in err
    return err


def test_train_bad_options_and_inputs_are_one_line_errors_that_name_them(corpus, tmp_path, capsys):
    from workbench.data.synthetic import write_synthetic_corpus

    out = tmp_path / "run"
    assert "--num-workers: must be an integer >= 0, got -1" in _train_error(
        capsys, *_train_args(corpus, out, "--num-workers", "-1"))
    assert "--worker-niceness: must be an integer >= 0, got -5" in _train_error(
        capsys, *_train_args(corpus, out, "--worker-niceness", "-5"))
    assert "--steps: must be an integer >= 1" in _train_error(capsys, *_train_args(corpus, out, "--steps", "0"))
    assert "--max-duration: must be a finite number > 0" in _train_error(
        capsys, *_train_args(corpus, out, "--max-duration", "-3"))
    for option, value in (("--lr", "inf"), ("--lr", "nan"), ("--max-duration", "inf")):  # never a model of NaNs
        assert f"{option}: must be a finite number > 0, got {float(value)}" in _train_error(
            capsys, *_train_args(corpus, out, option, value))
    assert not (out / "model.pt").exists()
    if not torch.cuda.is_available():
        err = _train_error(capsys, *[a if a != "cpu" else "cuda" for a in _train_args(corpus, out)])
        assert "--device cuda: this machine has no CUDA GPU" in err and "--device cpu" in err
    assert "--device: expected cuda, cuda:N or cpu, got 'foo'" in _train_error(
        capsys, *[a if a != "cpu" else "foo" for a in _train_args(corpus, out)])
    assert "--num-buckets 20: " in _train_error(capsys, *_train_args(corpus, out, "--num-buckets", "20"))
    assert "model name" in _train_error(capsys, *_train_args(corpus, out, "--model", "huge-rnnt"))
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert "is a file, not a folder" in _train_error(capsys, *_train_args(corpus, a_file / "run"))
    synthetic = write_synthetic_corpus(tmp_path / "synthetic", 20, seed=0)
    capsys.readouterr()  # its progress bar
    args = _train_args(corpus, out)
    args[args.index("--cuts") + 1] = str(synthetic)
    err = _train_error(capsys, *args)
    assert "has no audio" in err and str(synthetic) in err and "corpus tts" in err
    assert not out.exists()  # nothing written by a run that never started


def test_train_refuses_options_that_cannot_apply_and_folders_as_files(corpus, tmp_path, capsys):
    profile = save_profile(tmp_path / "profile.yaml", BucketProfile([0.8, 10.0], [2, 1]))
    out = tmp_path / "run"
    with_profile = _train_args(corpus, out, "--profile", str(profile))
    for option, value in (("--max-duration", "30"), ("--num-buckets", "4")):
        assert f"{option}: applies without --profile only" in _train_error(capsys, *with_profile, option, value)
    assert "--no-concurrent: applies with --profile only" in _train_error(
        capsys, *_train_args(corpus, out, "--no-concurrent"))
    assert "--strict: applies with --profile only" in _train_error(capsys, *_train_args(corpus, out, "--strict"))
    assert "--joint-chunk-size: applies to transducers (rnnt, tdt) only, not to --model tiny-ctc" in _train_error(
        capsys, *_train_args(corpus, out, "--joint-chunk-size", "2"))
    assert "--loss fused: applies to the reference transducers (rnnt, tdt) only, not to --model tiny-ctc" in \
        _train_error(capsys, *_train_args(corpus, out, "--loss", "fused"))
    args = _train_args(corpus, out)
    args[args.index("--cuts") + 1] = str(tmp_path)
    assert f"--cuts {tmp_path}: is a folder" in _train_error(capsys, *args)
    args = _train_args(corpus, out)
    args[args.index("--tokenizer") + 1] = str(tmp_path)
    assert f"{tmp_path}: is a folder; give the tokenizer's .model file" in _train_error(capsys, *args)
    assert not out.exists()


@pytest.mark.parametrize("change,needle", [
    (lambda cut: cut["supervisions"][0].update(text=42), "field 'supervisions[0].text' = 42; it must be a string"),
    (lambda cut: cut.update(custom=[5]), "field 'custom' = [5]; it must be an object"),
    (lambda cut: cut.update(supervisions={"text": "abc"}), "field 'supervisions' = {'text': 'abc'}")])
def test_train_names_the_manifest_line_of_a_field_of_the_wrong_type(corpus, tmp_path, capsys, change, needle):
    import gzip

    cuts_path, tokenizer_path = corpus
    lines = gzip.open(cuts_path, "rt").read().splitlines()
    cut = json.loads(lines[1])
    change(cut)
    lines[1] = json.dumps(cut)
    bad = tmp_path / "cuts.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "run"
    err = _train_error(capsys, *_train_args((bad, tokenizer_path), out, "--steps", "2", "--num-workers", "0"))
    assert f"{bad}:2: cut " in err and needle in err
    assert not out.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all", None])
def test_resume_from_a_truncated_or_garbage_state_is_one_line(corpus, tmp_path, capsys, content):
    assert main(_train_args(corpus, tmp_path, "--steps", "2", "--save-every", "1")) == 0
    capsys.readouterr()
    state = tmp_path / "train_state.pt"
    state.write_bytes(state.read_bytes()[:1000] if content is None else content)
    err = _train_error(capsys, *_train_args(corpus, tmp_path, "--steps", "3", "--resume"))
    assert f"--resume: {state} is not a training state written by `workbench train`" in err
    assert "weights_only" not in err  # never advise loading untrusted pickles


def test_train_warns_at_start_and_end_when_the_profile_drops_much_of_the_corpus(corpus, tmp_path, capsys):
    profile = tmp_path / "short.yaml"  # the tone corpus runs 0.5-1 s: a 0.7 s top bin drops many cuts
    save_profile(profile, BucketProfile(bucket_duration_bins=[0.7], bucket_batch_size=[2]))
    assert main(_train_args(corpus, tmp_path / "run", "--steps", "2", "--profile", str(profile),
                            "--no-concurrent")) == 0
    printed = capsys.readouterr().out
    warnings = [line for line in printed.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "by the profile's bins" in warnings[0] and "in training" in warnings[1]
    assert "left out" in warnings[0] and "fitting no bucket" in warnings[0] and "too_long" in warnings[0]
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["corpus_fit"]["unfit"] == summary["corpus_fit"]["reasons"]["too_long"] > 0
    err = _train_error(capsys, *_train_args(corpus, tmp_path / "strict", "--steps", "2", "--profile", str(profile),
                                            "--strict"))
    assert "(--strict)" in err and not (tmp_path / "strict").exists()


def test_an_error_in_a_data_loader_worker_is_one_line(corpus, tmp_path, capsys):
    import gzip

    cuts_path, _ = corpus
    lines = gzip.open(cuts_path, "rt").read().splitlines()
    broken = json.loads(lines[1])
    broken["recording"]["sources"][0]["source"] = str(tmp_path / "gone.flac")  # the first cut still has audio
    damaged = tmp_path / "cuts.jsonl.gz"
    with gzip.open(damaged, "wt") as f:
        f.write("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    args = _train_args(corpus, tmp_path / "run", "--num-workers", "1", "--steps", "20")
    args[args.index("--cuts") + 1] = str(damaged)
    err = _train_error(capsys, *args)
    assert "reading a batch: cut" in err and "has no audio" in err and "worker" not in err


def test_train_max_seconds_stops_launching_steps_after_the_wall_time(corpus, tmp_path, monkeypatch):
    import time

    from workbench.training import recipe

    cuts_path, tokenizer_path = corpus
    launch = recipe.train_one_step

    def slow_step(run, host_batch, *, data_s):  # each step takes at least 0.3 s of wall time
        time.sleep(0.3)
        return launch(run, host_batch, data_s=data_s)

    monkeypatch.setattr(recipe, "train_one_step", slow_step)
    config = recipe.TrainConfig(cuts=str(cuts_path), tokenizer=str(tokenizer_path), out_dir=str(tmp_path),
                                model="tiny-ctc", steps=100, max_duration=6, num_buckets=2, dtype="fp32",
                                device="cpu", num_workers=0, max_seconds=1.0)
    summary = recipe.train(config)
    # 1 s / 0.3 s per step: stopped by the clock, not by --steps (a loaded machine may fit only one step)
    assert 1 <= summary["steps"] <= 5
    assert len((tmp_path / "train_log.jsonl").read_text().splitlines()) == summary["steps"]
    with pytest.raises(ValueError, match="--max-seconds"):
        recipe.train(recipe.TrainConfig(cuts=str(cuts_path), tokenizer=str(tokenizer_path),
                                        out_dir=str(tmp_path), max_seconds=-1))


def test_a_run_folder_is_never_mixed_with_another_run(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train_args(corpus, out, "--steps", "2", "--save-every", "1", "--num-workers", "0")) == 0
    state = (out / "train_state.pt").read_bytes()
    err = _train_error(capsys, *_train_args(corpus, out, "--steps", "2", "--num-workers", "0"))
    assert f"--out {out}: holds a run (model.pt, train_state.pt, train_summary.json)" in err
    assert (out / "train_state.pt").read_bytes() == state  # refused: nothing touched
    assert "choose one" in _train_error(capsys, *_train_args(corpus, out, "--resume", "--overwrite"))
    assert main(_train_args(corpus, out, "--steps", "2", "--num-workers", "0", "--overwrite")) == 0
    assert not (out / "train_state.pt").exists()  # the old run's state cannot be resumed into the new one


def test_resume_refuses_an_input_rewritten_at_the_same_path(corpus, tmp_path, capsys):
    """The state records the SHA-256 of the manifest, tokenizer and profile bytes: a tokenizer retrained, or a
    manifest rewritten, at the path the run was trained with is named, and nothing of the run is touched."""
    import gzip
    import shutil

    from workbench.data.tokenizer import train_tokenizer

    cuts_src, tokenizer_src = corpus
    cuts, tokenizer = tmp_path / "cuts.jsonl.gz", tmp_path / "tok.model"
    shutil.copy(cuts_src, cuts)
    shutil.copy(tokenizer_src, tokenizer)
    out = tmp_path / "run"
    args = _train_args((cuts, tokenizer), out, "--steps", "3", "--num-workers", "0")
    assert main(_train_args((cuts, tokenizer), out, "--steps", "2", "--save-every", "1", "--num-workers", "0")) == 0
    run_files = {p.name: p.read_bytes() for p in out.iterdir()}
    original = tokenizer.read_bytes()
    # the same eight letters and vocabulary size, other frequencies: another model at the same path
    train_tokenizer(["a" * 40 + " " + "bcdefgh"] * 3, tmp_path / "tok", 10, model_type="char", progress=False)
    assert tokenizer.read_bytes() != original
    err = _train_error(capsys, *args, "--resume")
    assert "--resume: the tokenizer (--tokenizer) is not the one" in err and "contents changed" in err
    tokenizer.write_bytes(original)
    with gzip.open(cuts, "rt") as f:
        lines = f.read().splitlines()
    with gzip.open(cuts, "wt") as f:  # the same cuts in another order: another corpus for a resume
        f.write("\n".join(lines[::-1]) + "\n")
    err = _train_error(capsys, *args, "--resume")
    assert "--resume: the corpus manifest (--cuts) is not the one" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == run_files
    with gzip.GzipFile(cuts, "wb", mtime=12345) as f:  # the same cuts recompressed: another gzip header
        f.write(("\n".join(lines) + "\n").encode())
    assert cuts.read_bytes() != cuts_src.read_bytes()
    assert main([*args, "--resume"]) == 0  # the inputs as they were: the run continues
    assert [r["step"] for r in _log(out)] == [0, 1, 2]


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_the_sampler_is_closed_however_training_stops(corpus, tmp_path, monkeypatch, error):
    """A Ctrl-C or a crash mid-epoch still stops the sampler's filling thread, so the process can exit."""
    from workbench.training import recipe

    closed, one_step = [], recipe.train_one_step

    def crash_on_third(run, host_batch, **kw):
        if run.step == 2:
            raise error("stopped")
        return one_step(run, host_batch, **kw)

    monkeypatch.setattr(recipe, "train_one_step", crash_on_third)
    monkeypatch.setattr(recipe, "close_sampler", lambda sampler: closed.append(sampler))
    with pytest.raises(error):
        recipe.train(recipe.TrainConfig(cuts=str(corpus[0]), tokenizer=str(corpus[1]), out_dir=str(tmp_path / "run"),
                                        model="tiny-ctc", max_duration=2.0, num_buckets=2, dtype="fp32",
                                        device="cpu", warmup_steps=2, steps=6, num_workers=0))
    assert len(closed) == 1


def test_train_a_transducer_with_the_fused_loss(corpus, tmp_path):
    out = tmp_path / "fused"
    assert main(_train_args(corpus, out, "--model", "tiny-rnnt", "--loss", "fused", "--steps", "2",
                            "--log-every", "1")) == 0
    assert load_checkpoint(out / "model.pt").config.joint_loss == "fused"
    assert all(np.isfinite(record["loss"]) for record in _log(out))
