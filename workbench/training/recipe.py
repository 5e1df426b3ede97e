"""Training recipe: train any workbench model on a lhotse corpus, on one device or under torchrun (DDP).

    python -m workbench train --cuts data/tts/cuts.jsonl.gz --tokenizer data/tts/tokenizer_bpe_256.model \
        --model large-rnnt --profile profiles/large-rnnt.yaml --steps 2000 --out runs/large-rnnt
    torchrun --nproc-per-node 2 -m workbench train ...same options...    # DistributedDataParallel

With --profile (from the OOMptimizer) batches come from workbench.bucketing.make_sampler and respect
its per-bucket batch sizes; without one, from lhotse's DynamicBucketingSampler with --max-duration
seconds of audio per batch. The sampler runs in the main process and feeds a DataLoader whose
--num-workers processes read, resample and collate the audio; features are computed on the device. One
DataLoader iterator serves the whole run: a thread draws the sampler's batches ahead across epoch ends
(workbench.training.epochs), so the next epoch's bucket buffer is filled and its first batches are read
while the current epoch's last batches train.

Each step is queued without waiting for the one before (its loss is read after the next launch), so
the next batch is fetched while the GPU works: on CUDA the transducer and AED steps have no host sync
(the transducer losses check their lengths with device-side asserts; torch's CTC loss copies its
lengths to the host).
Per step the log records the loss, batch size, audio seconds, padding, the time the device waited for
data (data_s: on CUDA the GPU's idle gap between the end of one step and the start of the next) and
the step's own device time (step_s, split into forward_backward_s and optimizer_s), the host's time to
queue it (host_s, with the process's CPU seconds and involuntary context switches meanwhile: host_cpu_s,
host_preemptions); on CUDA also the caching allocator's counters so far in this process
(num_device_alloc: cudaMalloc calls, num_alloc_retries, num_ooms; reserved_bytes now), read, like the
peak, once the next step was launched. Writes
<out>/model.pt (weights and config: load_checkpoint reads it with torch.load(weights_only=True)),
<out>/train_log.jsonl and <out>/train_summary.json.

--save-every N also writes <out>/train_state.pt every N steps (and at the end): weights, optimizer, where
each rank's sampler is in its epoch (batches drawn ahead, into later epochs too, or prefetched by the
workers but not trained on are not counted, so a resume neither loses nor repeats them), RNG states and
the log so far. --resume continues from it: the same corpus, model, sampler settings and world size are
required (a mismatch names the field; the manifest, tokenizer and profile are compared by the SHA-256 of
their bytes, so one rewritten at the same path is caught too); --steps may grow. Without a profile, or
with --no-concurrent, the resumed run is the run that was never stopped; with concurrent bucketing the
batches after the checkpoint may differ.

A step that runs out of device memory (one process) is trained in parts: the batch is halved, again down
to one utterance where needed, and the parts' gradients are accumulated (each loss weighted by its share
of the batch's target tokens) into one optimizer step; every utterance is trained once. One warning line
names the bucket and the batch size, and the bucket's batch size is lowered for the rest of the run, from
the next batch trained on (the batches drawn ahead are drawn again, or with concurrent bucketing trained in
parts; the sizes are kept in train_state.pt; train_summary.json lists the steps and the profile's
bucket_batch_size line that fits). One utterance that does not fit alone ends the run with a one-line
error naming it, after saving train_state.pt as of the step before.

Under torchrun every rank's sampler knows its rank and world size, so ranks draw different batches;
DDP all-reduces the gradients; rank 0 logs and saves. A profile for DDP comes from
`workbench oomptimize --ddp` (one GPU, DDP's gradient buckets accounted) or `--nproc N`.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import logging
import math
import os
import resource
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from lhotse import CutSet
from lhotse.dataset import DynamicBucketingSampler
from tqdm.auto import tqdm

from workbench.atomic import atomic_path, check_writable, write_text_atomically
from workbench.bucketing import (BucketProfile, batches_drawn, close_sampler, load_profile, load_sampler_state_dict,
                                 make_sampler, sampler_state_dict, set_bucket_batch_size)
from workbench.bucketing.constraint import BucketBatchSizeConstraint
from workbench.bucketing.fit import FITS, REASONS, make_fitter
from workbench.data.manifest import read_cut_arrays
from workbench.data.tokenizer import load_tokenizer, tokenized_cut_arrays
from workbench.memory import configure_allocator
from workbench.memory.oom import is_oom_error
from workbench.training.collate import CutBatchDataset, cut_has_audio, cut_token_count
from workbench.models.config import DEFAULT_JOINT_LOSS, ModelConfig, check_joint_loss, config_from_name
from workbench.training.epochs import EpochBatchDataset, EpochBatches
from workbench.training.distributed import (Ranks, destroy_process_group, gather_objects, init_process_group,
                                          ranks_from_env, sum_over_ranks, weights_digest)
from workbench.models.losses import loss_backend
from workbench.models.model import DTYPES, ASRModel, build_model, compile_encoder_layers
from workbench.options import WORKER_NICENESS, dropped_data_line
from workbench.plain import to_plain
from workbench.training.data import (allocator_settings_in_effect, allocator_settings_warning,
                                     check_worker_niceness, default_num_workers, loader_for_sampler)
from workbench.options import check_int
from workbench.training.split_batch import PartsTrained, UtteranceOutOfMemoryError, train_in_parts

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    cuts: str                        # lhotse CutSet manifest (.jsonl or .jsonl.gz) with audio
    tokenizer: str                   # sentencepiece .model; its size sets the model's vocabulary
    out_dir: str                     # where model.pt, train_log.jsonl and train_summary.json go
    model: str = "tiny-rnnt"         # "{tiny,large,xl}-{rnnt,tdt,ctc,aed}"
    profile: str | None = None       # bucket profile YAML with batch sizes; None -> lhotse max_duration
    max_duration: float = 200.0      # seconds of audio per batch without a profile
    num_buckets: int = 10            # lhotse buckets without a profile
    steps: int = 1000                # optimizer steps (epochs repeat as needed)
    lr: float = 1e-3                 # peak AdamW learning rate
    warmup_steps: int = 100          # linear warm-up, then cosine decay to 0 at `steps`
    weight_decay: float = 1e-3       # AdamW weight decay
    grad_clip: float = 1.0           # max global gradient norm
    dtype: str = "bf16"              # bf16 (autocast) or fp32
    device: str | None = None        # cuda or cpu; None: cuda when available
    log_every: int = 10              # steps between log lines
    seed: int = 0                    # model init and sampler shuffling
    save_every: int = 0              # steps between resumable train_state.pt saves (0: only model.pt at the end)
    resume: bool = False             # continue from <out_dir>/train_state.pt
    overwrite: bool = False          # start over in an out_dir that holds a run (its state is removed first)
    concurrent: bool = True          # concurrent bucketing in make_sampler (off: exact resume; off under DDP)
    num_workers: int = field(default_factory=default_num_workers)  # DataLoader worker processes (0: main process)
    prefetch_factor: int = 2         # batches each worker prepares ahead (each held in shared memory)
    worker_niceness: int = WORKER_NICENESS  # nice levels (0-19) the workers run below this process (0: the same)
    strict: bool = False             # error (not a warning) when more than 1 % of the corpus fits no bucket
    log_cut_ids: bool = False        # each log record lists the cut ids of every rank's batch
    joint_chunk_size: int = 0        # transducers: joint + loss over chunks of this many utterances (0: whole)
    loss: str = DEFAULT_JOINT_LOSS   # transducers: materialized (the joint's logits, then the loss) | fused
    max_seconds: float = 0.0         # stop launching steps after this many wall seconds of training (0: no limit)
    compile: bool = False            # torch.compile each encoder block (dynamic shapes); use a profile made with it


STATE_FILE = "train_state.pt"
# torch.cuda.memory_stats() counters each CUDA step record carries (cumulative in the process)
ALLOCATOR_COUNTERS = ("num_device_alloc", "num_alloc_retries", "num_ooms")
# The files a run depends on, by TrainConfig field: a resume checks their contents, not only their paths.
INPUT_FILES = {"cuts": "corpus manifest (--cuts)", "tokenizer": "tokenizer (--tokenizer)",
               "profile": "profile (--profile)"}
# Settings a resumed run must share with the saved one (steps, logging, saving and workers may change).
RESUME_MUST_MATCH = ("cuts", "tokenizer", "model", "profile", "max_duration", "num_buckets", "lr",
                     "warmup_steps", "weight_decay", "grad_clip", "dtype", "seed", "concurrent")


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up over warmup_steps (step 0 -> lr / warmup), then cosine to 0 at config.steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def check_config(config: TrainConfig) -> None:
    """One-line ValueErrors naming the option, before any work."""
    if config.dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {sorted(DTYPES)}, got {config.dtype!r}")
    for name, minimum in (("steps", 1), ("log_every", 1), ("num_buckets", 1), ("prefetch_factor", 1),
                          ("num_workers", 0), ("save_every", 0), ("warmup_steps", 0),
                          ("joint_chunk_size", 0)):
        check_int(getattr(config, name), f"--{name.replace('_', '-')}", minimum)
    check_worker_niceness(config.worker_niceness, "--worker-niceness")
    if not (isinstance(config.max_seconds, (int, float)) and 0 <= config.max_seconds < math.inf):
        raise ValueError(f"--max-seconds: must be a finite number >= 0, got {config.max_seconds!r}")
    for name in ("max_duration", "lr"):
        if not 0 < getattr(config, name) < math.inf:
            raise ValueError(f"--{name.replace('_', '-')}: must be a finite number > 0, got {getattr(config, name)!r}")
    for name in ("weight_decay", "grad_clip"):
        if not 0 <= getattr(config, name) < math.inf:
            raise ValueError(f"--{name.replace('_', '-')}: must be a finite number >= 0, got {getattr(config, name)!r}")
    if Path(config.cuts).is_dir():
        raise ValueError(f"--cuts {config.cuts}: is a folder; give the cuts manifest file (e.g. cuts.jsonl.gz)")
    if not Path(config.cuts).is_file():
        raise FileNotFoundError(f"--cuts: manifest {config.cuts!r} does not exist")
    if config.resume and config.overwrite:
        raise ValueError("--resume and --overwrite: choose one (continue the run, or start over)")
    held = [name for name in ("model.pt", STATE_FILE, "train_summary.json") if (Path(config.out_dir) / name).exists()]
    if held and not (config.resume or config.overwrite):
        raise ValueError(f"--out {config.out_dir}: holds a run ({', '.join(held)}); pass --resume to continue it "
                         "or --overwrite to start over")
    head = config_from_name(config.model).head  # a wrong --model is one line now, not after the corpus is read
    if config.joint_chunk_size and head not in ("rnnt", "tdt"):
        raise ValueError(f"--joint-chunk-size: applies to transducers (rnnt, tdt) only, not to --model {config.model}")
    check_joint_loss(config.loss, head, config.model, config.joint_chunk_size)
    for name in ("model.pt", "train_log.jsonl", "train_summary.json", *([STATE_FILE] if config.save_every else [])):
        check_writable(Path(config.out_dir) / name)  # refused now, not after hours of training


def file_digest(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> str:
    """SHA-256 of a file's contents, read ``chunk_bytes`` at a time (a manifest of gigabytes takes seconds);
    a .gz file's decompressed bytes, since its header holds a time and a name that a rewrite changes."""
    digest = hashlib.sha256()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def input_digests(config: TrainConfig) -> dict[str, str | None]:
    """``{field: SHA-256}`` of the files named by the INPUT_FILES fields of ``config`` (None when not given)."""
    return {name: file_digest(getattr(config, name)) if getattr(config, name) else None for name in INPUT_FILES}


