"""`workbench train` when a step runs out of memory: the batch is trained in parts (every utterance once, the
whole batch's gradient), one warning line, the bucket's batch size lowered for the rest of the run, kept by
--resume and listed in the summary; one utterance that does not fit alone is a one-line error."""

import collections
import re
import json
import logging
import math

import pytest
import torch
from lhotse import CutSet

from limited_memory_model import LimitedMemory, ids_by_audio
from workbench.bucketing import BucketProfile, save_profile
from workbench.cli import main
from workbench.data.tokenizer import load_tokenizer
from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus
from workbench.training import recipe
from workbench.training.collate import CutBatchDataset
from workbench.training.distributed import Ranks


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tones")
    cuts_path = write_tone_corpus(root, 16, seed=1, min_letters=3, max_letters=6)
    tokenizer_path = train_letter_tokenizer(root / "letters")
    return cuts_path, tokenizer_path, ids_by_audio(cuts_path, tokenizer_path)


@pytest.fixture
def limited(corpus, monkeypatch):
    """``limited(max_utterances, never_fits=())``: the recipe builds models that run out of memory so (the
    one made before stops recording)."""
    made = []

    def make(max_utterances=10**9, **kw):
        for memory in made:
            memory.close()
        memory = LimitedMemory(corpus[2], max_utterances, **kw)
        made.append(memory)
        monkeypatch.setattr(recipe, "build_model", memory.build)
        return memory
    yield make
    for memory in made:
        memory.close()


def _profile(tmp_path, sizes=(4, 4)):
    path = tmp_path / "profile.yaml"  # the tone corpus runs 0.5-1.2 s: both buckets hold cuts
    save_profile(path, BucketProfile(bucket_duration_bins=[0.8, 10.0], bucket_batch_size=list(sizes)))
    return path


def _config(corpus, out, profile=None, **kw):
    cuts_path, tokenizer_path, _ = corpus
    settings = dict(model="tiny-ctc", steps=8, dtype="fp32", device="cpu", num_workers=0, warmup_steps=2,
                    concurrent=False, log_cut_ids=True, log_every=1)
    settings.update(kw)
    return recipe.TrainConfig(cuts=str(cuts_path), tokenizer=str(tokenizer_path), out_dir=str(out),
                              profile=None if profile is None else str(profile), **settings)


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _bucket(duration):
    return 0 if duration <= 0.8 else 1


def test_a_batch_out_of_memory_is_trained_in_parts_and_its_bucket_lowered(corpus, tmp_path, limited, caplog):
    memory = limited(max_utterances=2)
    caplog.set_level(logging.WARNING, logger="workbench.training.recipe")
    summary = recipe.train(_config(corpus, tmp_path / "run", _profile(tmp_path), steps=10, save_every=5))
    log = _log(tmp_path / "run")
    batches = [ids for r in log for ids in r["cut_ids"]]
    # every utterance of every batch trained exactly once, by the step that drew it
    assert memory.steps == batches
    assert collections.Counter(memory.trained) == collections.Counter(cut for ids in batches for cut in ids)
    assert set(memory.trained) == {c.id for c in CutSet.from_file(corpus[0])}  # more than one epoch
    assert max(memory.forward_sizes) == 4 and 3 not in memory.forward_sizes[-3:]
    events = summary["out_of_memory"]
    assert sorted(e["bucket"] for e in events) == [0, 1]  # each bucket ran out once, then fit
    lines = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(lines) == len(events) == 2
    durations = {c.id: c.duration for c in CutSet.from_file(corpus[0])}
    for event, line in zip(events, lines):
        record = log[event["step"]]
        assert record["batch_size"] == event["batch_size"] > 2 and record["parts"] == event["parts"]
        assert sum(event["parts"]) == event["batch_size"] and max(event["parts"]) <= 2
        assert event["lowered_to"] == 2 and event["bucket_bounds"] == [0.8, 10.0][event["bucket"]]
        bounds = "<= 0.8 s" if event["bucket"] == 0 else "<= 10 s"
        assert (f"step {event['step']}: out of memory on a batch of {event['batch_size']} utterances from bucket "
                f"{event['bucket']} ({bounds}); trained it in {len(event['parts'])} parts") in line
        assert line.endswith("lowered the bucket's batch size to 2 for the rest of the run")
        assert "\n" not in line
        later = [r for r in log[event["step"] + 1:] if _bucket(durations[r["cut_ids"][0][0]]) == event["bucket"]]
        assert later and all(r["batch_size"] <= 2 and "parts" not in r for r in later)
    assert summary["lowered_batch_sizes"] == {"0": 2, "1": 2}
    assert summary["profile_fix"] == "bucket_batch_size: [2, 2]"
    assert any("lowered bucket_batch_size[0] 4 -> 2, bucket_batch_size[1] 4 -> 2" in w and
               "bucket_batch_size: [2, 2]" in w for w in summary["warnings"])
    saved = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert saved["out_of_memory"] == events and saved["profile_fix"] == summary["profile_fix"]
    state = torch.load(tmp_path / "run" / recipe.STATE_FILE, weights_only=True)
    assert state["out_of_memory"] == events


