"""make_dataloader: the profile-driven DataLoader a user's own loop gets, with the allocator set up."""

import os

import pytest
import torch

from workbench.bucketing import BucketProfile, save_profile
from workbench.data import write_synthetic_corpus
from workbench.training import make_dataloader


class CutCount(torch.utils.data.Dataset):
    """dataset[cuts] -> the cut ids and durations (what a real dataset would read and collate)."""

    def __getitem__(self, cuts):
        return {"ids": [c.id for c in cuts], "durations": torch.tensor([c.duration for c in cuts])}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    manifest = write_synthetic_corpus(root, 300, progress=False)
    profile = save_profile(root / "profile.yaml", BucketProfile([5.0, 10.0, 40.0], [16, 8, 2]))
    return manifest, profile


def test_batches_follow_the_profile_and_cover_the_epoch(corpus):
    manifest, profile = corpus
    loader = make_dataloader(manifest, profile, CutCount(), num_workers=0, configure_allocator=False)
    assert loader.allocator_status is None and loader.batch_size is None
    ids = []
    for batch in loader:
        longest = float(batch["durations"].max())
        limit = 16 if longest <= 5 else 8 if longest <= 10 else 2
        assert len(batch["ids"]) <= limit
        ids += batch["ids"]
    assert len(ids) == len(set(ids)) == 300 - loader.sampler.unfit_report.total_unfit


def test_workers_and_ranks_split_the_corpus(corpus):
    manifest, profile = corpus
    seen = []
    for rank in (0, 1):
        loader = make_dataloader(manifest, profile, CutCount(), num_workers=1, world_size=2, rank=rank,
                                 configure_allocator=False)
        assert loader.persistent_workers and loader.prefetch_factor == 2
        seen.append({i for batch in loader for i in batch["ids"]})
    assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_ranks_come_from_torchrun_before_the_process_group_is_up(corpus, monkeypatch):
    manifest, profile = corpus
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loader = make_dataloader(manifest, profile, CutCount(), num_workers=0, configure_allocator=False)
    assert (loader.sampler.world_size, loader.sampler.rank) == (2, 1)


def test_a_bad_argument_leaves_the_allocator_settings_alone(corpus, monkeypatch):
    manifest, _ = corpus
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(TypeError):
        make_dataloader(manifest, [1], CutCount(), num_workers=0)
    import os

    assert "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_allocator_is_configured_unless_opted_out(corpus):
    manifest, profile = corpus
    status = make_dataloader(manifest, profile, CutCount(), num_workers=0).allocator_status
    if torch.cuda.is_available():
        assert status.expandable_segments is True or status.skip_reason == "user_disabled"
    else:
        assert status.skip_reason == "no_cuda"


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(cuts="nope.jsonl.gz"), FileNotFoundError, "nope.jsonl.gz: no such manifest"),
    (dict(cuts=42), TypeError, "cuts: expected a lhotse CutSet or a manifest path, got int"),
    (dict(profile=[1, 2]), TypeError, "profile: expected a BucketProfile or a path, got list"),
    (dict(num_workers=-1), ValueError, "num_workers: must be an integer >= 0"),
    (dict(num_workers=1.5), ValueError, "num_workers: must be an integer >= 0, got 1.5"),
    (dict(prefetch_factor=0), ValueError, "prefetch_factor: must be an integer >= 1, got 0"),
    (dict(seed=-2), ValueError, "seed: must be an integer >= 0, got -2"),
    (dict(world_size=0), ValueError, "world_size: must be an integer >= 1, got 0"),
    (dict(rank=True), ValueError, "rank: must be an integer >= 0, got True"),
    (dict(world_size=2, rank=2), ValueError, r"rank: must be below world_size \(2\), got 2"),
    (dict(dataset=None), TypeError, "dataset: expected a map-style dataset"),
    (dict(cuts="{folder}"), ValueError, "is a folder; give the cuts manifest file"),
])
def test_bad_arguments_are_named(corpus, kwargs, error, needle):
    manifest, profile = corpus
    args = dict(cuts=manifest, profile=profile, dataset=CutCount(), num_workers=0, configure_allocator=False) | kwargs
    if args["cuts"] == "{folder}":
        args["cuts"] = manifest.parent
    with pytest.raises(error, match=needle):
        make_dataloader(args.pop("cuts"), args.pop("profile"), args.pop("dataset"), **args)


