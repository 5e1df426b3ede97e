"""The allocator bench's parent side: worker subprocesses for the calibration and the rounds, and what they
return, split into the four configurations {dynamic, static} x {plain, expandable}."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from benchmarks.allocator import shapes as shape_source
from benchmarks.harness import bench_env
from workbench.memory.telemetry import device_alloc_events
from workbench.records import allocator as record
from workbench.units import GiB, MiB

CONFIG_NAMES = record.CONFIG_NAMES
SHAPE_COLUMNS = ("batch_size", "duration_s", "num_tokens")  # the worker's tags that make a step's shape
SWITCH_TOLERANCE_BYTES = 64 << 20  # segments of the other kind a block may add before its switch counts as failed


@dataclass
class Rounds:
    """The calibrated shapes and limits of a run, and its rounds so far."""
    shapes: list[tuple[int, float, int]]  # (batch size, padded duration s, padded tokens), largest peak first
    shape_source: str
    calibration: dict  # the calibrate worker's JSON: peak_allocated_bytes, peaks, total_bytes, model, wall_s
    limits: dict[str, float]  # headroom label -> memory limit, bytes
    fractions: dict[str, float]  # headroom label -> per-process memory fraction (0: no limit)
    results: dict[str, list] = field(default_factory=dict)  # headroom -> rounds, each {config: split_round()}
    switches: dict[str, list] = field(default_factory=dict)  # headroom -> per round: failed allocator switches
    block_settings: dict[str, list] = field(default_factory=dict)  # headroom -> per round: each block's settings
    order: list[dict] = field(default_factory=list)  # one entry per worker call, in run order
    round_walls: list[float] = field(default_factory=list)  # wall seconds of each complete round
    stopped: str | None = None  # why rounds stopped before --rounds

    @property
    def labels(self) -> list[str]:
        return list(self.limits)

    @property
    def rounds_run(self) -> int:
        return min(len(v) for v in self.results.values())


def headroom_label(headroom: float) -> str:
    return f"{headroom:g}"


def run_worker(mode: str, tmp: Path, shapes_path: Path, args, fraction: float = 0.0) -> dict:
    """One worker subprocess (``worker.py``): ``mode`` "calibrate" or "interleaved" (the blocks of
    ``args.blocks``) under the memory ``fraction`` of the device (0: no limit). Returns its JSON; a worker
    that fails prints its output's tail to stderr and raises RuntimeError."""
    out = tmp / f"{mode}_{time.monotonic_ns()}.json"
    env = {k: v for k, v in bench_env().items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    cmd = [sys.executable, "-m", "benchmarks.allocator.worker", "--mode", mode, "--shapes", str(shapes_path),
           "--rows", str(out), "--model", args.model, "--dtype", args.dtype, "--fraction", str(fraction),
           "--device", args.device, "--passes", str(args.passes), "--blocks", args.blocks]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=args.worker_timeout_s)
    if proc.returncode != 0:
        print(f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}", file=sys.stderr, flush=True)
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"worker {mode} failed with exit code {proc.returncode}: {last}")
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    print(f"[allocator] {mode} done in {result['wall_s']:.1f} s", flush=True)
    return result


def calibrate(args, tmp: Path, shapes_path: Path) -> Rounds:
    """Measure each shape's peak in a worker, put the largest first and set each headroom's memory limit."""
    shapes, source = shape_source.load_shapes(args, tmp)
    shapes_path.write_text(json.dumps(shapes))
    cal = run_worker("calibrate", tmp, shapes_path, args)
    shapes = shape_source.largest_first(shapes, cal["peaks"])  # the warm-up pass starts with the largest peak
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
    return Rounds(shapes=shapes, shape_source=source, calibration=cal, limits=limits, fractions=fractions,
                  results={label: [] for label in labels}, switches={label: [] for label in labels})


def next_round_fits(rounds: Rounds, elapsed_s: float, budget_s: float) -> bool:
    """True when another round, as long as the longest so far, ends within ``budget_s`` (0: no limit);
    otherwise ``rounds.stopped`` says why."""
    if not budget_s or not rounds.round_walls or elapsed_s + max(rounds.round_walls) <= budget_s:
        return True
    done = len(rounds.round_walls)
    rounds.stopped = (f"stopped after {done} round(s): the next would end near "
                      f"{elapsed_s + max(rounds.round_walls):.0f} s, past --budget-s {budget_s:.0f}")
    print(f"[allocator] {rounds.stopped}", flush=True)
    return False


def run_round(rounds: Rounds, r: int, tmp: Path, shapes_path: Path, args) -> None:
    """Round ``r`` (0-based): one worker subprocess per headroom; its rows join ``rounds``."""
    t_round = time.perf_counter()
    for label in rounds.labels:
        result = run_worker("interleaved", tmp, shapes_path, args, rounds.fractions[label])
        rounds.results[label].append(split_round(result, len(rounds.shapes)))
        rounds.switches[label].append(switch_failures(result))
        rounds.block_settings.setdefault(label, []).append(result["blocks"])
        rounds.order.append(dict(round=r + 1, headroom=label, blocks=args.blocks, wall_s=result["wall_s"],
                                 startup_s=result.get("startup_s"), steps_s=result.get("steps_s")))
    rounds.round_walls.append(time.perf_counter() - t_round)


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