def check_same_inputs(saved: dict, current: dict, state_path: Path) -> None:
    """ValueError naming the first input file whose contents differ from those the saved run read (the same
    path may hold a retrained tokenizer or a rewritten manifest)."""
    for name, label in INPUT_FILES.items():
        if name in saved and saved[name] != current.get(name):
            was, now = (d[:12] if d else "none" for d in (saved[name], current.get(name)))
            raise ValueError(f"--resume: the {label} is not the one {state_path} was trained with: its contents "
                             f"changed (SHA-256 {now}..., trained with {was}...); restore it, or start over with "
                             "--overwrite")


def resolve_device(name: str | None, ranks: Ranks) -> torch.device:
    """The device this rank trains on: cuda:LOCAL_RANK under torchrun; a one-line error without CUDA."""
    name = name or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: expected cuda, cuda:N or cpu, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: this machine has no CUDA GPU that torch can use; "
                             "train with --device cpu")
        if ranks.distributed:
            if ranks.local_rank >= torch.cuda.device_count():
                raise ValueError(f"torchrun started {ranks.local_rank + 1}+ processes on a machine with "
                                 f"{torch.cuda.device_count()} GPU(s): use --nproc-per-node "
                                 f"{torch.cuda.device_count()} or fewer")
            device = torch.device("cuda", ranks.local_rank)
    elif device.type != "cpu":
        raise ValueError(f"--device: expected cuda or cpu, got {name!r}")
    return device


