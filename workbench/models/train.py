"""Training recipe: train any workbench model on a lhotse corpus.

    python -m workbench train --cuts data/tts/cuts.jsonl.gz --tokenizer data/tts/tokenizer_bpe256.model \
        --model large-rnnt --profile profiles/large-rnnt.yaml --steps 2000 --out runs/large-rnnt

With --profile (from the OOMptimizer) batches come from workbench.bucketing.make_sampler and respect
its per-bucket batch sizes; without one, from lhotse's DynamicBucketingSampler with --max-duration
seconds of audio per batch. Logs loss and audio seconds per second; writes <out>/model.pt (weights and
config: load with load_checkpoint, which uses torch.load(weights_only=True)) and <out>/train_log.jsonl.

--save-every N also writes <out>/train_state.pt every N steps (and at the end): weights, optimizer,
where the sampler is in its epoch, RNG states and the log so far. --resume continues from it: the
same corpus, model and sampler settings are required (a mismatch names the field); --steps may grow.
Without a profile, or with --no-concurrent, the resumed run is the run that was never stopped; with
concurrent bucketing (the default) the batches after the checkpoint may differ.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench.atomic import atomic_path, write_text_atomically
from workbench.models.collate import collate_cuts, cut_text
from workbench.models.config import ModelConfig
from workbench.models.model import DTYPES, ASRModel, build_model

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    cuts: str                        # lhotse CutSet manifest (.jsonl or .jsonl.gz)
    tokenizer: str                   # sentencepiece .model; its size sets the model's vocabulary
    out_dir: str                     # where model.pt and train_log.jsonl go
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
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    log_every: int = 10              # steps between log lines
    seed: int = 0                    # model init and sampler shuffling
    save_every: int = 0              # steps between resumable train_state.pt saves (0: only model.pt at the end)
    resume: bool = False             # continue from <out_dir>/train_state.pt
    concurrent: bool = True          # concurrent bucketing in make_sampler (off: exact resume)


STATE_FILE = "train_state.pt"
# Settings a resumed run must share with the saved one (steps, logging and saving may change).
RESUME_MUST_MATCH = ("cuts", "tokenizer", "model", "profile", "max_duration", "num_buckets", "lr",
                     "warmup_steps", "weight_decay", "grad_clip", "dtype", "seed", "concurrent")


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up over warmup_steps (step 0 -> lr / warmup), then cosine to 0 at config.steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_batches(cuts, config: TrainConfig, tokenizer):
    """The sampler for this run: make_sampler with the profile, else lhotse's DynamicBucketingSampler."""
    from lhotse.dataset import DynamicBucketingSampler

    if config.profile:
        from workbench.bucketing import load_profile, make_sampler

        def num_tokens(cut) -> int:
            custom = cut.custom or {}
            return int(custom["num_tokens"]) if "num_tokens" in custom else len(tokenizer.encode(cut_text(cut)))

        return make_sampler(cuts, load_profile(config.profile), shuffle=True, seed=config.seed,
                            num_tokens_fn=num_tokens, concurrent=config.concurrent)
    return DynamicBucketingSampler(cuts, max_duration=config.max_duration, num_buckets=config.num_buckets,
                                   shuffle=True, seed=config.seed)


