"""The allocator bench's figures: per configuration and headroom over the rounds, paired time ratios, the
targets' checks, and the record (its fields: ``workbench/records/allocator.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.allocator.rounds import Rounds
from benchmarks.harness import Run, write_result
from workbench.memory.telemetry import summarize_steps
from workbench.records import allocator as record
from workbench.timing import summarize

TARGET_TIME_RATIO = record.TARGET_TIME_RATIO
PAIRS = {  # figure name -> (numerator, denominator), ratios of per-round total time of the same steps
    "dynamic_expandable/static_plain": ("dynamic_expandable", "static_plain"),  # the target
    "dynamic_expandable/static_expandable": ("dynamic_expandable", "static_expandable"),  # the fallback target
    "dynamic_plain/static_plain": ("dynamic_plain", "static_plain"),
    "static_expandable/static_plain": ("static_expandable", "static_plain"),  # expandable segments' own cost
}
TARGET_PAIRS = ("dynamic_expandable/static_plain", "dynamic_expandable/static_expandable")  # in order of preference
MAX_EVENTS = 40  # allocation events kept per configuration and headroom


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




def build_figures(rounds: Rounds, args, errors: list[str], complete: bool) -> tuple[dict, dict, dict]:
    """(figures, series, step times) of the rounds so far, with every headroom's checks; ``errors``: the
    run's failed parts so far."""
    rounds_run = rounds.rounds_run
    failures, warnings_ = list(errors), []
    blocks_per_allocator = len(args.blocks) // 2
    warmup = len(rounds.shapes) * blocks_per_allocator  # each configuration's warm-up passes come first
    figures, series, step_times = {"headrooms": {}}, {}, {}
    for label in rounds.labels if rounds_run else ():
        # a headroom's extra round from a round cut short has no partner: dropped
        block, series[label], step_times[label] = headroom_figures(rounds.results[label][:rounds_run], warmup,
                                                                   args.passes * blocks_per_allocator)
        block.update(headroom=float(label), memory_limit_bytes=int(rounds.limits[label]),
                     memory_fraction=rounds.fractions[label])
        block_failures, block_warnings = check_headroom(label, block, rounds_run)
        failures += block_failures + [f"[headroom {label}] round {r + 1}: {f}"
                                      for r, rnd in enumerate(rounds.switches[label]) for f in rnd]
        warnings_ += block_warnings
        figures["headrooms"][label] = block
    if not rounds_run:
        failures.append("no complete round: nothing measured")
    if rounds.stopped:
        warnings_.append(rounds.stopped)
    if not complete:
        failures.append(f"incomplete: written after round {rounds_run} of up to {args.rounds}")
    figures.update(smoke=bool(args.smoke), complete=complete, rounds_run=rounds_run,
                   rounds_planned=args.rounds, passes=args.passes, targets_met=not failures,
                   targets_enforced=not args.smoke, failures=failures, warnings=warnings_)
    return figures, series, step_times


def write_record(run: Run, rounds: Rounds, complete: bool) -> tuple[Path, dict, dict]:
    """Write ``<out>/<name>.json`` with the rounds so far and ``run``'s failed parts; returns (path, figures,
    params)."""
    args, cal = run.args, rounds.calibration
    figures, series, step_times = build_figures(rounds, args, run.failures, complete)
    params = dict(model=cal["model"], dtype=args.dtype, device=args.device, smoke=bool(args.smoke),
                  steps=len(rounds.shapes), warmup_steps=len(rounds.shapes), passes=args.passes, rounds=args.rounds,
                  budget_s=args.budget_s, blocks=args.blocks, block_settings=rounds.block_settings,
                  batch_audio_s=args.batch_audio_s, buckets=args.buckets, headrooms=[float(h) for h in args.headroom],
                  memory_limit_bytes={k: int(v) for k, v in rounds.limits.items()}, memory_fractions=rounds.fractions,
                  largest_peak_allocated_bytes=cal["peak_allocated_bytes"], calibration_wall_s=cal["wall_s"],
                  shape_source=rounds.shape_source, shapes=rounds.shapes, series=series,
                  round_step_times_s=step_times, run_order=rounds.order, wall_s=run.seconds())
    return write_result(args.name, what=record_what(args, cal, len(rounds.shapes)), figures=figures,
                        params=params, out_dir=args.out), figures, params


def record_what(args, calibration: dict, num_shapes: int) -> str:
    """The record's ``what``; a smoke run says first what it stood in for."""
    what = ("training steps near the memory limit, dynamic vs static batch shapes, with and without expandable "
            f"segments; rounds of one fresh subprocess each, allocator switched per block ({args.blocks}), "
            "ratios paired per round")
    if not args.smoke:
        return what
    cpu = ("; no allocator on a CPU: memory counters are 0, calibration peaks are batch bytes"
           if args.device == "cpu" else "")
    return (f"SMOKE RUN on {args.device} ({calibration['model']}, {num_shapes} short shapes, no memory limit; "
            f"not a measurement{cpu}): {what}")
