"""The data path of a training loop: a profile-driven lhotse sampler feeding a DataLoader.

The lhotse way: the sampler runs in the main process and yields CutSets; ``num_workers`` DataLoader
processes turn each into a batch (``dataset[cuts]``: read, resample, collate); batches land in pinned
memory on a GPU machine. ``workbench train`` and :func:`make_dataloader` share :func:`loader_for_sampler`.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

import torch
from lhotse import CutSet

from workbench.bucketing.profile import BucketProfile, load_profile
from workbench.bucketing.sampler import make_sampler
from workbench.data.manifest import existing_manifest
from workbench.memory import configure_allocator as configure_cuda_allocator
from workbench.memory import current_allocator_settings
from workbench.memory.settings import settings_differences
from workbench.training.distributed import local_world_size, ranks_from_env
from workbench.options import MAX_NICENESS, WORKER_NICENESS, check_int

log = logging.getLogger(__name__)


def default_num_workers() -> int:
    """Data-loading workers per process: the cores this process may use, shared among the processes of
    this machine, less one for the main process; at most 16."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(16, cores // local_world_size() - 1))


def allocator_settings_in_effect() -> str | None:
    """The CUDA allocator settings this process runs (or will run) under, ``""`` for torch's defaults; None
    without CUDA (no allocator to compare)."""
    if not torch.cuda.is_available():
        return None
    return current_allocator_settings() or ""


def allocator_settings_warning(profile: BucketProfile, source: str, current: str | None) -> str | None:
    """One line when ``profile`` was searched under other CUDA allocator settings than ``current`` (those in
    effect; None: no CUDA). None when they agree, or when the profile does not record them (made before
    profiles did)."""
    searched = profile.allocator_settings
    if searched is None or current is None:
        return None
    differences = settings_differences(searched, current)
    if not differences:
        return None
    return (f"{source}: searched under CUDA allocator settings {searched!r} but this process has {current!r} "
            f"({'; '.join(differences)}); its batch sizes may not fit")


def lower_worker_priority(niceness: int, worker_id: int) -> None:
    """A DataLoader worker's start: lower its CPU priority by ``niceness`` nice levels (0-19), so that where the
    workers and the training process want the same cores, the process that launches the GPU's work goes first
    (the workers prepare batches ahead and have slack; a late launch leaves the GPU idle). A system that
    refuses leaves the worker at the process's priority, said once by the first worker."""
    if niceness:
        try:
            os.nice(niceness)
        except OSError as e:
            if worker_id == 0:
                log.warning("worker_niceness %d: this system refused to lower the workers' priority (%s); they run "
                            "at the training process's", niceness, e)


def check_worker_niceness(value, option: str = "worker_niceness") -> None:
    """One-line ValueError naming ``option`` unless ``value`` is a nice level from 0 to MAX_NICENESS."""
    check_int(value, option, 0)
    if value > MAX_NICENESS:
        raise ValueError(f"{option}: must be at most {MAX_NICENESS} (the lowest CPU priority), got {value}")


def loader_for_sampler(sampler, dataset: torch.utils.data.Dataset, *, num_workers: int, prefetch_factor: int = 2,
                       seed: int = 0, pin_memory: bool | None = None,
                       worker_niceness: int = WORKER_NICENESS) -> torch.utils.data.DataLoader:
    """``DataLoader(dataset, sampler=sampler, batch_size=None)`` with persistent workers, ``prefetch_factor``
    batches per worker ahead, pinned memory when CUDA is there, the workers' base seed drawn from ``seed``
    (not the global RNG, which a resume restores), and the workers' CPU priority ``worker_niceness`` nice
    levels below this process's (:func:`lower_worker_priority`; 0: the same)."""
    check_int(num_workers, "num_workers", 0)
    check_int(prefetch_factor, "prefetch_factor", 1)
    check_worker_niceness(worker_niceness)
    return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=num_workers,
                                       pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
                                       prefetch_factor=prefetch_factor if num_workers else None,
                                       persistent_workers=num_workers > 0,
                                       worker_init_fn=functools.partial(lower_worker_priority, worker_niceness)
                                       if num_workers else None,
                                       generator=torch.Generator().manual_seed(seed))