def check_audio(cuts: CutSet, path: str) -> None:
    """The corpus must carry audio: the synthetic corpus (durations and texts only) cannot be trained on."""
    first = next(iter(cuts), None)
    if first is None:
        raise ValueError(f"--cuts: {path} has no cuts")
    if not cut_has_audio(first):
        raise ValueError(f"--cuts: {path}: cut {first.id!r} has no audio (no recording, or its file is missing); "
                         "training needs real audio, e.g. `workbench corpus tts --out DIR`")


def check_profile_for_run(profile: BucketProfile, path: str, config: TrainConfig, ranks: Ranks,
                          device: torch.device) -> list[str]:
    """Warnings (returned and logged) when the profile was measured for another model, dtype, GPU or CUDA
    allocator settings; ValueError when it was made without DDP's accounting for a multi-process run."""
    meta = profile.metadata or {}
    if profile.bucket_batch_size is None:
        raise ValueError(f"--profile {path}: no 'bucket_batch_size': run `workbench oomptimize --bins {path}` "
                         "first, or set one batch size per bucket")
    run = {"model": config.model, "dtype": {"bf16": "bfloat16", "fp32": "float32"}[config.dtype],
           "joint_chunk_size": config.joint_chunk_size, "joint_loss": config.loss, "compile": config.compile}
    if device.type == "cuda":
        run["gpu"] = torch.cuda.get_device_name(device)
    warnings = [f"--profile {path}: metadata.{name} is {meta[name]!r} but this run has {value!r}; its batch "
                "sizes may not fit" for name, value in run.items() if name in meta and meta[name] != value]
    if device.type == "cuda":
        allocator = allocator_settings_warning(profile, f"--profile {path}", allocator_settings_in_effect())
        warnings += [allocator] if allocator else []
    if config.compile and "compile" not in meta:  # no metadata.compile: taken as measured on the eager step
        warnings.append(f"--profile {path}: made without --compile (no metadata.compile) but this run compiles "
                        "the encoder; its batch sizes may not fit")
    if ranks.distributed and meta.get("ddp") is False:
        raise ValueError(f"--profile {path}: made for one process without DDP (metadata.ddp is false), but this "
                         f"run has {ranks.world_size}: make it with `workbench oomptimize --ddp` or "
                         f"`--nproc {ranks.world_size}`")
    made_for = meta.get("world_size")
    if ranks.distributed and isinstance(made_for, int) and made_for > 1 and made_for != ranks.world_size:
        warnings.append(f"--profile {path}: metadata.world_size is {made_for} but this run has "
                        f"{ranks.world_size} processes")
    for w in warnings:
        log.warning(w)
    return warnings


def corpus_fit(config: TrainConfig, profile: BucketProfile) -> dict:
    """How many cuts of the corpus fit no bucket of the profile, by reason (read from the manifest)."""
    fitter = make_fitter(profile.bucket_duration_bins, profile.max_tps)
    arrays = tokenized_cut_arrays(config.cuts, config.tokenizer if fitter.needs_tokens else None, progress=False)
    _, reason = fitter.assign(arrays.durations, arrays.num_tokens)
    counts = {name: int((reason == code).sum()) for code, name in REASONS.items()}
    return {"cuts": int(len(reason)), "unfit": int((reason != FITS).sum()), "reasons": counts}


def report_dropped(fit: dict, config: TrainConfig, *, when: str, strict: bool | None = None) -> str | None:
    """A message when more than DROP_NOTICE_SHARE of the cuts fit no bucket (ValueError when ``strict``,
    which defaults to --strict)."""
    line = dropped_data_line(fit["cuts"], fit["reasons"], what="cuts")
    if line is None:
        return None
    message = (f"--profile {config.profile}: {line} {when}, fitting no bucket; make bins from this corpus with "
               "`workbench bins`")
    if config.strict if strict is None else strict:
        raise ValueError(message + " (--strict)")
    log.warning(message)
    return message


def make_batches(cuts: CutSet, config: TrainConfig, tokenizer, profile: BucketProfile | None, ranks: Ranks):
    """The sampler for this run and rank: make_sampler with the profile, else lhotse's DynamicBucketingSampler.

    Concurrent bucketing is off under DDP: its filling thread's timing would give ranks different batches."""
    if profile is not None:
        def num_tokens(cut) -> int:
            return cut_token_count(cut, tokenizer)

        return make_sampler(cuts, profile, shuffle=True, seed=config.seed, num_tokens_fn=num_tokens,
                            concurrent=config.concurrent and not ranks.distributed,
                            world_size=ranks.world_size, rank=ranks.rank)
    num_cuts = sum(1 for _ in itertools.islice(iter(cuts), config.num_buckets))
    if num_cuts < config.num_buckets:
        raise ValueError(f"--num-buckets {config.num_buckets}: {config.cuts} has only {num_cuts} cuts; "
                         f"pass --num-buckets {num_cuts} or fewer")
    return DynamicBucketingSampler(cuts, max_duration=config.max_duration, num_buckets=config.num_buckets,
                                   shuffle=True, seed=config.seed, world_size=ranks.world_size, rank=ranks.rank)


