"""Expandable segments vs the plain caching allocator, with dynamic batch shapes near the memory limit.

    python3 -m workbench.bench.allocator --out benchmarks/results                    # ~5-6 min on an H200
    python3 -m workbench.bench.allocator --out DIR --headroom 0.08 0.15 --budget-s 560   # a sweep, <10 min

What runs: training steps (forward, loss, backward, optimizer step) of ``workbench.models`` 'large-rnnt'
in worker subprocesses (``workbench.bench.allocator_worker``). 64 batch shapes (batch size, padded
duration, padded tokens; 200 s of padded audio per batch) come from lhotse's DynamicBucketingSampler built
by ``workbench.bucketing.make_sampler`` on a synthetic corpus. On a GPU host without lhotse, ``--shapes-file`` takes the shapes written
beforehand on a CPU machine with ``--write-shapes PATH``. A calibration subprocess measures each shape's
peak; the largest goes first, and a per-process memory fraction puts the limit ``--headroom`` above the
largest peak, so the caching allocator cannot keep blocks for every shape.

Protocol. Four configurations, {dynamic, static} x {expandable segments off, on}, each in a fresh
subprocess (the allocator settings must be in place before CUDA initializes). Every subprocess runs one
unrecorded prime step (the cheapest shape: the optimizer state then exists before the warm-up, as in
training), a warm-up pass over every shape (largest first: per-shape first-time costs such as cuDNN plans
are paid, and the allocator sees every shape), then ``--passes`` measured passes. "Dynamic" runs the steps
in sampler order. "Static" runs every step twice in a row and times only the repeat, which has exactly the
shape of the step before it: the allocator has nothing to do, so it is the time of the same steps with
static shapes (its untimed first occurrences give an in-process dynamic-vs-static ratio for free).
A round runs the four subprocesses in ABCD order (static_plain, dynamic_expandable, static_expandable,
dynamic_plain: each dynamic next to a static), for every headroom; rounds repeat (up to ``--rounds``,
default 4) while ``--budget-s`` (default 330 s) allows, the first always. Subprocesses of identical
configurations differed 10-15 % in step time on the H200, so the figures are per round: the median of the
per-round median step times with their spread across rounds, and the ratios dynamic/static of the total
time of the same steps computed within each round (paired), reported as their median and range over
rounds. Each headroom is its own block under ``figures["headrooms"]``. Every step after the warm-up that
allocates device memory (or retries, or OOMs) is listed with its shape, the shape before it, reserved
bytes before and after, and a reason (``workbench.memory.device_alloc_events``: OOM-retry, peak above
warm-up, re-allocated after frees, cache miss), so a missed allocation target says why.

Time (estimate from the 24-shape H200 runs at 500 s of audio per batch, which took ~141 s: ~11 s to start a
worker subprocess, ~0.24 s per warm step, ~+0.12 s per shape in the warm-up pass; steps at 200 s of audio
taken as ~0.1 s): shapes ~10 s, calibration ~25 s; one round of one headroom ~4 x (11 + 64 x 0.2) s of
starts and warm-up passes + (1 + 1 + 2 + 2) x 64 x 0.1 s measured, ~135 s. Two rounds fit the default
330 s budget (~5.5 minutes in all), a third only if steps are faster than estimated: the budget is checked
against the longest round so far, so slower steps give fewer rounds, not a longer run. Each headroom adds
~135 s per round: ``--headroom 0.08 0.15 --budget-s 560`` gives one round by this estimate (two if steps
are faster), within the 10-minute command limit; a conclusive sweep needs one run per headroom or more time. The JSON records every worker's wall and start-up time (``params["run_order"]``) to
refine this estimate, and is rewritten after every round (``figures["complete"]`` false until the end),
so a run killed by an outer time limit keeps the rounds it finished.

Targets (checked for every headroom, non-zero exit when missed): with expandable segments, no device
allocation per step in the measured passes, and total step time within 5 % of static shapes with the
plain allocator (median of the per-round paired ratios; ``time_target`` says "met"/"missed" when every
round falls on one side of 1.05, "inconclusive" when they straddle it; "conclusive" needs >= 2 rounds
on one side). Must hold or the run is invalid: static timed steps allocate nothing, no OOM.

    python3 -m workbench.bench.allocator --smoke --out /tmp/smoke     # ~15 s on a 2-core CPU

--smoke: the same parent and worker subprocesses with tiny-rnnt, 4 sampler-drawn shapes from a 400-cut
synthetic corpus (utterances up to 3 s), one round, 2 measured passes (--rounds/--headroom still work).
Without CUDA the workers run on the CPU, two at a time, where there is no allocator to measure: the
memory counters are zero, the calibration "peaks" are the batch's bytes, and no memory limit is set. The
JSON is marked "smoke": true and goes only to --out (required); the targets are reported but do not set
the exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from workbench.bench.allocator_worker import worker
from workbench.bench.results import check_smoke_out, report_failures, summarize, write_result

FRAME_S = 0.08  # encoder frame after subsampling, seconds (for the joint-size cost of a shape)
TARGET_TIME_RATIO = 1.05


# ---------------------------------------------------------------- batch shapes (CPU, parent process)

def sampler_shapes(num_steps: int, *, batch_audio_s: float, num_buckets: int, seed: int,
                   work_dir: Path, num_cuts: int | None = None,
                   max_duration_s: float = 40.0) -> tuple[list[tuple[int, float, int]], str]:
    """Batch shapes (batch size, max duration s, max tokens) from a real bucketed lhotse sampler over a
    synthetic corpus of ``num_cuts`` (default max(4000, 200 x num_steps)) utterances up to
    ``max_duration_s`` seconds. Returns (shapes, source)."""
    import lhotse

    from workbench.bucketing import close_sampler, cut_num_tokens, estimate_2d_bins, make_sampler
    from workbench.bucketing.profile import BucketProfile
    from workbench.data.synthetic import write_synthetic_corpus

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
    from workbench.data.synthetic import synthetic_cut_arrays

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

# ABCD order within a round: each dynamic configuration runs next to a static one, so the paired ratios
# compare subprocesses that ran one after the other.
CONFIGS = [("static", False), ("dynamic", True), ("static", True), ("dynamic", False)]
PAIRS = {  # figure name -> (numerator, denominator), ratios of per-round total time of the same steps
    "dynamic_expandable/static_plain": ("dynamic_expandable", "static_plain"),  # the target
    "dynamic_expandable/static_expandable": ("dynamic_expandable", "static_expandable"),
    "dynamic_plain/static_plain": ("dynamic_plain", "static_plain"),
    "static_expandable/static_plain": ("static_expandable", "static_plain"),  # expandable segments' own cost
}
TARGET_PAIR = "dynamic_expandable/static_plain"
SMOKE_DEFAULTS = dict(model="tiny-rnnt", steps=4, batch_audio_s=6.0, buckets=2, worker_timeout_s=120, rounds=1,
                      passes=2, budget_s=120.0)
SMOKE_CORPUS = dict(num_cuts=400, max_duration_s=3.0)
MAX_EVENTS = 40  # allocation events kept per configuration and headroom


def config_name(mode: str, expandable: bool) -> str:
    return f"{mode}_{'expandable' if expandable else 'plain'}"


def headroom_label(headroom: float) -> str:
    return f"{headroom:g}"


def run_worker(mode: str, expandable: bool, tmp: Path, shapes_path: Path, args, fraction: float = 0.0) -> dict:
    out = tmp / f"{mode}_{int(expandable)}_{time.monotonic_ns()}.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    cmd = [sys.executable, "-m", "workbench.bench.allocator", "--worker", "--mode", mode, "--shapes",
           str(shapes_path), "--rows", str(out), "--model", args.model, "--dtype", args.dtype,
           "--fraction", str(fraction), "--device", args.device, "--passes", str(args.passes)] + \
        (["--expandable"] if expandable else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=args.worker_timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {mode} expandable={expandable} failed:\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    print(f"[allocator] {config_name(mode, expandable)} done in {result['wall_s']:.1f} s", flush=True)
    return result


def round_figures(frame, warmup: int, passes: int) -> dict:
    """One subprocess's figures: ``frame`` holds every step in run order (warm-up pass of ``warmup`` steps,
    then the measured passes; static runs: untimed first occurrence + timed repeat)."""
    import pandas as pd

    from workbench.memory.telemetry import summarize_steps

    frame = pd.DataFrame(frame)
    measured_all = frame.iloc[warmup:]
    timed = measured_all[measured_all["timed"]] if "timed" in measured_all else measured_all
    summary = summarize_steps(pd.concat([frame.iloc[:warmup], timed]), warmup=warmup)
    first = measured_all[~measured_all["timed"]] if "timed" in measured_all else measured_all.iloc[:0]
    return dict(summary, median_step_s=float(timed["time_s"].median()),
                total_time_s=float(timed["time_s"].sum()) / passes,  # one pass over the shapes
                cold_total_time_s=float(frame["time_s"].iloc[1:warmup].sum()),  # warm-up without its first step
                warmup_device_allocs=int(frame["device_allocs"].iloc[:warmup].sum()),
                first_occurrence_total_time_s=float(first["time_s"].sum()) / passes if len(first) else None,
                timed_step_times_s=[float(t) for t in timed["time_s"]])


def block_figures(rounds: list[dict], warmup: int, passes: int) -> tuple[dict, dict, dict]:
    """Figures of one headroom over its rounds: ``rounds`` is a list of {config name: worker result}.
    Returns (figures, series of the first round for plots, per-round timed step times)."""
    import pandas as pd

    from workbench.memory.telemetry import device_alloc_events

    per_round = [{name: round_figures(r["rows"], warmup, passes) for name, r in rnd.items()} for rnd in rounds]
    names = list(per_round[0])
    figures = {}
    for name in names:
        figs = [rf[name] for rf in per_round]
        medians = [f["median_step_s"] for f in figs]
        frames = [pd.DataFrame(rnd[name]["rows"]) for rnd in rounds]
        events = []
        for r, frame in enumerate(frames):
            for event in device_alloc_events(frame, start=warmup, limit=MAX_EVENTS):
                if event.get("timed", True) or event["oom"]:  # static: its untimed first occurrences may allocate
                    events.append(dict(event, round=r + 1))
        figures[name] = {
            "rounds": len(figs),
            "steps": figs[0]["steps"],  # timed steps per round
            "step_time_s": summarize(medians),  # over rounds: the median of per-round medians, with spread
            "median_step_s": float(np.median(medians)),
            "round_median_step_s": medians,
            "round_total_time_s": [f["total_time_s"] for f in figs],
            "total_time_s": float(np.median([f["total_time_s"] for f in figs])),
            "cold_total_time_s": float(np.median([f["cold_total_time_s"] for f in figs])),
            "device_allocs_per_step": float(np.mean([f["device_allocs_per_step"] for f in figs])),
            "device_frees_per_step": float(np.mean([f["device_frees_per_step"] for f in figs])),
            "device_alloc_bytes_per_step": float(np.mean([f["device_alloc_bytes_per_step"] for f in figs])),
            "steps_with_device_alloc": int(sum(f["steps_with_device_alloc"] for f in figs)),
            "alloc_retries": int(sum(f["alloc_retries"] for f in figs)),
            "ooms": int(sum(f["ooms"] for f in figs)),
            "peak_reserved_bytes": int(max(f["peak_reserved_bytes"] for f in figs)),
            "warmup_device_allocs": int(np.median([f["warmup_device_allocs"] for f in figs])),
            "allocation_events": events[:MAX_EVENTS],
            "settings": rounds[0][name]["settings"],
            "worker_wall_s": [rnd[name].get("wall_s") for rnd in rounds],
            "worker_startup_s": [rnd[name].get("startup_s") for rnd in rounds],
        }
        if name.startswith("static"):  # the untimed first occurrences are dynamic steps of the same process
            ratios = [f["first_occurrence_total_time_s"] / f["total_time_s"] for f in figs]
            figures[name]["in_process_first_vs_repeat"] = dict(summarize(ratios), rounds=ratios)
    paired = {}
    for pair, (num, den) in PAIRS.items():
        if num in names and den in names:
            values = [rf[num]["total_time_s"] / rf[den]["total_time_s"] for rf in per_round]
            paired[pair] = dict(summarize(values), rounds=values)
    figures["paired_time_ratios"] = paired
    figures["time_ratio_vs_static_plain"] = {
        name: float(np.median([rf[name]["total_time_s"] / rf["static_plain"]["total_time_s"] for rf in per_round]))
        for name in names}
    figures["cold_shapes_time_ratio_vs_static_plain"] = {
        name: float(np.median([rf[name]["cold_total_time_s"] / (rf["static_plain"]["total_time_s"]
                                                                - rf["static_plain"]["timed_step_times_s"][0])
                               for rf in per_round])) for name in names}
    figures["time_ratio_dynamic_expandable_vs_static_expandable"] = \
        paired["dynamic_expandable/static_expandable"]["median"]
    series = {}
    for name in names:
        frame = pd.DataFrame(rounds[0][name]["rows"])
        if "timed" in frame:
            frame = frame[frame["timed"]]
        series[name] = {k: [float(v) for v in frame[k]] for k in
                        ("time_s", "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
                         "device_allocs", "device_frees", "alloc_retries", "pass_")}
    step_times = {name: [rf[name]["timed_step_times_s"] for rf in per_round] for name in names}
    return figures, series, step_times


def check_block(label: str, figures: dict, rounds_run: int) -> tuple[list[str], list[str]]:
    """(failures, warnings) of one headroom block; the target verdict goes into figures["time_target"]."""
    failures, warnings_ = [], []
    tag = f"[headroom {label}]"
    for name in ("static_plain", "static_expandable"):
        if figures[name]["device_allocs_per_step"] != 0:
            why = "; ".join(sorted({e["reason"].split(":")[0] for e in figures[name]["allocation_events"]}))
            failures.append(f"{tag} {name}: timed static steps allocated device memory "
                            f"({figures[name]['device_allocs_per_step']:.2f}/step; {why}): reference invalid")
    for name in ("static_plain", "static_expandable", "dynamic_expandable"):
        if figures[name]["ooms"]:
            failures.append(f"{tag} {name}: {figures[name]['ooms']} OOM(s) after warm-up")
    if figures["dynamic_plain"]["ooms"]:
        warnings_.append(f"{tag} dynamic_plain hit {figures['dynamic_plain']['ooms']} OOM(s) after warm-up (the plain "
                         "allocator fragments at this limit); its times include the OOM-aborted steps")
    dyn = figures["dynamic_expandable"]
    if dyn["device_allocs_per_step"] != 0:
        lines = [f"round {e['round']} pass {e.get('pass_')} step {e.get('index')} shape {e['shape']} after "
                 f"{e['previous_shape']}: {e['device_allocs']} alloc(s), {e['alloc_retries']} retr(y/ies): "
                 f"{e['reason']}" for e in dyn["allocation_events"][:6]]
        failures.append(f"TARGET missed {tag}: dynamic_expandable makes {dyn['device_allocs_per_step']:.2f} device "
                        f"allocations per step after the warm-up pass ({dyn['steps_with_device_alloc']} steps over "
                        f"{rounds_run} round(s)), want 0:\n    " + "\n    ".join(lines))
    ratios = figures["paired_time_ratios"][TARGET_PAIR]
    above = [r > TARGET_TIME_RATIO for r in ratios["rounds"]]
    verdict = "met" if not any(above) else "missed" if all(above) else "inconclusive"
    figures["time_target"] = dict(pair=TARGET_PAIR, limit=TARGET_TIME_RATIO, median=ratios["median"],
                                  rounds=ratios["rounds"], verdict=verdict,
                                  conclusive=verdict != "inconclusive" and rounds_run >= 2)
    if ratios["median"] > TARGET_TIME_RATIO:
        failures.append(f"TARGET missed {tag}: dynamic_expandable takes {ratios['median']:.3f}x the time of static "
                        f"shapes (median of {rounds_run} paired round(s), range {ratios['min']:.3f}-"
                        f"{ratios['max']:.3f}), want <= {TARGET_TIME_RATIO}")
    if verdict == "inconclusive" or rounds_run < 2:
        warnings_.append(f"{tag} time target not conclusive: per-round ratios "
                         f"{', '.join(f'{r:.3f}' for r in ratios['rounds'])} "
                         + ("straddle" if verdict == "inconclusive" else "on one side of")
                         + f" {TARGET_TIME_RATIO} over {rounds_run} round(s) (want >= 2, all on one side)")
    if figures["dynamic_plain"]["device_allocs_per_step"] == 0:
        warnings_.append(f"{tag} dynamic_plain made no device allocations after the warm-up pass: the limit did not "
                         "bite (lower --headroom for a harder test)")
    return failures, warnings_


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for allocator.json (default benchmarks/results)")
    p.add_argument("--steps", type=int, default=64, help="batch shapes in the sequence (a warm-up pass over them, "
                   "then --passes measured passes)")
    p.add_argument("--passes", type=int, default=1, help="measured passes over the shapes per subprocess")
    p.add_argument("--rounds", type=int, default=4, help="most rounds (each: every headroom x ABCD in fresh "
                   "subprocesses); rounds after the first run only while --budget-s allows")
    p.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget of the whole run: a round "
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
    p.add_argument("--worker-timeout-s", type=int, default=300)
    p.add_argument("--smoke", action="store_true", help="tiny-rnnt, 4 short shapes, one round, seconds (CPU without "
                   "CUDA); needs --out (never benchmarks/results)")
    p.add_argument("--device", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="dynamic", help=argparse.SUPPRESS)
    p.add_argument("--expandable", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shapes", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--fraction", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    if args.smoke:
        check_smoke_out(p, args.out)
        for name, value in SMOKE_DEFAULTS.items():  # only where the command line kept the default
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2, got {args.steps}")
    if args.passes < 1 or args.rounds < 1:
        raise ValueError(f"--passes and --rounds must be >= 1, got {args.passes} and {args.rounds}")
    if any(h < 0 for h in args.headroom) or len(set(args.headroom)) != len(args.headroom):
        raise ValueError(f"--headroom: want distinct values >= 0, got {args.headroom}")
    if args.device is None:  # the workers' device: the GPU, except for a smoke run without one
        import torch

        args.device = "cpu" if args.smoke and not torch.cuda.is_available() else "cuda"
    if args.write_shapes:
        with tempfile.TemporaryDirectory() as tmp_name:
            shapes, source = sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s, num_buckets=args.buckets,
                                            seed=args.seed, work_dir=Path(tmp_name))
        Path(args.write_shapes).write_text(json.dumps(dict(shapes=shapes, source=source)))
        print(f"wrote {len(shapes)} shapes ({source}) to {args.write_shapes}")
        return 0


    t_start = time.perf_counter()
    labels = [headroom_label(h) for h in args.headroom]
    results = {label: [] for label in labels}  # headroom -> list of rounds, each {config: worker result}
    order, failures, warnings_, stopped = [], [], [], None

    def write_record(complete: bool):
        """Figures of the rounds so far, written to the JSON (after every round: a run cut short keeps them)."""
        rounds_run = min(len(v) for v in results.values())
        run_failures, run_warnings = list(failures), list(warnings_)
        warmup = len(shapes)
        figures = {"headrooms": {}}
        series, step_times = {}, {}
        for label in labels:
            if not rounds_run:
                continue
            # a headroom's extra round from a round cut short has no partner: dropped
            block, series[label], step_times[label] = block_figures(results[label][:rounds_run], warmup, args.passes)
            block.update(headroom=float(label), memory_limit_bytes=int(limits[label]),
                         memory_fraction=fractions[label])
            block_failures, block_warnings = check_block(label, block, rounds_run)
            run_failures += block_failures
            run_warnings += block_warnings
            figures["headrooms"][label] = block
        if not rounds_run:
            run_failures.append("no complete round: nothing measured")
        if stopped:
            run_warnings.append(stopped)
        if not complete:
            run_failures.append(f"incomplete: written after round {rounds_run} of up to {args.rounds}")
        figures.update(smoke=bool(args.smoke), complete=complete, rounds_run=rounds_run, rounds_planned=args.rounds,
                       passes=args.passes, targets_met=not run_failures, targets_enforced=not args.smoke,
                       failures=run_failures, warnings=run_warnings)
        model = cal["model"]
        params = dict(model=model, dtype=args.dtype, device=args.device, smoke=bool(args.smoke), steps=len(shapes),
                      warmup_steps=warmup, passes=args.passes, rounds=args.rounds, budget_s=args.budget_s,
                      config_order=[config_name(m, e) for m, e in CONFIGS], batch_audio_s=args.batch_audio_s,
                      buckets=args.buckets, headrooms=[float(h) for h in args.headroom],
                      memory_limit_bytes={k: int(v) for k, v in limits.items()}, memory_fractions=fractions,
                      largest_peak_allocated_bytes=cal["peak_allocated_bytes"], calibration_wall_s=cal["wall_s"],
                      shape_source=shape_source, shapes=shapes, series=series, round_step_times_s=step_times,
                      run_order=order, wall_s=time.perf_counter() - t_start)
        what = ("training steps near the memory limit, dynamic vs static batch shapes, with and without expandable "
                "segments; rounds of fresh subprocesses in ABCD order, ratios paired per round")
        if args.smoke:
            what = (f"SMOKE RUN on {args.device} ({model}, {len(shapes)} short shapes; not a measurement"
                    + ("; no allocator on a CPU: memory counters are 0, calibration peaks are batch bytes, no limit "
                       "set" if args.device == "cpu" else "") + f"): {what}")
        path = write_result(args.name, what=what, figures=figures, params=params, out_dir=args.out)
        return path, figures, params

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.shapes_file:
            loaded = json.loads(Path(args.shapes_file).read_text())
            shapes = [tuple(x) for x in loaded["shapes"]]
            shape_source = f"{loaded['source']} (from {Path(args.shapes_file).name}, written with --write-shapes)"
        else:
            shapes, shape_source = sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s,
                                                  num_buckets=args.buckets, seed=args.seed, work_dir=tmp / "corpus",
                                                  **(SMOKE_CORPUS if args.smoke else {}))
        shapes_path = tmp / "shapes.json"
        shapes_path.write_text(json.dumps(shapes))
        cal = run_worker("calibrate", False, tmp, shapes_path, args)
        shapes = largest_first(shapes, cal["peaks"])  # the warm-up pass starts with the largest peak
        shapes_path.write_text(json.dumps(shapes))
        print(f"[allocator] {len(shapes)} shapes ({shape_source}); largest {shapes[0]}", flush=True)
        limits = {label: cal["peak_allocated_bytes"] * (1 + h) for label, h in zip(labels, args.headroom)}
        fractions = {label: min(0.95, limit / cal["total_bytes"]) for label, limit in limits.items()}
        for label in labels:
            print(f"[allocator] headroom {label}: largest batch peaks at "
                  f"{cal['peak_allocated_bytes'] / 2**30:.2f} GiB; "
                  f"limit {limits[label] / 2**30:.2f} GiB (fraction {fractions[label]:.4f})", flush=True)
        round_walls = []
        for r in range(args.rounds):
            elapsed = time.perf_counter() - t_start
            if r and elapsed + max(round_walls) > args.budget_s:
                stopped = (f"stopped after {r} round(s): the next would end near {elapsed + max(round_walls):.0f} s, "
                           f"past --budget-s {args.budget_s:.0f}")
                print(f"[allocator] {stopped}", flush=True)
                break
            t_round = time.perf_counter()
            try:
                for label in labels:
                    run = lambda m, e: run_worker(m, e, tmp, shapes_path, args, fractions[label])  # noqa: E731
                    if args.smoke and args.device == "cpu":
                        # Nothing is measured on a CPU: two configurations at a time keep the smoke run short.
                        from concurrent.futures import ThreadPoolExecutor

                        with ThreadPoolExecutor(max_workers=2) as pool:
                            futures = {config_name(m, e): pool.submit(run, m, e) for m, e in CONFIGS}
                            done = {name: f.result() for name, f in futures.items()}
                    else:  # one at a time, in ABCD order: the configurations share the GPU
                        done = {config_name(m, e): run(m, e) for m, e in CONFIGS}
                    results[label].append(done)
                    order += [dict(round=r + 1, headroom=label, config=name, wall_s=res["wall_s"],
                                   startup_s=res.get("startup_s")) for name, res in done.items()]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                failures.append(f"round {r + 1}: {type(exc).__name__}: {str(exc)[-1500:]}")
                print(f"[allocator] round {r + 1} failed; keeping the complete rounds\n{exc}", flush=True)
                break
            round_walls.append(time.perf_counter() - t_round)
            write_record(complete=False)  # a run killed later keeps the rounds so far
    path, figures, params = write_record(complete=True)
    model, rounds_run, failures, warnings_ = (params['model'], figures['rounds_run'], figures['failures'],
                                              figures['warnings'])

    print(f"\nmodel: {model}; shapes: {len(shapes)} from {shape_source}; {rounds_run} round(s) x {args.passes} "
          f"measured pass(es); {params['wall_s']:.0f} s; wrote {path}")
    for label, block in figures["headrooms"].items():
        print(f"\nheadroom {label}: limit {limits[label] / 2**30:.2f} GiB")
        print(f"{'config':<20} {'median ms':>10} {'round range ms':>15} {'vs static':>10} {'allocs/step':>12} "
              f"{'frees/step':>11} {'retries':>8} {'OOMs':>5} {'peak res GiB':>13}")
        for name in (config_name(m, e) for m, e in CONFIGS):
            f = block[name]
            st = f["step_time_s"]
            print(f"{name:<20} {st['median'] * 1e3:>10.1f} {st['min'] * 1e3:>7.1f}-{st['max'] * 1e3:<7.1f} "
                  f"{block['time_ratio_vs_static_plain'][name]:>10.3f} {f['device_allocs_per_step']:>12.2f} "
                  f"{f['device_frees_per_step']:>11.2f} {f['alloc_retries']:>8d} {f['ooms']:>5d} "
                  f"{f['peak_reserved_bytes'] / 2**30:>13.2f}")
        for pair, ratio in block["paired_time_ratios"].items():
            print(f"  paired per round {pair:<38} median {ratio['median']:.3f} (range {ratio['min']:.3f}-"
                  f"{ratio['max']:.3f}; rounds {', '.join(f'{v:.3f}' for v in ratio['rounds'])})")
        for name in ("static_plain", "static_expandable"):
            ip = block[name]["in_process_first_vs_repeat"]
            print(f"  in-process {name}: first occurrence vs repeat of the same shape {ip['median']:.3f}x")
        print(f"  time target ({TARGET_PAIR} <= {TARGET_TIME_RATIO}): {block['time_target']['verdict']}"
              + ("" if block["time_target"]["conclusive"] else " (not conclusive)"))
    for w in warnings_:
        print(f"WARNING: {w}")
    return report_failures(failures, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
