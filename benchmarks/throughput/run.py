"""The throughput study: does the OOMptimizer's profile make training faster than lhotse's best fixed batch?

    python -m benchmarks.throughput --model {xl-aed,large-rnnt} --part prepare --out DIR
    python -m benchmarks.throughput --model large-rnnt --part train   --out DIR   # needs the prepare part
    python -m benchmarks.throughput --model large-rnnt --part all --smoke --out /tmp/x   # CPU, tiny

Corpus: espeak-ng speech (``workbench.data.tts``) made on the GPU machine itself (espeak-ng is carried
there as Debian packages; its synthesis is far faster than real time), with ``--join`` sentences per
utterance so durations reach 30-40 s as in real corpora (longer ones are dropped), each utterance listed
``--repeat`` times so every bucket fills many full batches at the profile's batch sizes. Real audio is
read, resampled and collated by the DataLoader workers as in any training run; repeats share one file, so
the corpus is small to make and nothing large travels to the GPU machine. Carrying a corpus made here
would not fit the 64 MiB a call carries; audio synthesized on the fly would measure the synthesis.

Parts (each within one GPU call): ``prepare`` makes the corpus, 1D and 2D bins (``profile_from_arrays``),
fills both with the OOMptimizer (``oomptimize`` in this process: the model and probe stay loaded between
the two profiles and the baseline search, where the CLI would load the model three times), and finds the
baseline's ``max_duration``; ``train`` trains each of the three samplers once, for ``--seconds`` of wall
time, and reads two comparisons from those runs: the same wall time (every step of each run) and the same
optimizer steps (the first k steps of each run, k = ``--steps`` or the fewest steps a run reached, if
less). A run's first k steps draw the batches a run stopped at k would draw (same seed), so their speed,
batch sizes and padding are that run's, and one run per sampler serves both; only the learning rate
differs (training's cosine decays over the 10^6 steps asked for, so it is nearly constant after the warm-up,
where a run of k steps would decay to 0 at k), which moves the loss, not the speed. A later part reads
the prepared profiles from the record (``--from``, default the committed one) and remakes the corpus
(same seed, same cuts; kept in ``--corpus-dir`` between the models and calls of one machine). The record
is rewritten after each part and each trained sampler, so a call stopped at its limit keeps what finished.

Baseline: lhotse's ``DynamicBucketingSampler`` with the largest ``max_duration`` that survives a full pass.
lhotse puts a cut in bucket i when bins[i-1] < duration <= bins[i] (bins as it estimates them from the
corpus) and adds cuts to a batch until one more cut as long as the longest so far would take the padded
duration (cuts x longest) above max_duration; the cut that closes the batch may be longer. So a batch
of bucket b holds at most floor(max_duration / shortest cut of b) cuts, padded at worst to b's longest
cut and most tokens. The OOMptimizer's search over those worst-case shapes gives the largest batch size
B_b that fits each bucket, so max_duration = min over b of B_b x shortest cut of b (to 0.1 s below). One
pass of that sampler over the corpus (batch shapes only, no training) then checks that no batch exceeds
its bucket's probed worst case. The probe runs under the same memory fraction as the profiles' search.
"""

from __future__ import annotations

import argparse
import bisect
import fcntl
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.mfu import matmul_flops_per_second, step_flops
from benchmarks.harness import check_smoke_out, cpu_smoke_torch, cuda_missing
from workbench.records.throughput import record_name
from workbench.records.results import RESULTS_DIR

MODELS = ("large-rnnt", "xl-aed")
SMOKE_MODELS = {"large-rnnt": "tiny-rnnt", "xl-aed": "tiny-aed"}  # --smoke trains these on the CPU
SAMPLERS = ("baseline", "1d", "2d")
PARTS = ("prepare", "train", "all")
MAX_UTTERANCE_S = 40.0  # longer joined utterances are dropped from the corpus
LHOTSE_NUM_BUCKETS = 10  # the baseline's buckets (TrainConfig's default)
SMOKE_BATCH_AUDIO_S = 12.0  # smoke: the modelled memory budget holds this much padded audio per batch


@dataclass
class Study:
    args: argparse.Namespace
    workdir: Path
    model: str                      # the model trained (the tiny stand-in under --smoke)
    corpus_dir: Path | None = None  # default workdir/corpus
    figures: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    save: Any = None                # callable: write the record as it stands (to record_path)
    record_path: Path | None = None

    def say(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f} s] {message}", flush=True)