def make_loader(batches: EpochBatches, config: TrainConfig, device: torch.device) -> torch.utils.data.DataLoader:
    """The lhotse way: the sampler in this process (its batches drawn ahead across epochs by ``batches``),
    audio read and collated in ``num_workers`` workers; the loader yields LoadedBatch(epoch, index, batch)."""
    return loader_for_sampler(batches, EpochBatchDataset(CutBatchDataset(config.tokenizer)),
                              num_workers=config.num_workers, prefetch_factor=config.prefetch_factor,
                              seed=config.seed, pin_memory=device.type == "cuda",
                              worker_niceness=config.worker_niceness)


@dataclass
class Run:
    """What one training run holds between steps (one per rank)."""

    config: TrainConfig
    ranks: Ranks
    device: torch.device
    model: ASRModel
    forward: torch.nn.Module  # the model, or its DDP wrapper (forward(batch) -> loss)
    optimizer: torch.optim.Optimizer
    sampler: object
    step: int = 0
    epoch: int = 0
    epoch_batches: int = 0  # batches of the current epoch trained on (the sampler may have drawn more)
    records: list = field(default_factory=list)
    last_end_event: object = None  # CUDA event at the end of the last launched step
    loss_backend: str | None = None  # transducers: which loss runs, and why
    out_of_memory: list = field(default_factory=list)  # one dict per step that ran out of memory (see lower_batch_size)
    input_digests: dict = field(default_factory=dict)  # SHA-256 of the files the run reads: see input_digests
    batches: EpochBatches | None = None  # the sampler's batches drawn ahead across epochs, while training runs
    redraw: bool = False  # a bucket's batch size was lowered: draw again from the next batch to train on


def train(config: TrainConfig) -> dict:
    """Run the recipe; returns {"losses", "audio_seconds_per_second", "data_wait_share", "checkpoint", ...}
    (the same summary as <out>/train_summary.json; on ranks other than 0 the checkpoint is None)."""
    check_config(config)
    ranks = ranks_from_env()
    device = resolve_device(config.device, ranks)
    if device.type == "cuda":
        configure_allocator()  # before the first CUDA allocation
    init_process_group(ranks, device)
    if config.overwrite and ranks.is_main:  # a later --resume must not find the old run's state
        (Path(config.out_dir) / STATE_FILE).unlink(missing_ok=True)
    try:
        return _train(config, ranks, device)
    finally:
        destroy_process_group()


def _train(config: TrainConfig, ranks: Ranks, device: torch.device) -> dict:
    tokenizer = load_tokenizer(config.tokenizer)
    read_cut_arrays(config.cuts, progress=False)  # a field of the wrong type: file:line now, not a worker's traceback
    cuts = CutSet.from_file(config.cuts)
    check_audio(cuts, config.cuts)
    profile = load_profile(config.profile) if config.profile else None
    warnings, fit = [], None
    if profile is not None:
        warnings += check_profile_for_run(profile, config.profile, config, ranks, device)
        fit = corpus_fit(config, profile)
        message = report_dropped(fit, config, when="by the profile's bins")
        warnings += [message] if message else []
    run = start_run(config, ranks, device, tokenizer, cuts, profile)
    if device.type == "cuda":  # this run's peak, not an earlier run's in the same process
        torch.cuda.reset_peak_memory_stats(device)
    train_steps(run)
    return finish_run(run, fit, warnings)


def start_run(config: TrainConfig, ranks: Ranks, device: torch.device, tokenizer, cuts: CutSet,
              profile: BucketProfile | None) -> Run:
    torch.manual_seed(config.seed)
    model = build_model(config.model, vocab_size=tokenizer.vocab_size(),
                        joint_chunk_size=config.joint_chunk_size, joint_loss=config.loss).to(device)
    if config.compile:
        compile_encoder_layers(model)
        log.info("encoder blocks compiled with torch.compile (dynamic shapes; compiling on the first step)")
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sampler = make_batches(cuts, config, tokenizer, profile, ranks)
    run = Run(config, ranks, device, model, model, optimizer, sampler, input_digests=input_digests(config))
    if model.config.head in ("rnnt", "tdt"):
        dtype = torch.bfloat16 if config.dtype == "bf16" else torch.float32
        run.loss_backend = loss_backend(torch.empty(0, device=device, dtype=dtype))[1]
        log.info("transducer loss: %s", run.loss_backend)
    if config.resume:
        load_training_state(Path(config.out_dir) / STATE_FILE, run)
        log.info("resumed from %s at step %d (epoch %d)", Path(config.out_dir) / STATE_FILE, run.step, run.epoch)
    if ranks.distributed:
        run.forward = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None)
    return run


def train_steps(run: Run) -> None:
    """Steps until run.step reaches config.steps, or config.max_seconds of wall time have passed since the
    first batch was asked for; saves train_state.pt as asked. One DataLoader iterator serves every epoch:
    its sampler (:class:`EpochBatches`) draws ahead across epoch ends in a thread, so the next epoch's
    batches are on their way before the current one ends. The drawing thread and the sampler's filling
    thread are stopped however the loop ends (an error, Ctrl-C), so the process can exit."""
    config = run.config
    if config.max_seconds and run.ranks.distributed:
        raise ValueError("--max-seconds: not under torchrun (ranks would stop after different steps)")
    started = time.perf_counter()

    def more_steps() -> bool:
        in_time = not config.max_seconds or time.perf_counter() - started < config.max_seconds
        return run.step < config.steps and in_time
    progress = tqdm(total=config.steps, initial=run.step, desc=f"train {config.model}", unit="step",
                    disable=None if run.ranks.is_main else True)  # None: off when stderr is no terminal
    run.batches = EpochBatches(run.sampler)
    run.batches.start_at(run.epoch, run.epoch_batches)
    try:
        run_epochs(run, make_loader(run.batches, config, run.device), progress, more_steps)
        progress.close()
        if config.save_every:  # where the sampler stands now: a later --resume --steps N continues from here
            save_training_state(Path(config.out_dir) / STATE_FILE, run)
    finally:
        progress.close()
        run.batches.stop()
        close_sampler(run.sampler)


