"""The decoding bench's CLI: greedy RNN-T / TDT decoding speed, frame-looping vs label-looping with CUDA graphs
off / partial / full, against torchaudio's RNNTBeamSearch; with --nemo, against NeMo 3.0.0's own greedy
decoders in the same process, on NeMo's own prediction network and joint.

    python3 -m benchmarks.decoding --out DIR [--quick]          # GPU: decoding.json
    python3 -m benchmarks.decoding --nemo --out DIR [--quick]   # GPU, NeMo importable: decoding_nemo.json
    python3 -m benchmarks.decoding --smoke --out DIR            # CPU dry run of both, seconds
    ... --kernel-profile    # also one profiled decode per size of Grid.profile_batches (kernel_profile.py)

Decoding loop only (encoder outputs given; random weights; vocabulary 1024, predictor and joint 640, encoder
512): 12 s and 30 s at 80 ms frames, B in {1, 16, 64, 128}, fp32 and bf16 (--quick: B in {1, 16}, 12 s,
fp32). Each row's blank bias is bisected on its own input towards 1/3 labels per frame. Methods of one graph
mode (off, partial, full) are timed interleaved, call by call. Checks: label-looping off / partial / full
give identical tokens and timestamps; frame-looping, window 1 and NeMo match them in fp32; in bf16 the token
disagreement of frame-looping and window 1 is at most ``MAX_BF16_DISAGREEMENT`` (NeMo's is reported).
Every row is checked against the reference of its size: the method users get by default (``default_method``:
the fused full graph on CUDA) or the next of ``REFERENCE_ORDER``; a row that differs carries
``first_difference`` (the utterance, label and frame where it first departs, and our joint's top-2 margins
there). Targets (exit 1 when missed) judge our full graph with the default kernels (``target_method``):
>= ``MIN_SPEEDUP_OVER_FRAME_LOOPING`` x frame-looping off at B=16, 12 s, fp32; with --nemo, >=
``MIN_SPEEDUP_OVER_NEMO`` x NeMo's at every size (against its partial graphs where its full graph failed);
the torch stages' full graph is reported beside. --nemo runs in two passes: first, at every size, what the
targets need (``NEMO_TARGET_METHODS``), then, while the budget lasts, the rest (``NEMO_BREAKDOWN_METHODS``:
the torch stages' full graph everywhere, the eager modes and the torch stages' partial graphs at
``Grid.breakdown_batches``). NeMo's full graph runs only after every other row, the record written before
(an illegal memory access there, seen at B=128, poisons the CUDA context): at each size, timed interleaved with
our full-graph methods, whose rows from the pass then give way to these; sizes from
``NEMO_FULL_GRAPH_LAST_FROM_B`` come last. After a failure there, ours keep their rows from the pass and the
sizes not reached are listed as not run. --kernel-profile: after every timed row, one more
decode of the default kernels' partial graphs (``profiled_method``; on CPU their eager mode) at each fp32 size
of ``Grid.profile_batches`` x ``Grid.profile_frames`` runs under torch.profiler, and its row gets
``kernel_profile`` (kernels by device time, per outer iteration). The modules: ``methods.py`` (sizes, methods),
``grid.py`` (what runs where), ``passes.py`` (the two passes), ``rows.py`` (one size's rows), ``run_last.py``
(the rows run last), ``profiles.py`` (--kernel-profile), ``cases.py``, ``calibration.py``, ``checks.py``,
``iterations.py``, ``targets.py``, the peers (``nemo_peer.py``, ``torchaudio_peer.py``), ``empty_loop.py``,
``kernel_profile.py``; workbench/records/decoding.py reads the record. More in benchmarks/NOTES.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.decoding import nemo_peer
from benchmarks.decoding.cases import Outcome
from benchmarks.decoding.empty_loop import empty_while_iteration_seconds
from benchmarks.decoding.grid import Grid
from benchmarks.decoding.methods import (
    ENC,
    FRAME_S,
    JOINT,
    NEMO_BREAKDOWN_EVERYWHERE,
    NEMO_BREAKDOWN_METHODS,
    NEMO_TARGET_METHODS,
    PRED,
    TDT_DURATIONS,
    VOCAB,
    W,
    default_method,
    profiled_method,
)
from benchmarks.decoding.passes import measure_grid
from benchmarks.decoding.profiles import PROFILE_AFTER_BUDGET_S, add_kernel_profiles
from benchmarks.decoding.run_last import DEFERRED_AFTER_BUDGET_S, measure_deferred, note_timed_without_nemo
from benchmarks.decoding.targets import add_nemo_speedups, nemo_targets_of, targets_of
from benchmarks.decoding.torchaudio_peer import torchaudio_reference
from benchmarks.harness import Run, bench_device, bench_parser, start
from workbench.decoding import label_looping
from workbench.records import decoding as record


def record_what(*, smoke: bool, nemo: bool) -> str:
    """The record's one-line description."""
    return (("SMOKE RUN (off modes, tiny shapes; not a measurement): " if smoke else "")
            + ("greedy RNN-T/TDT decoding loop (encoder output given), ours against NeMo 3.0.0 in the same process "
               "on NeMo's modules: seconds per batch, speedups, hypotheses compared" if nemo else
               "greedy RNN-T/TDT decoding loop (encoder output given): seconds per batch, audio s/s, speedups"))


