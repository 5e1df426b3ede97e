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
``kernel_profile`` (kernels by device time, per outer iteration). The parts: ``methods.py`` (sizes, methods,
names), ``grid.py`` (what runs where), ``cases.py``, ``calibration.py``, ``checks.py``, ``iterations.py``,
``targets.py``, the peers (``nemo_peer.py``, ``torchaudio_peer.py``), ``empty_loop.py``, ``kernel_profile.py``,
``live.py`` (the notebook's table); ``record.py`` owns the record's fields. More in benchmarks/NOTES.md.
"""


from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.decoding import kernel_profile, nemo_peer
from workbench.records import decoding as record
from benchmarks.decoding.calibration import calibrate_blank_bias
from benchmarks.decoding.cases import Case, Deferred, Outcome, ToProfile
from benchmarks.decoding.checks import SAME_MATH, check_row
from benchmarks.decoding.empty_loop import empty_while_iteration_seconds
from benchmarks.decoding.grid import NEMO_FULL_GRAPH_LAST_FROM_B, Grid, deferred_methods, methods_for, plan_methods
from benchmarks.decoding.iterations import add_iteration_counts
from benchmarks.decoding.methods import (
    BLANK,
    ENC,
    FRAME_S,
    FUSED,
    FUSED_LSTM,
    JOINT,
    NEMO_BREAKDOWN_EVERYWHERE,
    NEMO_BREAKDOWN_METHODS,
    NEMO_TARGET_METHODS,
    PRED,
    REFERENCE_ORDER,
    TDT_DURATIONS,
    VOCAB,
    W,
    default_method,
    method_name,
    own_window,
    profiled_method,
    window_runs_here,
)
from benchmarks.decoding.targets import add_nemo_speedups, add_speedups, nemo_targets_of, targets_of
from benchmarks.decoding.torchaudio_peer import torchaudio_reference
from benchmarks.profiling import profile_call
from benchmarks.harness import bench_device, check_smoke_out, cuda_missing, report_failures, write_result
from workbench.timing import summarize, timer_for
from workbench.decoding import GreedyTransducerDecoder, label_looping, make_toy_transducer
from workbench.decoding.toy_models import set_blank_bias


def timed(fn, repeat: int, warmup: int, device: torch.device) -> dict[str, float]:
    return timer_for(device)(fn, repeat=repeat, warmup=warmup)


def build_models(device: torch.device, nemo: bool = False) -> dict[str, tuple]:
    """model name -> (predictor, joint, durations) in fp32, seeded: ours, or NeMo's modules adapted (``nemo``)."""
    models = {}
    for name, durations in (("rnnt", None), ("tdt", TDT_DURATIONS)):
        make = nemo_peer.make_nemo_transducer if nemo else make_toy_transducer
        predictor, joint = make(vocab_size=VOCAB, enc_dim=ENC, pred_dim=PRED, joint_dim=JOINT,
                                durations=durations, seed=0, device=device)
        models[name] = (predictor, joint, durations)
    return models


def in_dtype(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    return module if dtype == torch.float32 else copy.deepcopy(module).to(dtype)


def flatten_lstm_weights(module: torch.nn.Module) -> None:
    """One weight buffer for cuDNN in every LSTM of ``module`` (else it compacts them on every call)."""
    for m in module.modules():
        if isinstance(m, torch.nn.LSTM):
            m.flatten_parameters()


@dataclass
class Prepared:
    """A method ready to time: its first call (warm-up and graph capture) has given its hypotheses."""
    algorithm: str
    mode: str
    window: int
    call: Any
    key: tuple  # (tokens per utterance, frames per utterance)
    stats: dict
    mode_used: str
    graph_nodes: dict | None = None  # our graph modes: nodes and kernels of each captured stage graph
    window_used: int | None = None  # our decoders: the blank window they took

    @property
    def name(self) -> str:
        return method_name(self.algorithm, self.mode, self.window)


def prepare_method(case: Case, algorithm: str, mode: str, window: int, outcome: Outcome) -> Prepared | None:
    """Build the method's decoder and run it once (None, with a failure listed, when that raises)."""
    try:
        if algorithm == "nemo":
            nemo = nemo_peer.NemoGreedy(case.predictor, case.joint, case.durations, mode)
            key = nemo(case.enc, case.lengths)
            if case.device.type == "cuda":
                torch.cuda.synchronize(case.device)  # an asynchronous failure shows here, on its own row
            return Prepared(algorithm, mode, window, lambda: nemo(case.enc, case.lengths), key, {},
                            nemo_peer.NEMO_MODES[mode] or "off")
        if algorithm in (FUSED, FUSED_LSTM):
            dec = case.decoder(algorithm="label_looping", cuda_graphs=mode, blank_window=window,
                               kernels="triton" if algorithm == FUSED_LSTM else "triton_cudnn")
        else:
            dec = case.decoder(algorithm=algorithm, cuda_graphs=mode, blank_window=window, kernels="torch")
        hyps = dec(case.enc, case.lengths)  # also the warm-up (and the graph capture)
    except Exception as e:  # noqa: BLE001 - keep measuring the rest; the failure is reported
        outcome.failures.append(f"{case.tag}: {method_name(algorithm, mode, window)} raised {type(e).__name__}: {e}")
        print(f"FAIL: {outcome.failures[-1]}", flush=True)
        return None
    stats = dict(dec.last_stats)
    if window != W and algorithm != "frame_looping":  # an explicit window's own iteration counts, from an eager run
        probe = case.decoder(cuda_graphs="off", blank_window=window, kernels="torch")
        probe(case.enc, case.lengths)
        stats = dict(probe.last_stats)
    key = ([h.tokens for h in hyps], [h.timestamps for h in hyps])
    if (case.profile_kernels and (algorithm, mode, window) == profiled_method(case.device)
            and not any(item.case is case for item in outcome.to_profile)):
        outcome.to_profile.append(ToProfile(case, method_name(algorithm, mode, window), dec))
    nodes = None
    if dec.mode_used in ("full", "partial"):
        try:
            nodes = dec.stage_graph_nodes()
        except Exception as e:  # noqa: BLE001 - a count we cannot make is said, not fatal
            nodes = {"unavailable": f"{type(e).__name__}: {e}"}
    return Prepared(algorithm, mode, window, lambda: dec(case.enc, case.lengths), key, stats, dec.mode_used, nodes,
                    dec.window_used)


def time_interleaved(case: Case, prepared: list[Prepared], outcome: Outcome) -> list[dict]:
    """Time the prepared methods call by call in turn (so a drift of the machine hits them alike); one row
    each (a method that raises while timed is dropped, with a failure listed)."""
    repeat = 5 if all(p.mode == "full" for p in prepared) else 3
    samples: dict[str, list[float]] = {p.name: [] for p in prepared}
    alive = list(prepared)
    for _ in range(repeat):
        for p in list(alive):
            try:
                samples[p.name].append(timed(p.call, device=case.device, repeat=1, warmup=0)["median"])
            except Exception as e:  # noqa: BLE001
                outcome.failures.append(f"{case.tag}: {p.name} raised {type(e).__name__} while timed: {e}")
                print(f"FAIL: {outcome.failures[-1]}", flush=True)
                alive.remove(p)
    rows = []
    b, t = case.batch, case.frames
    for p in alive:
        timing = summarize(samples[p.name])
        rows.append({"model": case.model, "dtype": str(case.dtype)[6:], "batch": b, "frames": t,
                     "audio_seconds": t * FRAME_S, "method": p.name, "time_s": timing,
                     "audio_s_per_s": b * t * FRAME_S / timing["median"],
                     "labels_per_frame": sum(len(k) for k in p.key[0]) / (b * t), "mode_used": p.mode_used,
                     "_key": p.key, "_stats": p.stats})
        if p.graph_nodes is not None:
            rows[-1]["graph_nodes"] = p.graph_nodes
        if p.window_used is not None and p.algorithm != "frame_looping":
            rows[-1]["blank_window"] = p.window_used
    return rows


def measure_methods(case: Case, methods: list[tuple[str, str, int | str]], outcome: Outcome) -> list[dict]:
    """Prepare every method, then time those of one graph mode interleaved; rows with ``_key`` and ``_stats``."""
    prepared = [p for method in methods if (p := prepare_method(case, *method, outcome)) is not None]
    rows = []
    for mode in dict.fromkeys(p.mode for p in prepared):
        rows += time_interleaved(case, [p for p in prepared if p.mode == mode], outcome)
    order = [method_name(*m) for m in methods]
    return sorted(rows, key=lambda r: order.index(r["method"]))


def finish_rows(case: Case, rows: list[dict], outcome: Outcome) -> None:
    """Take the case's reference and loop counts from these rows where it has none yet, then check every row
    and add its iteration counts (a window given explicitly: its own)."""
    if case.reference is None:
        names = [method_name(*m) for m in REFERENCE_ORDER]
        default = default_method(case.device, "full" if case.device.type == "cuda" else "off")
        by_name = {r["method"]: r for r in rows}
        chosen = next((by_name[n] for n in [default, *names] if n in by_name), None)
        if chosen is not None:
            case.reference, case.reference_method = chosen["_key"], chosen["method"]
    if case.loop_stats is None:
        case.loop_stats = next((r["_stats"] for r in rows if r["method"] in SAME_MATH
                                and "outer_iterations" in r["_stats"]), None)
    for row in rows:
        stats = row.pop("_stats")
        check_row(case, row, outcome)
        row["blank_bias"] = case.blank_bias
        add_iteration_counts(row, stats if own_window(row["method"]) else case.loop_stats)


def measure_case(case: Case, calibrator: GreedyTransducerDecoder | None, outcome: Outcome, smoke: bool,
                 methods: list[tuple[str, str, int | str]] | None = None) -> list[dict]:
    """Calibrate the blank bias on the case's input (the first time; later calls set it again on the shared
    joint), then time and check ``methods`` (default: the case's) on it; those of ``deferred_methods`` are
    queued in ``outcome.deferred``."""
    if case.blank_bias is None:
        with torch.inference_mode():
            bias, rate = calibrate_blank_bias(calibrator, case.enc, case.lengths, steps=11 if not smoke else 8)
        case.blank_bias = bias
        outcome.calibration[case.tag] = {"blank_bias": bias, "labels_per_frame": rate}
        if abs(rate - 1 / 3) > 0.1 and not smoke:
            outcome.failures.append(f"{case.tag}: blank-bias calibration reached {rate:.3f} labels per frame, not "
                                    "about 1/3")
    else:
        set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
    wanted = case.methods if methods is None else methods
    methods = [m for m in methods_for(case) if m in wanted]
    later = deferred_methods(case, methods)
    case.measured = [m for m in methods if m not in later or m[0] != "nemo"]
    group = measure_methods(case, case.measured, outcome)
    finish_rows(case, group, outcome)
    if later:
        outcome.deferred.append(Deferred(case, later))
    return group


def cuda_context_error(device: torch.device) -> str | None:
    """None while the device still runs work; else the error (an illegal memory access poisons the context)."""
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def measure_deferred(outcome: Outcome, deadline: float = float("inf")) -> list[dict]:
    """The deferred groups (NeMo's full graph with our full-graph methods of that size), those below
    ``NEMO_FULL_GRAPH_LAST_FROM_B`` first, fp32 first, each timed interleaved. When NeMo's ran, these rows of
    ours take the place of the ones from the pass in ``outcome.rows`` and NeMo's is returned; when it failed,
    ours keep theirs (marked ``nemo_full_graph: "failed"``). After a failure that leaves the CUDA context
    unusable, or past ``deadline``, the rest are listed as not run (and their rows marked so)."""
    rows, lost = [], None
    order = sorted(outcome.deferred, key=lambda d: (d.case.batch >= NEMO_FULL_GRAPH_LAST_FROM_B,
                                                    d.case.dtype != torch.float32, d.case.model, d.case.frames,
                                                    d.case.batch))
    for item in order:
        case = item.case
        names = ", ".join(method_name(*m) for m in item.methods)
        if lost or time.perf_counter() > deadline:
            why = f"the CUDA context failed earlier: {lost}" if lost else "past the time for the rows run last"
            outcome.skipped.append(f"{case.tag}: {names} not run ({why})")
            _note_timed_without_nemo(outcome.rows, case, item, f"not run ({why})")
            continue
        set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
        interleaved = measure_methods(case, item.methods, outcome)
        lost = cuda_context_error(case.device) if case.device.type == "cuda" else None
        if lost:
            outcome.context_lost = lost
            outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                                    f"{', '.join(method_name(*m) for m in item.methods if m[0] == 'nemo')}: {lost}")
        if lost or method_name("nemo", "full") not in {r["method"] for r in interleaved}:
            _note_timed_without_nemo(outcome.rows, case, item, "failed")  # ours keep their rows from the pass
            continue
        finish_rows(case, interleaved, outcome)
        by_method = {r["method"]: r for r in interleaved}
        for index, row in enumerate(outcome.rows):  # ours in their places, NeMo's returned
            if _same_size(row, case) and row["method"] in by_method:
                outcome.rows[index] = by_method.pop(row["method"])
        _print_group(f"{case.tag} (run last)", interleaved)
        rows += list(by_method.values())
    outcome.deferred.clear()
    return rows


def _same_size(row: dict, case: Case) -> bool:
    """Whether ``row`` is of the case's model, dtype, B and T."""
    return (row.get("model"), row.get("dtype"), row.get("batch"), row.get("frames")) == (
        case.model, str(case.dtype)[6:], case.batch, case.frames)


def _note_timed_without_nemo(rows: list[dict], case: Case, item: Deferred, why: str) -> None:
    """Mark our rows of the deferred group's methods at the case's size: NeMo's full graph did not run beside
    them; ``nemo_full_graph`` says why ("failed", or "not run (...)")."""
    names = {method_name(*m) for m in item.methods if m[0] != "nemo"}
    for row in rows:
        if _same_size(row, case) and row["method"] in names:
            row["timing_note"] = "timed in the pass without NeMo's full graph beside it"
            row["nemo_full_graph"] = why


def profile_case(case: Case, decoder: GreedyTransducerDecoder, method: str) -> dict[str, Any]:
    """One more decode of the case by its warm ``decoder`` under torch.profiler: ``kernel_profile.kernel_breakdown``
    per outer iteration of that decode (from ``decoder.last_stats``), with the method, the graph mode it ran in,
    the seconds the profiling took and whether its hypotheses equal the case's reference. A profiler that
    raises gives {"method", "unavailable"}."""
    set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
    try:
        hyps, events, wall = profile_call(lambda: decoder(case.enc, case.lengths), case.device)
    except Exception as e:  # noqa: BLE001 - a profile we cannot make is said, not fatal
        return {"method": method, "unavailable": f"{type(e).__name__}: {e}"}
    profile = kernel_profile.kernel_breakdown(events, case.device.type, decoder.last_stats.get("outer_iterations"))
    key = ([h.tokens for h in hyps], [h.timestamps for h in hyps])
    equal = None if case.reference is None else list(zip(*key)) == list(zip(*case.reference))
    return {"method": method, "mode_used": decoder.mode_used, "profiling_wall_s": wall,
            "equal_to_reference": equal, **profile}


DEFERRED_AFTER_BUDGET_S = 70.0  # no group run last starts later than this after the budget
PROFILE_AFTER_BUDGET_S = 90.0   # --kernel-profile: no profile starts later than this after the budget


def add_kernel_profiles(outcome: Outcome, deadline: float = float("inf")) -> None:
    """Profile every decoder kept in ``outcome.to_profile`` (``profile_case``) and put it in its row as
    ``kernel_profile``, with ``timed_seconds_per_outer_iteration`` of that row and of the default method's
    full graph at the same size (where they have one); run after every timed row, so the profiler changes no
    timing. After a CUDA context failure, or from ``deadline`` (a ``time.perf_counter()`` value) on, the rest are
    listed as not run."""
    def row_of(case: Case, method: str) -> dict | None:
        return next((r for r in outcome.rows if _same_size(r, case) and r.get("method") == method), None)

    for item in outcome.to_profile:
        case = item.case
        row = row_of(case, item.method)
        lost = cuda_context_error(case.device) if case.device.type == "cuda" else None
        late = time.perf_counter() > deadline
        if row is None or lost or late:
            why = (f"the CUDA context failed: {lost}" if lost else "no timed row" if row is None
                   else "past the time budget")
            outcome.skipped.append(f"kernel profile {case.tag} {item.method}: not run ({why})")
            continue
        row["kernel_profile"] = profile_case(case, item.decoder, item.method)
        timed = {r["method"]: r["seconds_per_outer_iteration"]
                 for r in (row, row_of(case, default_method(case.device, "full")))
                 if r is not None and r.get("seconds_per_outer_iteration")}
        row["kernel_profile"]["timed_seconds_per_outer_iteration"] = timed
        print(f"kernel profile {case.tag} {item.method}: {row['kernel_profile'].get('profiling_wall_s', 0):.1f} s",
              flush=True)
    outcome.to_profile.clear()


def measure_grid(grid: Grid, device: torch.device, outcome: Outcome, *, t_start: float, budget_s: float,
                 smoke: bool, nemo: bool = False, kernel_profile: bool = False) -> None:
    """Every (dtype, model, T, B) of the grid while the budget lasts, in two passes (``plan_methods``); what the
    budget leaves out is listed as skipped. ``kernel_profile``: the cases of ``grid.profiled`` keep their
    ``profiled_method`` decoder in ``outcome.to_profile``."""
    models = build_models(device, nemo=nemo)
    parts: dict[tuple, tuple] = {}  # (dtype, model) -> predictor, joint, durations, calibrator
    base_by_dtype: dict[torch.dtype, dict] = {}
    second: list[tuple[Case, list]] = []
    for dtype, model_name, frames, batch in grid.cells():
        if outcome.context_lost:
            outcome.skipped.append(f"{model_name} {str(dtype)[6:]} B={batch} T={frames}: not run (the CUDA context "
                                   "failed)")
            continue
        if (dtype, model_name) not in parts:
            predictor32, joint32, durations = models[model_name]
            predictor, joint = in_dtype(predictor32, dtype), in_dtype(joint32, dtype)
            flatten_lstm_weights(predictor)
            # One decoder calibrates every row of this model and dtype (graphs captured once, reused).
            calibrator = GreedyTransducerDecoder(predictor, joint, blank_id=BLANK, durations=durations)
            parts[(dtype, model_name)] = (predictor, joint, durations, calibrator)
        predictor, joint, durations, calibrator = parts[(dtype, model_name)]
        first, later = plan_methods(nemo, batch, grid)
        later = [m for m in later if window_runs_here(m[2], batch, durations is not None, dtype)]
        gen = torch.Generator(device=device).manual_seed(batch * 1000 + frames)
        case = Case(model_name, dtype, predictor, joint, durations,
                    torch.randn(batch, frames, ENC, device=device, generator=gen),
                    torch.full((batch,), frames, device=device), device, methods=first + later,
                    profile_kernels=kernel_profile and grid.profiled(dtype, frames, batch))
        if time.perf_counter() - t_start > budget_s:
            outcome.skipped.append(case.tag)
            continue
        group = measure_case(case, calibrator, outcome, smoke, methods=first)
        add_speedups(group, base_by_dtype.setdefault(dtype, {}))
        outcome.rows += group
        _print_group(case.tag, group)
        if lost_context(case, outcome):
            continue
        if later:
            second.append((case, later))
    for case, later in second:
        if outcome.context_lost:
            outcome.skipped.append(f"{case.tag}: {', '.join(method_name(*m) for m in later)} (second pass; the CUDA "
                                   "context failed)")
            continue
        if time.perf_counter() - t_start > budget_s:
            outcome.skipped.append(f"{case.tag}: {', '.join(method_name(*m) for m in later)} (second pass)")
            continue
        group = measure_case(case, None, outcome, smoke, methods=later)
        for row in group:
            row["timing_note"] = "second pass: timed after every size's first pass, not interleaved with its rows"
        outcome.rows += group
        _print_group(f"{case.tag} (second pass)", group)
        lost_context(case, outcome)


def lost_context(case: Case, outcome: Outcome) -> bool:
    """After a pass over a case on CUDA: whether the methods it ran (``case.measured``) left the CUDA context
    unusable (an illegal memory access is sticky). If so the failure names the case and those methods (the
    first failure listed before it is the one that faulted), every later case is listed as not run, and
    ``outcome.context_lost`` is set."""
    if case.device.type != "cuda" or not (lost := cuda_context_error(case.device)):
        return False
    outcome.context_lost = lost
    outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                            f"{', '.join(method_name(*m) for m in case.measured)} ({lost}); the rest did not run")
    print(f"FAIL: {outcome.failures[-1]}", flush=True)
    return True


