"""The allocator bench's CLI: expandable segments vs the plain caching allocator with dynamic batch shapes
near the memory limit (the protocol: benchmarks/NOTES.md, "How each bench measures").

    python3 -m benchmarks.allocator --out benchmarks/results            # GPU
    python3 -m benchmarks.allocator --out DIR --headroom 0.08 0.15       # a headroom sweep
    python3 -m benchmarks.allocator --smoke --out /tmp/smoke            # CPU dry run, seconds

Steps: parse the options, draw the batch shapes from lhotse's sampler, calibrate each shape's peak in a
worker subprocess (``worker.py``), run rounds of worker subprocesses while the budget allows, and write
``<out>/<name>.json`` after every round (``record.py`` owns its fields). Exit code 1 when a target is missed
outside --smoke, 2 without CUDA and without --smoke.
"""


from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import lhotse
import numpy as np
import pandas as pd
import torch

from workbench.records import allocator as record
from benchmarks.allocator.worker import parse_blocks
from benchmarks.harness import check_smoke_out, cuda_missing, report_failures, write_result
from workbench.timing import summarize
from workbench.bucketing import close_sampler, cut_num_tokens, estimate_2d_bins, make_sampler
from workbench.bucketing.profile import BucketProfile
from workbench.data.synthetic import synthetic_cut_arrays, write_synthetic_corpus
from workbench.memory.telemetry import device_alloc_events, summarize_steps
from workbench.units import GiB, MiB

FRAME_S = 0.08  # encoder frame after subsampling, seconds (for the joint-size cost of a shape)
TARGET_TIME_RATIO = record.TARGET_TIME_RATIO


# ---------------------------------------------------------------- batch shapes (CPU, parent process)