def make_dataloader(cuts: CutSet | str | os.PathLike, profile: BucketProfile | str | os.PathLike,
                    dataset: torch.utils.data.Dataset, *, num_workers: int | None = None, seed: int = 0,
                    shuffle: bool = True, world_size: int | None = None, rank: int | None = None,
                    num_tokens_fn: Callable[[Any], int] | None = None, prefetch_factor: int = 2,
                    concurrent: bool | None = None, configure_allocator: bool = True,
                    worker_niceness: int = WORKER_NICENESS) -> torch.utils.data.DataLoader:
    """The DataLoader that ``workbench train`` uses, for your own loop: batches of the profile's sizes, one
    bucket each, from ``cuts`` (a CutSet or a manifest path) through ``dataset[cuts]`` in ``num_workers``
    processes (default: the cores shared among this machine's ranks, less one), ``worker_niceness`` nice levels
    (0-19) below this process's CPU priority (default 0: the same).

    ``configure_allocator`` (default True) turns on the CUDA allocator's expandable segments before CUDA
    starts, keeping every option you set (``workbench.memory.configure_allocator``); False leaves it alone.
    ``world_size``/``rank`` default to torchrun's (``WORLD_SIZE``/``RANK``; else 1 and 0); concurrent bucketing
    is on for one process and off for several (ranks must draw the same buckets). Call
    ``loader.sampler.set_epoch(epoch)`` before each epoch; ``loader.sampler.unfit_report`` counts what no
    bucket took. ``loader.allocator_status`` says what the allocator set-up did; ``loader.allocator_warning``
    is the line logged when the profile was searched under other allocator settings than those in effect.
    """
    source = f"profile {profile}" if isinstance(profile, (str, os.PathLike)) else "profile"
    if isinstance(profile, (str, os.PathLike)):
        profile = load_profile(profile)
    if not isinstance(profile, BucketProfile):
        raise TypeError(f"profile: expected a BucketProfile or a path, got {type(profile).__name__}")
    if isinstance(cuts, (str, os.PathLike)):
        cuts = CutSet.from_jsonl_lazy(existing_manifest(cuts))
    if not isinstance(cuts, CutSet):
        raise TypeError(f"cuts: expected a lhotse CutSet or a manifest path, got {type(cuts).__name__}")
    if not callable(getattr(dataset, "__getitem__", None)):
        raise TypeError(f"dataset: expected a map-style dataset (dataset[cuts] -> batch), got {type(dataset).__name__}")
    ranks = ranks_from_env()  # torchrun's environment, whether or not the process group is up yet
    world_size = ranks.world_size if world_size is None else world_size
    rank = ranks.rank if rank is None else rank
    check_worker_niceness(worker_niceness)
    for name, value, minimum in (("num_workers", num_workers, 0), ("prefetch_factor", prefetch_factor, 1),
                                 ("seed", seed, 0), ("world_size", world_size, 1), ("rank", rank, 0)):
        if value is not None:
            check_int(value, name, minimum)
    if rank >= world_size:
        raise ValueError(f"rank: must be below world_size ({world_size}), got {rank}")
    status = configure_cuda_allocator() if configure_allocator else None  # after the arguments are checked
    sampler = make_sampler(cuts, profile, world_size=world_size, rank=rank, shuffle=shuffle, seed=seed,
                           num_tokens_fn=num_tokens_fn,
                           concurrent=world_size == 1 if concurrent is None else concurrent)
    loader = loader_for_sampler(sampler, dataset, seed=seed, prefetch_factor=prefetch_factor,
                                worker_niceness=worker_niceness,
                                num_workers=default_num_workers() if num_workers is None else num_workers)
    loader.allocator_status = status
    loader.allocator_warning = allocator_settings_warning(profile, source, allocator_settings_in_effect())
    if loader.allocator_warning:
        log.warning(loader.allocator_warning)
    return loader