def run_epochs(run: Run, loader, progress, more_steps) -> None:
    """The steps of :func:`train_steps`: draw, launch, and log each step one step late. A batch of a later
    epoch than run.epoch opens that epoch (run.epoch, run.epoch_batches follow the batches trained on)."""
    config, out = run.config, Path(run.config.out_dir)
    pending = None  # the step launched last, finished (loss read) after the next one is launched
    batches = None  # the loader's iterator: started inside the first step's data wait
    while more_steps():
        waited = time.perf_counter()
        try:
            if batches is None:
                batches = redraw_batches(run, loader) if run.redraw else iter(loader)
            epoch, index, host_batch = next(batches)
        except StopIteration:
            raise ValueError(f"--cuts: the sampler gave 0 batches from {config.cuts} (empty corpus or nothing "
                             "fits)") from None
        except Exception as e:  # noqa: BLE001 - a worker's error arrives wrapped, with its traceback as text
            raise worker_error(e) from None
        if epoch != run.epoch:
            run.epoch, run.epoch_batches = epoch, 0
        if index != run.epoch_batches:
            raise RuntimeError(f"batch {index} of epoch {epoch} arrived where batch {run.epoch_batches} was due")
        try:
            launched = train_one_step(run, host_batch, data_s=time.perf_counter() - waited)
        except UtteranceOutOfMemoryError as e:  # the step before is kept; this one left no trace
            if pending is not None:
                log_step(run, finish_step(pending), progress)
            if not config.save_every:
                raise
            saved = save_training_state(out / STATE_FILE, run)
            raise UtteranceOutOfMemoryError(f"{e}; saved the training state before it to {saved} (step "
                                            f"{run.step}): --resume it with --joint-chunk-size", e.row) from None
        if pending is not None:  # the step before is done on the device by now, or nearly
            log_step(run, finish_step(pending), progress)
        pending = launched
        if config.save_every and run.step % config.save_every == 0 and run.step < config.steps:
            log_step(run, finish_step(pending), progress)
            pending = None
            save_training_state(out / STATE_FILE, run)
            run.last_end_event = None  # the next step's data_s is the host's wait, not the save
        if run.redraw:
            batches = None
    if pending is not None:
        log_step(run, finish_step(pending), progress)


def redraw_batches(run: Run, loader):
    """A new iterator of ``loader`` from the next batch to train on, drawn with the batch sizes in effect now
    (after a lowering): the batches drawn ahead with the old sizes are dropped, and drawn again."""
    run.batches.stop()
    with run.batches.lock:
        state = sampler_state_dict(run.sampler, batches_consumed=run.epoch_batches, epoch=run.epoch)
    close_sampler(run.sampler)
    restore_sampler(run, state, run.epoch)
    run.batches.start_at(run.epoch, run.epoch_batches)
    run.redraw = False
    return iter(loader)


@dataclass
class LaunchedStep:
    """A step whose work is queued on the device: its record lacks the loss and device times until
    :func:`finish_step`."""

    record: dict
    loss: torch.Tensor                 # on the host (pinned, filled asynchronously) or the CPU loss
    events: list                       # CUDA: start, backward done, end (after the loss copy); else []
    previous_end: object = None        # the end event of the step before (the device's idle gap)


def worker_error(e: Exception) -> Exception:
    """A DataLoader worker's exception as its own type with its last line (torch adds the worker's
    traceback to the message); exceptions that cannot be rebuilt from a message become RuntimeError."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    message = lines[-1] if lines else type(e).__name__
    prefix = f"{type(e).__name__}: "
    message = message[len(prefix):] if message.startswith(prefix) else message
    try:
        return type(e)(f"reading a batch: {message}")
    except Exception:  # noqa: BLE001 - exception types whose constructor takes other arguments
        return RuntimeError(f"reading a batch: {message}")


def train_one_step(run: Run, host_batch: dict, *, data_s: float) -> LaunchedStep:
    """Queue one optimizer step on a host batch without waiting for the device, so the next batch is
    fetched while this one runs. ``data_s``: seconds this process waited for the batch."""
    config, device = run.config, run.device
    started, started_host = time.perf_counter(), host_counters()
    cuda = device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else []
    audio_lens, token_lens = host_batch["audio_lens"], host_batch["token_lens"]
    lr = learning_rate(run.step, config)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    if cuda:
        events[0].record()
    run.model.train()
    parts = forward_backward(run, host_batch)
    loss = parts.loss
    if cuda:
        events[1].record()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if cuda:
        loss_host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        loss_host.copy_(loss.detach(), non_blocking=True)
        events[2].record()
    else:
        loss_host = loss.detach()
    host_s, (cpu_s, preemptions) = time.perf_counter() - started, host_counters(since=started_host)
    record = {"step": run.step, "epoch": run.epoch, "batch_size": int(len(audio_lens)),
              "audio_s": float(audio_lens.sum()) / run.model.config.sample_rate, "data_s": data_s,
              "host_data_s": data_s, "step_s": host_s, "host_s": host_s, "host_cpu_s": cpu_s,
              "host_preemptions": preemptions, "lr": lr,
              "input_padding": padding_share(audio_lens), "output_padding": padding_share(token_lens)}
    if len(parts.part_sizes) > 1:
        record["parts"] = parts.part_sizes
    if config.log_cut_ids:
        record["cut_ids"] = gather_objects(list(host_batch.get("cut_ids", [])), run.ranks)
    launched = LaunchedStep(record, loss_host, events, run.last_end_event)
    run.last_end_event = events[2] if cuda else None
    run.step += 1
    run.epoch_batches += 1
    return launched


def host_counters(since: tuple[float, int] | None = None) -> tuple[float, int]:
    """This process's CPU seconds (all its threads) and involuntary context switches (a thread put off its
    core for another task, e.g. a DataLoader worker), or their increase ``since`` an earlier reading."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    now = (usage.ru_utime + usage.ru_stime, usage.ru_nivcsw)
    return now if since is None else (now[0] - since[0], now[1] - since[1])


