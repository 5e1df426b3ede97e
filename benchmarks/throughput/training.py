"""Training each sampler of the throughput study once, each in a fresh process, and the two comparisons read
from those runs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.gpu_clocks import GpuClocks
from benchmarks.mfu import step_flops
from benchmarks.throughput.profiles import build_study_model
from benchmarks.throughput.settings import LHOTSE_NUM_BUCKETS, say, trained_model, workdir
from workbench.records.throughput import PLAIN_ALLOCATOR, PROFILE_OF

REPO = Path(__file__).resolve().parents[2]
ALLOCATOR_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch reads these when CUDA starts
STARTUP_S = 40.0  # a training process's wall seconds besides --train-s (start, corpus, checkpoint), at most
WORKER_SLACK_S = 240.0  # a training process is stopped this long after its --train-s


def sampler_settings(prep: dict, sampler: str, folder) -> dict[str, Any]:
    """TrainConfig's sampler options: the baseline's max_duration (s) and lhotse buckets, or the sampler's
    profile (:data:`PROFILE_OF`) written to ``folder``/profile.yaml."""
    from workbench.bucketing import BucketProfile, save_profile

    if sampler == "baseline":
        return {"max_duration": prep["baseline"]["max_duration"], "num_buckets": LHOTSE_NUM_BUCKETS}
    p = prep["profiles"][PROFILE_OF[sampler]]
    return {"profile": str(save_profile(folder / "profile.yaml", BucketProfile(
        p["bucket_duration_bins"], p["bucket_batch_size"], p.get("max_tps"), p.get("metadata") or {})))}


def worker_env(expandable_segments: bool) -> dict[str, str]:
    """The training process's environment: no allocator settings (training turns expandable segments on,
    as any run does), or ``expandable_segments:False`` (which training respects); the repository on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    if not expandable_segments:
        env.update(dict.fromkeys(ALLOCATOR_ENV, "expandable_segments:False"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def train_sampler(run, prep: dict, sampler: str, train_s: float) -> dict[str, Any]:
    """Train one sampler for ``train_s`` wall seconds through ``workbench.training.recipe.train`` in a fresh
    process (``worker.py``; the allocator is chosen before CUDA starts): {"summary", "records"
    (train_log.jsonl), "settings", "allocator"}, or {"ooms": 1, "error", "settings", "allocator"} when one
    utterance does not fit. A process that fails otherwise raises RuntimeError with its last line."""
    from workbench.training.recipe import TrainConfig

    args = run.args
    out = workdir(args) / "train" / sampler
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = sampler_settings(prep, sampler, out)
    config = TrainConfig(cuts=prep["corpus"]["cuts"], tokenizer=prep["corpus"]["tokenizer"], out_dir=str(out),
                         model=trained_model(args), steps=1_000_000, max_seconds=train_s,
                         warmup_steps=args.warmup_steps, dtype="fp32" if args.smoke else "bf16",
                         device="cpu" if args.smoke else None, log_every=10,
                         **({"num_workers": 0} if args.smoke else {}), **settings,
                         **({} if args.worker_niceness is None else {"worker_niceness": args.worker_niceness}))
    expandable = sampler not in PLAIN_ALLOCATOR
    spec, result = out / "worker.json", out / "worker_result.json"
    spec.write_text(json.dumps({"train_config": asdict(config), "smoke": args.smoke}))
    say(run, f"training {sampler} for {train_s:g} s ({settings}; expandable segments {'on' if expandable else 'off'})")
    with open(out / "worker.log", "w") as log, GpuClocks() as clocks:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput.worker", str(spec), str(result)],
                              env=worker_env(expandable), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              timeout=train_s + WORKER_SLACK_S)
    if proc.returncode != 0 or not result.is_file():
        tail = (out / "worker.log").read_text().strip().splitlines()[-20:] or ["(no output)"]
        print("\n".join(tail), file=sys.stderr, flush=True)
        raise RuntimeError(f"{sampler}: the training process exited with code {proc.returncode}: {tail[-1]}")
    done = json.loads(result.read_text())
    allocator = {"expandable_segments": expandable, "settings": done.get("allocator_settings"),
                 "env": done.get("allocator_env")}
    if "summary" not in done:
        say(run, f"{sampler} ran out of memory: {done['error']}")
        return {"ooms": 1, "error": done["error"], "settings": settings, "allocator": allocator}
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    say(run, f"{sampler}: {len(records)} steps, {done['summary']['audio_seconds_per_second']:.0f} audio s/s")
    return {"summary": done["summary"], "records": records, "settings": settings, "allocator": allocator,
            "gpu_clocks": clocks.figures()}


def train_seconds(run, num_samplers: int, reserve_s: float) -> float:
    """Each sampler's wall seconds of training: ``--train-s``, less where ``--budget-s`` would not hold
    ``num_samplers`` runs (each STARTUP_S more) and ``reserve_s`` after them; at least 1 s."""
    args = run.args
    if not args.budget_s:
        return args.train_s
    share = (args.budget_s - run.seconds() - reserve_s) / max(1, num_samplers) - STARTUP_S
    return max(1.0, min(args.train_s, round(share)))


def views(args: argparse.Namespace, prep: dict, trained: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """The two comparisons from one run per sampler: {"seconds": figures over every step, "steps": figures
    over the first k steps (k: ``--steps``, or fewer when a run reached fewer)}, each {sampler: RunFigures}.
    ``ooms``: the steps that ran out of memory (each trained in parts)."""
    from workbench.records.throughput import run_figures

    warmup, k = args.warmup_records, same_steps(args, trained)
    out: dict[str, dict[str, dict]] = {"seconds": {}, "steps": {}}
    for sampler, t in trained.items():
        if "records" not in t:
            out["seconds"][sampler], out["steps"][sampler] = dict(t), dict(t)
            continue
        uppers, records = bucket_uppers(prep, sampler), t["records"]
        ooms = [e["step"] for e in t["summary"].get("out_of_memory") or []]
        # a record's peak is read once the next step is launched: record k-2's covers the first k steps
        first = {**t["summary"], "peak_allocated_bytes": records[max(0, k - 2)].get("peak_allocated_bytes")}
        out["seconds"][sampler] = {**run_figures(t["summary"], records, uppers, warmup=warmup), "ooms": len(ooms),
                                   "settings": t["settings"], "allocator_settings": t.get("allocator"),
                                   "call": t.get("call"), "gpu_clocks": t.get("gpu_clocks"),
                                   "worker_niceness": t["summary"].get("worker_niceness")}
        out["steps"][sampler] = {**run_figures(first, records[:k], uppers, warmup=warmup),
                                 "ooms": sum(step < k for step in ooms), "settings": t["settings"],
                                 "allocator_settings": t.get("allocator"), "call": t.get("call"),
                                 "worker_niceness": t["summary"].get("worker_niceness")}
    return out


def same_steps(args: argparse.Namespace, trained: dict[str, dict]) -> int:
    """k of the same-steps view: ``--steps``, or the fewest steps a trained (not OOMed) run reached."""
    return min([args.steps, *(len(t["records"]) for t in trained.values() if "records" in t)])


def bucket_uppers(prep: dict, sampler: str) -> list[float]:
    """The upper duration bounds (s) of a sampler's buckets, ascending, without repeats (2D sub-buckets
    share one): lhotse's bins and the longest cut for the baseline, the profile's bins otherwise."""
    if sampler == "baseline":
        return sorted({*prep["baseline"]["lhotse_bins"], max(b["longest_s"] for b in prep["baseline"]["buckets"])})
    bins = prep["profiles"][PROFILE_OF[sampler]]["bucket_duration_bins"]
    return sorted({float(b[0] if isinstance(b, (list, tuple)) else b) for b in bins})


def add_mfu(args: argparse.Namespace, by_view: dict[str, dict[str, dict]], prep: dict, rate: float) -> None:
    """Each sampler's FLOPs per padded audio second (one forward+backward at its median batch shape over
    the whole run, under FlopCounterMode; both views share it) and each view's MFU: those FLOPs x padded
    audio seconds per second / the measured matmul rate (FLOP/s)."""
    import torch

    from workbench.data.tokenizer import load_tokenizer

    model = build_study_model(args, load_tokenizer(prep["corpus"]["tokenizer"]).vocab_size())
    tps = prep["corpus"]["tokens"][2] / max(prep["corpus"]["duration_s"][2], 1e-9)
    for sampler, run in by_view["seconds"].items():
        if "audio_seconds_per_second" not in run:
            continue
        b, d = max(1, round(run["batch_size"]["median"])), run["longest_cut_s"]["median"]
        per_second = step_flops(model, b, d, max(1, round(d * tps)), args.smoke) / (b * d)
        for view in by_view.values():
            view[sampler]["flops_per_padded_audio_s"] = per_second
            view[sampler]["mfu"] = per_second * view[sampler]["padded_audio_seconds_per_second"] / rate
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