def record_params(grid: Grid, device: torch.device, *, quick: bool, smoke: bool, nemo: bool, kernel_profile: bool,
                  target_method: str) -> dict[str, Any]:
    """What the record measured: sizes, grid, dtypes, the default kernels, how rows are calibrated and timed."""
    params = {"vocab": VOCAB, "predictor": PRED, "joint": JOINT, "encoder_dim": ENC, "frame_s": FRAME_S,
              "tdt_durations": TDT_DURATIONS, "batches": grid.batches, "frames": grid.frame_counts,
              "dtypes": [str(d)[6:] for d in grid.dtypes], "max_symbols": 10, "quick": quick,
              "tf32": False, "smoke": smoke, "blank_window": W, "target_method": target_method,
              "default_kernels": label_looping.resolve_kernels("auto", device=device)[1],
              "weights": "NeMo's RNNTDecoder and RNNTJoint, random" if nemo else "workbench toy transducer, random",
              "calibration": "blank bias bisected per row (model, dtype, B, T) on that row's own input, "
                             "towards 1/3 labels per frame",
              "timing": "methods of one graph mode timed interleaved, call by call"}
    if nemo:
        params["breakdown_batches"] = grid.breakdown_batches
        params["passes"] = ("first at every size: " + ", ".join(m.label for m in NEMO_TARGET_METHODS)
                            + "; then " + ", ".join(m.label for m in NEMO_BREAKDOWN_EVERYWHERE)
                            + " at every size and " + ", ".join(m.label for m in NEMO_BREAKDOWN_METHODS)
                            + " at the breakdown batches; NeMo's full graph after every other row, at each size "
                            "interleaved with our full graph of the first pass (whose row it then replaces)")
    if kernel_profile:
        params["kernel_profile"] = {
            "method": profiled_method(device).label, "dtype": "float32", "frames": grid.profile_frames,
            "batches": [b for b in grid.profile_batches if b in grid.batches],
            "how": "one more decode after every timed row, under torch.profiler (CPU and CUDA activities)"}
    if not nemo:
        params["speedup_note"] = "TDT rows are compared with RNN-T frame-looping off of the same batch and length"
    return params


def save_record(run: Run, grid: Grid, device: torch.device, outcome: Outcome, empty: dict, *,
                pending: str | None = None) -> Path:
    """Write the record as it stands, with its targets; ``pending`` (rows still to run) is listed among the
    failures of this write only, as are the targets' failures then."""
    args = run.args
    kept = list(run.failures)
    if pending:
        run.failures.append(pending)
    target_method = default_method(device)
    if args.nemo:
        add_nemo_speedups(outcome.rows)
        targets = nemo_targets_of(outcome.rows, run.failures, smoke=args.smoke, target_method=target_method)
    else:
        targets = targets_of(outcome.rows, run.failures, target_method=target_method)
    run.figures = {"smoke": args.smoke, "rows": outcome.rows, "empty_while_iteration": empty,
                   "calibration": outcome.calibration, "targets": targets, "skipped_for_time": outcome.skipped,
                   "elapsed_s": run.seconds()}
    if args.nemo:
        run.figures["peer"] = nemo_peer.peer_description()
    run.params = record_params(grid, device, quick=args.quick, smoke=args.smoke, nemo=args.nemo,
                               kernel_profile=args.kernel_profile, target_method=target_method)
    path = run.save()
    if pending:
        run.failures[:] = kept
    return path


def drop_after_context_loss(outcome: Outcome) -> None:
    """Nothing more runs on a device whose CUDA context failed: the rows run last and the profiles are listed
    as not run."""
    for d in outcome.deferred:
        note_timed_without_nemo(outcome.rows, d.case, d, "not run (the CUDA context failed)")
    outcome.skipped += [f"{d.case.tag}: rows run last (the CUDA context failed)" for d in outcome.deferred]
    outcome.skipped += [f"{p.case.tag}: kernel profile (the CUDA context failed)" for p in outcome.to_profile]
    outcome.deferred, outcome.to_profile = [], []