def forward_backward(run: Run, host_batch: dict) -> PartsTrained:
    """Forward and backward of a host batch, its gradients left in ``.grad``.

    One process: a batch that runs out of memory is trained in parts (workbench.training.split_batch), with
    one warning line, and its bucket's batch size is lowered for the rest of the run; a batch drawn before
    that, larger than its bucket's size now, is trained in parts of that size. Under torchrun every rank must
    run the same backward passes, so there an out-of-memory is a one-line error."""
    device = run.device
    bucket = batch_bucket(run, host_batch)
    num_rows = len(host_batch["audio_lens"])

    def to_device(part: dict) -> dict:
        return {k: v.to(device, non_blocking=True) for k, v in part.items() if isinstance(v, torch.Tensor)}

    def forward(batch: dict) -> torch.Tensor:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=run.config.dtype == "bf16"):
            return run.forward(batch)

    if run.ranks.distributed:
        try:
            loss = forward(to_device(host_batch))
            loss.backward()
        except RuntimeError as e:
            if not is_oom_error(e):
                raise
            lower = ("--max-duration" if run.config.profile is None
                     else f"that bucket's batch size in --profile {run.config.profile}")
            raise ValueError(f"out of memory at step {run.step} on a batch of {num_rows} utterances from "
                             f"{bucket_name(run, bucket)}; under torchrun batches are not split: lower "
                             f"{lower}") from None
        return PartsTrained(loss=loss.detach(), part_sizes=[num_rows])
    try:
        parts = train_in_parts(host_batch, forward=forward, to_device=to_device,
                               normalizer=lambda token_lens: float(run.model.loss_normalizer(token_lens)),
                               zero_grad=lambda: run.optimizer.zero_grad(set_to_none=True),
                               max_rows=None if bucket is None else run.sampler.constraint.batch_sizes[bucket])
    except UtteranceOutOfMemoryError as e:
        raise UtteranceOutOfMemoryError(
            f"out of memory at step {run.step} on one utterance alone, {utterance_name(host_batch, e.row)} from "
            f"{bucket_name(run, bucket)}: it cannot be split; make it fit (--joint-chunk-size, a smaller model) "
            "or leave it out (a corpus or profile without it; a new run)", e.row) from None
    if parts.failed_sizes:
        lower_batch_size(run, host_batch, bucket, parts)
    return parts


def batch_bucket(run: Run, host_batch: dict) -> int | None:
    """The bucket of the profile that a batch came from (its cuts share one), from the first cut's duration
    and token count; None without a profile or without those fields."""
    constraint = getattr(run.sampler, "constraint", None)
    if not isinstance(constraint, BucketBatchSizeConstraint) or not host_batch.get("durations"):
        return None
    bucket, _ = constraint.fitter.select(host_batch["durations"][0], host_batch["num_tokens"][0])
    return bucket if bucket >= 0 else None


def bucket_bounds(run: Run, bucket: int | None):
    """The bucket's upper bounds as the profile writes them: seconds (1D) or [seconds, tokens] (2D)."""
    return None if bucket is None else run.sampler.profile.bucket_duration_bins[bucket]


def bucket_name(run: Run, bucket: int | None) -> str:
    """``bucket 3 (<= 12.5 s, <= 140 tokens)`` (1D: seconds only); what the batches are without a profile."""
    if bucket is None:
        return ("lhotse's --max-duration batches (no profile)" if run.config.profile is None
                else "a bucket of the profile")
    bounds = bucket_bounds(run, bucket)
    if isinstance(bounds, (list, tuple)):
        return f"bucket {bucket} (<= {bounds[0]:g} s, <= {bounds[1]:g} tokens)"
    return f"bucket {bucket} (<= {bounds:g} s)"


def utterance_name(host_batch: dict, row: int) -> str:
    """``'cut-id' (3.20 s, 41 tokens)`` for a row of a batch (its row number when it has no cut ids)."""
    ids, durations = host_batch.get("cut_ids"), host_batch.get("durations")
    name = repr(ids[row]) if ids else f"row {row}"
    return (f"{name} ({durations[row]:.2f} s, {host_batch['num_tokens'][row]} tokens)" if durations
            else name)


def lower_batch_size(run: Run, host_batch: dict, bucket: int | None, parts: PartsTrained) -> None:
    """After a step that ran out of memory and was trained in parts: its bucket gives batches of at most the
    largest part size that fit, from batch ``from_batch`` of epoch ``from_epoch``; one warning line; the step
    is recorded in ``run.out_of_memory`` (saved in the training state, listed in the summary).

    A sampler that replays its epoch exactly (no concurrent bucketing) draws again from the next batch to
    train on (:func:`redraw_batches`); a concurrent one would replay different batches (cuts trained twice or
    not at all), so its size changes where its drawing thread stands and the batches drawn ahead with the old
    size are trained in parts."""
    lowered = from_epoch = from_batch = None
    if bucket is not None and parts.safe_size < run.sampler.constraint.batch_sizes[bucket]:
        lowered = parts.safe_size
        if getattr(run.sampler, "concurrent", False):
            with run.batches.lock:
                set_bucket_batch_size(run.sampler, bucket, lowered)
                from_epoch, from_batch = run.sampler.epoch, batches_drawn(run.sampler)
        else:
            run.redraw = True
            from_epoch, from_batch = run.epoch, run.epoch_batches + 1
    num_rows = len(host_batch["audio_lens"])
    run.out_of_memory.append({"step": run.step, "epoch": run.epoch, "bucket": bucket,
                              "bucket_bounds": bucket_bounds(run, bucket), "batch_size": num_rows,
                              "parts": parts.part_sizes, "lowered_to": lowered, "from_epoch": from_epoch,
                              "from_batch": from_batch})
    then = (f"; lowered the bucket's batch size to {lowered} for the rest of the run" if lowered else
            "; lower --max-duration" if bucket is None and run.config.profile is None else "")
    log.warning("step %d: out of memory on a batch of %d utterances from %s; trained it in %d parts (%s)%s",
                run.step, num_rows, bucket_name(run, bucket), len(parts.part_sizes),
                ", ".join(map(str, parts.part_sizes)), then)


def lowered_batch_sizes(run: Run) -> dict[int, int]:
    """Bucket -> the batch size it was lowered to in this run (buckets never lowered are left out)."""
    sizes: dict[int, int] = {}
    for event in run.out_of_memory:
        if event["lowered_to"] is not None:
            sizes[event["bucket"]] = min(event["lowered_to"], sizes.get(event["bucket"], event["lowered_to"]))
    return sizes


