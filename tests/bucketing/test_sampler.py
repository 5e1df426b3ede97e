import logging

import numpy as np
import pytest

from workbench.bucketing import BucketProfile, close_sampler, make_fitter, make_sampler
from workbench.bucketing.constraint import BucketBatchSizeConstraint
from workbench.data import cuts_from_arrays

pytestmark = pytest.mark.filterwarnings("ignore:You are using DynamicBucketingSampler with an eagerly")


def _corpus(n=600, seed=0):
    rng = np.random.default_rng(seed)
    d = np.round(rng.uniform(0.5, 12.0, n), 2)
    t = np.maximum(1, (d * rng.uniform(2, 4, n)).astype(int))
    d[:3] = [13.0, 14.0, 20.0]  # too long for the profile below
    t[3:5] = [400, 300]  # tokens per second far above the limit
    return d, t


PROFILE_2D = BucketProfile(bucket_duration_bins=[[4.0, 10], [4.0, 20], [8.0, 25], [8.0, 40], [12.0, 60]],
                           bucket_batch_size=[16, 9, 7, 5, 3], max_tps=[6.0, 6.0, 5.5, 5.5, 5.0])


def _check_epoch(sampler, profile, d, t):
    fitter = make_fitter([tuple(b) for b in profile.bucket_duration_bins] if profile.is_2d
                         else profile.bucket_duration_bins, profile.max_tps)
    expected_idx, reason = fitter.assign(d, t)
    seen = []
    for batch in sampler:
        buckets = {expected_idx[int(c.id[1:])] for c in batch}
        assert len(buckets) == 1, f"a batch mixes buckets {buckets}"
        b = buckets.pop()
        assert b >= 0
        assert 1 <= len(batch) <= profile.bucket_batch_size[b]
        seen += [c.id for c in batch]
    return seen, expected_idx, reason


@pytest.mark.parametrize("concurrent", [False, True])
def test_every_batch_respects_its_bucket_and_unfit_are_reported(concurrent, caplog):
    d, t = _corpus()
    cuts = cuts_from_arrays(d, t)
    sampler = make_sampler(cuts, PROFILE_2D, concurrent=concurrent, buffer_size=1000, seed=1)
    with caplog.at_level(logging.WARNING, logger="workbench.bucketing.sampler"):
        seen, idx, reason = _check_epoch(sampler, PROFILE_2D, d, t)
    assert sorted(seen) == sorted(f"c{i}" for i in np.flatnonzero(idx >= 0))  # each fitting cut once
    report = sampler.unfit_report
    assert report.seen == len(d)
    assert report.counts["too_long"] == 3
    assert report.counts["tps_over_limit"] == int((reason == 2).sum()) >= 2
    assert report.counts["too_many_tokens"] == int((reason == 3).sum())
    assert report.total_unfit == int((idx < 0).sum())
    assert {e["id"] for e in report.examples["too_long"]} == {"c0", "c1", "c2"}
    assert "fit no bucket" in report.summary()
    assert "fits no bucket" in caplog.text


def test_1d_profile_and_full_batches_use_the_batch_size():
    d = np.repeat([1.0, 2.0, 3.0], 40)
    cuts = cuts_from_arrays(d)
    profile = BucketProfile(bucket_duration_bins=[1.0, 2.0, 3.0], bucket_batch_size=[10, 8, 4])
    sampler = make_sampler(cuts, profile, concurrent=False, shuffle=False)
    sizes = {}
    for batch in sampler:
        dur = {c.duration for c in batch}
        assert len(dur) == 1
        sizes.setdefault(dur.pop(), []).append(len(batch))
    assert sizes == {1.0: [10] * 4, 2.0: [8] * 5, 3.0: [4] * 10}
    assert sampler.unfit_report.total_unfit == 0


def test_world_size_splits_batches_between_ranks():
    d, t = _corpus(400, seed=3)
    cuts = cuts_from_arrays(d, t)
    ids = []
    for rank in (0, 1):
        s = make_sampler(cuts, PROFILE_2D, world_size=2, rank=rank, concurrent=False, seed=5, drop_last=True)
        ids.append([c.id for batch in s for c in batch])
    assert ids[0] and ids[1]
    assert not set(ids[0]) & set(ids[1])


def test_constraint_select_bucket_and_errors():
    fitter = make_fitter([(4.0, 10), (8.0, 30)], [5.0, 5.0])
    c = BucketBatchSizeConstraint(fitter=fitter, batch_sizes=[4, 2])
    cut = cuts_from_arrays([3.0], [12])[0]
    assert c.measure_length(cut) == (3.0, 12)
    with pytest.raises(ValueError, match="too_many_tokens"):  # strict 2D: only its own duration group
        c.select_bucket(example=cut)
    loose = BucketBatchSizeConstraint(fitter=make_fitter([(4.0, 10), (8.0, 30)], [5.0, 5.0], strict_2d=False),
                                      batch_sizes=[4, 2])
    assert loose.select_bucket(example=cut) == 1
    with pytest.raises(ValueError, match="too_long"):
        c.select_bucket(example_len=(9.0, 1))
    with pytest.raises(ValueError, match="batch_sizes has 1 entries"):
        BucketBatchSizeConstraint(fitter=fitter, batch_sizes=[4])


