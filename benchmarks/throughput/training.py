"""Training each sampler of the throughput study once, and the two comparisons read from those runs."""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from benchmarks.mfu import step_flops
from benchmarks.throughput.profiles import build_study_model
from benchmarks.throughput.settings import LHOTSE_NUM_BUCKETS, say, trained_model, workdir


def sampler_settings(prep: dict, sampler: str, folder) -> dict[str, Any]:
    """TrainConfig's sampler options: the baseline's max_duration (s) and lhotse buckets, or a profile
    written to ``folder``/profile.yaml."""
    from workbench.bucketing import BucketProfile, save_profile

    if sampler == "baseline":
        return {"max_duration": prep["baseline"]["max_duration"], "num_buckets": LHOTSE_NUM_BUCKETS}
    p = prep["profiles"][sampler]
    return {"profile": str(save_profile(folder / "profile.yaml", BucketProfile(
        p["bucket_duration_bins"], p["bucket_batch_size"], p.get("max_tps"), p.get("metadata") or {})))}


def train_sampler(run, prep: dict, sampler: str) -> dict[str, Any]:
    """Train one sampler through ``workbench.training.recipe.train`` for ``--train-s`` wall seconds:
    {"summary", "records" (train_log.jsonl), "settings"}, or {"ooms": 1, "error", "settings"}."""
    from workbench.memory.oom import is_oom_error
    from workbench.training.recipe import TrainConfig, train

    args = run.args
    out = workdir(args) / "train" / sampler
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = sampler_settings(prep, sampler, out)
    config = TrainConfig(cuts=prep["corpus"]["cuts"], tokenizer=prep["corpus"]["tokenizer"], out_dir=str(out),
                         model=trained_model(args), steps=1_000_000, max_seconds=args.train_s,
                         warmup_steps=args.warmup_steps, dtype="fp32" if args.smoke else "bf16",
                         device="cpu" if args.smoke else None, log_every=10,
                         **({"num_workers": 0} if args.smoke else {}), **settings)
    say(run, f"training {sampler} for {args.train_s:g} s ({settings})")
    try:
        summary = train(config)
    except Exception as e:  # noqa: BLE001 - an OOM is a result (counted), anything else is a failure
        if not is_oom_error(e):
            raise
        say(run, f"{sampler} ran out of memory: {str(e).splitlines()[0]}")
        return {"ooms": 1, "error": str(e).splitlines()[0], "settings": settings}
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    say(run, f"{sampler}: {len(records)} steps, {summary['audio_seconds_per_second']:.0f} audio s/s")
    return {"summary": summary, "records": records, "settings": settings}


def views(args: argparse.Namespace, prep: dict, trained: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """The two comparisons from one run per sampler: {"seconds": figures over every step, "steps": figures
    over the first k steps (k: ``--steps``, or fewer when a run reached fewer)}, each {sampler: RunFigures}."""
    from workbench.records.throughput import run_figures

    warmup, k = args.warmup_records, same_steps(args, trained)
    out: dict[str, dict[str, dict]] = {"seconds": {}, "steps": {}}
    for sampler, t in trained.items():
        if "records" not in t:
            out["seconds"][sampler], out["steps"][sampler] = dict(t), dict(t)
            continue
        uppers, records = bucket_uppers(prep, sampler), t["records"]
        # a record's peak is read once the next step is launched: record k-2's covers the first k steps
        first = {**t["summary"], "peak_allocated_bytes": records[max(0, k - 2)].get("peak_allocated_bytes")}
        out["seconds"][sampler] = {**run_figures(t["summary"], records, uppers, warmup=warmup), "ooms": 0,
                                   "settings": t["settings"]}
        out["steps"][sampler] = {**run_figures(first, records[:k], uppers, warmup=warmup), "ooms": 0,
                                 "settings": t["settings"]}
    return out


def same_steps(args: argparse.Namespace, trained: dict[str, dict]) -> int:
    """k of the same-steps view: ``--steps``, or the fewest steps a trained (not OOMed) run reached."""
    return min([args.steps, *(len(t["records"]) for t in trained.values() if "records" in t)])


def bucket_uppers(prep: dict, sampler: str) -> list[float]:
    """The upper duration bounds (s) of a sampler's buckets, ascending, without repeats (2D sub-buckets
    share one): lhotse's bins and the longest cut for the baseline, the profile's bins otherwise."""
    if sampler == "baseline":
        return sorted({*prep["baseline"]["lhotse_bins"], max(b["longest_s"] for b in prep["baseline"]["buckets"])})
    bins = prep["profiles"][sampler]["bucket_duration_bins"]
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
        if run.get("ooms"):
            continue
        b, d = max(1, round(run["batch_size"]["median"])), run["longest_cut_s"]["median"]
        per_second = step_flops(model, b, d, max(1, round(d * tps)), args.smoke) / (b * d)
        for view in by_view.values():
            view[sampler]["flops_per_padded_audio_s"] = per_second
            view[sampler]["mfu"] = per_second * view[sampler]["padded_audio_seconds_per_second"] / rate
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