def out_of_memory_advice(run: Run) -> str | None:
    """One line for the summary's warnings after steps that ran out of memory: the batch sizes lowered and
    the profile line that fits (or, without a profile, a lower --max-duration)."""
    if not run.out_of_memory:
        return None
    lowered = lowered_batch_sizes(run)
    if not lowered:
        lower = (f"--max-duration (now {run.config.max_duration:g})" if run.config.profile is None
                 else f"the batch sizes of --profile {run.config.profile}")
        return f"out of memory in training on {len(run.out_of_memory)} batch(es), each trained in parts: lower {lower}"
    profile = run.sampler.profile
    changes = ", ".join(f"bucket_batch_size[{b}] {profile.bucket_batch_size[b]} -> {size}"
                        for b, size in sorted(lowered.items()))
    return (f"--profile {run.config.profile}: out of memory in training; lowered {changes}; a profile that fits "
            f"this run: {profile_fix(run)}")


def profile_fix(run: Run) -> str | None:
    """The profile's ``bucket_batch_size`` line with the sizes this run lowered (None when none were)."""
    lowered = lowered_batch_sizes(run)
    if not lowered:
        return None
    sizes = [lowered.get(b, size) for b, size in enumerate(run.sampler.profile.bucket_batch_size)]
    return f"bucket_batch_size: [{', '.join(map(str, sizes))}]"