def sampler_shapes(num_steps: int, *, batch_audio_s: float, num_buckets: int, seed: int,
                   work_dir: Path, num_cuts: int | None = None,
                   max_duration_s: float = 40.0) -> tuple[list[tuple[int, float, int]], str]:
    """Batch shapes (batch size, max duration s, max tokens) from a real bucketed lhotse sampler over a
    synthetic corpus of ``num_cuts`` (default max(4000, 200 x num_steps)) utterances up to
    ``max_duration_s`` seconds. Returns (shapes, source)."""
    path = write_synthetic_corpus(work_dir, num_cuts=num_cuts or max(4000, num_steps * 200), seed=seed,
                                  progress=False, max_duration_s=max_duration_s)
    cuts = lhotse.CutSet.from_file(path)
    durations = np.array([c.duration for c in cuts])
    tokens = np.array([cut_num_tokens(c) for c in cuts])
    fit = estimate_2d_bins(durations, tokens, num_buckets, 2)  # with the TPS filter, as in training
    bins = [[float(d), int(t)] for d, t in fit.bins]
    sizes = [max(1, int(batch_audio_s // d)) for d, _ in bins]
    profile = BucketProfile(bucket_duration_bins=bins, bucket_batch_size=sizes, max_tps=list(fit.max_tps))
    sampler = make_sampler(cuts, profile, shuffle=True, seed=seed)
    shapes = []
    try:
        for batch in sampler:
            shapes.append((len(batch), max(c.duration for c in batch), max(cut_num_tokens(c) for c in batch)))
            if len(shapes) == num_steps:
                break
    finally:
        close_sampler(sampler)  # stop the concurrent filling thread
    if len(shapes) < num_steps:
        raise ValueError(f"sampler gave {len(shapes)} batches, need {num_steps}: raise --steps' corpus size")
    return shapes, ("lhotse DynamicBucketingSampler via workbench.bucketing.make_sampler, 2D bins with TPS "
                    "filter, synthetic corpus")


def drawn_shapes(num_steps: int, *, batch_audio_s: float, num_buckets: int, seed: int) -> list[tuple[int, float, int]]:
    """What a bucketing sampler yields, drawn directly: pick a bucket (weighted by its share of cuts),
    fill it up to ``batch_audio_s`` of padded audio, pad to the batch's longest cut and transcript. Fast:
    the tests use it in place of :func:`sampler_shapes`."""
    arrays = synthetic_cut_arrays(20_000, seed=seed)
    dur, tok = arrays.durations, arrays.num_tokens
    order = np.argsort(dur, kind="stable")
    dur, tok = dur[order], tok[order]
    cum = np.cumsum(dur)
    edges = np.searchsorted(cum, cum[-1] * np.arange(1, num_buckets) / num_buckets)
    groups = np.split(np.arange(dur.size), edges)
    rng = np.random.default_rng(seed + 1)
    weights = np.array([len(g) for g in groups], dtype=float)
    shapes = []
    for _ in range(num_steps):
        g = groups[rng.choice(len(groups), p=weights / weights.sum())]
        bound = dur[g[-1]]
        batch = rng.choice(g, size=min(len(g), max(1, int(batch_audio_s // bound))), replace=False)
        shapes.append((len(batch), float(dur[batch].max()), int(tok[batch].max())))
    return shapes


def largest_first(shapes: list[tuple[int, float, int]], costs: list[float] | None = None) -> list[tuple[int, float, int]]:
    """The costliest shape moved to the front: by ``costs`` (e.g. measured peak bytes) when given, else by
    joint-tensor size B*T*(U+1) plus encoder size B*T."""
    cost = costs if costs is not None else [b * (d / FRAME_S) * (u + 1) + b * d / FRAME_S for b, d, u in shapes]
    i = int(np.argmax(cost))
    return [shapes[i]] + shapes[:i] + shapes[i + 1:]


# ---------------------------------------------------------------- parent: run, compare, write

# One round = one fresh subprocess running these blocks (P: plain allocator, E: expandable segments). The
# ABBA order cancels a linear drift within the round; each block's static-mode passes pair every dynamic
# step (first occurrence) with a static one (the repeat) in the same block.
BLOCKS = "PEEP"
CONFIG_NAMES = record.CONFIG_NAMES
PAIRS = {  # figure name -> (numerator, denominator), ratios of per-round total time of the same steps
    "dynamic_expandable/static_plain": ("dynamic_expandable", "static_plain"),  # the target
    "dynamic_expandable/static_expandable": ("dynamic_expandable", "static_expandable"),  # the fallback target
    "dynamic_plain/static_plain": ("dynamic_plain", "static_plain"),
    "static_expandable/static_plain": ("static_expandable", "static_plain"),  # expandable segments' own cost
}
TARGET_PAIRS = ("dynamic_expandable/static_plain", "dynamic_expandable/static_expandable")  # in order of preference
SMOKE_DEFAULTS = dict(model="tiny-rnnt", steps=4, batch_audio_s=6.0, buckets=2, worker_timeout_s=120, rounds=1,
                      budget_s=120.0)
SMOKE_CORPUS = dict(num_cuts=400, max_duration_s=3.0)
SHAPE_COLUMNS = ("batch_size", "duration_s", "num_tokens")  # the worker's tags that make a step's shape
MAX_EVENTS = 40  # allocation events kept per configuration and headroom
SWITCH_TOLERANCE_BYTES = 64 << 20  # segments of the other kind a block may add before its switch counts as failed


def headroom_label(headroom: float) -> str:
    return f"{headroom:g}"


def run_worker(mode: str, tmp: Path, shapes_path: Path, args, fraction: float = 0.0) -> dict:
    """One worker subprocess (``worker.py``): ``mode`` "calibrate" or "interleaved" (the blocks of
    ``args.blocks``) under the memory ``fraction`` of the device (0: no limit). Returns its JSON."""
    out = tmp / f"{mode}_{time.monotonic_ns()}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    cmd = [sys.executable, "-m", "benchmarks.allocator.worker", "--mode", mode, "--shapes", str(shapes_path),
           "--rows", str(out), "--model", args.model, "--dtype", args.dtype, "--fraction", str(fraction),
           "--device", args.device, "--passes", str(args.passes), "--blocks", args.blocks]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=args.worker_timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {mode} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    print(f"[allocator] {mode} done in {result['wall_s']:.1f} s", flush=True)
    return result


def split_round(result: dict, num_shapes: int) -> dict[str, dict]:
    """A round's rows as the four configurations {dynamic, static} x {plain, expandable}: ``rows`` holds the
    warm-up passes of the allocator's blocks, then its measured steps in run order, "dynamic" the first
    occurrences (each after a different shape), "static" the repeats. ``events`` are the measured steps that
    touched device memory (``workbench.memory.device_alloc_events``, found per allocator block in run order,
    so each names the step really before it); ``plot_rows`` the first block of the allocator alone."""
    frame = pd.DataFrame(result["rows"])
    done = {}
    for allocator in ("plain", "expandable"):
        mine = frame[frame["allocator"] == allocator]
        blocks = [b for b in result["blocks"] if b["allocator"] == allocator]
        warm, measured = mine[mine["pass_"] == 1], mine[mine["pass_"] > 1]
        if len(warm) != num_shapes * len(blocks):
            raise ValueError(f"round rows: {len(warm)} warm-up steps for {allocator}, want {num_shapes} per block")
        events = [e for b in blocks
                  for e in device_alloc_events(mine[mine["block"] == b["block"]], start=num_shapes,
                                               shape_columns=SHAPE_COLUMNS)]
        first_block = mine[mine["block"] == blocks[0]["block"]]
        for kind, repeat in (("dynamic", False), ("static", True)):
            def keep(f):  # warm-up steps and this kind's measured steps
                return f[(f["pass_"] == 1) | (f["repeat"] == repeat)]
            done[f"{kind}_{allocator}"] = dict(
                settings=blocks[0]["settings"], rows=pd.concat([warm, keep(measured)]).to_dict(orient="list"),
                events=[e for e in events if e["repeat"] == repeat], plot_rows=keep(first_block).to_dict(orient="list"))
    return {name: done[name] for name in CONFIG_NAMES}


def switch_failures(result: dict) -> list[str]:
    """Blocks whose allocator switch did not take: segments of the other kind grew by more than
    SWITCH_TOLERANCE_BYTES between the switch and the block's end (torch's snapshot, by segment kind)."""
    failures = []
    for b in result["blocks"]:
        other = "plain" if b["allocator"] == "expandable" else "expandable"
        grew = b["segments_end"][other] - b["segments_after_switch"][other]
        if grew > SWITCH_TOLERANCE_BYTES:
            failures.append(f"block {b['block']} ({b['allocator']}): {other} segments grew by {grew / MiB:.0f} MiB "
                            f"after switching to {b['settings']!r}: the switch did not take")
    return failures


def round_figures(frame, warmup: int, passes: int) -> dict:
    """One configuration's figures in one round: ``frame`` holds its ``warmup`` warm-up steps, then its
    measured steps, ``passes`` passes over the shapes (:func:`split_round`)."""
    frame = pd.DataFrame(frame)
    measured = frame.iloc[warmup:]
    return dict(summarize_steps(frame, warmup=warmup), median_step_s=float(measured["time_s"].median()),
                total_time_s=float(measured["time_s"].sum()) / passes,  # one pass over the shapes
                warmup_device_allocs=int(frame["device_allocs"].iloc[:warmup].sum()),
                timed_step_times_s=[float(t) for t in measured["time_s"]])


def headroom_figures(rounds: list[dict], warmup: int, passes: int) -> tuple[dict, dict, dict]:
    """Figures of one headroom over its rounds: ``rounds`` is a list of {config name: rows, events, settings}
    (:func:`split_round`). Returns (figures, series of the first round's first block of each configuration
    for plots, per-round measured step times)."""
    per_round = [{name: round_figures(r["rows"], warmup, passes) for name, r in rnd.items()} for rnd in rounds]
    names = list(per_round[0])
    figures = {}
    for name in names:
        figs = [rf[name] for rf in per_round]
        medians = [f["median_step_s"] for f in figs]
        events = [dict(e, round=r + 1) for r, rnd in enumerate(rounds) for e in rnd[name]["events"]]
        figures[name] = {
            "rounds": len(figs),
            "steps": figs[0]["steps"],  # measured steps per round
            "step_time_s": summarize(medians),  # over rounds: the median of per-round medians, with spread
            "median_step_s": float(np.median(medians)),
            "round_median_step_s": medians,
            "round_total_time_s": [f["total_time_s"] for f in figs],
            "total_time_s": float(np.median([f["total_time_s"] for f in figs])),
            "device_allocs_per_step": float(np.mean([f["device_allocs_per_step"] for f in figs])),
            "device_frees_per_step": float(np.mean([f["device_frees_per_step"] for f in figs])),
            "device_alloc_bytes_per_step": float(np.mean([f["device_alloc_bytes_per_step"] for f in figs])),
            "steps_with_device_alloc": int(sum(f["steps_with_device_alloc"] for f in figs)),
            "alloc_retries": int(sum(f["alloc_retries"] for f in figs)),
            "ooms": int(sum(f["ooms"] for f in figs)),
            "peak_reserved_bytes": int(max(f["peak_reserved_bytes"] for f in figs)),
            "warmup_device_allocs": int(np.median([f["warmup_device_allocs"] for f in figs])),  # the allocator's
            "allocation_events": events[:MAX_EVENTS],
            "allocation_events_total": len(events),
            "settings": rounds[0][name]["settings"],
        }
    paired = {}
    for pair, (num, den) in PAIRS.items():
        values = [rf[num]["total_time_s"] / rf[den]["total_time_s"] for rf in per_round]
        paired[pair] = dict(summarize(values), rounds=values)
    figures["paired_time_ratios"] = paired
    figures["time_ratio_vs_static_plain"] = {
        name: float(np.median([rf[name]["total_time_s"] / rf["static_plain"]["total_time_s"] for rf in per_round]))
        for name in names}
    series = {}
    for name in names:
        frame = pd.DataFrame(rounds[0][name]["plot_rows"])
        series[name] = {k: [float(v) for v in frame[k]] for k in
                        ("time_s", "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
                         "device_allocs", "device_frees", "alloc_retries", "pass_")}
    step_times = {name: [rf[name]["timed_step_times_s"] for rf in per_round] for name in names}
    return figures, series, step_times


def invalid_references(figures: dict) -> dict[str, str]:
    """Static configuration -> why it is no reference for static shapes (allocations in its repeated-shape
    steps, or OOMs after warm-up); the valid ones are left out."""
    invalid = {}
    for name in ("static_plain", "static_expandable"):
        why = []
        if figures[name]["device_allocs_per_step"] != 0:
            reasons = "; ".join(sorted({e["reason"].split(":")[0] for e in figures[name]["allocation_events"]}))
            why.append(f"its repeated-shape steps allocated device memory "
                       f"({figures[name]['device_allocs_per_step']:.2f}/step; {reasons})")
        if figures[name]["ooms"]:
            why.append(f"{figures[name]['ooms']} OOM(s) after warm-up")
        if why:
            invalid[name] = " and ".join(why)
    return invalid


def check_headroom(label: str, figures: dict, rounds_run: int) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one headroom; the target verdict goes into figures["time_target"]."""
    failures, warnings_ = [], []
    tag = f"[headroom {label}]"
    invalid = invalid_references(figures)
    if "static_expandable" in invalid:  # expandable segments must not allocate once warm, static shapes least of all
        failures.append(f"{tag} static_expandable: {invalid['static_expandable']}")
    if figures["dynamic_expandable"]["ooms"]:
        failures.append(f"{tag} dynamic_expandable: {figures['dynamic_expandable']['ooms']} OOM(s) after warm-up")
    if figures["dynamic_plain"]["ooms"]:
        warnings_.append(f"{tag} dynamic_plain hit {figures['dynamic_plain']['ooms']} OOM(s) after warm-up (the plain "
                         "allocator fragments at this limit); its times include the OOM-aborted steps")
    # The target's reference: static shapes with the plain allocator, or with expandable segments where the plain
    # allocator cannot run them at this limit (a finding about the plain allocator, not a broken measurement).
    target_pair = next((pair for pair in TARGET_PAIRS if PAIRS[pair][1] not in invalid), None)
    if "static_plain" in invalid:
        line = f"{tag} static_plain: {invalid['static_plain']}: not a reference for static shapes"
        if target_pair:
            warnings_.append(f"{line}; the time target uses {target_pair}")
        else:
            failures.append(f"{line}, and static_expandable is not either: no valid reference")
    dyn = figures["dynamic_expandable"]
    if dyn["device_allocs_per_step"] != 0:
        lines = [f"round {e['round']} pass {e.get('pass_')} step {e.get('index')} shape {e['shape']} after "
                 f"{e['previous_shape']}: {e['device_allocs']} alloc(s), {e['alloc_retries']} retr(y/ies): "
                 f"{e['reason']}" for e in dyn["allocation_events"][:6]]
        failures.append(f"TARGET missed {tag}: dynamic_expandable makes {dyn['device_allocs_per_step']:.2f} device "
                        f"allocations per step after the warm-up pass ({dyn['steps_with_device_alloc']} steps over "
                        f"{rounds_run} round(s)), want 0:\n    " + "\n    ".join(lines))
    if target_pair is None:
        figures["time_target"] = dict(pair=None, limit=TARGET_TIME_RATIO, verdict="no valid reference",
                                      conclusive=False)
        return failures, warnings_
    ratios = figures["paired_time_ratios"][target_pair]
    above = [r > TARGET_TIME_RATIO for r in ratios["rounds"]]
    verdict = "met" if not any(above) else "missed" if all(above) else "inconclusive"
    figures["time_target"] = dict(pair=target_pair, limit=TARGET_TIME_RATIO, median=ratios["median"],
                                  rounds=ratios["rounds"], verdict=verdict,
                                  conclusive=verdict != "inconclusive" and rounds_run >= 2)
    if ratios["median"] > TARGET_TIME_RATIO:
        failures.append(f"TARGET missed {tag}: {target_pair} is {ratios['median']:.3f} (median of {rounds_run} "
                        f"paired round(s), range {ratios['min']:.3f}-{ratios['max']:.3f}), want <= "
                        f"{TARGET_TIME_RATIO}")
    if verdict == "inconclusive" or rounds_run < 2:
        warnings_.append(f"{tag} time target not conclusive: per-round ratios "
                         f"{', '.join(f'{r:.3f}' for r in ratios['rounds'])} "
                         + ("straddle" if verdict == "inconclusive" else "on one side of")
                         + f" {TARGET_TIME_RATIO} over {rounds_run} round(s) (want >= 2, all on one side)")
    if figures["dynamic_plain"]["device_allocs_per_step"] == 0 and figures.get("memory_fraction"):
        warnings_.append(f"{tag} dynamic_plain made no device allocations after the warm-up pass: the limit did not "
                         "bite (lower --headroom for a harder test)")
    return failures, warnings_


@dataclass
class AllocatorRun:
    """One run of the bench: its options, its calibrated shapes and limits, and the rounds so far."""
    args: argparse.Namespace
    shapes: list[tuple[int, float, int]]  # (batch size, padded duration s, padded tokens), largest peak first
    shape_source: str
    calibration: dict  # the calibrate worker's JSON: peak_allocated_bytes, peaks, total_bytes, model, wall_s
    limits: dict[str, float]  # headroom label -> memory limit, bytes
    fractions: dict[str, float]  # headroom label -> per-process memory fraction (0: no limit)
    t_start: float  # time.perf_counter() at the start, seconds
    results: dict[str, list] = field(default_factory=dict)  # headroom -> rounds, each {config: split_round()}
    switches: dict[str, list] = field(default_factory=dict)  # headroom -> per round: failed allocator switches
    block_settings: dict[str, list] = field(default_factory=dict)  # headroom -> per round: each block's settings
    order: list[dict] = field(default_factory=list)  # one entry per worker call, in run order
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stopped: str | None = None  # why rounds stopped before --rounds

    @property
    def labels(self) -> list[str]:
        return list(self.limits)

    @property
    def blocks_per_allocator(self) -> int:
        return len(self.args.blocks) // 2


def parse_args(argv=None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The options, with --smoke's defaults applied where the command line kept the default; ValueError
    for a bad value."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for allocator.json (default benchmarks/results)")
    p.add_argument("--steps", type=int, default=64, help="batch shapes in the sequence (a warm-up pass over them, "
                   "then --passes measured passes)")
    p.add_argument("--passes", type=int, default=1, help="measured passes over the shapes per block (each shape "
                   "twice in a row)")
    p.add_argument("--blocks", default=BLOCKS, help="allocator per block of a round, P plain, E expandable segments; "
                   "needs as many P as E")
    p.add_argument("--rounds", type=int, default=4, help="most rounds (each: every headroom, one fresh subprocess "
                   "running --blocks); rounds after the first run only while --budget-s allows")
    p.add_argument("--budget-s", type=float, default=500.0, help="wall-clock budget of the whole run: a round "
                   "starts only when it is expected to end within it (the first round always runs)")
    p.add_argument("--shapes-file", help="JSON list of [batch_size, duration_s, num_tokens] written by --write-shapes")
    p.add_argument("--write-shapes", help="only write the sampler's shapes to this JSON file and exit (CPU)")
    p.add_argument("--model", default="large-rnnt")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--batch-audio-s", type=float, default=200.0, help="padded audio seconds per batch")
    p.add_argument("--buckets", type=int, default=8)
    p.add_argument("--headroom", type=float, nargs="+", default=[0.08],
                   help="memory limit = (1 + this) x largest peak; several values: a sweep, one block each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="allocator", help="result name: <out>/<name>.json")
    p.add_argument("--worker-timeout-s", type=int, default=480, help="limit of one worker subprocess (a whole "
                   "round), seconds")
    p.add_argument("--smoke", action="store_true", help="tiny-rnnt, 4 short shapes, one round, seconds (CPU without "
                   "CUDA); needs --out (never benchmarks/results)")
    args = p.parse_args(argv)
    if args.smoke:
        check_smoke_out(p, args.out)
        for name, value in SMOKE_DEFAULTS.items():  # only where the command line kept the default
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2, got {args.steps}")
    if args.passes < 1 or args.rounds < 1:
        raise ValueError(f"--passes and --rounds must be >= 1, got {args.passes} and {args.rounds}")
    blocks = parse_blocks(args.blocks)
    if sum(blocks) * 2 != len(blocks):
        raise ValueError(f"--blocks: want as many P as E blocks (the configurations are compared per pass), "
                         f"got {args.blocks!r}")
    if any(h < 0 for h in args.headroom) or len(set(args.headroom)) != len(args.headroom):
        raise ValueError(f"--headroom: want distinct values >= 0, got {args.headroom}")
    # the workers' device: the GPU, except for a smoke run without one
    args.device = "cpu" if args.smoke and not torch.cuda.is_available() else "cuda"
    return p, args


def write_shapes_only(args) -> int:
    """--write-shapes: the sampler's shapes as JSON, for a GPU host without lhotse."""
    with tempfile.TemporaryDirectory() as tmp_name:
        shapes, source = sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s, num_buckets=args.buckets,
                                        seed=args.seed, work_dir=Path(tmp_name))
    Path(args.write_shapes).write_text(json.dumps(dict(shapes=shapes, source=source)))
    print(f"wrote {len(shapes)} shapes ({source}) to {args.write_shapes}")
    return 0


def load_shapes(args, tmp: Path) -> tuple[list[tuple[int, float, int]], str]:
    """(shapes, where they come from): the --shapes-file, else lhotse's sampler over a synthetic corpus."""
    if args.shapes_file:
        loaded = json.loads(Path(args.shapes_file).read_text())
        source = f"{loaded['source']} (from {Path(args.shapes_file).name}, written with --write-shapes)"
        return [tuple(x) for x in loaded["shapes"]], source
    return sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s, num_buckets=args.buckets, seed=args.seed,
                          work_dir=tmp / "corpus", **(SMOKE_CORPUS if args.smoke else {}))


def calibrate(args, tmp: Path, shapes_path: Path, t_start: float) -> AllocatorRun:
    """Measure each shape's peak in a worker, put the largest first and set each headroom's memory limit."""
    shapes, source = load_shapes(args, tmp)
    shapes_path.write_text(json.dumps(shapes))
    cal = run_worker("calibrate", tmp, shapes_path, args)
    shapes = largest_first(shapes, cal["peaks"])  # the warm-up pass starts with the largest peak
    shapes_path.write_text(json.dumps(shapes))
    print(f"[allocator] {len(shapes)} shapes ({source}); largest {shapes[0]}", flush=True)
    labels = [headroom_label(h) for h in args.headroom]
    limits = {label: cal["peak_allocated_bytes"] * (1 + h) for label, h in zip(labels, args.headroom)}
    # A smoke run sets no limit: a tiny model's peak (tens of MiB) is below the allocator's segment
    # granularity, so a limit a few per cent above it fails at the first step.
    fractions = {label: 0.0 if args.smoke else min(0.95, limit / cal["total_bytes"]) for label, limit in limits.items()}
    for label in labels:
        print(f"[allocator] headroom {label}: largest batch peaks at {cal['peak_allocated_bytes'] / GiB:.2f} GiB; "
              + (f"limit {limits[label] / GiB:.2f} GiB (fraction {fractions[label]:.4f})" if fractions[label]
                 else "no memory limit (smoke run)"), flush=True)
    return AllocatorRun(args=args, shapes=shapes, shape_source=source, calibration=cal, limits=limits,
                        fractions=fractions, t_start=t_start, results={label: [] for label in labels},
                        switches={label: [] for label in labels})


def run_round(run: AllocatorRun, r: int, tmp: Path, shapes_path: Path) -> None:
    """Round ``r`` (0-based): one worker subprocess per headroom; its rows join ``run``."""
    for label in run.labels:
        result = run_worker("interleaved", tmp, shapes_path, run.args, run.fractions[label])
        run.results[label].append(split_round(result, len(run.shapes)))
        run.switches[label].append(switch_failures(result))
        run.block_settings.setdefault(label, []).append(result["blocks"])
        run.order.append(dict(round=r + 1, headroom=label, blocks=run.args.blocks, wall_s=result["wall_s"],
                              startup_s=result.get("startup_s"), steps_s=result.get("steps_s")))


def run_rounds(run: AllocatorRun, tmp: Path, shapes_path: Path) -> None:
    """Rounds while --rounds and --budget-s allow (the first always); the record is rewritten after each, so
    a run killed later keeps the rounds so far. A failed round stops the run and is listed in failures."""
    args, round_walls = run.args, []
    for r in range(args.rounds):
        elapsed = time.perf_counter() - run.t_start
        if r and elapsed + max(round_walls) > args.budget_s:
            run.stopped = (f"stopped after {r} round(s): the next would end near {elapsed + max(round_walls):.0f} s, "
                           f"past --budget-s {args.budget_s:.0f}")
            print(f"[allocator] {run.stopped}", flush=True)
            return
        t_round = time.perf_counter()
        try:
            run_round(run, r, tmp, shapes_path)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            run.failures.append(f"round {r + 1}: {type(exc).__name__}: {str(exc)[-1500:]}")
            print(f"[allocator] round {r + 1} failed; keeping the complete rounds\n{exc}", flush=True)
            return
        round_walls.append(time.perf_counter() - t_round)
        write_record(run, complete=False)


def build_figures(run: AllocatorRun, complete: bool) -> tuple[dict, dict, dict]:
    """(figures, series, step times) of the rounds so far, with every headroom's checks."""
    rounds_run = min(len(v) for v in run.results.values())
    failures, warnings_ = list(run.failures), list(run.warnings)
    warmup = len(run.shapes) * run.blocks_per_allocator  # each configuration's warm-up passes come first
    figures, series, step_times = {"headrooms": {}}, {}, {}
    for label in run.labels if rounds_run else ():
        # a headroom's extra round from a round cut short has no partner: dropped
        block, series[label], step_times[label] = headroom_figures(run.results[label][:rounds_run], warmup,
                                                                   run.args.passes * run.blocks_per_allocator)
        block.update(headroom=float(label), memory_limit_bytes=int(run.limits[label]),
                     memory_fraction=run.fractions[label])
        block_failures, block_warnings = check_headroom(label, block, rounds_run)
        failures += block_failures + [f"[headroom {label}] round {r + 1}: {f}"
                                      for r, rnd in enumerate(run.switches[label]) for f in rnd]
        warnings_ += block_warnings
        figures["headrooms"][label] = block
    if not rounds_run:
        failures.append("no complete round: nothing measured")
    if run.stopped:
        warnings_.append(run.stopped)
    if not complete:
        failures.append(f"incomplete: written after round {rounds_run} of up to {run.args.rounds}")
    figures.update(smoke=bool(run.args.smoke), complete=complete, rounds_run=rounds_run,
                   rounds_planned=run.args.rounds, passes=run.args.passes, targets_met=not failures,
                   targets_enforced=not run.args.smoke, failures=failures, warnings=warnings_)
    return figures, series, step_times


def write_record(run: AllocatorRun, complete: bool) -> tuple[Path, dict, dict]:
    """Write the record of the rounds so far; returns (path, figures, params)."""
    args, cal = run.args, run.calibration
    figures, series, step_times = build_figures(run, complete)
    params = dict(model=cal["model"], dtype=args.dtype, device=args.device, smoke=bool(args.smoke),
                  steps=len(run.shapes), warmup_steps=len(run.shapes), passes=args.passes, rounds=args.rounds,
                  budget_s=args.budget_s, blocks=args.blocks, block_settings=run.block_settings,
                  batch_audio_s=args.batch_audio_s, buckets=args.buckets, headrooms=[float(h) for h in args.headroom],
                  memory_limit_bytes={k: int(v) for k, v in run.limits.items()}, memory_fractions=run.fractions,
                  largest_peak_allocated_bytes=cal["peak_allocated_bytes"], calibration_wall_s=cal["wall_s"],
                  shape_source=run.shape_source, shapes=run.shapes, series=series, round_step_times_s=step_times,
                  run_order=run.order, wall_s=time.perf_counter() - run.t_start)
    what = ("training steps near the memory limit, dynamic vs static batch shapes, with and without expandable "
            f"segments; rounds of one fresh subprocess each, allocator switched per block ({args.blocks}), "
            "ratios paired per round")
    if args.smoke:
        what = (f"SMOKE RUN on {args.device} ({cal['model']}, {len(run.shapes)} short shapes, no memory limit; not a "
                "measurement" + ("; no allocator on a CPU: memory counters are 0, calibration peaks are batch "
                                 "bytes" if args.device == "cpu" else "") + f"): {what}")
    path = write_result(args.name, what=what, figures=figures, params=params, out_dir=args.out)
    return path, figures, params


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if args.write_shapes:
        return write_shapes_only(args)
    if cuda_missing(args.smoke):
        return 2
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shapes_path = tmp / "shapes.json"
        run = calibrate(args, tmp, shapes_path, t_start)
        run_rounds(run, tmp, shapes_path)
    path, figures, params = write_record(run, complete=True)
    print(f"\nwrote {path}")
    print("\n".join(record.table_lines({"figures": figures, "params": params})))
    return report_failures(figures["failures"], smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