def test_with_concurrent_bucketing_a_lowering_trains_every_utterance_once_per_epoch(corpus, tmp_path, limited):
    """A concurrent sampler's epoch cannot be replayed exactly: its size changes where its thread stands,
    and the batches drawn ahead with the old size are trained in parts."""
    memory = limited(max_utterances=2)
    summary = recipe.train(_config(corpus, tmp_path / "run", _profile(tmp_path), steps=10, concurrent=True))
    log = _log(tmp_path / "run")
    batches = [ids for r in log for ids in r["cut_ids"]]
    assert memory.steps == batches
    assert collections.Counter(memory.trained) == collections.Counter(cut for ids in batches for cut in ids)
    everyone = {c.id for c in CutSet.from_file(corpus[0])}
    epochs = sorted({r["epoch"] for r in log})
    assert len(epochs) > 1
    for epoch in epochs:
        cuts = [cut for r in log if r["epoch"] == epoch for ids in r["cut_ids"] for cut in ids]
        assert len(cuts) == len(set(cuts))  # none twice in an epoch
        if epoch != epochs[-1]:
            assert set(cuts) == everyone  # none left out of a whole epoch
    lowered = [e for e in summary["out_of_memory"] if e["lowered_to"]]
    assert lowered and all((e["from_epoch"], e["from_batch"]) >= (e["epoch"], 0) for e in lowered)


def test_the_gradient_of_a_step_trained_in_parts_is_the_whole_batch_gradient(corpus, tmp_path, limited):
    cuts_path, tokenizer_path, _ = corpus
    cuts = CutSet.from_file(cuts_path)
    profile = BucketProfile(bucket_duration_bins=[10.0], bucket_batch_size=[16])
    host_batch = CutBatchDataset(str(tokenizer_path))[cuts.subset(first=7)]
    gradients, losses = [], []
    for max_utterances in (100, 2):
        memory = limited(max_utterances)
        config = _config(corpus, tmp_path / str(max_utterances))
        run = recipe.start_run(config, Ranks(), torch.device("cpu"), load_tokenizer(tokenizer_path), cuts, profile)
        parts = recipe.forward_backward(run, host_batch)
        gradients.append({name: p.grad.clone() for name, p in run.model.named_parameters() if p.grad is not None})
        losses.append(float(parts.loss))
        assert memory.pending == host_batch["cut_ids"] and len(parts.part_sizes) == (1 if max_utterances > 7 else 4)
    assert gradients[0].keys() == gradients[1].keys() and len(gradients[0]) > 5
    for name, whole in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], whole, rtol=1e-4, atol=1e-6)
    assert math.isclose(losses[0], losses[1], rel_tol=1e-5)


def test_resume_keeps_the_lowered_batch_sizes_and_the_batches(corpus, tmp_path, limited):
    memory = limited(max_utterances=2)
    straight = recipe.train(_config(corpus, tmp_path / "straight", _profile(tmp_path), steps=10))
    straight_log, straight_steps = _log(tmp_path / "straight"), memory.steps
    stop = straight["out_of_memory"][0]["step"] + 2  # saved after the first lowering, in the same epoch
    memory = limited(max_utterances=2)
    recipe.train(_config(corpus, tmp_path / "split", _profile(tmp_path), steps=stop, save_every=stop))
    before = memory.steps
    memory = limited(max_utterances=2)
    resumed = recipe.train(_config(corpus, tmp_path / "split", _profile(tmp_path), steps=10, save_every=stop,
                                   resume=True))
    split_log = _log(tmp_path / "split")
    assert [r["cut_ids"] for r in split_log] == [r["cut_ids"] for r in straight_log]
    assert before + memory.steps == straight_steps  # the same utterances, each trained once
    assert resumed["out_of_memory"] == straight["out_of_memory"]
    assert resumed["lowered_batch_sizes"] == straight["lowered_batch_sizes"] != {}
    # the resumed run's sampler draws with the lowered sizes: no batch after the resume is split
    assert all("parts" not in r for r in split_log[stop:])


