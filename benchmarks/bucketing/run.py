"""The bucketing benches' CLI (CPU only): `workbench bins` on 1M utterances, and time to the first batch.

    python3 -m benchmarks.bucketing --out benchmarks/results [--num-cuts 1000000] [--parts bins tokenized]
    python3 -m benchmarks.bucketing --smoke --out /tmp/x      # 3000 utterances

Parts: ``bins`` writes ``bucketing_bins_1m`` and ``bucketing_first_batch``, ``tokenized`` writes
``bucketing_bins_1m_tokenizer``.

1. ``bucketing_bins_1m``: `workbench bins` end to end (a fresh process: import, read the manifest,
   2D bins, write the profile, padding summary) on a synthetic manifest with token counts, against the
   same work through lhotse: iterate ``CutSet.from_jsonl_lazy`` for durations and token counts, then the
   plain-loop 2D estimate (as NeMo's script does). Both must give the same bins.
2. ``bucketing_first_batch``: time to the first batch of ``make_sampler`` on the same manifest read
   lazily, with concurrent bucketing and without, for two buffer sizes.

Exits non-zero when the two ways disagree, a batch breaks its bucket's batch size, or the 1M target
(<= 10 s end to end) is missed. ``workbench/records/bucketing.py`` owns the records' fields.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lhotse import CutSet

from workbench.records import bucketing as record
from benchmarks.manifest_reading.run import lhotse_durations
from benchmarks.harness import Run, bench_parser, start, write_result
from workbench.timing import summarize
from workbench.bucketing import (
    BucketProfile,
    close_sampler,
    estimate_2d_bins,
    estimate_duration_bins,
    load_profile,
    make_fitter,
    make_sampler,
    padding_comparison,
)
from workbench.bucketing.reference import loop_2d
from workbench.data.manifest import read_cut_arrays
from workbench.data.synthetic import write_synthetic_corpus
from workbench.data.tokenizer import count_tokens, load_tokenizer, train_tokenizer

TARGET_BINS_S = 10.0
TARGET_BINS_TOKENIZED_S = 30.0
NUM_CUTS, SMOKE_NUM_CUTS = 1_000_000, 3000
PARTS = ("bins", "tokenized")


def _time_bins_cli(args: list[str], repeat: int) -> tuple[list[float], str | None]:
    """Wall seconds of ``repeat`` fresh `workbench bins ARGS` processes (30 x 2 buckets), or the error."""
    cmd = [sys.executable, "-m", "workbench", "bins", *args, "--buckets", "30", "--sub-buckets", "2"]  # everything bins computes (output captured)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        samples.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return samples, f"`{' '.join(cmd[2:])}` failed: {proc.stderr.strip()[-500:]}"
    return samples, None


def _in_process_breakdown(manifest: Path) -> dict:
    """Seconds of each stage of `workbench bins`, in this process: read, 1D + 2D bins, padding summary."""
    t0 = time.perf_counter()
    arrays = read_cut_arrays(manifest, progress=False)
    t1 = time.perf_counter()
    bins_1d = estimate_duration_bins(arrays.durations, 30)
    est = estimate_2d_bins(arrays.durations, arrays.num_tokens, 30, 2)
    t2 = time.perf_counter()
    padding_comparison(arrays.durations, arrays.num_tokens,
                       {"none": None, "1D": bins_1d, "2D": (est.bins, est.max_tps)})
    t3 = time.perf_counter()
    return {"stage_read_manifest_s": t1 - t0, "stage_bins_1d_2d_s": t2 - t1, "stage_padding_summary_s": t3 - t2}


def bench_bins(manifest: Path, work: Path, repeat: int) -> tuple[dict, list[str]]:
    failures: list[str] = []
    out = work / "profile.yaml"
    samples, error = _time_bins_cli([str(manifest), "--out", str(out)], repeat)
    if error:
        return {}, [error]
    ours = [tuple(b) for b in load_profile(out).bucket_duration_bins]
    breakdown = _in_process_breakdown(manifest)

    t0 = time.perf_counter()
    durations, tokens = lhotse_durations(manifest, progress=True)
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs = loop_2d(durations, tokens, 30, 2, 4.0)[0]
    t_est = time.perf_counter() - t0
    if ours != theirs:
        failures.append(f"bins differ: ours {len(ours)} bins, lhotse-iteration {len(theirs)} bins; first "
                        f"difference at {next(i for i, (a, b) in enumerate(zip(ours + [None], theirs + [None])) if a != b)}")
    ours_s = summarize(samples)
    if ours_s["median"] > TARGET_BINS_S:
        failures.append(f"`workbench bins` on {len(durations)} utterances took {ours_s['median']:.1f} s "
                        f"(target <= {TARGET_BINS_S} s)")
    figures = {"workbench_bins_end_to_end_s": ours_s, "lhotse_iteration_read_s": t_read,
               "loop_estimate_s": t_est, "lhotse_total_s": t_read + t_est,
               "speedup_vs_lhotse": (t_read + t_est) / ours_s["median"], "num_bins": len(ours),
               "bins_equal": ours == theirs, "utterances": len(durations), **breakdown}
    return figures, failures


def bench_bins_tokenized(manifest: Path, work: Path, repeat: int) -> tuple[dict, list[str]]:
    """`workbench bins --tokenizer`: every transcript tokenized by a sentencepiece BPE model (1024)."""
    failures: list[str] = []
    model = work / "bpe1024.model"
    arrays = read_cut_arrays(manifest, with_texts=True, progress=False)  # read once: training and the check
    if not model.exists():
        train_tokenizer(arrays.texts[:100_000], work / "bpe1024", vocab_size=1024, progress=False)
    out = work / "profile_tokenized.yaml"
    samples, error = _time_bins_cli([str(manifest), "--tokenizer", str(model), "--out", str(out)], repeat)
    if error:
        return {}, [error]
    # The profile must come from the tokenizer's counts, not the manifest's.
    t0 = time.perf_counter()
    counts = count_tokens(load_tokenizer(model), arrays.texts)
    t_count = time.perf_counter() - t0

    expected = [tuple(b) for b in estimate_2d_bins(arrays.durations, counts, 30, 2).bins]
    if [tuple(b) for b in load_profile(out).bucket_duration_bins] != expected:
        failures.append("`workbench bins --tokenizer` bins differ from the estimate over the tokenizer's counts")
    ours_s = summarize(samples)
    if ours_s["median"] > TARGET_BINS_TOKENIZED_S:
        failures.append(f"`workbench bins --tokenizer` took {ours_s['median']:.1f} s (target <= "
                        f"{TARGET_BINS_TOKENIZED_S} s)")
    return {"workbench_bins_tokenized_end_to_end_s": ours_s, "stage_tokenize_s": t_count,
            "target_s": TARGET_BINS_TOKENIZED_S, "utterances": len(arrays)}, failures


def bench_first_batch(manifest: Path, work: Path, repeat: int) -> tuple[dict, list[str]]:
    """Seconds to the first batch of make_sampler on the lazily read manifest, with concurrent bucketing
    and without, per buffer size; failures when a batch breaks its bucket's batch size."""
    failures: list[str] = []
    base = load_profile(work / "profile.yaml")
    bins = [tuple(b) for b in base.bucket_duration_bins]
    batch_sizes = [max(1, int(600 // b[0])) for b in bins]  # ~600 s of audio per batch
    profile = BucketProfile(bucket_duration_bins=base.bucket_duration_bins, bucket_batch_size=batch_sizes,
                            max_tps=base.max_tps)
    fitter = make_fitter(bins, base.max_tps)
    figures: dict = {}
    for buffer_size in (20_000, 100_000):
        for concurrent in (False, True):
            samples = []
            for _ in range(repeat):
                cuts = CutSet.from_jsonl_lazy(manifest)
                sampler = make_sampler(cuts, profile, concurrent=concurrent, buffer_size=buffer_size, seed=0)
                t0 = time.perf_counter()
                batch = next(iter(sampler))
                samples.append(time.perf_counter() - t0)
                close_sampler(sampler)
                buckets = {fitter.select(c.duration, c.custom["num_tokens"])[0] for c in batch}
                if len(buckets) != 1 or len(batch) > batch_sizes[buckets.pop()]:
                    failures.append(f"first batch (concurrent={concurrent}) breaks its bucket's batch size")
            figures[f"buffer_{buffer_size}_{'concurrent' if concurrent else 'sequential'}_s"] = summarize(samples)
        seq = figures[f"buffer_{buffer_size}_sequential_s"]["median"]
        con = figures[f"buffer_{buffer_size}_concurrent_s"]["median"]
        figures[f"buffer_{buffer_size}_speedup"] = seq / con
    return figures, failures


def write_record(run: Run, name: str, what: str, figures: dict, params: dict) -> None:
    """Write one of the bench's records to ``--out`` (a smoke run's ``what`` says so)."""
    what += " (SMOKE: tiny shapes, not a measurement)" if run.smoke else ""
    write_result(name, what=what, figures=figures, params=params, out_dir=run.args.out)


def bins_part(run: Run, manifest: Path, work: Path, params: dict) -> None:
    """``bucketing_bins_1m``, then (when the bins were made) ``bucketing_first_batch``."""
    print("1/2 bins end to end vs lhotse CutSet iteration ...", flush=True)
    bins_fig, failures = bench_bins(manifest, work, run.args.repeat)
    run.failures += failures
    if not bins_fig:
        return
    write_record(run, "bucketing_bins_1m", "`workbench bins` end to end vs the same via lhotse CutSet iteration "
                 "and a plain-loop estimate (CPU)", bins_fig, params)
    print("2/2 time to first batch, concurrent vs not ...", flush=True)
    fb_fig, fb_fail = bench_first_batch(manifest, work, run.args.repeat)
    run.failures += fb_fail
    write_record(run, "bucketing_first_batch", "time to first batch of make_sampler on a lazily read manifest: "
                 "concurrent bucketing vs not (CPU)", fb_fig, params)
    print("\n".join(record.table_lines(bins_fig) + record.table_lines(fb_fig)))


def tokenized_part(run: Run, manifest: Path, work: Path, params: dict) -> None:
    """``bucketing_bins_1m_tokenizer``."""
    print("bins with a sentencepiece tokenizer over every transcript ...", flush=True)
    tok_fig, tok_fail = bench_bins_tokenized(manifest, work, run.args.repeat)
    run.failures += tok_fail
    if tok_fig:
        write_record(run, "bucketing_bins_1m_tokenizer", "`workbench bins --tokenizer` end to end: every "
                     "transcript tokenized with a sentencepiece BPE-1024 model (CPU)", tok_fig, params)
        print("\n".join(record.table_lines(tok_fig)))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, parts=PARTS, out_required=True)
    parser.add_argument("--num-cuts", type=int, default=None, help="utterances in the synthetic manifest "
                        f"(default {NUM_CUTS}; {SMOKE_NUM_CUTS} under --smoke)")
    parser.add_argument("--work", default=None, help="folder for the manifest (kept and reused)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of the fast paths")
    run = start(parser, argv, name="", what="bucketing benches", needs_cuda=False)  # each part writes its records
    logging.getLogger("workbench.bucketing.sampler").setLevel(logging.ERROR)  # unfit cuts are expected here

    num_cuts = run.args.num_cuts or (SMOKE_NUM_CUTS if run.smoke else NUM_CUTS)
    work = Path(run.args.work or Path(tempfile.gettempdir()) / f"workbench_bench_bucketing_{num_cuts}")
    manifest = work / "cuts.jsonl.gz"
    if not manifest.exists():
        print(f"writing a {num_cuts}-utterance synthetic manifest to {manifest} ...", flush=True)
        write_synthetic_corpus(work, num_cuts, seed=0)
    params = {"num_cuts": num_cuts, "manifest": "synthetic seed 0", "buckets": 30, "sub_buckets": 2,
              "tps_threshold": 4.0, "repeat": run.args.repeat}
    for part, measure in (("bins", bins_part), ("tokenized", tokenized_part)):
        if run.wants(part):
            with run.part(part):
                measure(run, manifest, work, params)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