def train(config: TrainConfig) -> dict:
    """Run the recipe; returns {"losses": [...], "audio_seconds_per_second": float, "checkpoint": path}."""
    from lhotse import CutSet

    from workbench.data.tokenizer import load_tokenizer

    if config.dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {config.dtype!r}")
    if config.steps < 1:
        raise ValueError(f"steps: need at least 1, got {config.steps}")
    if not Path(config.cuts).exists():
        raise FileNotFoundError(f"cuts manifest {config.cuts!r} does not exist")
    tokenizer = load_tokenizer(config.tokenizer)
    torch.manual_seed(config.seed)
    device = torch.device(config.device)
    model = build_model(config.model, vocab_size=tokenizer.vocab_size()).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sampler = make_batches(CutSet.from_file(config.cuts), config, tokenizer)

    records: list[dict] = []
    step, epoch = 0, 0
    out = Path(config.out_dir)
    if config.resume:
        step, epoch, records = load_training_state(out / STATE_FILE, config, model, optimizer, sampler)
        log.info("resumed from %s at step %d (epoch %d)", out / STATE_FILE, step, epoch)
    progress = tqdm(total=config.steps, initial=step, desc=f"train {config.model}", unit="step")
    resumed_mid_epoch = config.resume  # the restored sampler may have nothing left of its epoch
    while step < config.steps:
        sampler.set_epoch(epoch)
        batches_this_epoch = 0
        for cuts in sampler:
            start = time.perf_counter()
            host_batch = collate_cuts(cuts, tokenizer)
            seconds = float(host_batch["audio_lens"].sum()) / model.config.sample_rate  # on the host: no sync
            batch = {k: v.to(device, non_blocking=True) for k, v in host_batch.items()}
            lr = learning_rate(step, config)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = model.training_step(batch, dtype=DTYPES[config.dtype])
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss)  # synchronizes, so the timing below is honest
            elapsed = time.perf_counter() - start
            records.append({"step": step, "loss": loss_value, "batch_size": len(host_batch["audio_lens"]),
                            "audio_s": seconds, "step_s": elapsed, "lr": lr})
            if step % config.log_every == 0 or step == config.steps - 1:
                log.info("step %d  loss %.4f  %.1f audio s/s", step, loss_value, seconds / elapsed)
            progress.update(1)
            progress.set_postfix(loss=f"{loss_value:.3f}")
            step += 1
            batches_this_epoch += 1
            if config.save_every and step % config.save_every == 0 and step < config.steps:
                save_training_state(out / STATE_FILE, config, model, optimizer, sampler, step, epoch, records)
            if step >= config.steps:
                break
        if batches_this_epoch == 0 and not resumed_mid_epoch:
            raise ValueError(f"cuts: the sampler gave 0 batches from {config.cuts} (empty corpus or nothing fits)")
        resumed_mid_epoch = False
        if step >= config.steps:
            break  # the epoch stays current: a checkpoint saved below resumes inside it
        epoch += 1
    progress.close()
    if config.save_every:  # where the sampler stands now: a later --resume --steps N continues from here
        save_training_state(out / STATE_FILE, config, model, optimizer, sampler, step, epoch, records)
    from workbench.bucketing import close_sampler

    close_sampler(sampler)

    checkpoint = save_checkpoint(out / "model.pt", model, extra={"train_config": asdict(config), "steps": step})
    _write_jsonl(out / "train_log.jsonl", records)
    throughput = sum(r["audio_s"] for r in records) / sum(r["step_s"] for r in records)
    log.info("done: %d steps, %.1f audio s/s, saved %s", step, throughput, checkpoint)
    return {"losses": [r["loss"] for r in records], "audio_seconds_per_second": throughput,
            "checkpoint": checkpoint}


def save_training_state(path: Path, config: TrainConfig, model: ASRModel, optimizer, sampler, step: int,
                        epoch: int, records: list[dict]) -> Path:
    """Everything a resumed run needs, atomically, in plain types (torch.load(weights_only=True))."""
    from workbench.bucketing import sampler_state_dict

    state = {"train_config": asdict(config), "step": step, "epoch": epoch, "records": records,
             "model": _cpu_state_dict(model),
             "optimizer": optimizer.state_dict(), "sampler": sampler_state_dict(sampler),
             "cpu_rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    return _save_atomically(path, state)


def load_training_state(path: Path, config: TrainConfig, model: ASRModel, optimizer,
                        sampler) -> tuple[int, int, list[dict]]:
    """Restore what :func:`save_training_state` wrote into a freshly built run; returns (step, epoch,
    records). Raises FileNotFoundError, or ValueError naming the setting that differs."""
    from workbench.bucketing import load_sampler_state_dict

    if not path.is_file():
        raise FileNotFoundError(f"--resume: {str(path)!r} does not exist (train with --save-every first)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved = state["train_config"]
    for name in RESUME_MUST_MATCH:
        if saved.get(name) != getattr(config, name):
            raise ValueError(f"--resume: {name} is {getattr(config, name)!r} but {path} was trained with "
                             f"{saved.get(name)!r}")
    if state["step"] > config.steps:
        raise ValueError(f"--resume: {path} is at step {state['step']}, beyond --steps {config.steps}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    load_sampler_state_dict(sampler, state["sampler"])
    torch.set_rng_state(state["cpu_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"], state["epoch"], list(state["records"])


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
    """The model saved by :func:`save_checkpoint`, in eval mode on ``device``."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    saved = torch.load(path, map_location=device, weights_only=True)
    model = ASRModel(ModelConfig(**saved["config"])).to(device)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def _write_jsonl(path: Path, records: list[dict]) -> None:
    write_text_atomically(path, "".join(json.dumps(r) + "\n" for r in records))
