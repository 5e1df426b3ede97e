"""Batches drawn ahead across epoch ends: the order and epochs of a sampler iterated epoch by epoch, no
data wait at an epoch's start when the sampler is slow to start one, and a resume that continues exactly
whatever the thread had drawn ahead."""

import json
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from workbench.bucketing import BucketProfile, make_sampler, save_profile
from workbench.data import cuts_from_arrays
from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus
from workbench.training import recipe
from workbench.training.epochs import EpochBatches

pytestmark = pytest.mark.filterwarnings("ignore:You are using DynamicBucketingSampler with an eagerly")
EPOCH_START_S = 0.6  # the slow sampler's sleep at the start of each epoch
STEP_S = 0.15        # the slow step's sleep: an epoch of 7 steps trains for longer than an epoch start


def _sampler(num_cuts=40, seed=0):
    durations = np.random.default_rng(seed).uniform(1, 10, num_cuts)
    cuts = cuts_from_arrays(durations, (durations * 3).astype(int) + 1)
    profile = BucketProfile([[3.0, 20], [6.0, 40], [10.0, 60]], [4, 3, 2])
    return make_sampler(cuts, profile, concurrent=False, seed=seed, buffer_size=100)


def _ids(cuts):
    return [c.id for c in cuts]


def test_batches_follow_the_epochs_of_the_sampler_in_order_with_their_positions():
    expected = []
    for epoch in range(3):
        sampler = _sampler()
        sampler.set_epoch(epoch)
        expected += [(epoch, index, _ids(b)) for index, b in enumerate(sampler)]
    batches = EpochBatches(_sampler(), depth=4)
    drawn = iter(batches)
    got = [next(drawn) for _ in range(len(expected))]
    batches.stop()
    assert [(b.epoch, b.index, _ids(b.cuts)) for b in got] == expected
    assert len({e for e, _, _ in expected}) == 3 and expected[0][2] != expected[len(expected) // 3][2]


def test_a_new_iteration_starts_where_start_at_says_and_an_empty_epoch_ends_it():
    batches = EpochBatches(_sampler(), depth=2)
    batches.start_at(5, 0)
    first = next(iter(batches))
    assert (first.epoch, first.index) == (5, 0)
    batches.stop()
    empty = make_sampler(cuts_from_arrays(np.array([30.0]), np.array([5])),  # fits no bucket
                         BucketProfile([[3.0, 20]], [4]), concurrent=False)
    assert list(EpochBatches(empty)) == []
    with pytest.raises(ValueError, match="depth"):
        EpochBatches(empty, depth=0)
    with pytest.raises(ValueError, match="index"):
        batches.start_at(0, -1)


def test_an_error_while_drawing_reaches_the_reader():
    class Broken:
        def set_epoch(self, epoch):
            raise RuntimeError(f"no epoch {epoch}")

    with pytest.raises(RuntimeError, match="no epoch 0"):
        list(EpochBatches(Broken()))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tones")
    cuts_path = write_tone_corpus(root, 12, seed=0, min_letters=3, max_letters=6)  # 7 batches of <= 2 s
    return cuts_path, train_letter_tokenizer(root / "letters")


def _config(corpus, out, **kw):
    settings = dict(model="tiny-ctc", max_duration=2.0, num_buckets=2, dtype="fp32", device="cpu",
                    warmup_steps=2, num_workers=0, log_cut_ids=True, log_every=1)
    return recipe.TrainConfig(cuts=str(corpus[0]), tokenizer=str(corpus[1]), out_dir=str(out), **{**settings, **kw})


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _slow_epoch_starts(monkeypatch) -> list[tuple[float, float]]:
    """The recipe's sampler sleeps EPOCH_START_S at the start of each epoch (as lhotse's does while it fills
    its bucket buffer); each step takes STEP_S longer. Returns the list that collects each step's start and
    end times (seconds, time.perf_counter)."""
    make_batches, launch = recipe.make_batches, recipe.train_one_step

    def slow_sampler(*args, **kw):
        sampler = make_batches(*args, **kw)

        class SlowStart(type(sampler)):
            def __iter__(self):
                if not self._just_restored_state:
                    time.sleep(EPOCH_START_S)
                return super().__iter__()
        sampler.__class__ = SlowStart
        return sampler

    times = []

    def slow_step(run, host_batch, *, data_s):
        started = time.perf_counter()
        time.sleep(STEP_S)
        launched = launch(run, host_batch, data_s=data_s)
        times.append((started, time.perf_counter()))
        return launched

    monkeypatch.setattr(recipe, "make_batches", slow_sampler)
    monkeypatch.setattr(recipe, "train_one_step", slow_step)
    return times


@pytest.mark.parametrize("workers", [0, 2])
def test_a_slow_epoch_start_is_drawn_ahead_while_the_epoch_before_trains(corpus, tmp_path, monkeypatch, workers):
    times = _slow_epoch_starts(monkeypatch)
    recipe.train(_config(corpus, tmp_path, steps=22, num_workers=workers))
    log = _log(tmp_path)
    starts = [r["step"] for r in log if r["step"] > 0 and r["epoch"] != log[r["step"] - 1]["epoch"]]
    assert [log[step]["epoch"] for step in starts] == [1, 2, 3]
    assert all(0 < r["host_s"] == r["step_s"] for r in log)  # on the CPU the step's time is the host's
    assert sum(r["host_cpu_s"] for r in log) > 0 and all(r["host_preemptions"] >= 0 for r in log)
    # the wall time between a step's end and the next one's start, and what the log says the step waited
    gaps = [round(times[step][0] - times[step - 1][1], 3) for step in starts]
    logged = [round(log[step]["data_s"], 3) for step in starts]
    print(f"first step's data wait {log[0]['data_s']:.3f} s; at the next epochs' first steps: {gaps} s between "
          f"steps, {logged} s logged")
    assert log[0]["data_s"] >= EPOCH_START_S  # the run's first epoch start cannot be hidden, and is logged
    # each later epoch's start was drawn while the epoch before trained (7 x STEP_S, longer than its start)
    assert max(gaps) < EPOCH_START_S / 2 and max(logged) < EPOCH_START_S / 2, (gaps, logged)


@pytest.mark.parametrize("profile", [False, True])
@pytest.mark.parametrize("where", ["mid-epoch", "epoch end"])
def test_a_resume_continues_the_batches_drawn_ahead_into_the_next_epochs(corpus, tmp_path, monkeypatch, where,
                                                                         profile):
    """Saved in the middle of the first epoch, or at the end of the second, while the thread had drawn into
    later epochs: the resumed run trains the uninterrupted run's batches, epochs and losses (with lhotse's
    max_duration sampler, or a profile's without concurrent bucketing)."""
    if profile:
        path = tmp_path / "profile.yaml"  # the tone corpus runs 0.5-1.2 s: both buckets hold cuts
        save_profile(path, BucketProfile(bucket_duration_bins=[0.8, 10.0], bucket_batch_size=[3, 2]))
        kw = dict(profile=str(path), concurrent=False)
    else:
        kw = {}
    straight = recipe.train(_config(corpus, tmp_path / "straight", steps=20, num_workers=2, **kw))
    whole = _log(tmp_path / "straight")
    per_epoch = [sum(r["epoch"] == e for r in whole) for e in range(2)]
    stop = per_epoch[0] // 2 if where == "mid-epoch" else sum(per_epoch)
    assert whole[-1]["epoch"] >= 2 and 0 < stop < 20
    drawn_at_save, save, launch = [], recipe.save_training_state, recipe.train_one_step

    def saving(path, run):  # once the thread has drawn into a later epoch (a loaded machine may take a while)
        deadline = time.monotonic() + 60
        while run.sampler.diagnostics.current_epoch <= run.epoch and time.monotonic() < deadline:
            time.sleep(0.01)
        with run.batches.lock:
            drawn_at_save.append(run.sampler.diagnostics.current_epoch)
        return save(path, run)

    def crash_after_checkpoint(run, host_batch, **kw):
        if run.step == stop:
            raise RuntimeError("simulated crash")
        return launch(run, host_batch, **kw)

    monkeypatch.setattr(recipe, "save_training_state", saving)
    monkeypatch.setattr(recipe, "train_one_step", crash_after_checkpoint)
    config = _config(corpus, tmp_path / "split", steps=20, save_every=stop, num_workers=2, **kw)
    with pytest.raises(RuntimeError, match="simulated crash"):
        recipe.train(config)
    assert len(drawn_at_save) == 1 and drawn_at_save[0] > whole[stop - 1]["epoch"]  # drawn into a later epoch
    monkeypatch.setattr(recipe, "train_one_step", launch)
    resumed = recipe.train(replace(config, resume=True))
    split = _log(tmp_path / "split")
    assert [r["step"] for r in split] == list(range(20))
    assert [(r["epoch"], r["cut_ids"]) for r in split] == [(r["epoch"], r["cut_ids"]) for r in whole]
    np.testing.assert_allclose(resumed["losses"], straight["losses"], rtol=1e-5)
    a, b = (torch.load(tmp_path / d / "model.pt", weights_only=True)["state_dict"] for d in ("straight", "split"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def _train_epochs(tmp_path, device: str, model: str, *, num_cuts: int, letters: tuple[int, int], batch_size: int,
                  steps: int) -> tuple[dict, list[dict]]:
    """``model`` trained on ``num_cuts`` tone utterances of ``letters`` letters (0.16 s each) with a one-bucket
    profile of ``batch_size``, 4 workers, without concurrent bucketing (lhotse's filling thread waits in
    whole seconds at each epoch start, longer than an epoch of a small corpus trains); the summary and log."""
    cuts = write_tone_corpus(tmp_path / "tones", num_cuts, seed=3, min_letters=letters[0], max_letters=letters[1])
    tokenizer = train_letter_tokenizer(tmp_path / "letters")
    profile = save_profile(tmp_path / "profile.yaml", BucketProfile([0.2 * letters[1] + 1.0], [batch_size]))
    summary = recipe.train(recipe.TrainConfig(
        cuts=str(cuts), tokenizer=str(tokenizer), out_dir=str(tmp_path / "run"), model=model, profile=str(profile),
        steps=steps, warmup_steps=2, lr=1e-4, dtype="bf16", device=device, num_workers=4, concurrent=False,
        log_every=10))
    return summary, _log(tmp_path / "run")


def _wait_after_first_epoch(log: list[dict]) -> tuple[float, float, list[float]]:
    """Seconds of data wait and of steps over the epochs after the first, and the waits at their starts."""
    after = [r for r in log if r["epoch"] >= 1]
    starts = [round(r["data_s"], 4) for r in after if r["epoch"] != log[r["step"] - 1]["epoch"]]
    return sum(r["data_s"] for r in after), sum(r["step_s"] for r in after), starts


@pytest.mark.gpu
def test_gpu_data_wait_after_the_first_epoch_is_under_5_percent_of_the_step(tmp_path):
    """The device's idle gap before each step (data_s, from CUDA events) over the epochs after the first
    (warm-up: kernels chosen, memory grown), against the steps' device time. Batches of 32 utterances of
    18-21 s keep large-rnnt's step on the GPU longer than its launch on the host; 6 batches an epoch."""
    summary, log = _train_epochs(tmp_path, "cuda", "large-rnnt", num_cuts=192, letters=(110, 130), batch_size=32,
                                 steps=30)
    assert summary["steps"] == 30 and log[-1]["epoch"] >= 4 and summary["out_of_memory"] == []
    data_s, step_s, starts = _wait_after_first_epoch(log)
    print(f"data wait after the first epoch: {data_s:.3f} s of {data_s + step_s:.3f} s; at epoch starts {starts} s")
    assert len(starts) >= 3 and data_s < 0.05 * step_s, (data_s, step_s, starts)