def test_make_sampler_rejects_bad_setup():
    cuts = cuts_from_arrays([1.0, 2.0], [1, 2])
    with pytest.raises(ValueError, match="bucket_batch_size"):
        make_sampler(cuts, BucketProfile(bucket_duration_bins=[2.0]))
    with pytest.raises(ValueError, match="rank"):
        make_sampler(cuts, BucketProfile(bucket_duration_bins=[2.0], bucket_batch_size=[2]), world_size=2, rank=2)
    with pytest.raises(ValueError, match="num_tokens_fn"):
        make_sampler(cuts_from_arrays([1.0, 2.0]), PROFILE_2D)
    with pytest.raises(TypeError, match="profile: expected a BucketProfile .*, got dict"):
        make_sampler(cuts, {"bucket_duration_bins": [2.0], "bucket_batch_size": [2]})
    profile = BucketProfile(bucket_duration_bins=[2.0], bucket_batch_size=[2])
    with pytest.raises(ValueError, match="buffer_size: must be an integer >= 1, got 0"):
        make_sampler(cuts, profile, buffer_size=0)
    with pytest.raises(ValueError, match="seed: must be an integer >= 0, got 1.5"):
        make_sampler(cuts, profile, seed=1.5)


@pytest.mark.parametrize("concurrent", [False, True])
def test_cuts_missing_token_counts_are_counted_not_fatal(concurrent):
    cuts = cuts_from_arrays([1.0] * 30, [3] * 30)
    for cut in list(cuts)[10:15]:
        cut.custom = None
    s = make_sampler(cuts, PROFILE_2D, concurrent=concurrent, buffer_size=100)
    assert sum(len(b) for b in s) == 25
    assert s.unfit_report.counts["no_token_count"] == 5
    assert s.unfit_report.examples["no_token_count"][0]["id"] == "c10"


def test_custom_num_tokens_fn_and_early_close():
    d = np.full(300, 2.0)
    cuts = cuts_from_arrays(d)
    profile = BucketProfile(bucket_duration_bins=[[2.0, 5], [2.0, 10]], bucket_batch_size=[6, 3])
    s = make_sampler(cuts, profile, num_tokens_fn=lambda c: 4 + int(c.id[1:]) % 2 * 4, concurrent=True,
                     buffer_size=200)
    it = iter(s)
    first = next(it)
    tokens = {4 + int(c.id[1:]) % 2 * 4 for c in first}
    assert len(tokens) == 1  # one bucket per batch: 4 tokens -> bucket 0 (6 a batch), 8 -> bucket 1 (3)
    assert len(first) == {4: 6, 8: 3}[tokens.pop()]
    close_sampler(s)


def _ids(batches):
    return [[c.id for c in b] for b in batches]


def _resumable(seed: int, num_cuts: int, batch_sizes: list[int]):
    """(cuts of 1-10 s, a 3-bucket profile, a function making its sampler without concurrent bucketing)."""
    durations = np.random.default_rng(seed).uniform(1, 10, num_cuts)
    cuts = cuts_from_arrays(durations, (durations * 3).astype(int) + 1)
    profile = BucketProfile([[3.0, 20], [6.0, 40], [10.0, 60]], batch_sizes)
    return cuts, profile, lambda: make_sampler(cuts, profile, concurrent=False, seed=3, buffer_size=100)


def test_sampler_resumes_mid_epoch_from_a_json_checkpoint():
    import json

    from workbench.bucketing import load_sampler_state_dict, sampler_state_dict

    cuts, profile, make = _resumable(5, 500, [8, 4, 2])
    uninterrupted = _ids(make())
    sampler = make()
    it = iter(sampler)
    seen = [[c.id for c in next(it)] for _ in range(7)]
    state = json.loads(json.dumps(sampler_state_dict(sampler)))  # plain types: JSON or torch.save
    resumed = make()
    load_sampler_state_dict(resumed, state)
    assert seen + _ids(resumed) == uninterrupted
    assert len(uninterrupted) > 20  # the checkpoint really was mid-epoch


