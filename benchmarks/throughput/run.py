"""The throughput study: does the OOMptimizer's profile make training faster than lhotse's best fixed batch?

    python -m benchmarks.throughput --model {xl-aed,large-rnnt} --parts prepare --out DIR
    python -m benchmarks.throughput --model large-rnnt --parts train   --out DIR   # needs the prepare part
    python -m benchmarks.throughput --model large-rnnt --smoke --out /tmp/x   # both parts; CPU, tiny

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
baseline's ``max_duration``; ``train`` trains each of the three samplers once, for ``--train-s`` of wall
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
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import Run, bench_parser, cpu_smoke_torch, start
from benchmarks.mfu import matmul_flops_per_second
from benchmarks.throughput.baseline import find_baseline
from benchmarks.throughput.corpus import make_corpus
from benchmarks.throughput.profiles import build_study_model, make_probe, make_profiles
from benchmarks.throughput.settings import MODELS, say, trained_model
from benchmarks.throughput.training import add_mfu, same_steps, train_sampler, views
from workbench.records.results import RESULTS_DIR
from workbench.records.throughput import SAMPLERS, checks, record_name, summary_lines

PARTS = ("prepare", "train")


def prepare_part(run: Run) -> None:
    """The corpus, both profiles and the baseline, into ``figures["prepare"]``."""
    from workbench.data.tokenizer import load_tokenizer

    corpus, arrays = make_corpus(run.args)
    say(run, f"corpus: {corpus['num_cuts']} cuts, {corpus['hours']:.1f} h, durations {corpus['duration_s']}")
    model = build_study_model(run.args, load_tokenizer(corpus["tokenizer"]).vocab_size())
    probe = make_probe(run.args, model)
    profiles = make_profiles(run, arrays, model, probe)
    baseline = find_baseline(run, corpus, arrays, probe)
    run.figures["prepare"] = {"corpus": corpus, "profiles": profiles, "baseline": baseline,
                              "memory_fraction": run.args.memory_fraction}


def train_part(run: Run) -> None:
    """Train every sampler on the prepared corpus; both views are published after each one."""
    prep = run.figures.get("prepare")
    if prep is None:
        raise ValueError("--parts train: no prepared profiles in the record; run --parts prepare first "
                         "(or pass --from the record it wrote)")
    corpus, _ = make_corpus(run.args)  # the same seed and options give the same cuts
    prep = {**prep, "corpus": {**prep["corpus"], "cuts": corpus["cuts"], "tokenizer": corpus["tokenizer"]}}
    rate = matmul_flops_per_second(run.smoke)
    trained: dict[str, dict] = {}
    for sampler in SAMPLERS:
        trained[sampler] = train_sampler(run, prep, sampler)
        publish(run, views(run.args, prep, trained), same_steps(run.args, trained), rate, complete=False)
    by_view = views(run.args, prep, trained)
    add_mfu(run.args, by_view, prep, rate["flops_per_s"])
    publish(run, by_view, same_steps(run.args, trained), rate, complete=True)


def publish(run: Run, by_view: dict[str, dict[str, dict]], k: int, rate: dict, *, complete: bool) -> None:
    """Put both views (the same-steps one over ``k`` steps) in the figures (``complete`` false while
    samplers remain) and save the record."""
    run.figures["seconds"] = {"runs": by_view["seconds"], "matmul": rate, "budget": {"seconds": run.args.train_s}}
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
    if "prepare" in args.parts:
        return {k: v for k, v in previous.items() if k not in ("steps", "seconds", "complete")}
    if "prepare" not in previous:
        parser.error("--parts train: no prepared profiles in the record; run --parts prepare first "
                     "(or pass --from the record it wrote)")
    return previous


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
    p.add_argument("--steps", type=int, default=30, help="optimizer steps of the same-steps comparison")
    p.add_argument("--train-s", type=float, default=60.0, help="wall seconds each sampler trains")
    p.add_argument("--warmup-steps", type=int, default=10, help="learning-rate warm-up steps")
    p.add_argument("--warmup-records", type=int, default=5, help="first steps left out of the medians")
    p.add_argument("--utterances", type=int, default=400, help="unique spoken utterances")
    p.add_argument("--join", type=int, default=4, help="sentences per utterance, 1..N")
    p.add_argument("--repeat", type=int, default=200, help="times each utterance is listed")
    p.add_argument("--buckets-1d", type=int, default=12, help="1D profile buckets")
    p.add_argument("--buckets-2d", type=int, default=12, help="2D profile duration buckets (x2 token sub-buckets; "
                                                             "the 1D profile's duration resolution by default)")
    p.add_argument("--memory-fraction", type=float, default=0.9, help="the probes' memory limit")
    return p


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` on a count below 1 (or 0), a training time <= 0 s or a memory fraction outside (0, 1]."""
    for name in ("steps", "utterances", "join", "repeat", "buckets_1d", "buckets_2d"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_steps", "warmup_records"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    if not args.train_s > 0 or not 0 < args.memory_fraction <= 1:
        parser.error("--train-s must be > 0 and --memory-fraction in (0, 1]")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    run = start(parser, argv, name="throughput", what="throughput study")
    args = run.args
    check_options(parser, args)
    run.name = record_name(args.model)
    run.what = (f"throughput study, {args.model}: lhotse max_duration baseline vs the 1D and 2D OOMptimizer "
                "profiles, same steps and same wall time")
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