def _print_group(tag: str, group: list[dict]) -> None:
    if group:
        print(f"{tag}: " + ", ".join(f"{r['method']} {r['time_s']['median'] * 1e3:.2f} ms" for r in group), flush=True)


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
        params["passes"] = ("first at every size: " + ", ".join(method_name(*m) for m in NEMO_TARGET_METHODS)
                            + "; then " + ", ".join(method_name(*m) for m in NEMO_BREAKDOWN_EVERYWHERE)
                            + " at every size and " + ", ".join(method_name(*m) for m in NEMO_BREAKDOWN_METHODS)
                            + " at the breakdown batches; NeMo's full graph after every other row, at each size "
                            "interleaved with our full graph of the first pass (whose row it then replaces)")
    if kernel_profile:
        params["kernel_profile"] = {
            "method": method_name(*profiled_method(device)), "dtype": "float32", "frames": grid.profile_frames,
            "batches": [b for b in grid.profile_batches if b in grid.batches],
            "how": "one more decode after every timed row, under torch.profiler (CPU and CUDA activities)"}
    if not nemo:
        params["speedup_note"] = "TDT rows are compared with RNN-T frame-looping off of the same batch and length"
    return params


def run(out_dir: str, quick: bool, budget_s: float, device: torch.device, smoke: bool = False,
        nemo: bool = False, kernel_profile: bool = False) -> int:
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    torch.backends.cudnn.allow_tf32 = False
    grid, outcome = Grid.of(quick, smoke), Outcome()
    if device.type == "cuda":
        empty = empty_while_iteration_seconds(iterations=2000, repeat=10)
    else:
        empty = {"seconds_per_iteration": float("nan"), "note": "not measured on CPU"}
    print(f"empty conditional-while iteration: {empty['seconds_per_iteration'] * 1e6:.2f} us")
    measure_grid(grid, device, outcome, t_start=t_start, budget_s=budget_s, smoke=smoke, nemo=nemo,
                 kernel_profile=kernel_profile)
    if nemo:
        outcome.skipped.append("torchaudio reference (not part of the NeMo comparison)")
    elif smoke:
        outcome.skipped.append("torchaudio reference (smoke)")
    elif outcome.context_lost:
        outcome.skipped.append("torchaudio reference (the CUDA context failed)")
    elif time.perf_counter() - t_start < budget_s:
        outcome.rows += torchaudio_reference(grid.frame_counts, device)
    else:
        outcome.skipped.append("torchaudio reference")
    name = ("decoding_nemo" if nemo else "decoding") + ("_quick" if quick else "")
    target_method = default_method(device)

    def write(figures_failures: list[str]) -> tuple[Any, dict[str, Any]]:
        if nemo:
            add_nemo_speedups(outcome.rows)
            targets = nemo_targets_of(outcome.rows, figures_failures, smoke=smoke, target_method=target_method)
        else:
            targets = targets_of(outcome.rows, figures_failures, target_method=target_method)
        figures = {"smoke": smoke, "rows": outcome.rows, "empty_while_iteration": empty,
                   "calibration": outcome.calibration, "targets": targets, "failures": figures_failures,
                   "skipped_for_time": outcome.skipped, "elapsed_s": time.perf_counter() - t_start}
        if nemo:
            figures["peer"] = nemo_peer.peer_description()
        params = record_params(grid, device, quick=quick, smoke=smoke, nemo=nemo, kernel_profile=kernel_profile,
                               target_method=target_method)
        path = write_result(
            name, out_dir=out_dir,
            what=record_what(smoke=smoke, nemo=nemo), params=params, figures=figures)
        return path, figures

    path = None
    if outcome.context_lost:  # nothing more can run on this device: the record keeps what did
        for d in outcome.deferred:
            _note_timed_without_nemo(outcome.rows, d.case, d, "not run (the CUDA context failed)")
        outcome.skipped += [f"{d.case.tag}: rows run last (the CUDA context failed)" for d in outcome.deferred]
        outcome.skipped += [f"{p.case.tag}: kernel profile (the CUDA context failed)" for p in outcome.to_profile]
        outcome.deferred, outcome.to_profile = [], []
    if outcome.deferred:  # written before the rows that may poison the CUDA context
        pending = [d.case.tag for d in outcome.deferred]
        # if the process dies in the rows run last, the record on disk says they never finished
        path, _ = write([*outcome.failures, f"rows run last not finished (full-graph group): {pending}"])
        print(f"wrote {path}; running last: {pending}", flush=True)
        outcome.rows += measure_deferred(outcome, deadline=t_start + budget_s + DEFERRED_AFTER_BUDGET_S)
    if outcome.context_lost:
        outcome.skipped += [f"{p.case.tag}: kernel profile (the CUDA context failed)" for p in outcome.to_profile]
        outcome.to_profile = []
    # after every timed row: the profiler changes no timing
    add_kernel_profiles(outcome, deadline=t_start + budget_s + PROFILE_AFTER_BUDGET_S)
    try:
        path, figures = write(outcome.failures)
    except Exception as e:  # noqa: BLE001 - e.g. a device query on a failed CUDA context
        if path is None:
            raise
        print(f"FAIL: could not rewrite {path} after the rows run last ({type(e).__name__}: {e}); it holds "
              f"every row before them. Failures: {outcome.failures}", flush=True)
        return 1
    print("\n".join(record.table_lines(figures) + record.kernel_profile_lines(figures)))
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s")
    if outcome.skipped:
        print(f"SKIPPED: {outcome.skipped}")
    return report_failures(outcome.failures, smoke=smoke)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for decoding.json (decoding_nemo.json with --nemo)")
    parser.add_argument("--quick", action="store_true", help="B in {1, 16}, 12 s, fp32 only")
    parser.add_argument("--nemo", action="store_true", help="ours against NeMo 3.0.0's greedy decoders, on NeMo's "
                        "modules (NeMo must be importable)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="skip remaining configs after this")
    parser.add_argument("--kernel-profile", action="store_true", help="after the timed rows, one decode of the "
                        "default kernels' partial graphs (CPU: eager) per fp32 size of B in {1, 16, 128} (those in "
                        "the grid) x 150 frames (smoke: B in {1, 3} x 20), under torch.profiler: the row's "
                        "kernel_profile (kernels by device time, per outer iteration)")
    parser.add_argument("--smoke", action="store_true", help="B in {1, 3}, 20 frames, off modes, on the CPU "
                        "when there is no CUDA: every code path in seconds, nothing measured; without --nemo it "
                        "also dry-runs the NeMo comparison when NeMo is importable")
    args = parser.parse_args(argv)
    if args.smoke:
        check_smoke_out(parser, args.out)
    if cuda_missing(args.smoke):
        return 2
    unavailable = nemo_peer.nemo_unavailable_reason() if (args.nemo or args.smoke) else None
    if args.nemo and unavailable:
        print(f"FAIL: --nemo: {unavailable}; ../shared/tools/fetch_nemo_wheels.sh says how to install it",
              file=sys.stderr)
        return 2
    rc = run(args.out, args.quick, args.budget_s, bench_device(), smoke=args.smoke, nemo=args.nemo,
             kernel_profile=args.kernel_profile)
    if args.smoke and not args.nemo:
        if unavailable:
            print(f"NeMo comparison of the smoke run skipped: {unavailable}")
        else:
            rc = max(rc, run(args.out, args.quick, args.budget_s, bench_device(), smoke=True, nemo=True,
                             kernel_profile=args.kernel_profile))
    return rc


if __name__ == "__main__":
    sys.exit(main())