def test_without_a_profile_the_batch_is_trained_in_parts_and_max_duration_named(corpus, tmp_path, limited, caplog):
    memory = limited(max_utterances=1)
    caplog.set_level(logging.WARNING, logger="workbench.training.recipe")
    summary = recipe.train(_config(corpus, tmp_path / "run", max_duration=3.0, num_buckets=2, steps=3))
    log = _log(tmp_path / "run")
    assert memory.steps == [ids for r in log for ids in r["cut_ids"]]
    assert summary["out_of_memory"] and summary["lowered_batch_sizes"] == {} and summary["profile_fix"] is None
    lines = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(lines) == len(summary["out_of_memory"])
    assert "from lhotse's --max-duration batches (no profile)" in lines[0] and lines[0].endswith("lower --max-duration")
    assert any("lower --max-duration (now 3)" in w for w in summary["warnings"])


def test_one_utterance_that_does_not_fit_alone_is_a_one_line_error_with_the_state_saved(corpus, tmp_path, limited,
                                                                                        capsys):
    cuts_path, tokenizer_path, _ = corpus
    cuts = sorted(CutSet.from_file(cuts_path), key=lambda c: c.duration)
    too_large = cuts[-1]  # the longest: bucket 1
    memory = limited(max_utterances=2, never_fits={too_large.id})
    out = tmp_path / "run"
    code = main(["train", "--cuts", str(cuts_path), "--tokenizer", str(tokenizer_path), "--out", str(out),
                 "--model", "tiny-ctc", "--profile", str(_profile(tmp_path)), "--steps", "20", "--dtype", "fp32",
                 "--device", "cpu", "--num-workers", "0", "--no-concurrent", "--save-every", "100"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workbench train: error: out of memory at step ")
    assert err.endswith("--resume it with --joint-chunk-size\n")
    assert (f"on one utterance alone, {too_large.id!r} ({too_large.duration:.2f} s, " in err
            and "from bucket 1 (<= 10 s, " not in err and "from bucket 1 (<= 10 s)" in err)
    assert "it cannot be split" in err and f"saved the training state before it to {out / 'train_state.pt'}" in err
    assert "Traceback" not in err
    state = torch.load(out / "train_state.pt", weights_only=True)
    step = int(err.split("out of memory at step ")[1].split(" ")[0])
    assert state["step"] == step == len(memory.steps) and len(state["records"]) == step
    assert not (out / "model.pt").exists() and not (out / "train_summary.json").exists()
    assert not (out / "train_log.jsonl").exists()
    other = tmp_path / "run_unsaved"  # without --save-every the run keeps no state: nothing is written
    assert main(["train", "--cuts", str(cuts_path), "--tokenizer", str(tokenizer_path), "--out", str(other),
                 "--model", "tiny-ctc", "--profile", str(_profile(tmp_path)), "--steps", "20", "--dtype", "fp32",
                 "--device", "cpu", "--num-workers", "0", "--no-concurrent"]) == 2
    err = capsys.readouterr().err
    assert "it cannot be split" in err and "saved" not in err and not (other / "train_state.pt").exists()


def _step_bytes(model, optimizer, host_batch) -> int:
    """Device bytes one bf16 training step on ``host_batch`` needs above what is allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    batch = {k: v.cuda() for k, v in host_batch.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss, batch
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.gpu
def test_gpu_training_with_a_profile_too_large_trains_every_utterance_once(tmp_path, monkeypatch, caplog):
    """A profile whose batch size is 1.5x what fits under a memory limit: real out-of-memory errors, each such
    batch trained in parts, every utterance once, the bucket's size lowered to one that fits."""
    from workbench.memory import configure_allocator
    from workbench.memory.oom import release_memory
    from workbench.training.collate import collate_cuts

    configure_allocator()  # what train() does first: measure under the settings training runs under

    # 96 utterances of 40 letters: one duration (6.5 s) and token count, so memory depends on batch size only
    cuts_path = write_tone_corpus(tmp_path / "tones", 96, seed=2, min_letters=40, max_letters=40)
    tokenizer_path = train_letter_tokenizer(tmp_path / "letters")
    tokenizer = load_tokenizer(tokenizer_path)
    cuts = CutSet.from_file(cuts_path)
    fits, too_large = 32, 48
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = recipe.build_model("large-rnnt", vocab_size=tokenizer.vocab_size()).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    host = {n: collate_cuts(cuts.subset(first=n), tokenizer) for n in (1, fits, too_large)}
    _step_bytes(model, optimizer, host[1])  # optimizer state and library workspaces exist from here on
    need = {n: _step_bytes(model, optimizer, host[n]) for n in (fits, too_large)}
    assert need[too_large] - need[fits] > 2**28, need  # a margin of 128 MiB on each side of the limit
    release_memory()
    settled = torch.cuda.memory_reserved()  # weights, optimizer state, and what earlier tests left behind
    del model, optimizer
    release_memory()
    limit = settled + (need[fits] + need[too_large]) // 2  # a batch of `fits` fits, one of `too_large` does not
    profile = tmp_path / "profile.yaml"
    save_profile(profile, BucketProfile(bucket_duration_bins=[20.0], bucket_batch_size=[too_large]))
    memory = LimitedMemory(ids_by_audio(cuts_path, tokenizer_path), batch_norm=True)  # only the GPU's limit
    monkeypatch.setattr(recipe, "build_model", memory.build)
    caplog.set_level(logging.WARNING, logger="workbench.training.recipe")
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total, torch.cuda.current_device())
    try:
        summary = recipe.train(recipe.TrainConfig(
            cuts=str(cuts_path), tokenizer=str(tokenizer_path), out_dir=str(tmp_path / "run"), model="large-rnnt",
            profile=str(profile), steps=6, device="cuda", dtype="bf16", num_workers=0, concurrent=False,
            log_cut_ids=True, warmup_steps=1))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
        memory.close()
    log = _log(tmp_path / "run")
    batches_trained = [ids for r in log for ids in r["cut_ids"]]
    assert memory.steps == batches_trained  # every utterance of every batch, once, in the step that drew it
    assert collections.Counter(memory.trained) == collections.Counter(c for ids in batches_trained for c in ids)
    assert set(memory.trained) == {c.id for c in cuts}  # 2 x 48 a first epoch, at most 24 each after
    events = summary["out_of_memory"]  # the first step may fit: the optimizer state is made at its end
    assert events and events[0]["batch_size"] == too_large and events[0]["step"] <= 1
    assert 1 <= summary["lowered_batch_sizes"]["0"] <= fits
    assert all(r["batch_size"] <= summary["lowered_batch_sizes"]["0"] for r in log[events[-1]["step"] + 1:])
    lines = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(lines) == len(events) and "from bucket 0 (<= 20 s)" in lines[0]


def test_under_torchrun_a_batch_out_of_memory_is_a_one_line_error(corpus, tmp_path, limited):
    cuts_path, tokenizer_path, _ = corpus
    cuts = CutSet.from_file(cuts_path)
    limited(max_utterances=2)
    profile = BucketProfile(bucket_duration_bins=[10.0], bucket_batch_size=[16])
    profile_path = save_profile(tmp_path / "p.yaml", profile)  # the run records the digest of its profile
    run = recipe.start_run(_config(corpus, tmp_path, profile=str(profile_path)), Ranks(), torch.device("cpu"),
                           load_tokenizer(tokenizer_path), cuts, profile)
    run.ranks = Ranks(0, 2, 0)  # every rank must run the same backward passes: nothing is split
    host_batch = CutBatchDataset(str(tokenizer_path))[cuts.subset(first=4)]
    with pytest.raises(ValueError, match=r"^out of memory at step 0 on a batch of 4 utterances from bucket 0 "
                                         r"\(<= 10 s\); under torchrun batches are not split: lower that bucket's "
                                         r"batch size in --profile " + re.escape(str(profile_path)) + "$"):
        recipe.forward_backward(run, host_batch)