def finish_step(step: LaunchedStep) -> dict:
    """Wait for a launched step and complete its record (times in seconds).

    On CUDA ``step_s`` is the device's time for the step (events) and ``data_s`` the device's idle gap
    since the step before ended: the time the GPU waited for this batch (host wait, copy, launch). On
    the CPU both are host times. ``host_s`` is the host's wall time to queue the step, ``host_cpu_s`` and
    ``host_preemptions`` this process's CPU seconds and involuntary context switches meanwhile
    (:func:`host_counters`): ``host_s`` near ``step_s`` says the host set the pace (or the launch queue was
    full), and many preemptions that other processes, such as the DataLoader's workers, took its cores.
    On CUDA ``num_host_alloc`` and ``host_alloc_us`` count the pinned-memory blocks made so far in the
    process and the microseconds CUDA's calls took to make them (a new block pins its pages, which can hold
    up the launches meanwhile)."""
    record = step.record
    if step.events:
        start, backward_done, end = step.events
        end.synchronize()
        record["forward_backward_s"] = start.elapsed_time(backward_done) / 1e3
        record["optimizer_s"] = backward_done.elapsed_time(end) / 1e3
        record["step_s"] = start.elapsed_time(end) / 1e3
        if step.previous_end is not None:
            record["data_s"] = step.previous_end.elapsed_time(start) / 1e3
        # the run's peak so far: read after the next step was launched, so it covers that step too
        record["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
        stats = torch.cuda.memory_stats()
        for key in ALLOCATOR_COUNTERS:
            record[key] = int(stats.get(key, 0))
        record["reserved_bytes"] = int(stats.get("reserved_bytes.all.current", 0))
        if hasattr(torch.cuda, "host_memory_stats"):  # the pinned (host) allocator: blocks made and the time in
            pinned = torch.cuda.host_memory_stats()   # CUDA's calls that made them (a new block pins pages)
            record["num_host_alloc"] = int(pinned.get("num_host_alloc", 0))
            record["host_alloc_us"] = float(pinned.get("host_alloc_time.total", 0))
    record["loss"] = float(step.loss)
    return record


def padding_share(lengths: torch.Tensor) -> float:
    """Share of a padded [B, max(lengths)] batch that is padding."""
    total = int(lengths.numel()) * int(lengths.max()) if lengths.numel() else 0
    return 1.0 - float(lengths.sum()) / total if total else 0.0


def log_step(run: Run, record: dict, progress) -> None:
    run.records.append(record)
    if run.ranks.is_main and (record["step"] % run.config.log_every == 0 or run.step == run.config.steps):
        log.info("step %d  loss %.4f  %.1f audio s/s  data wait %.0f %%", record["step"], record["loss"],
                 record["audio_s"] * run.ranks.world_size / max(record["step_s"] + record["data_s"], 1e-9),
                 100 * record["data_s"] / max(record["step_s"] + record["data_s"], 1e-9))
    progress.update(1)
    progress.set_postfix(loss=f"{record['loss']:.3f}")


def finish_run(run: Run, fit: dict | None, warnings: list[str]) -> dict:
    """Sum over ranks, check the ranks' weights agree, save (rank 0) and return the summary."""
    config, ranks, out = run.config, run.ranks, Path(run.config.out_dir)
    records = run.records
    audio_s, data_s, step_s = sum_over_ranks([sum(r["audio_s"] for r in records),
                                              sum(r["data_s"] for r in records),
                                              sum(r["step_s"] for r in records)], ranks)
    digests = gather_objects(weights_digest(run.model), ranks) if ranks.distributed else []
    if len(set(digests)) > 1:
        raise RuntimeError(f"the ranks' weights differ after training (digests {digests})")
    unfit = getattr(run.sampler, "unfit_report", None)
    if unfit is not None and fit is not None:
        seen = {"cuts": unfit.seen, "unfit": unfit.total_unfit, "reasons": dict(unfit.counts)}
        message = report_dropped(seen, config, when="in training", strict=False)  # --strict acted at the start
        warnings = warnings + ([message] if message else [])
    advice = out_of_memory_advice(run)
    warnings = warnings + ([advice] if advice else [])
    wall = (data_s + step_s) / ranks.world_size  # per-rank seconds; ranks run side by side
    summary = {"model": config.model, "steps": run.step, "world_size": ranks.world_size, "audio_seconds": audio_s,
               "losses": [r["loss"] for r in records],
               "audio_seconds_per_second": audio_s / wall if wall else 0.0,
               "data_wait_share": data_s / (data_s + step_s) if data_s + step_s else 0.0,
               "num_workers": config.num_workers, "worker_niceness": config.worker_niceness, "corpus_fit": fit,
               "warnings": warnings,
               "weights_digests": digests, "loss_backend": run.loss_backend, "checkpoint": None,
               "out_of_memory": run.out_of_memory,
               "lowered_batch_sizes": {str(b): size for b, size in sorted(lowered_batch_sizes(run).items())},
               "profile_fix": profile_fix(run)}
    if run.device.type == "cuda":
        summary["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(run.device))
    if ranks.is_main:
        checkpoint = save_checkpoint(out / "model.pt", run.model,
                                     extra={"train_config": asdict(config), "steps": run.step})
        summary["checkpoint"] = str(checkpoint)
        _write_jsonl(out / "train_log.jsonl", records)
        write_text_atomically(out / "train_summary.json", json.dumps(to_plain(summary), indent=2) + "\n")
        log.info("done: %d steps, %.1f audio s/s, data wait %.1f %%, saved %s", run.step,
                 summary["audio_seconds_per_second"], 100 * summary["data_wait_share"], checkpoint)
    return summary


def save_training_state(path: Path, run: Run) -> Path | None:
    """Everything a resumed run needs, atomically, in plain types (torch.load(weights_only=True)).
    Every rank takes part (each rank's sampler and RNG states); rank 0 writes."""
    with run.batches.lock if run.batches is not None else nullcontext():  # the drawing thread may be ahead
        sampler = sampler_state_dict(run.sampler, batches_consumed=run.epoch_batches, epoch=run.epoch)
    rank_state = {"sampler": sampler,
                  "records": run.records,  # each rank's own: the run's totals sum over ranks
                  "cpu_rng": torch.get_rng_state(),
                  "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    per_rank = gather_objects(rank_state, run.ranks)
    if not run.ranks.is_main:
        return None
    state = {"train_config": asdict(run.config), "input_digests": run.input_digests, "step": run.step,
             "epoch": run.epoch, "epoch_batches": run.epoch_batches, "records": run.records,
             "world_size": run.ranks.world_size, "out_of_memory": run.out_of_memory,
             "model": _cpu_state_dict(run.model), "optimizer": run.optimizer.state_dict(), "ranks": per_rank}
    return _save_atomically(path, state)


def load_training_state(path: Path, run: Run) -> None:
    """Restore what :func:`save_training_state` wrote into a freshly built run (before DDP wraps it).
    Raises FileNotFoundError, or ValueError naming the file and the setting that differs."""
    config = run.config
    if not path.is_file():
        raise FileNotFoundError(f"--resume: {str(path)!r} does not exist (train with --save-every first)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        saved, ranks_state = state["train_config"], state["ranks"]
        step, epoch, epoch_batches = int(state["step"]), int(state["epoch"]), int(state["epoch_batches"])
    except Exception as e:  # noqa: BLE001 - truncated, garbage or foreign files fail in many ways
        raise ValueError(f"--resume: {path} is not a training state written by `workbench train` "
                         f"({type(e).__name__}); delete it to start afresh, or pass another --out") from None
    for name in RESUME_MUST_MATCH:
        if saved.get(name) != getattr(config, name):
            raise ValueError(f"--resume: {name} is {getattr(config, name)!r} but {path} was trained with "
                             f"{saved.get(name)!r}")
    check_same_inputs(state.get("input_digests") or {}, run.input_digests, path)
    if len(ranks_state) != run.ranks.world_size:
        raise ValueError(f"--resume: {path} was saved by {len(ranks_state)} process(es), this run has "
                         f"{run.ranks.world_size}: resume with the same number of processes")
    if step > config.steps:
        raise ValueError(f"--resume: {path} is at step {step}, beyond --steps {config.steps}")
    mine = ranks_state[run.ranks.rank]
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.out_of_memory = list(state.get("out_of_memory", []))
    restore_sampler(run, mine["sampler"], epoch)
    torch.set_rng_state(mine["cpu_rng"])
    if mine["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(mine["cuda_rng"])
    run.step, run.epoch, run.epoch_batches = step, epoch, epoch_batches
    run.records = list(mine.get("records", state["records"]))


def restore_sampler(run: Run, state: dict, epoch: int) -> None:
    """Put ``run.sampler`` where ``state`` (from sampler_state_dict, in epoch ``epoch``) stands: the bucket batch
    sizes in effect at the epoch's start, then the lowerings of ``run.out_of_memory`` that took effect in that
    epoch replayed at their batches (a concurrent sampler's lowering drawn ahead into a later epoch holds
    from this epoch's start: that sampler's resumed batches may differ anyway)."""
    profile = getattr(run.sampler, "profile", None)
    if profile is not None:
        for bucket, size in enumerate(profile.bucket_batch_size):
            set_bucket_batch_size(run.sampler, bucket, size)
    lowered_this_epoch = []
    for event in run.out_of_memory:
        if event["lowered_to"] is None:
            continue
        if event["from_epoch"] == epoch:
            lowered_this_epoch.append((event["from_batch"], event["bucket"], event["lowered_to"]))
        else:
            set_bucket_batch_size(run.sampler, event["bucket"], event["lowered_to"])
    load_sampler_state_dict(run.sampler, state, batch_size_changes=lowered_this_epoch)


def save_checkpoint(path: str | os.PathLike, model: ASRModel, *, extra: dict | None = None) -> Path:
    """Weights + config in one file (plain tensors and dicts, loadable with weights_only=True), atomically."""
    return _save_atomically(path, {"config": model.config.to_dict(), "state_dict": _cpu_state_dict(model),
                                   **(extra or {})})


def _cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _save_atomically(path: str | os.PathLike, obj: dict) -> Path:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def load_checkpoint(path: str | os.PathLike, *, device: str | torch.device = "cpu") -> ASRModel:
    """The model saved by :func:`save_checkpoint`, in eval mode on ``device``. One-line errors for a
    missing or unreadable file. Off CUDA, a model saved with ``depthwise`` or ``time_depthwise="triton"`` gets
    torch's depthwise convolutions (the same parameters and sums), since the Triton kernels need a GPU."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
        config = ModelConfig(**saved["config"])
        state_dict = saved["state_dict"]
        if torch.device(device).type != "cuda":
            config = replace(config, depthwise="torch", time_depthwise="torch")
    except Exception as e:  # noqa: BLE001 - truncated, garbage or foreign files fail in many ways
        raise ValueError(f"{path}: not a checkpoint written by `workbench train` ({type(e).__name__})") from None
    model = ASRModel(config).to(device)
    model.load_state_dict(state_dict)
    return model.eval()


def _write_jsonl(path: Path, records: list[dict]) -> None:
    write_text_atomically(path, "".join(json.dumps(to_plain(r)) + "\n" for r in records))
