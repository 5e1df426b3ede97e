"""The throughput study: does the OOMptimizer's profile make training faster than lhotse's best fixed batch?

    python -m benchmarks.throughput --model {xl-aed,large-rnnt} --parts prepare --out DIR
    python -m benchmarks.throughput --model large-rnnt --parts train --budget-s 500 --out DIR   # after prepare
    python -m benchmarks.throughput --model large-rnnt --smoke --out /tmp/x   # both parts; CPU, tiny

Corpus: espeak-ng speech (``workbench.data.tts``) made on the GPU machine itself (espeak-ng is carried
there as Debian packages; its synthesis is far faster than real time), by default with the realistic
preset (``--corpus-preset``: speaking rates, silences, languages and accents vary as in real corpora,
docs/CORPUS.md), up to ``--join`` sentences per utterance so durations reach 30-40 s (longer ones are
dropped), each utterance listed ``--repeat`` times so every bucket fills many full batches at the profile's
batch sizes. Real audio is read, resampled and collated by the DataLoader workers as in any training run;
repeats share one file, so the corpus is small to make and nothing large travels to the GPU machine.

Samplers (``workbench.records.throughput.SAMPLERS``): lhotse's baseline; the 1D profile (``--buckets-1d``
duration buckets); the 2D profile at the 1D profile's duration bins x 2 token sub-buckets (the headline:
it differs from the 1D profile only by the token split, so 2D / 1D measures what the second dimension
buys); the 2D profile at an equal number of buckets (``--buckets-1d`` / 2 duration buckets x 2: the 1D
profile's bucket count and search cost, coarser durations); and the 2D profile again with the CUDA
allocator's expandable segments off (OOMs, allocation retries and cudaMalloc calls per step at the
profile's memory, against the 2D run with them on).

Parts (each within one GPU call): ``prepare`` makes the corpus, the three profiles' bins
(``profile_from_arrays``), fills them with the OOMptimizer (``oomptimize`` in this process: the model and
probe stay loaded between the profiles and the baseline search, where the CLI would load the model each
time), and finds the baseline's ``max_duration``; ``train`` trains each of ``--samplers`` once, each in a
fresh process (``worker.py``: the allocator is chosen before CUDA starts, and no run inherits another's
cached memory), for ``--train-s`` of wall time (cut so that every sampler fits ``--budget-s``; a call too short
for all five trains some, ``--samplers``, and a later train call the rest: it keeps the earlier call's runs
of samplers it does not train where both trained for the same seconds and steps), then reads two
comparisons from those runs: the same wall time (every step of each run) and the same optimizer steps
(the first k steps of each run, k = ``--steps`` or the fewest steps a run reached, if less). A run's first
k steps draw the batches a run stopped at k would draw (same seed), so their speed, batch sizes and padding
are that run's, and one run per sampler serves both; only the learning rate differs (training's cosine
decays over the 10^6 steps asked for, so it is nearly constant after the warm-up, where a run of k steps
would decay to 0 at k), which moves the loss, not the speed. The matmul rate for MFU is measured after the
runs, so they have the device to themselves. A later part reads the prepared profiles from the record
(``--from``, default the committed one) and remakes the corpus (same seed, same cuts; kept in
``--corpus-dir`` between the models and calls of one machine). The record is rewritten after each part and
each trained sampler, so a call stopped at its limit keeps what finished.

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
import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.harness import Run, bench_parser, cpu_smoke_torch, one_line, start
from benchmarks.mfu import matmul_flops_per_second
from benchmarks.throughput.baseline import find_baseline
from benchmarks.throughput.corpus import make_corpus
from benchmarks.throughput.profiles import build_study_model, make_probe, make_profiles
from benchmarks.throughput.settings import (CORPUS_PRESETS, MODELS, device_memory_mib, say, study_record_name,
                                           trained_model)
from benchmarks.throughput.training import (STARTUP_S, add_mfu, same_steps, train_sampler, train_seconds,
                                            views)
from workbench.records.results import RESULTS_DIR, git_commit
from workbench.records.throughput import PROFILE_OF, SAMPLERS, checks, record_name, summary_lines

PARTS = ("prepare", "train")
MFU_RESERVE_S = 60.0  # wall seconds kept after the runs for the matmul rate and the FLOP counts


def prepare_part(run: Run) -> None:
    """The corpus, the profiles and the baseline, into ``figures["prepare"]``."""
    from workbench.data.tokenizer import load_tokenizer

    corpus, arrays = make_corpus(run.args)
    tps = corpus["tokens_per_second"]
    say(run, f"corpus: {corpus['num_cuts']} cuts, {corpus['hours']:.1f} h, durations {corpus['duration_s']}, "
             f"tokens/s p10/p50/p90 {tps['p10']}/{tps['p50']}/{tps['p90']}")
    model = build_study_model(run.args, load_tokenizer(corpus["tokenizer"]).vocab_size())
    probe = make_probe(run.args, model)
    profiles = make_profiles(run, arrays, model, probe)
    baseline = find_baseline(run, corpus, arrays, probe)
    run.figures["prepare"] = {"corpus": corpus, "profiles": profiles, "baseline": baseline,
                              "memory_fraction": run.args.memory_fraction, "device_memory_mib": device_memory_mib()}


def train_part(run: Run) -> None:
    """Train every sampler of ``--samplers`` on the prepared corpus, each in its own process; both views are
    published after each one, the MFU once all have run."""
    earlier = {view: run.figures.pop(view, None) for view in ("seconds", "steps")}
    prep = run.figures.get("prepare")
    if prep is None:
        raise ValueError("--parts train: no prepared profiles in the record; run --parts prepare first "
                         "(or pass --from the record it wrote)")
    searched, here = prep.get("device_memory_mib"), device_memory_mib()
    if searched and here and searched != here:
        raise ValueError(f"--parts train: the profiles were searched on a GPU of {searched} MiB, this one has {here} "
                         "MiB; run --parts prepare on this kind of GPU first")
    release_device()
    corpus, _ = make_corpus(run.args)  # the same seed and options give the same cuts
    prep = {**prep, "corpus": {**prep["corpus"], "cuts": corpus["cuts"], "tokenizer": corpus["tokenizer"]}}
    asked = [s for s in SAMPLERS if s in run.args.samplers]
    train_s = train_seconds(run, len(asked), MFU_RESERVE_S if not run.smoke else 0.0)
    run.figures["samplers"] = asked
    trained: dict[str, dict] = {}
    call = {"git_commit": git_commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    for sampler in asked:
        if run.args.budget_s and run.seconds() + train_s + STARTUP_S + MFU_RESERVE_S > run.args.budget_s:
            run.failures.append(f"train: {sampler} not run (the budget of {run.args.budget_s:g} s was spent)")
            continue
        try:
            trained[sampler] = {**train_sampler(run, prep, sampler, train_s), "call": call}
        except (RuntimeError, subprocess.TimeoutExpired) as e:  # the other samplers still train
            run.failures.append(f"train: {sampler}: {one_line(e)}")
            continue
        k = same_steps(run.args, trained)
        publish(run, merged(views(run.args, prep, trained), earlier, asked, train_s, k), k, None, train_s,
                complete=False)
    by_view = views(run.args, prep, trained)
    rate = matmul_flops_per_second(run.smoke)
    add_mfu(run.args, by_view, prep, rate["flops_per_s"])
    k = same_steps(run.args, trained)
    by_view = merged(by_view, earlier, asked, train_s, k)
    kept = [s for s in SAMPLERS if s not in asked and s in by_view["seconds"]]
    if kept:
        say(run, f"kept from an earlier call (same {train_s:g} s and {k} steps): {', '.join(kept)}")
    run.figures["samplers"] = [s for s in SAMPLERS if s in asked or s in kept]
    publish(run, by_view, k, rate, train_s, complete=set(trained) == set(asked))


def merged(by_view: dict[str, dict[str, dict]], earlier: dict[str, dict | None], asked: list[str], train_s: float,
           k: int) -> dict[str, dict[str, dict]]:
    """``by_view`` with an earlier train call's runs of the samplers not asked now (a study trained over
    several calls, e.g. ``--samplers baseline 1d 2d`` then ``--samplers 2d_equal 2d_plain_allocator``), kept
    only where that call trained each sampler for the same wall seconds and read the same k steps, so every
    run's figures cover the same window. Each run's ``call`` says which call trained it."""
    seconds, steps = earlier.get("seconds") or {}, earlier.get("steps") or {}
    if (seconds.get("budget") or {}).get("seconds") != train_s or (steps.get("budget") or {}).get("steps") != k:
        return by_view
    keep = [s for s in SAMPLERS if s not in asked and s in seconds.get("runs", {}) and s in steps.get("runs", {})]
    return {"seconds": {**by_view["seconds"], **{s: seconds["runs"][s] for s in keep}},
            "steps": {**by_view["steps"], **{s: steps["runs"][s] for s in keep}}}


def release_device() -> None:
    """Give this process's cached device memory back (a prepare part in the same process held the model), so
    the training processes find the device as empty as it can be."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def publish(run: Run, by_view: dict[str, dict[str, dict]], k: int, rate: dict | None, train_s: float, *,
            complete: bool) -> None:
    """Put both views (the same-steps one over ``k`` steps, the same-time one over ``train_s`` seconds each)
    and the matmul rate (None until measured) in the figures (``complete`` false while samplers remain) and
    save the record."""
    run.figures["seconds"] = {"runs": by_view["seconds"], "matmul": rate, "budget": {"seconds": train_s}}
    run.figures["steps"] = {"runs": by_view["steps"], "matmul": rate, "budget": {"steps": k}}
    run.figures["complete"] = complete
    run.save()


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