@pytest.mark.parametrize("searched, current, warns", [
    (None, "", False),  # a profile from before profiles recorded the settings: nothing to compare
    ("expandable_segments:True", "expandable_segments:True", False),
    ("expandable_segments:True", None, False),  # no CUDA: no allocator
    ("expandable_segments:True", "expandable_segments:False", True),
    ("expandable_segments:True,max_split_size_mb:256", "expandable_segments:True", True),
])
def test_a_profile_searched_under_other_allocator_settings_is_one_warning_line(corpus, tmp_path, monkeypatch, caplog,
                                                                                searched, current, warns):
    from workbench.training import data

    manifest, _ = corpus
    profile = save_profile(tmp_path / "p.yaml", BucketProfile([5.0, 10.0, 40.0], [16, 8, 2],
                                                             allocator_settings=searched))
    monkeypatch.setattr(data, "allocator_settings_in_effect", lambda: current)
    caplog.set_level("WARNING", logger="workbench.training.data")
    loader = make_dataloader(manifest, profile, CutCount(), num_workers=0, configure_allocator=False)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ([loader.allocator_warning] if warns else []) and (loader.allocator_warning is None) != warns
    if warns:
        assert lines[0].startswith(f"profile {profile}: searched under CUDA allocator settings {searched!r} but "
                                   f"this process has {current!r} (") and lines[0].endswith("may not fit")


class _WorkerNiceness(torch.utils.data.Dataset):
    """dataset[anything] -> the niceness of the process that reads it."""

    def __getitem__(self, item):
        return torch.tensor(os.nice(0))


def test_workers_run_the_given_nice_levels_below_the_training_process():
    from workbench.training.data import loader_for_sampler

    own = os.nice(0)
    if own + 3 > 19:
        pytest.skip(f"this process runs at nice {own}: its workers cannot go 3 levels lower")
    lowered = [int(x) for x in loader_for_sampler([0, 1], _WorkerNiceness(), num_workers=1, pin_memory=False,
                                                  worker_niceness=3)]
    assert lowered == [own + 3] * 2
    assert os.nice(0) == own  # this process keeps its priority
    same = [int(x) for x in loader_for_sampler([0], _WorkerNiceness(), num_workers=1, pin_memory=False)]
    assert same == [own]  # the default: the same priority
    for bad, message in ((-1, "worker_niceness: must be an integer >= 0, got -1"),
                         (20, "worker_niceness: must be at most 19 (the lowest CPU priority), got 20")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            loader_for_sampler([0], _WorkerNiceness(), num_workers=1, worker_niceness=bad)


def test_make_dataloader_passes_the_workers_niceness_on(tmp_path, monkeypatch):
    import workbench.training.data as data

    seen = {}
    monkeypatch.setattr(data, "loader_for_sampler", lambda sampler, dataset, **kw: seen.update(kw) or
                        type("Loader", (), {})())
    corpus = write_synthetic_corpus(tmp_path / "corpus", 8, progress=False)
    profile = save_profile(tmp_path / "p.yaml", BucketProfile([2.0, 4.0], [2, 2]))
    data.make_dataloader(corpus, profile, _WorkerNiceness(), worker_niceness=5, configure_allocator=False)
    assert seen["worker_niceness"] == 5
    with pytest.raises(ValueError, match="worker_niceness: must be at most 19"):
        data.make_dataloader(corpus, profile, _WorkerNiceness(), worker_niceness=25, configure_allocator=False)
