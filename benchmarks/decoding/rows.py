"""One size's rows: build each method's decoder, time the methods of one graph mode interleaved, check the rows."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.decoding import nemo_peer
from benchmarks.decoding.calibration import calibrate_blank_bias
from benchmarks.decoding.cases import Case, Deferred, Outcome, ToProfile
from benchmarks.decoding.checks import SAME_MATH, check_row
from benchmarks.decoding.grid import deferred_methods, methods_for
from benchmarks.decoding.iterations import add_iteration_counts
from benchmarks.decoding.methods import (
    BLANK,
    ENC,
    FRAME_S,
    JOINT,
    PRED,
    REFERENCE_ORDER,
    TDT_DURATIONS,
    VOCAB,
    default_method,
    profiled_method,
)
from workbench.decoding import GreedyTransducerDecoder, make_toy_transducer
from workbench.decoding.methods import DecoderMethod
from workbench.decoding.toy_models import set_blank_bias
from workbench.timing import summarize, timer_for


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
    method: DecoderMethod
    call: Any
    key: tuple  # (tokens per utterance, frames per utterance)
    stats: dict
    mode_used: str
    graph_nodes: dict | None = None  # our graph modes: nodes and kernels of each captured stage graph
    window_used: int | None = None  # our decoders: the blank window they took

    @property
    def name(self) -> str:
        return self.method.label


def prepare_method(case: Case, method: DecoderMethod, outcome: Outcome) -> Prepared | None:
    """Build the method's decoder and run it once (None, with a failure listed, when that raises)."""
    try:
        if method.algorithm == "nemo":
            nemo = nemo_peer.NemoGreedy(case.predictor, case.joint, case.durations, method.graph_mode)
            key = nemo(case.enc, case.lengths)
            if case.device.type == "cuda":
                torch.cuda.synchronize(case.device)  # an asynchronous failure shows here, on its own row
            return Prepared(method, lambda: nemo(case.enc, case.lengths), key, {},
                            nemo_peer.NEMO_MODES[method.graph_mode] or "off")
        dec = case.decoder(**method.decoder_options())
        hyps = dec(case.enc, case.lengths)  # also the warm-up (and the graph capture)
    except Exception as e:  # noqa: BLE001 - keep measuring the rest; the failure is reported
        outcome.failures.append(f"{case.tag}: {method.label} raised {type(e).__name__}: {e}")
        print(f"FAIL: {outcome.failures[-1]}", flush=True)
        return None
    stats = dict(dec.last_stats)
    if method.own_window and method.algorithm != "frame_looping":  # its own iteration counts, from an eager run
        probe = case.decoder(cuda_graphs="off", blank_window=method.blank_window, kernels="torch")
        probe(case.enc, case.lengths)
        stats = dict(probe.last_stats)
    key = ([h.tokens for h in hyps], [h.timestamps for h in hyps])
    if (case.profile_kernels and method == profiled_method(case.device)
            and not any(item.case is case for item in outcome.to_profile)):
        outcome.to_profile.append(ToProfile(case, method.label, dec))
    nodes = None
    if dec.mode_used in ("full", "partial"):
        try:
            nodes = dec.stage_graph_nodes()
        except Exception as e:  # noqa: BLE001 - a count we cannot make is said, not fatal
            nodes = {"unavailable": f"{type(e).__name__}: {e}"}
    return Prepared(method, lambda: dec(case.enc, case.lengths), key, stats, dec.mode_used, nodes, dec.window_used)


def time_interleaved(case: Case, prepared: list[Prepared], outcome: Outcome) -> list[dict]:
    """Time the prepared methods call by call in turn (so a drift of the machine hits them alike); one row
    each (a method that raises while timed is dropped, with a failure listed)."""
    repeat = 5 if all(p.method.graph_mode == "full" for p in prepared) else 3
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
        if p.window_used is not None and p.method.algorithm != "frame_looping":
            rows[-1]["blank_window"] = p.window_used
    return rows


def measure_methods(case: Case, methods: list[DecoderMethod], outcome: Outcome) -> list[dict]:
    """Prepare every method, then time those of one graph mode interleaved; rows with ``_key`` and ``_stats``."""
    prepared = [p for method in methods if (p := prepare_method(case, method, outcome)) is not None]
    rows = []
    for mode in dict.fromkeys(p.method.graph_mode for p in prepared):
        rows += time_interleaved(case, [p for p in prepared if p.method.graph_mode == mode], outcome)
    order = [m.label for m in methods]
    return sorted(rows, key=lambda r: order.index(r["method"]))


def finish_rows(case: Case, rows: list[dict], outcome: Outcome) -> None:
    """Take the case's reference and loop counts from these rows where it has none yet, then check every row
    and add its iteration counts (a window given explicitly: its own)."""
    if case.reference is None:
        names = [m.label for m in REFERENCE_ORDER]
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
        add_iteration_counts(row, stats if DecoderMethod.of_label(row["method"]).own_window else case.loop_stats)


def measure_case(case: Case, calibrator: GreedyTransducerDecoder | None, outcome: Outcome, smoke: bool,
                 methods: list[DecoderMethod] | None = None) -> list[dict]:
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
    case.measured = [m for m in methods if m not in later or m.algorithm != "nemo"]
    group = measure_methods(case, case.measured, outcome)
    finish_rows(case, group, outcome)
    if later:
        outcome.deferred.append(Deferred(case, later))
    return group



def print_group(tag: str, group: list[dict]) -> None:
    if group:
        print(f"{tag}: " + ", ".join(f"{r['method']} {r['time_s']['median'] * 1e3:.2f} ms" for r in group), flush=True)