# ------------------------------------------------------------------------------------------ corpus


def make_corpus(study: Study) -> tuple[dict[str, Any], Any]:
    """The study's corpus under workdir/corpus (kept when already there): its paths and statistics, and
    its CutArrays (durations, tokens counted by its tokenizer)."""
    args, root = study.args, study.corpus_dir or study.workdir / "corpus"
    cuts_path, tokenizer_path = root / "cuts.jsonl.gz", root / "tokenizer.model"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:  # two studies in parallel make it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        _make_corpus_files(study, root, cuts_path, tokenizer_path)
    from workbench.data.tokenizer import tokenized_cut_arrays

    arrays = tokenized_cut_arrays(cuts_path, tokenizer_path, progress=False)
    d, u = arrays.durations, arrays.num_tokens
    return {"cuts": str(cuts_path), "tokenizer": str(tokenizer_path), "num_cuts": int(len(d)),
            "unique_utterances": int(len(d) // args.repeat), "repeat": args.repeat, "join": args.join,
            "hours": float(d.sum() / 3600), "duration_s": [float(x) for x in _percentiles(d)],
            "tokens": [float(x) for x in _percentiles(u)], "max_tokens_per_second": float((u / d).max()),
            "kind": "tone (smoke)" if args.smoke else "espeak-ng tts"}, arrays


def _make_corpus_files(study: Study, root: Path, cuts_path: Path, tokenizer_path: Path) -> None:
    """Speak (or, under --smoke, tone) the corpus into ``root`` unless its cuts are already there."""
    args = study.args
    if cuts_path.is_file():  # written last (atomically), so a corpus with cuts is whole
        return
    root.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus

        made = write_tone_corpus(root / "tones", args.utterances, seed=0, min_letters=3, max_letters=24)
        train_letter_tokenizer(root / "tokenizer")  # writes tokenizer_path
        repeated_cuts(made, cuts_path, args.repeat, max_duration=math.inf)
    else:
        from workbench.data.tokenizer import train_tokenizer
        from workbench.data.tts import default_text, make_tts_corpus, split_sentences

        train_tokenizer(split_sentences(default_text()), root / "tokenizer", 256, progress=False)
        made = make_tts_corpus(root / "tts", num_utterances=args.utterances, join=args.join,
                               tokenizer=tokenizer_path, num_workers=max(1, (os.cpu_count() or 2) - 1),
                               progress=False)
        repeated_cuts(made["cuts"], cuts_path, args.repeat, max_duration=MAX_UTTERANCE_S)


def _percentiles(x):
    import numpy as np

    return np.percentile(x, [0, 10, 50, 90, 100])


def repeated_cuts(source: str | os.PathLike, out: Path, repeat: int, *, max_duration: float) -> Path:
    """Write ``out``: the cuts of ``source`` up to ``max_duration`` seconds, each listed ``repeat`` times
    (ids suffixed -r1, -r2, ...; copies share the audio), interleaved so that the copies of one utterance
    are a corpus apart."""
    from lhotse import CutSet

    from workbench.atomic import atomic_path

    kept = [c for c in CutSet.from_file(source) if c.duration <= max_duration]
    if not kept:
        raise ValueError(f"{source}: no cut of at most {max_duration:g} s")
    copies = [c if r == 0 else c.with_id(f"{c.id}-r{r}") for r in range(repeat) for c in kept]
    with atomic_path(out) as tmp:
        CutSet.from_cuts(copies).to_file(tmp)
    return out


# ----------------------------------------------------------------------------------------- probes


def build_study_model(study: Study, vocab_size: int):
    import torch

    from workbench.models import build_model

    device = "cuda" if torch.cuda.is_available() and not study.args.smoke else "cpu"
    return build_model(study.model, vocab_size=vocab_size).to(device)


def make_probe(study: Study, model):
    """The OOMptimizer's GPU probe, or under --smoke the modelled one (budget: SMOKE_BATCH_AUDIO_S of
    padded audio per batch above the weights and optimizer state)."""
    import torch

    if study.args.smoke:
        from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe

        base = 4 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        budget = base + 256.0 * model.config.sample_rate * SMOKE_BATCH_AUDIO_S
        return ModeledMemoryProbe(model, dtype=torch.float32, budget_bytes=budget)
    from workbench.oomptimizer.probe import TrainingStepProbe

    return TrainingStepProbe(model, dtype=torch.bfloat16, memory_fraction=study.args.memory_fraction)


def fill_profile(study: Study, model, probe, bins):
    """``bins`` with batch sizes: ``oomptimize`` on a GPU; the same search over the modelled probe when smoke."""
    from workbench.oomptimizer.run import oomptimize, profile_buckets
    from workbench.oomptimizer.search import search_batch_sizes

    if not study.args.smoke:
        profile, _ = oomptimize(model, study.model, bins, memory_fraction=study.args.memory_fraction)
        return profile
    result = search_batch_sizes(profile_buckets(bins), probe, budget_bytes=probe.budget_bytes)
    bins.bucket_batch_size = result.profile_batch_sizes()
    bins.metadata.update(model=study.model, probes=result.num_probes, modelled_memory=True)
    return bins


def make_profiles(study: Study, arrays, model, probe) -> dict[str, dict]:
    """1D and 2D bins from the corpus, filled by the OOMptimizer; {"1d": profile dict, "2d": ...}."""
    from workbench.bucketing import profile_from_arrays

    args, out = study.args, {}
    for kind in ("1d", "2d"):
        started = time.perf_counter()
        if kind == "1d":
            bins = profile_from_arrays(arrays.durations, arrays.num_tokens, num_buckets=args.buckets_1d, one_d=True)
            bins.max_tps = float((arrays.num_tokens / arrays.durations).max())  # the probe's token bound: no cut above
        else:
            bins = profile_from_arrays(arrays.durations, arrays.num_tokens, num_buckets=args.buckets_2d,
                                       num_subbuckets=2)
        profile = fill_profile(study, model, probe, bins)
        out[kind] = {**profile.to_dict(), "search_s": time.perf_counter() - started}
        study.say(f"{kind} profile: {profile.num_buckets} buckets, batch sizes {profile.bucket_batch_size}")
    return out


def lhotse_buckets(cuts_path: str, tokens_by_id: dict[str, int], max_duration: float = 100.0
                   ) -> tuple[list[float], list[dict]]:
    """lhotse's duration bins for this corpus (as DynamicBucketingSampler estimates them) and, per bucket
    (lhotse's rule: bisect_left), its cuts, shortest and longest cut (s) and most tokens."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler

    cuts = CutSet.from_file(cuts_path)
    sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, num_buckets=LHOTSE_NUM_BUCKETS,
                                      shuffle=True, seed=0)
    bins = [float(b) for b in sampler.duration_bins]
    buckets = [{"index": i, "cuts": 0, "shortest_s": math.inf, "longest_s": 0.0, "max_tokens": 0}
               for i in range(len(bins) + 1)]
    for cut in cuts:  # the cuts' own durations: the manifest's rounding decides ties at a bin as in lhotse
        duration, tokens = cut.duration, tokens_by_id[cut.id]
        b = buckets[bisect.bisect_left(bins, duration)]
        b["cuts"] += 1
        b["shortest_s"], b["longest_s"] = min(b["shortest_s"], duration), max(b["longest_s"], duration)
        b["max_tokens"] = max(b["max_tokens"], int(tokens))
    return bins, [b for b in buckets if b["cuts"]]


def find_baseline(study: Study, corpus: dict, arrays, probe) -> dict[str, Any]:
    """The largest max_duration whose worst-case batch fits every lhotse bucket, then a check pass."""
    from workbench.oomptimizer.search import search_batch_sizes

    started = time.perf_counter()
    tokens_by_id = dict(zip(arrays.ids, arrays.num_tokens.tolist()))
    bins, buckets = lhotse_buckets(corpus["cuts"], tokens_by_id)
    shapes = [(b["longest_s"], float(b["max_tokens"])) for b in buckets]
    result = search_batch_sizes(shapes, probe, budget_bytes=probe.budget_bytes)
    for b, size in zip(buckets, result.profile_batch_sizes()):
        b["max_batch_size"] = int(size)
    max_duration = math.floor(10 * min(b["max_batch_size"] * b["shortest_s"] for b in buckets)) / 10
    if max_duration <= 0:
        raise RuntimeError("baseline: not even one cut of the longest bucket fits the probe's budget")
    study.say(f"baseline: max_duration {max_duration:g} s over lhotse bins {[round(x, 1) for x in bins]}")
    return {"max_duration": max_duration, "lhotse_bins": bins, "buckets": buckets, "probes": result.num_probes,
            "search_s": time.perf_counter() - started,
            "pass": check_baseline_pass(corpus, tokens_by_id, bins, buckets, max_duration)}


def check_baseline_pass(corpus: dict, tokens_by_id: dict[str, int], bins: list[float], buckets: list[dict],
                        max_duration: float) -> dict:
    """One epoch of the baseline sampler (shapes only): batches, and those beyond their bucket's probed
    worst case (more cuts than B_b or floor(max_duration / shortest), a longer cut or more tokens)."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler

    by_index = {b["index"]: b for b in buckets}
    sampler = DynamicBucketingSampler(CutSet.from_file(corpus["cuts"]), max_duration=max_duration,
                                      num_buckets=LHOTSE_NUM_BUCKETS, shuffle=True, seed=0)
    batches, exceeding, largest = 0, 0, 0
    for batch in sampler:
        longest = max(c.duration for c in batch)
        b = by_index.get(bisect.bisect_left(bins, longest))
        n = len(batch)
        tokens = max(tokens_by_id[c.id] for c in batch)
        # lhotse yields a cut longer than max_duration alone: one cut is always a batch
        limit = 0 if b is None else min(b["max_batch_size"], max(1, math.floor(max_duration / b["shortest_s"])))
        exceeding += b is None or n > limit or longest > b["longest_s"] or tokens > b["max_tokens"]
        batches, largest = batches + 1, max(largest, n)
    return {"batches": batches, "exceeding": exceeding, "largest_batch": largest}


# ----------------------------------------------------------------------------------------- training


def train_sampler(study: Study, prep: dict, sampler: str) -> dict[str, Any]:
    """Train one sampler through ``workbench.training.recipe.train`` for ``--seconds`` of wall time:
    {"summary", "records" (train_log.jsonl), "settings"}, or {"ooms": 1, "error", "settings"}."""
    from workbench.bucketing import BucketProfile, save_profile
    from workbench.memory.oom import is_oom_error
    from workbench.training.recipe import TrainConfig, train

    args = study.args
    out = study.workdir / "train" / sampler
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings: dict[str, Any] = {"max_duration": prep["baseline"]["max_duration"], "num_buckets": LHOTSE_NUM_BUCKETS}
    if sampler != "baseline":
        p = prep["profiles"][sampler]
        settings = {"profile": str(save_profile(out / "profile.yaml", BucketProfile(
            p["bucket_duration_bins"], p["bucket_batch_size"], p.get("max_tps"), p.get("metadata") or {})))}
    config = TrainConfig(cuts=prep["corpus"]["cuts"], tokenizer=prep["corpus"]["tokenizer"], out_dir=str(out),
                         model=study.model, steps=1_000_000, max_seconds=args.seconds, warmup_steps=args.warmup_steps,
                         dtype="fp32" if args.smoke else "bf16", device="cpu" if args.smoke else None,
                         log_every=10, **({"num_workers": 0} if args.smoke else {}), **settings)
    study.say(f"training {sampler} for {args.seconds:g} s ({settings})")
    try:
        summary = train(config)
    except Exception as e:  # noqa: BLE001 - an OOM is a result (counted), anything else is a failure
        if not is_oom_error(e):
            raise
        study.say(f"{sampler} ran out of memory: {str(e).splitlines()[0]}")
        return {"ooms": 1, "error": str(e).splitlines()[0], "settings": settings}
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    study.say(f"{sampler}: {len(records)} steps, {summary['audio_seconds_per_second']:.0f} audio s/s")
    return {"summary": summary, "records": records, "settings": settings}


def views(study: Study, prep: dict, trained: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """The two comparisons from one run per sampler: {"seconds": figures over every step, "steps": figures
    over the first k steps (k: ``--steps``, or fewer when a run reached fewer)}, each {sampler: RunFigures}."""
    from workbench.records.throughput import run_figures

    warmup, k = study.args.warmup_records, same_steps(study, trained)
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


def same_steps(study: Study, trained: dict[str, dict]) -> int:
    """k of the same-steps view: ``--steps``, or the fewest steps a trained (not OOMed) run reached."""
    return min([study.args.steps, *(len(t["records"]) for t in trained.values() if "records" in t)])


def bucket_uppers(prep: dict, sampler: str) -> list[float]:
    """The upper duration bounds (s) of a sampler's buckets, ascending, without repeats (2D sub-buckets
    share one): lhotse's bins and the longest cut for the baseline, the profile's bins otherwise."""
    if sampler == "baseline":
        return sorted({*prep["baseline"]["lhotse_bins"], max(b["longest_s"] for b in prep["baseline"]["buckets"])})
    bins = prep["profiles"][sampler]["bucket_duration_bins"]
    return sorted({float(b[0] if isinstance(b, (list, tuple)) else b) for b in bins})


def add_mfu(study: Study, by_view: dict[str, dict[str, dict]], prep: dict, rate: float) -> None:
    """Each sampler's FLOPs per padded audio second (one forward+backward at its median batch shape over
    the whole run, under FlopCounterMode; both views share it) and each view's MFU: those FLOPs x padded
    audio seconds per second / the measured matmul rate."""
    import torch

    from workbench.data.tokenizer import load_tokenizer

    model = build_study_model(study, load_tokenizer(prep["corpus"]["tokenizer"]).vocab_size())
    tps = prep["corpus"]["tokens"][2] / max(prep["corpus"]["duration_s"][2], 1e-9)
    for sampler, run in by_view["seconds"].items():
        if run.get("ooms"):
            continue
        b, d = max(1, round(run["batch_size"]["median"])), run["longest_cut_s"]["median"]
        per_second = step_flops(model, b, d, max(1, round(d * tps)), study.args.smoke) / (b * d)
        for view in by_view.values():
            view[sampler]["flops_per_padded_audio_s"] = per_second
            view[sampler]["mfu"] = per_second * view[sampler]["padded_audio_seconds_per_second"] / rate
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- parts


def prepare_part(study: Study) -> None:
    corpus, arrays = make_corpus(study)
    study.say(f"corpus: {corpus['num_cuts']} cuts, {corpus['hours']:.1f} h, durations {corpus['duration_s']}")
    from workbench.data.tokenizer import load_tokenizer

    model = build_study_model(study, load_tokenizer(corpus["tokenizer"]).vocab_size())
    probe = make_probe(study, model)
    profiles = make_profiles(study, arrays, model, probe)
    baseline = find_baseline(study, corpus, arrays, probe)
    study.figures["prepare"] = {"corpus": corpus, "profiles": profiles, "baseline": baseline,
                                "memory_fraction": study.args.memory_fraction}
    study.save()


def train_part(study: Study) -> None:
    prep = study.figures.get("prepare")
    if prep is None:
        raise ValueError("--part train: no prepared profiles in the record; run --part prepare first "
                         "(or pass --from the record it wrote)")
    corpus, _ = make_corpus(study)  # the same seed and options give the same cuts
    prep = {**prep, "corpus": {**prep["corpus"], "cuts": corpus["cuts"], "tokenizer": corpus["tokenizer"]}}
    rate = matmul_flops_per_second(study.args.smoke)
    trained: dict[str, dict] = {}
    for sampler in SAMPLERS:
        trained[sampler] = train_sampler(study, prep, sampler)
        publish(study, views(study, prep, trained), same_steps(study, trained), rate, complete=False)
    by_view = views(study, prep, trained)
    add_mfu(study, by_view, prep, rate["flops_per_s"])
    publish(study, by_view, same_steps(study, trained), rate, complete=True)


def publish(study: Study, by_view: dict[str, dict[str, dict]], k: int, rate: dict, *, complete: bool) -> None:
    """Put both views (the same-steps one over ``k`` steps) in the figures (``complete`` false while
    samplers remain) and save the record."""
    study.figures["seconds"] = {"runs": by_view["seconds"], "matmul": rate, "budget": {"seconds": study.args.seconds}}
    study.figures["steps"] = {"runs": by_view["steps"], "matmul": rate, "budget": {"steps": k}}
    study.figures["complete"] = complete
    study.save()


def load_previous(path: str | None, name: str) -> dict[str, Any]:
    """The figures of an earlier part's record (``--from``, else the committed one); {} when there is none."""
    source = Path(path) if path else RESULTS_DIR / f"{name}.json"
    if not source.is_file():
        if path:
            raise FileNotFoundError(f"--from: {source} does not exist")
        return {}
    try:
        return json.loads(source.read_text())["figures"]
    except (ValueError, KeyError) as e:
        raise ValueError(f"--from: {source} is not a throughput record ({type(e).__name__})") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--part", required=True, choices=PARTS)
    p.add_argument("--out", help="folder for throughput_<model>.json (default benchmarks/results)")
    p.add_argument("--from", dest="previous", help="the record of the earlier parts (default: the one in "
                                                   "benchmarks/results)")
    p.add_argument("--workdir", help="runs (default /tmp/workbench_throughput/<record>)")
    p.add_argument("--corpus-dir", help="the corpus, kept and shared by both models (default "
                                        "/tmp/workbench_throughput/corpus_<utterances>x<join>x<repeat>; "
                                        "<workdir>/corpus under --smoke)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps of the same-steps comparison")
    p.add_argument("--seconds", type=float, default=60.0, help="wall seconds each sampler trains")
    p.add_argument("--warmup-steps", type=int, default=10, help="learning-rate warm-up steps")
    p.add_argument("--warmup-records", type=int, default=5, help="first steps left out of the medians")
    p.add_argument("--utterances", type=int, default=400, help="unique spoken utterances")
    p.add_argument("--join", type=int, default=4, help="sentences per utterance, 1..N")
    p.add_argument("--repeat", type=int, default=200, help="times each utterance is listed")
    p.add_argument("--buckets-1d", type=int, default=12, help="1D profile buckets")
    p.add_argument("--buckets-2d", type=int, default=12, help="2D profile duration buckets (x2 token sub-buckets; "
                                                             "the 1D profile's duration resolution by default)")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="the probes' memory limit")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny model, tone corpus, modelled memory")
    args = p.parse_args(argv)
    for name in ("steps", "utterances", "join", "repeat", "buckets_1d", "buckets_2d"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_steps", "warmup_records"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    if not args.seconds > 0 or not 0 < args.memory_fraction <= 1:
        p.error("--seconds must be > 0 and --memory-fraction in (0, 1]")
    if args.smoke:
        check_smoke_out(p, args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import report_failures, write_result
    from workbench.records.throughput import checks, summary_lines

    args = parse_args(argv)
    if cuda_missing(args.smoke):
        return 2
    name = record_name(args.model)
    model = SMOKE_MODELS[args.model] if args.smoke else args.model
    workdir = Path(args.workdir or f"/tmp/workbench_throughput/{name}{'_smoke' if args.smoke else ''}")
    corpus_dir = Path(args.corpus_dir) if args.corpus_dir else None if args.smoke else \
        Path(f"/tmp/workbench_throughput/corpus_{args.utterances}x{args.join}x{args.repeat}")
    previous = load_previous(args.previous, name) if args.previous or not args.smoke else {}
    if args.part in ("prepare", "all"):  # a new preparation makes earlier training results stale
        previous = {k: v for k, v in previous.items() if k not in ("steps", "seconds", "complete")}
    study = Study(args, workdir, model, corpus_dir, {**previous, "model": model})

    def save() -> None:
        study.figures["checks"] = checks(study.figures)
        study.figures["failures"] = [k for k, ok in study.figures["checks"].items() if not ok]
        study.record_path = write_result(
            name, what=f"throughput study, {args.model}: lhotse max_duration baseline vs the 1D and 2D "
            "OOMptimizer profiles, same steps and same wall time" + (" (SMOKE)" if args.smoke else ""),
            figures=study.figures, params=dict(vars(args)), out_dir=args.out)
    study.save = save
    with cpu_smoke_torch(args.smoke):
        for part in (("prepare", "train") if args.part == "all" else (args.part,)):
            if part == "prepare":
                prepare_part(study)
            else:
                train_part(study)
    path = study.record_path
    print("\n".join(summary_lines(study.figures)))
    print(f"wrote {path}")
    return report_failures(study.figures["failures"], smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