def earlier_figures(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The figures this run starts from: an earlier part's record (none under --smoke without --from),
    less its training results when this run prepares anew (they would be stale)."""
    previous = load_previous(args.previous, record_name(args.model)) if args.previous or not args.smoke else {}
    if "prepare" in args.parts:  # the earlier runs trained on profiles this run replaces
        return {k: v for k, v in previous.items() if k not in ("steps", "seconds", "complete", "samplers")}
    if "prepare" not in previous:
        parser.error("--parts train: no prepared profiles in the record; run --parts prepare first "
                     "(or pass --from the record it wrote)")
    prepared_preset = previous["prepare"]["corpus"].get("preset", "plain")
    if prepared_preset != args.corpus_preset:
        parser.error(f"--parts train --corpus-preset {args.corpus_preset}: the record's profiles were prepared on "
                     f"the {prepared_preset} corpus; run --parts prepare with this preset first")
    missing = sorted({PROFILE_OF[s] for s in args.samplers if s in PROFILE_OF} - set(previous["prepare"]["profiles"]))
    if missing:
        parser.error(f"--parts train: the record has no {', '.join(missing)} profile; run --parts prepare first")
    if args.tag:  # a variant: the study's profiles, none of its runs (they trained otherwise)
        return {k: v for k, v in previous.items() if k not in ("steps", "seconds", "complete", "samplers")}
    # the earlier runs stay for the train part, which keeps those of samplers it does not train (``merged``)
    return {k: v for k, v in previous.items() if k not in ("complete", "samplers")}


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, parts=PARTS)
    p.prog = "python -m benchmarks.throughput"
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--from", dest="previous", help="the record of the earlier parts (default: the one in "
                                                   "benchmarks/results)")
    p.add_argument("--workdir", help="runs (default /tmp/workbench_throughput/<record>)")
    p.add_argument("--corpus-dir", help="the corpus, kept and shared by both models (default "
                                        "/tmp/workbench_throughput/corpus_<utterances>x<join>x<repeat>; "
                                        "<workdir>/corpus under --smoke)")
    p.add_argument("--corpus-preset", choices=CORPUS_PRESETS, default="realistic",
                   help="the espeak-ng corpus: realistic (speaking rates, silences and languages vary; default) "
                        "or plain (English at a few fixed speeds)")
    p.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS), metavar="SAMPLER",
                   help=f"what --parts train trains, any of {', '.join(SAMPLERS)} (default all)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps of the same-steps comparison")
    p.add_argument("--train-s", type=float, default=60.0, help="wall seconds each sampler trains (at most: "
                   "--budget-s cuts it so every sampler fits)")
    p.add_argument("--warmup-steps", type=int, default=10, help="learning-rate warm-up steps")
    p.add_argument("--warmup-records", type=int, default=5, help="first steps left out of the medians")
    p.add_argument("--utterances", type=int, default=400, help="unique spoken utterances")
    p.add_argument("--join", type=int, default=4, help="sentences per utterance, 1..N")
    p.add_argument("--repeat", type=int, default=200, help="times each utterance is listed")
    p.add_argument("--buckets-1d", type=int, default=12, help="1D profile buckets")
    p.add_argument("--buckets-2d", type=int, default=12, help="2D profile duration buckets (x2 token sub-buckets; "
                                                             "the 1D profile's duration resolution by default); "
                                                             "the equal-bucket 2D profile has --buckets-1d / 2")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="the probes' memory limit")
    p.add_argument("--tag", help="a variant trained beside the study (e.g. --worker-niceness 10 --tag nice10): "
                                 "its record is throughput_<model>_<tag>; it trains on the study's prepared "
                                 "profiles and keeps none of the study's training runs")
    p.add_argument("--worker-niceness", type=int, default=None,
                   help="nice levels (0-19) the training runs' DataLoader workers run below training (default: "
                        "train's)")
    return p


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` on a count below 1 (or 0), a training time <= 0 s or a memory fraction outside (0, 1]."""
    for name in ("steps", "utterances", "join", "repeat", "buckets_1d", "buckets_2d"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_steps", "warmup_records", "worker_niceness"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9_]+", args.tag):
        parser.error(f"--tag: letters, digits and _ only (it ends the record's file name), got {args.tag!r}")
    if args.tag is not None and "prepare" in args.parts:
        parser.error("--tag: a variant trains on the study's prepared profiles; use it with --parts train")
    if args.worker_niceness is not None and args.worker_niceness > 19:
        parser.error(f"--worker-niceness: must be at most 19 (the lowest CPU priority), got {args.worker_niceness}")
    if not args.train_s > 0 or not 0 < args.memory_fraction <= 1:
        parser.error("--train-s must be > 0 and --memory-fraction in (0, 1]")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    run = start(parser, argv, name="throughput", what="throughput study")
    args = run.args
    check_options(parser, args)
    run.name = study_record_name(args)
    run.what = (f"throughput study, {args.model}: lhotse max_duration baseline vs the OOMptimizer's 1D and 2D "
                "profiles (2D at 1D's duration bins and at 1D's bucket count; 2D without expandable segments), "
                "same steps and same wall time")
    run.checks = checks
    run.figures = {**earlier_figures(parser, args), "model": trained_model(args)}
    with cpu_smoke_torch(run.smoke):
        for part, measure in (("prepare", prepare_part), ("train", train_part)):
            if run.wants(part):
                with run.part(part):
                    measure(run)
    print("\n".join(summary_lines(json.loads(run.save().read_text())["figures"])))
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