def add_torchaudio_rows(run: Run, grid: Grid, outcome: Outcome, device: torch.device, budget_s: float) -> None:
    """torchaudio's RNNTBeamSearch rows (not with --nemo, not in a smoke run) when the run has taken less than
    ``budget_s`` seconds."""
    if run.args.nemo:
        outcome.skipped.append("torchaudio reference (not part of the NeMo comparison)")
    elif run.smoke:
        outcome.skipped.append("torchaudio reference (smoke)")
    elif outcome.context_lost:
        outcome.skipped.append("torchaudio reference (the CUDA context failed)")
    elif run.seconds() < budget_s:
        with run.part("torchaudio"):
            outcome.rows += torchaudio_reference(grid.frame_counts, device)
    else:
        outcome.skipped.append("torchaudio reference")


def measure_record(run: Run, device: torch.device) -> int:
    """One record (decoding.json, or decoding_nemo.json with --nemo): the grid, torchaudio, the rows run last,
    the kernel profiles; returns the exit code."""
    args = run.args
    run.name = ("decoding_nemo" if args.nemo else "decoding") + ("_quick" if args.quick else "")
    run.what = record_what(smoke=args.smoke, nemo=args.nemo)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    torch.backends.cudnn.allow_tf32 = False
    grid, outcome = Grid.of(args.quick, args.smoke), Outcome(failures=run.failures)
    budget_s = args.budget_s or math.inf  # seconds from the run's start
    if device.type == "cuda":
        empty = empty_while_iteration_seconds(iterations=2000, repeat=10)
    else:
        empty = {"seconds_per_iteration": float("nan"), "note": "not measured on CPU"}
    print(f"empty conditional-while iteration: {empty['seconds_per_iteration'] * 1e6:.2f} us")
    with run.part("grid"):
        measure_grid(grid, device, outcome, t_start=run.started, budget_s=budget_s, smoke=args.smoke,
                     nemo=args.nemo, kernel_profile=args.kernel_profile)
    add_torchaudio_rows(run, grid, outcome, device, budget_s)
    if outcome.context_lost:
        drop_after_context_loss(outcome)
    path = None
    if outcome.deferred:  # written first: if the process dies in the rows run last, the record says so
        pending = [d.case.tag for d in outcome.deferred]
        path = save_record(run, grid, device, outcome, empty,
                           pending=f"rows run last not finished (full-graph group): {pending}")
        print(f"wrote {path}; running last: {pending}", flush=True)
        outcome.rows += measure_deferred(outcome, deadline=run.started + budget_s + DEFERRED_AFTER_BUDGET_S)
    if outcome.context_lost:
        drop_after_context_loss(outcome)
    # after every timed row: the profiler changes no timing
    add_kernel_profiles(outcome, deadline=run.started + budget_s + PROFILE_AFTER_BUDGET_S)
    try:
        save_record(run, grid, device, outcome, empty)
    except Exception as e:  # noqa: BLE001 - e.g. a device query on a failed CUDA context
        if path is None:
            raise
        print(f"FAIL: could not rewrite {path} after the rows run last ({type(e).__name__}: {e}); it holds "
              f"every row before them. Failures: {run.failures}", flush=True)
        return 1
    print("\n".join(record.table_lines(run.figures) + record.kernel_profile_lines(run.figures)))
    if outcome.skipped:
        print(f"SKIPPED: {outcome.skipped}")
    return run.finish()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, budget_s=300.0, out_required=True)
    parser.add_argument("--quick", action="store_true", help="B in {1, 16}, 12 s, fp32 only")
    parser.add_argument("--nemo", action="store_true", help="ours against NeMo 3.0.0's greedy decoders, on NeMo's "
                        "modules (NeMo must be importable)")
    parser.add_argument("--kernel-profile", action="store_true", help="after the timed rows, one decode of the "
                        "default kernels' partial graphs (CPU: eager) per fp32 size of B in {1, 16, 128} (those in "
                        "the grid) x 150 frames (smoke: B in {1, 3} x 20), under torch.profiler: the row's "
                        "kernel_profile (kernels by device time, per outer iteration)")
    run = start(parser, argv, name="decoding", what="greedy RNN-T/TDT decoding loop")
    args = run.args
    unavailable = nemo_peer.nemo_unavailable_reason() if (args.nemo or args.smoke) else None
    if args.nemo and unavailable:
        print(f"FAIL: --nemo: {unavailable}; ../shared/tools/fetch_nemo_wheels.sh says how to install it",
              file=sys.stderr)
        return 2
    run.started = time.perf_counter()  # the budget counts from after NeMo's import (the stage's margin covers it)
    rc = measure_record(run, bench_device())
    if args.smoke and not args.nemo:  # the smoke run dry-runs the NeMo comparison too, where NeMo imports
        if unavailable:
            print(f"NeMo comparison of the smoke run skipped: {unavailable}")
        else:
            peer = Run(name="decoding_nemo", what="", args=argparse.Namespace(**{**vars(args), "nemo": True}))
            rc = max(rc, measure_record(peer, bench_device()))
    return rc