def test_sampler_resume_refuses_another_profile_or_seed():
    from workbench.bucketing import load_sampler_state_dict, sampler_state_dict

    cuts = cuts_from_arrays([2.0, 4.0, 8.0] * 10, [5, 10, 20] * 10)
    profile = BucketProfile([[3.0, 20], [6.0, 40], [10.0, 60]], [8, 4, 2])
    state = sampler_state_dict(make_sampler(cuts, profile, concurrent=False, seed=1))
    other = BucketProfile([[3.0, 20], [6.0, 40], [10.0, 60]], [8, 4, 3])
    with pytest.raises(ValueError, match="'bucket_batch_size' differs"):
        load_sampler_state_dict(make_sampler(cuts, other, concurrent=False, seed=1), state)
    with pytest.raises(ValueError, match="'seed' is 1, this sampler has 2"):
        load_sampler_state_dict(make_sampler(cuts, profile, concurrent=False, seed=2), state)
    with pytest.raises(ValueError, match="not written by sampler_state_dict"):
        load_sampler_state_dict(make_sampler(cuts, profile, concurrent=False, seed=1), {"epoch": 0})
    from lhotse.dataset import DynamicBucketingSampler

    plain = DynamicBucketingSampler(cuts, max_duration=20.0, num_buckets=2, seed=1)
    with pytest.raises(ValueError, match="saved with a bucket profile, but this sampler has none"):
        load_sampler_state_dict(plain, state)
    plain_state = sampler_state_dict(plain)  # a plain lhotse sampler: lhotse's own state, round-tripped
    assert "workbench_profile" not in plain_state
    load_sampler_state_dict(DynamicBucketingSampler(cuts, max_duration=20.0, num_buckets=2, seed=1), plain_state)


def test_a_lowered_bucket_batch_size_holds_from_the_next_batch_and_a_resume_replays_it():
    from workbench.bucketing import batches_drawn, load_sampler_state_dict, sampler_state_dict, set_bucket_batch_size

    cuts, profile, make = _resumable(7, 400, [8, 6, 4])
    bucket_of = {c.id: 0 if c.duration <= 3 else 1 if c.duration <= 6 else 2 for c in cuts}
    sampler = make()
    it = iter(sampler)
    before = [[c.id for c in next(it)] for _ in range(5)]
    assert batches_drawn(sampler) == 5
    set_bucket_batch_size(sampler, 0, 3)
    after = [[c.id for c in next(it)] for _ in range(6)]
    assert any(len(b) > 3 for b in before if bucket_of[b[0]] == 0)  # the change shows
    assert all(len(b) <= 3 for b in after if bucket_of[b[0]] == 0) and any(bucket_of[b[0]] == 0 for b in after)
    assert profile.bucket_batch_size == [8, 6, 4] and sampler.profile.bucket_batch_size == [8, 6, 4]
    state = sampler_state_dict(sampler)  # 11 batches seen; the size changed from batch 5 on
    rest = []  # the rest of the epoch (iterating the sampler anew would start it over)
    while (batch := next(it, None)) is not None:
        rest.append([c.id for c in batch])
    resumed = make()
    load_sampler_state_dict(resumed, state, batch_size_changes=[(5, 0, 3)])
    assert _ids(resumed) == rest  # the same 11 batches were skipped, then the same sizes drawn
    unreplayed = make()
    set_bucket_batch_size(unreplayed, 0, 3)
    load_sampler_state_dict(unreplayed, state)
    assert _ids(unreplayed) != rest  # applied from the epoch's start, the skipped batches differ
    for bucket, size, needle in ((3, 2, r"bucket 3 is not in \[0, 3\)"), (0, 0, "positive integer, got 0")):
        with pytest.raises(ValueError, match=needle):
            set_bucket_batch_size(make(), bucket, size)
    from lhotse.dataset import DynamicBucketingSampler

    with pytest.raises(ValueError, match="not made by make_sampler"):
        set_bucket_batch_size(DynamicBucketingSampler(cuts, max_duration=20.0, num_buckets=2), 0, 2)


def test_a_state_rewound_to_an_earlier_epoch_resumes_there_and_draws_the_later_epochs_again():
    from workbench.bucketing import load_sampler_state_dict, sampler_state_dict

    cuts, profile, make = _resumable(6, 300, [8, 4, 2])
    epochs = []
    for epoch in (0, 1):
        sampler = make()
        sampler.set_epoch(epoch)
        epochs.append(_ids(sampler))
    ahead = make()  # drew all of epoch 0 and some of epoch 1 while epoch 0's batch 5 was trained
    _ids(ahead)
    ahead.set_epoch(1)
    it = iter(ahead)
    for _ in range(3):
        next(it)
    state = sampler_state_dict(ahead, batches_consumed=5, epoch=0)
    resumed = make()
    load_sampler_state_dict(resumed, state)
    rest = _ids(resumed)
    resumed.set_epoch(1)
    assert rest == epochs[0][5:] and _ids(resumed) == epochs[1]
    with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 1\]"):
        sampler_state_dict(ahead, batches_consumed=0, epoch=2)
    with pytest.raises(ValueError, match="give batches_consumed too"):
        sampler_state_dict(ahead, epoch=0)
    with pytest.raises(ValueError, match="batches_consumed is 100000, but the sampler drew"):
        sampler_state_dict(ahead, batches_consumed=100000, epoch=0)
