"""The decoding bench's CLI: greedy RNN-T / TDT decoding speed, frame-looping vs label-looping with CUDA graphs
off / partial / full, against torchaudio's RNNTBeamSearch; with --nemo, against NeMo 3.0.0's own greedy
decoders in the same process, on NeMo's own prediction network and joint.

    python3 -m workbench.bench.decoding --out DIR [--quick]          # GPU: decoding.json
    python3 -m workbench.bench.decoding --nemo --out DIR [--quick]   # GPU, NeMo importable: decoding_nemo.json
    python3 -m workbench.bench.decoding --smoke --out DIR            # CPU dry run of both, seconds
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
``Grid.breakdown_batches``). NeMo's full graph at B >= ``NEMO_FULL_GRAPH_LAST_FROM_B`` runs after every
other row, the record written before: an illegal memory access there (seen at B=128) poisons the CUDA
context, and the rows after it are then listed as not run. --kernel-profile: after every timed row, one more
decode of the default kernels' partial graphs (``profiled_method``; on CPU their eager mode) at each fp32 size
of ``Grid.profile_batches`` x ``Grid.profile_frames`` runs under torch.profiler, and its row gets
``kernel_profile`` (kernels by device time, per outer iteration). ``record.py`` owns the record's fields. More
in benchmarks/NOTES.md.
"""


from __future__ import annotations

import argparse
import copy
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import torch

from workbench.bench.decoding import kernel_profile, nemo_peer, record
from workbench.bench.results import (
    bench_device,
    check_smoke_out,
    cuda_missing,
    report_failures,
    summarize,
    timer_for,
    write_result,
)
from workbench.decoding import GreedyTransducerDecoder, fused, label_looping, make_toy_transducer
from workbench.decoding.cuda_graphs import DriverGraph, capture_partial_graphs
from workbench.decoding.greedy import DEFAULT_BLANK_WINDOW
from workbench.decoding.protocol import module_dtype
from workbench.decoding.toy_models import set_blank_bias

VOCAB, PRED, JOINT, ENC = 1024, 640, 640, 512  # the sizes of the NeMo comparison
BLANK = VOCAB
FRAME_S = 0.08
TDT_DURATIONS = [0, 1, 2, 3, 4]
W = DEFAULT_BLANK_WINDOW
MIN_SPEEDUP_OVER_FRAME_LOOPING = 10.0  # the target: full graph vs frame-looping off, B=16, 12 s, fp32
# bf16 frame-looping vs label-looping: one near-tie flips the rest of an utterance (benchmarks/NOTES.md
# gives the disagreement measured); a wrong decision rule disagrees far more.
MAX_BF16_DISAGREEMENT = 0.25
# (algorithm, graph mode, blank window); the window applies to label-looping (RNN-T and TDT). Window 1
# (one frame per search step) runs in fp32 only, to show what the window buys.
# "label_looping_fused": the same decoder with the fused kernels that kernels="auto" picks on CUDA
# ("triton_cudnn", workbench.decoding.fused), where Triton runs; "label_looping_fused_lstm": kernels="triton",
# the LSTM predictor's step fused too (its sums in another order than cuDNN's: checked like frame-looping).
FUSED = "label_looping_fused"
FUSED_LSTM = "label_looping_fused_lstm"
METHODS = [("frame_looping", "off", W), ("label_looping", "off", W), ("label_looping", "partial", W),
           ("label_looping", "full", W), ("label_looping", "full", 1),
           (FUSED, "off", W), (FUSED, "partial", W), (FUSED, "full", W), (FUSED_LSTM, "full", W)]
# --nemo: ours and NeMo's label-looping decoders in each graph mode, on NeMo's modules. First pass, every size:
# what the targets need (the default kernels' full graph, NeMo's full graph and its partial graphs where the
# full one fails) and the partial graphs (their loop counts give the full graph's per-iteration figures).
NEMO_TARGET_METHODS = [(FUSED, "full", W), (FUSED, "partial", W), ("nemo", "full", W), ("nemo", "partial", W)]
# Second pass, while the budget lasts: the torch stages' full graph at every size; the eager modes and the torch
# stages' partial graphs (the slow ones) at Grid.breakdown_batches only.
NEMO_BREAKDOWN_EVERYWHERE = [("label_looping", "full", W), (FUSED_LSTM, "full", W)]
NEMO_BREAKDOWN_METHODS = [("label_looping", "off", W), ("label_looping", "partial", W), (FUSED, "off", W),
                          ("nemo", "off", W)]
NEMO_METHODS = [*NEMO_TARGET_METHODS, *NEMO_BREAKDOWN_EVERYWHERE, *NEMO_BREAKDOWN_METHODS]
# The reference of each size, when the default method has no row there: the first of these that has one.
REFERENCE_ORDER = [(FUSED, "full", W), ("label_looping", "off", W), (FUSED, "partial", W), ("label_looping", "full", W),
                   ("label_looping", "partial", W), (FUSED, "off", W)]
MIN_SPEEDUP_OVER_NEMO = {"rnnt": 4.0, "tdt": 2.0}  # our full graph over NeMo's, every B, length and dtype
NEMO_FULL_GRAPH_LAST_FROM_B = 128


def timed(fn, repeat: int, warmup: int, device: torch.device) -> dict[str, float]:
    return timer_for(device)(fn, repeat=repeat, warmup=warmup)


def method_name(algorithm: str, mode: str, window: int = W) -> str:
    if algorithm == "nemo":
        return {"off": "NeMo no graphs", "partial": "NeMo partial graphs", "full": "NeMo full graph"}[mode]
    suffix = " window 1" if window == 1 else ""
    if algorithm == FUSED:
        return f"label-looping fused {mode}{suffix}"
    if algorithm == FUSED_LSTM:
        return f"label-looping fused+lstm {mode}{suffix}"
    return f"{'frame' if algorithm == 'frame_looping' else 'label'}-looping {mode}{suffix}"


def default_algorithm(device: torch.device) -> str:
    """The bench's name for what ``GreedyTransducerDecoder`` runs by default on ``device``: the fused kernels
    (``FUSED``) where ``kernels="auto"`` picks them (CUDA, triton importable), else the torch stages."""
    return "label_looping" if label_looping.resolve_kernels("auto", device=device)[0] == "torch" else FUSED


def default_method(device: torch.device, mode: str = "full") -> str:
    """The method that ``GreedyTransducerDecoder`` runs by default on ``device`` in graph ``mode``."""
    return method_name(default_algorithm(device), mode)


def profiled_method(device: torch.device) -> tuple[str, str, int]:
    """(algorithm, mode, window) that --kernel-profile profiles: the default kernels' partial graphs on CUDA
    (the host runs the loop, so every iteration's kernels are traced), their eager mode elsewhere."""
    return default_algorithm(device), "partial" if device.type == "cuda" else "off", W


def calibrate_blank_bias(decoder: GreedyTransducerDecoder, enc: torch.Tensor, lengths: torch.Tensor,
                         target: float = 1 / 3, steps: int = 11) -> tuple[float, float]:
    """Bisect the blank bias of ``decoder``'s joint so labels per frame on this very input is about
    ``target``; returns (bias, labels per frame): of every bias tried, the one whose rate came closest.
    Each row of the table is calibrated on its own input: the rate of a random model at one fixed bias varies
    a lot between random inputs, and on one short utterance it jumps (one label more changes the rest of
    the path), so the last midpoint can sit on the far side of a jump."""
    frames = float(lengths.sum())

    def rate_at(bias: float) -> float:
        set_blank_bias(decoder.joint, BLANK, bias)
        return sum(len(h.tokens) for h in decoder(enc, lengths)) / frames

    low, high = -10.0, 10.0
    tried = []
    for _ in range(steps):
        mid = (low + high) / 2
        rate = rate_at(mid)
        tried.append((abs(rate - target), mid, rate))
        low, high = (mid, high) if rate > target else (low, mid)
    end = (low + high) / 2
    end_rate = rate_at(end)
    tried.append((abs(end_rate - target), end, end_rate))
    _, bias, rate = min(tried)
    set_blank_bias(decoder.joint, BLANK, bias)
    return bias, rate


def token_disagreement(hyps: list[list[int]], reference: list[list[int]]) -> float:
    """Edit distance between two decodings of the same utterances, over the longer sequence of each
    pair: 0 when equal, 1 when nothing matches (two empty decodings agree: 0)."""
    if len(hyps) != len(reference):
        raise ValueError(f"token_disagreement: {len(hyps)} hypotheses for {len(reference)} references")
    errors = total = 0
    for h, r in zip(hyps, reference):
        row = list(range(len(r) + 1))
        for i, a in enumerate(h, 1):
            prev, row[0] = row[0], i
            for j, b in enumerate(r, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (a != b))
        errors += row[-1]
        total += max(len(h), len(r))
    return errors / max(total, 1)


def torchaudio_reference(frames_list: list[int], device: torch.device) -> list[dict[str, Any]]:
    """torchaudio RNNTBeamSearch, beam 1, B=1, fp32, on an equal-sized torchaudio RNN-T (encoder given)."""
    try:  # optional dependency: torchaudio is on the GPU machines, not in pyproject.toml
        from torchaudio.models import RNNT, RNNTBeamSearch
        from torchaudio.models.rnnt import _Joiner, _Predictor
    except ImportError as e:  # torchaudio missing or the API removed
        print(f"torchaudio reference unavailable: {e}")
        return [{"method": "torchaudio RNNTBeamSearch beam 1", "unavailable": str(e)}]

    class PassThrough(torch.nn.Module):
        def forward(self, x, lengths):
            return x, lengths

        def infer(self, x, lengths, states):
            return x, lengths, []

    torch.manual_seed(0)
    predictor = _Predictor(num_symbols=VOCAB + 1, output_dim=JOINT, symbol_embedding_dim=PRED,
                           num_lstm_layers=1, lstm_hidden_dim=PRED)
    model = RNNT(PassThrough(), predictor, _Joiner(JOINT, VOCAB + 1)).to(device).eval()
    search = RNNTBeamSearch(model, BLANK, step_max_tokens=10)
    rows = []
    with torch.inference_mode():
        short = torch.randn(1, 50, JOINT, device=device)
        low, high = -20.0, 20.0
        for _ in range(8):  # coarse blank-bias bisection towards 1 label per 3 frames
            mid = (low + high) / 2
            model.joiner.linear.bias[BLANK] = mid
            rate = (len(search(short, torch.tensor([50], device=device), 1)[0][0]) - 1) / 50
            low, high = (mid, high) if rate > 1 / 3 else (low, mid)
        model.joiner.linear.bias[BLANK] = (low + high) / 2
        for frames in frames_list:
            enc = torch.randn(1, frames, JOINT, device=device)
            length = torch.tensor([frames], device=device)
            labels = len(search(enc, length, 1)[0][0]) - 1
            t = timed(lambda: search(enc, length, 1), device=device, repeat=3 if frames <= 150 else 1,
                          warmup=1 if frames <= 150 else 0)
            rows.append({"model": "rnnt", "dtype": "float32", "batch": 1, "frames": frames,
                         "audio_seconds": frames * FRAME_S, "method": "torchaudio RNNTBeamSearch beam 1",
                         "time_s": t, "audio_s_per_s": frames * FRAME_S / t["median"],
                         "labels_per_frame": labels / frames})
    return rows


@dataclass
class Grid:
    """What one run measures: batch sizes, encoder frames per utterance, dtypes; --nemo runs its breakdown
    methods (the eager modes, the torch stages' partial graphs) at ``breakdown_batches`` only; --kernel-profile
    profiles the fp32 sizes of ``profile_batches`` (those in the grid) at ``profile_frames``."""
    batches: list[int]
    frame_counts: list[int]
    dtypes: list[torch.dtype]
    breakdown_batches: list[int] = field(default_factory=lambda: [16])
    profile_batches: list[int] = field(default_factory=lambda: [1, 16, 128])
    profile_frames: int = 150

    @classmethod
    def of(cls, quick: bool, smoke: bool) -> "Grid":
        if smoke:  # CPU dry run of every code path (off modes only): seconds
            return cls([1, 3], [20], [torch.float32, torch.bfloat16], breakdown_batches=[1, 3],
                       profile_batches=[1, 3], profile_frames=20)
        if quick:
            return cls([1, 16], [150], [torch.float32])
        return cls([1, 16, 64, 128], [150, 375], [torch.float32, torch.bfloat16])

    def cells(self) -> list[tuple[torch.dtype, str, int, int]]:
        """(dtype, model, frames, batch) in the order they run: fp32 first, then bf16."""
        return [(dtype, model, frames, batch) for dtype in self.dtypes for model in ("rnnt", "tdt")
                for frames in self.frame_counts for batch in self.batches]

    def profiled(self, dtype: torch.dtype, frames: int, batch: int) -> bool:
        """Whether --kernel-profile profiles this size."""
        return dtype == torch.float32 and frames == self.profile_frames and batch in self.profile_batches


@dataclass
class Case:
    """One row group of the table: a model in a dtype on one random input of B utterances x T frames."""
    model: str
    dtype: torch.dtype
    predictor: torch.nn.Module
    joint: torch.nn.Module
    durations: list[int] | None
    enc: torch.Tensor  # [B, T, ENC]
    lengths: torch.Tensor  # [B]
    device: torch.device
    methods: list[tuple[str, str, int]] = field(default_factory=lambda: list(METHODS))
    blank_bias: float | None = None  # None until calibrated
    reference: tuple | None = None  # (tokens, frames) per utterance of reference_method
    reference_method: str | None = None
    loop_stats: dict | None = None  # outer and inner iterations (an eager or partial-graph row's)
    profile_kernels: bool = False  # --kernel-profile: keep profiled_method's decoder for add_kernel_profiles

    @property
    def batch(self) -> int:
        return self.enc.shape[0]

    @property
    def frames(self) -> int:
        return self.enc.shape[1]

    @property
    def tag(self) -> str:
        return f"{self.model} {str(self.dtype)[6:]} B={self.batch} T={self.frames}"

    def decoder(self, **kw) -> GreedyTransducerDecoder:
        return GreedyTransducerDecoder(self.predictor, self.joint, blank_id=BLANK, durations=self.durations, **kw)


@dataclass
class Deferred:
    """Methods of a case that run after every other row (NeMo's full graph at large B); the case holds what
    checks them."""
    case: Case
    methods: list[tuple[str, str, int]]


@dataclass
class ToProfile:
    """A warm decoder of ``profiled_method`` kept for its kernel profile, which runs after every timed row."""
    case: Case
    method: str
    decoder: GreedyTransducerDecoder


@dataclass
class Outcome:
    """What the run has found so far."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    calibration: dict[str, dict] = field(default_factory=dict)
    deferred: list[Deferred] = field(default_factory=list)
    to_profile: list[ToProfile] = field(default_factory=list)
    context_lost: str | None = None  # the CUDA error that made the context unusable, once one has


def empty_while_iteration_seconds(iterations: int = 2000, repeat: int = 10,
                                  device: torch.device | None = None) -> dict[str, float]:
    """Seconds of one iteration of a conditional WHILE node whose body is only its condition kernel (median
    over ``repeat`` replays; built as the decoders' full graph is), and of a replay with zero iterations."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    remaining = torch.zeros((), dtype=torch.int32, device=device)
    count = torch.zeros((), dtype=torch.int32, device=device)
    start = capture_partial_graphs({"start": lambda: remaining.copy_(count)}, device)["start"]
    graph = DriverGraph(device)
    loop = graph.conditional_handle()
    node = graph.child(graph.root, [], start, "start")
    node = graph.condition(graph.root, [node], "while_count_down", loop, remaining)
    _, body = graph.while_loop(graph.root, [node], loop)
    graph.condition(body, [], "while_count_down", loop, remaining)
    graph.instantiate()

    def replay_seconds(n: int) -> float:
        count.fill_(n)
        samples = []
        for _ in range(repeat + 2):
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_event.record()
            graph.replay()
            end_event.record()
            end_event.synchronize()
            samples.append(start_event.elapsed_time(end_event) / 1000.0)
        if int(remaining) != 0:
            raise RuntimeError(f"count-down loop did not run to 0 (left {int(remaining)})")
        return float(np.median(samples[2:]))

    zero, many = replay_seconds(0), replay_seconds(iterations)
    return {"seconds_per_iteration": (many - zero) / iterations, "replay_seconds_zero_iterations": zero,
            "iterations": iterations}


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


def methods_for(case: Case) -> list[tuple[str, str, int]]:
    """The case's methods that apply: frame-looping is RNN-T only, graphs need CUDA, window 1 runs in fp32, the
    fused kernels run on CUDA with Triton (not in the CPU smoke run: Triton's interpreter is far too slow)."""
    fused_reason = "CPU" if case.device.type != "cuda" else fused.triton_unavailable_reason(case.device)
    return [(algorithm, mode, window) for algorithm, mode, window in case.methods
            if not ((algorithm == "frame_looping" and case.durations is not None)
                    or (algorithm in (FUSED, FUSED_LSTM) and fused_reason is not None)
                    or (case.device.type != "cuda" and mode != "off")
                    or (window == 1 and case.dtype != torch.float32))]


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
    if algorithm == "label_looping" and window == 1:  # its iteration counts, from an eager run
        probe = case.decoder(cuda_graphs="off", blank_window=1, kernels="torch")
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
    return Prepared(algorithm, mode, window, lambda: dec(case.enc, case.lengths), key, stats, dec.mode_used, nodes)


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
    return rows


SAME_MATH = {method_name(a, m) for a in ("label_looping", FUSED) for m in ("off", "partial", "full")}


def check_row(case: Case, row: dict, outcome: Outcome) -> None:
    """Compare a row's tokens and frames with the case's reference. Our label-looping stages (torch or fused,
    off/partial/full) must agree exactly in every dtype. Frame-looping, window 1, fused+lstm (the LSTM step's
    sums in another order than cuDNN's) and NeMo run other GEMM shapes (or other kernels): exactly in fp32; in bf16 a near-tie can round either way and the rest of
    that utterance then follows another path, so there the token disagreement (edit distance) is reported (and,
    for our own methods, checked) instead. A row that differs gets ``first_difference``."""
    key, reference = row.pop("_key"), case.reference
    differing = sum(a != b for a, b in zip(zip(*key), zip(*reference))) if reference else case.batch
    row["reference_method"] = case.reference_method
    row["utterances_differing_from_reference"] = differing
    row["equal_to_reference"] = differing == 0
    if reference is not None and differing:
        row["first_difference"] = first_difference(reference, key)
        try:
            row["first_difference"].update(decision_margins(case, row["first_difference"], reference))
        except Exception as e:  # noqa: BLE001 - a diagnostic we cannot make is said, not fatal
            row["first_difference"]["margins_unavailable"] = f"{type(e).__name__}: {e}"
    if reference is not None and row["method"] not in SAME_MATH and case.dtype != torch.float32:
        row["token_disagreement"] = token_disagreement(key[0], reference[0])
        if row["token_disagreement"] > MAX_BF16_DISAGREEMENT and not row["method"].startswith("NeMo"):
            outcome.failures.append(f"{case.tag}: {row['method']}: token disagreement {row['token_disagreement']:.3f} "
                                    f"with {case.reference_method} (allowed {MAX_BF16_DISAGREEMENT} in bf16)")
    elif differing:
        outcome.failures.append(f"{case.tag}: {row['method']}: {differing} of {case.batch} utterances differ from "
                                f"{case.reference_method}")


def first_difference(reference: tuple, key: tuple) -> dict[str, Any] | None:
    """Where ``key``'s hypotheses first depart from ``reference``'s (each (tokens, frames) per utterance): the first
    differing utterance, the index of its first differing label, and each side's token and frame there (None
    past the end of a side's labels), with each side's label count in that utterance. None when equal."""
    for utterance, (ours_t, ours_f, theirs_t, theirs_f) in enumerate(zip(*reference, *key)):
        ours, theirs = list(zip(ours_t, ours_f)), list(zip(theirs_t, theirs_f))
        if ours == theirs:
            continue
        label = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        mine = ours[label] if label < len(ours) else (None, None)
        other = theirs[label] if label < len(theirs) else (None, None)
        return {"utterance": utterance, "label_index": label, "reference_token": mine[0], "reference_frame": mine[1],
                "token": other[0], "frame": other[1], "reference_labels": len(ours), "labels": len(theirs)}
    return None


@torch.inference_mode()
def decision_margins(case: Case, diff: dict, reference: tuple) -> dict[str, Any]:
    """Our joint at the first difference: the predictor after the common labels, at the earlier of the two sides'
    frames (the last frame when both ended): the top-2 tokens and their log-probability margin and, for TDT, the
    duration picked and the duration margin. A small margin is a rounding near-tie."""
    u, label = diff["utterance"], diff["label_index"]
    frames = [f for f in (diff["reference_frame"], diff["frame"]) if f is not None]
    frame = min(frames) if frames else int(case.lengths[u]) - 1
    prefix = reference[0][u][:label]
    p, j = case.predictor, case.joint
    labels = torch.full((1,), BLANK, dtype=torch.long, device=case.device)
    out, state = p.step(labels, p.init_state(1))
    for token in prefix:
        out, state = p.step(torch.full((1,), token, dtype=torch.long, device=case.device), state)
    enc = case.enc[u:u + 1, frame:frame + 1].to(module_dtype(j, case.enc.dtype))
    logits = j.joint_after_projection(j.project_encoder(enc)[:, 0], j.project_predictor(out))[0].float()
    v1 = logits.shape[0] - len(case.durations or [])
    top = torch.log_softmax(logits[:v1], dim=-1).topk(2)
    result = {"at_frame": frame, "top2_tokens": top.indices.tolist(),
              "top2_token_margin": float(top.values[0] - top.values[1])}
    if case.durations:
        top_d = torch.log_softmax(logits[v1:], dim=-1).topk(2)
        result.update(top2_durations=[case.durations[i] for i in top_d.indices.tolist()],
                      top2_duration_margin=float(top_d.values[0] - top_d.values[1]))
    return result


def add_iteration_counts(row: dict, stats: dict | None) -> None:
    """Outer and inner label-looping iterations, and seconds per iteration, on a label-looping row; on a graph
    row, kernels per outer iteration: those of find_label_first and emit_labels, those of find_label_again
    times inner iterations per outer one, and in the full graph its condition kernels (2 + inner per outer)."""
    if row["method"].startswith("label") and stats is not None and "outer_iterations" in stats:
        outer, inner, seconds = stats["outer_iterations"], stats["inner_iterations"], row["time_s"]["median"]
        row.update(outer_iterations=outer, inner_iterations=inner,
                   seconds_per_outer_iteration=seconds / max(1, outer),
                   seconds_per_iteration=seconds / max(1, outer + inner))
        nodes = row.get("graph_nodes") or {}
        if all(isinstance(nodes.get(s), dict) for s in ("find_label_first", "find_label_again", "emit_labels")):
            per_outer_inner = inner / max(1, outer)
            kernels = (nodes["find_label_first"]["kernels"] + nodes["emit_labels"]["kernels"]
                       + per_outer_inner * nodes["find_label_again"]["kernels"])
            if row.get("mode_used") == "full":
                kernels += 2 + per_outer_inner
            row["kernels_per_outer_iteration"] = kernels


def deferred_methods(case: Case, methods: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The methods that run last: the full-graph group when NeMo's full graph is in it at a large B."""
    if case.batch >= NEMO_FULL_GRAPH_LAST_FROM_B and ("nemo", "full", W) in methods:
        return [m for m in methods if m[1] == "full"]
    return []


def measure_methods(case: Case, methods: list[tuple[str, str, int]], outcome: Outcome) -> list[dict]:
    """Prepare every method, then time those of one graph mode interleaved; rows with ``_key`` and ``_stats``."""
    prepared = [p for method in methods if (p := prepare_method(case, *method, outcome)) is not None]
    rows = []
    for mode in dict.fromkeys(p.mode for p in prepared):
        rows += time_interleaved(case, [p for p in prepared if p.mode == mode], outcome)
    order = [method_name(*m) for m in methods]
    return sorted(rows, key=lambda r: order.index(r["method"]))


def finish_rows(case: Case, rows: list[dict], outcome: Outcome) -> None:
    """Take the case's reference and loop counts from these rows where it has none yet, then check every row
    and add its iteration counts (window 1: its own)."""
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
        add_iteration_counts(row, stats if row["method"].endswith("window 1") else case.loop_stats)


def measure_case(case: Case, calibrator: GreedyTransducerDecoder | None, outcome: Outcome, smoke: bool,
                 methods: list[tuple[str, str, int]] | None = None) -> list[dict]:
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
    group = measure_methods(case, [m for m in methods if m not in later], outcome)
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


def measure_deferred(outcome: Outcome) -> list[dict]:
    """The deferred method groups, fp32 first. Our methods of a group are first timed alone, so they keep a
    row when NeMo's then fails; when NeMo's run, the group is timed again interleaved and those rows count.
    After a failure that leaves the CUDA context unusable, the rest are listed as not run."""
    rows, lost = [], None
    for item in sorted(outcome.deferred, key=lambda d: (d.case.dtype != torch.float32, d.case.model,
                                                        d.case.frames, d.case.batch)):
        case = item.case
        if lost:
            outcome.skipped.append(f"{case.tag}: {', '.join(method_name(*m) for m in item.methods)} not run "
                                   f"(the CUDA context failed earlier: {lost})")
            continue
        set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
        group = measure_methods(case, [m for m in item.methods if m[0] != "nemo"], outcome)
        for row in group:
            row["timing_note"] = "timed alone: NeMo's method of this graph mode did not run"
        failures_before = len(outcome.failures)
        interleaved = measure_methods(case, item.methods, outcome)
        lost = cuda_context_error(case.device)
        if lost:
            outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                                    f"{', '.join(method_name(*m) for m in item.methods if m[0] == 'nemo')}: {lost}")
        elif len(outcome.failures) == failures_before:
            group = interleaved
        finish_rows(case, group, outcome)
        _print_group(f"{case.tag} (run last)", group)
        rows += group
    outcome.deferred.clear()
    return rows


def profile_case(case: Case, decoder: GreedyTransducerDecoder, method: str) -> dict[str, Any]:
    """One more decode of the case by its warm ``decoder`` under torch.profiler: ``kernel_profile.kernel_breakdown``
    per outer iteration of that decode (from ``decoder.last_stats``), with the method, the graph mode it ran in,
    the seconds the profiling took and whether its hypotheses equal the case's reference. A profiler that
    raises gives {"method", "unavailable"}."""
    set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
    try:
        hyps, events, wall = kernel_profile.profile_call(lambda: decoder(case.enc, case.lengths), case.device)
    except Exception as e:  # noqa: BLE001 - a profile we cannot make is said, not fatal
        return {"method": method, "unavailable": f"{type(e).__name__}: {e}"}
    profile = kernel_profile.kernel_breakdown(events, case.device.type, decoder.last_stats.get("outer_iterations"))
    key = ([h.tokens for h in hyps], [h.timestamps for h in hyps])
    equal = None if case.reference is None else list(zip(*key)) == list(zip(*case.reference))
    return {"method": method, "mode_used": decoder.mode_used, "profiling_wall_s": wall,
            "equal_to_reference": equal, **profile}


PROFILE_AFTER_BUDGET_S = 60.0  # --kernel-profile: no profile starts later than this after the budget


def add_kernel_profiles(outcome: Outcome, deadline: float = float("inf")) -> None:
    """Profile every decoder kept in ``outcome.to_profile`` (``profile_case``) and put it in its row as
    ``kernel_profile``, with ``timed_seconds_per_outer_iteration`` of that row and of the default method's
    full graph at the same size (where they have one); run after every timed row, so the profiler changes no
    timing. After a CUDA context failure, or from ``deadline`` (a ``time.perf_counter()`` value) on, the rest are
    listed as not run."""
    def row_of(case: Case, method: str) -> dict | None:
        shape = (case.model, str(case.dtype)[6:], case.batch, case.frames, method)
        return next((r for r in outcome.rows if (r.get("model"), r.get("dtype"), r.get("batch"), r.get("frames"),
                                                 r.get("method")) == shape), None)

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


def add_speedups(group: list[dict], base_by_shape: dict[tuple, float]) -> None:
    """Speedup over RNN-T frame-looping off of the same B and T (TDT rows use the RNN-T baseline too)."""
    base = next((r for r in group if r["method"] == "frame-looping off"), None)
    if base is not None:
        base_by_shape[(base["batch"], base["frames"])] = base["time_s"]["median"]
    for row in group:
        if (row["batch"], row["frames"]) in base_by_shape:
            row["speedup_vs_frame_looping_off"] = base_by_shape[(row["batch"], row["frames"])] / row["time_s"]["median"]


def add_nemo_speedups(rows: list[dict]) -> None:
    """On each of our label-looping rows: NeMo's seconds over ours in the same graph mode (``speedup_vs_nemo``,
    > 1: we are faster) and which NeMo row that is; our full graph falls back to NeMo's partial graphs where
    NeMo's full graph has no row (it failed)."""
    nemo = {(r["model"], r["dtype"], r["batch"], r["frames"], r["method"]): r["time_s"]["median"]
            for r in rows if r["method"].startswith("NeMo")}
    for r in rows:
        if not r["method"].startswith("label-looping") or r["method"].endswith("window 1"):
            continue
        mode = r["method"].split()[-1]
        candidates = [method_name("nemo", mode)] + ([method_name("nemo", "partial")] if mode == "full" else [])
        shape = (r["model"], r["dtype"], r["batch"], r["frames"])
        against = next((m for m in candidates if (*shape, m) in nemo), None)
        if against is not None:
            r["speedup_vs_nemo"], r["speedup_vs_nemo_method"] = nemo[(*shape, against)] / r["time_s"]["median"], against


def plan_methods(nemo: bool, batch: int, grid: Grid) -> tuple[list, list]:
    """(first pass, second pass) methods of a size: without --nemo every method in one pass; with it, what the
    targets need first, and the breakdown after every size's first pass (its eager modes and the torch stages'
    partial graphs at ``grid.breakdown_batches`` only)."""
    if not nemo:
        return list(METHODS), []
    later = NEMO_BREAKDOWN_EVERYWHERE + (NEMO_BREAKDOWN_METHODS if batch in grid.breakdown_batches else [])
    return list(NEMO_TARGET_METHODS), list(later)


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
        if lost_context(case, first, outcome):
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
        lost_context(case, later, outcome)


def lost_context(case: Case, methods: list, outcome: Outcome) -> bool:
    """After a case on CUDA: whether its methods left the CUDA context unusable (an illegal memory access is
    sticky). If so the failure names the case and its methods (the first failure listed before it is the one
    that faulted), every later case is listed as not run, and ``outcome.context_lost`` is set."""
    if case.device.type != "cuda" or not (lost := cuda_context_error(case.device)):
        return False
    outcome.context_lost = lost
    outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                            f"{', '.join(method_name(*m) for m in methods)} ({lost}); the rest did not run")
    print(f"FAIL: {outcome.failures[-1]}", flush=True)
    return True


def _print_group(tag: str, group: list[dict]) -> None:
    if group:
        print(f"{tag}: " + ", ".join(f"{r['method']} {r['time_s']['median'] * 1e3:.2f} ms" for r in group), flush=True)


def _b16_median(rows: list[dict], model: str, method: str) -> float | None:
    r = next((r for r in rows if r.get("model") == model and r.get("dtype") == "float32" and r.get("batch") == 16
              and r.get("frames") == 150 and r.get("method") == method), None)
    return None if r is None else r["time_s"]["median"]


def targets_of(rows: list[dict], failures: list[str], target_method: str = "label-looping full") -> dict[str, Any]:
    """The targets at B=16, 12 s, fp32, judged on ``target_method`` (the default kernels' full graph); a missed
    one is added to ``failures``."""
    rnnt_full, tdt_full = _b16_median(rows, "rnnt", target_method), _b16_median(rows, "tdt", target_method)
    rnnt_frame = _b16_median(rows, "rnnt", "frame-looping off")
    targets = {
        "target_method": target_method,
        "full_speedup_vs_frame_looping_off_rnnt": None if not (rnnt_full and rnnt_frame) else rnnt_frame / rnnt_full,
        "rnnt_full_s": rnnt_full, "tdt_full_s": tdt_full,
        "goal": f"{target_method} >= {MIN_SPEEDUP_OVER_FRAME_LOOPING:g}x frame-looping off",
    }
    if target_method != "label-looping full":
        torch_full = _b16_median(rows, "rnnt", "label-looping full")
        targets["torch_stages"] = {
            "method": "label-looping full", "rnnt_full_s": torch_full, "tdt_full_s": _b16_median(rows, "tdt", "label-looping full"),
            "full_speedup_vs_frame_looping_off_rnnt": None if not (torch_full and rnnt_frame) else rnnt_frame / torch_full}
    speedup = targets["full_speedup_vs_frame_looping_off_rnnt"]
    if speedup is None or speedup < MIN_SPEEDUP_OVER_FRAME_LOOPING:
        failures.append(f"{target_method} is not >= {MIN_SPEEDUP_OVER_FRAME_LOOPING:g}x frame-looping off at B=16, "
                        f"12 s, fp32: {speedup}")
    return targets


def _vs_nemo(rows: list[dict], method: str) -> tuple[list[dict], list[str]]:
    """``method``'s rows with a NeMo ratio, and those below the target as 'rnnt float32 B=1 T=150: 1.51x ...'."""
    full = [r for r in rows if r["method"] == method and "speedup_vs_nemo" in r]
    misses = [f"{r['model']} {r['dtype']} B={r['batch']} T={r['frames']}: {r['speedup_vs_nemo']:.2f}x "
              f"{r['speedup_vs_nemo_method']}" for r in full if r["speedup_vs_nemo"] < MIN_SPEEDUP_OVER_NEMO[r["model"]]]
    return full, misses


def nemo_targets_of(rows: list[dict], failures: list[str], *, smoke: bool,
                    target_method: str = "label-looping full") -> dict[str, Any]:
    """``target_method`` (the default kernels' full graph) against NeMo's full graph at every (model, dtype, B,
    T), the torch stages' full graph beside it, and the fp32 equality of NeMo's hypotheses with ours; a missed
    target is added to ``failures`` (on CPU, where no graph runs, only the equality is checked)."""
    full, misses = _vs_nemo(rows, target_method)
    nemo32 = [r for r in rows if r["method"].startswith("NeMo") and r["dtype"] == "float32"]
    unequal = [f"{r['model']} B={r['batch']} T={r['frames']} {r['method']}" for r in nemo32
               if not r.get("equal_to_reference", r.get("equal_to_label_looping_off"))]
    rnnt_full, tdt_full = _b16_median(rows, "rnnt", target_method), _b16_median(rows, "tdt", target_method)
    nemo_rnnt, nemo_tdt = _b16_median(rows, "rnnt", "NeMo full graph"), _b16_median(rows, "tdt", "NeMo full graph")
    targets = {
        "target_method": target_method,
        "rnnt_full_s": rnnt_full, "tdt_full_s": tdt_full, "nemo_rnnt_full_s": nemo_rnnt, "nemo_tdt_full_s": nemo_tdt,
        "speedup_vs_nemo_full_rnnt": nemo_rnnt / rnnt_full if rnnt_full and nemo_rnnt else None,
        "speedup_vs_nemo_full_tdt": nemo_tdt / tdt_full if tdt_full and nemo_tdt else None,
        "min_speedup_vs_nemo": dict(MIN_SPEEDUP_OVER_NEMO), "full_graph_rows_vs_nemo": len(full),
        "speedup_vs_nemo_missed": misses, "nemo_fp32_rows": len(nemo32), "nemo_fp32_rows_unequal": unequal,
        "goal": f"{target_method} >= " + ", ".join(f"{k.upper()} {v:g}x" for k, v in MIN_SPEEDUP_OVER_NEMO.items())
                + " NeMo's full graph at every size; NeMo's hypotheses equal to ours in fp32",
    }
    if target_method != "label-looping full":  # reported, not judged
        torch_full, torch_misses = _vs_nemo(rows, "label-looping full")
        targets["torch_stages"] = {"method": "label-looping full", "rnnt_full_s": _b16_median(rows, "rnnt", "label-looping full"),
                                   "tdt_full_s": _b16_median(rows, "tdt", "label-looping full"),
                                   "full_graph_rows_vs_nemo": len(torch_full), "speedup_vs_nemo_missed": torch_misses}
    if misses:
        failures.append(f"{target_method} below the NeMo target at {len(misses)} of {len(full)} sizes: {misses}")
    if not nemo32:
        failures.append("no fp32 NeMo row to compare hypotheses with")
    if not smoke and not full:
        failures.append(f"no {target_method} row with a NeMo time to compare with")
    return targets


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
        if nemo:
            params_extra = {"breakdown_batches": grid.breakdown_batches,
                            "passes": "first at every size: " + ", ".join(method_name(*m) for m in NEMO_TARGET_METHODS)
                            + "; then " + ", ".join(method_name(*m) for m in NEMO_BREAKDOWN_EVERYWHERE)
                            + " at every size and " + ", ".join(method_name(*m) for m in NEMO_BREAKDOWN_METHODS)
                            + " at the breakdown batches"}
        else:
            params_extra = {}
        params = {"vocab": VOCAB, "predictor": PRED, "joint": JOINT, "encoder_dim": ENC, "frame_s": FRAME_S,
                  "tdt_durations": TDT_DURATIONS, "batches": grid.batches, "frames": grid.frame_counts,
                  "dtypes": [str(d)[6:] for d in grid.dtypes], "max_symbols": 10, "quick": quick,
                  "tf32": False, "smoke": smoke, "blank_window": W, "target_method": target_method,
                  "default_kernels": label_looping.resolve_kernels("auto", device=device)[1],
                  "weights": "NeMo's RNNTDecoder and RNNTJoint, random" if nemo else "workbench toy transducer, random",
                  "calibration": "blank bias bisected per row (model, dtype, B, T) on that row's own input, "
                                 "towards 1/3 labels per frame",
                  "timing": "methods of one graph mode timed interleaved, call by call", **params_extra}
        if kernel_profile:
            params["kernel_profile"] = {
                "method": method_name(*profiled_method(device)), "dtype": "float32", "frames": grid.profile_frames,
                "batches": [b for b in grid.profile_batches if b in grid.batches],
                "how": "one more decode after every timed row, under torch.profiler (CPU and CUDA activities)"}
        if not nemo:
            params["speedup_note"] = "TDT rows are compared with RNN-T frame-looping off of the same batch and length"
        path = write_result(
            name, out_dir=out_dir,
            what=("SMOKE RUN (off modes, tiny shapes; not a measurement): " if smoke else "")
            + ("greedy RNN-T/TDT decoding loop (encoder output given), ours against NeMo 3.0.0 in the same process "
               "on NeMo's modules: seconds per batch, speedups, hypotheses compared" if nemo else
               "greedy RNN-T/TDT decoding loop (encoder output given): seconds per batch, audio s/s, speedups"),
            params=params, figures=figures)
        return path, figures

    path = None
    if outcome.context_lost:  # nothing more can run on this device: the record keeps what did
        outcome.skipped += [f"{d.case.tag}: rows run last (the CUDA context failed)" for d in outcome.deferred]
        outcome.skipped += [f"{p.case.tag}: kernel profile (the CUDA context failed)" for p in outcome.to_profile]
        outcome.deferred, outcome.to_profile = [], []
    if outcome.deferred:  # written before the rows that may poison the CUDA context
        pending = [d.case.tag for d in outcome.deferred]
        # if the process dies in the rows run last, the record on disk says they never finished
        path, _ = write([*outcome.failures, f"rows run last not finished (full-graph group): {pending}"])
        print(f"wrote {path}; running last: {pending}", flush=True)
        outcome.rows += measure_deferred(outcome)
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


def live_speed_record(batches=(1, 4), frames: int = 20, repeat: int = 2, blank_bias: float = 4.0) -> dict[str, Any]:
    """A small measurement of the decoding table on this machine (CPU: eager modes only), in the record's
    shape: toy models (vocabulary 64), ``frames`` encoder frames per utterance, ``repeat`` timed calls."""
    device = bench_device()
    modes = ["off", "partial", "full"] if device.type == "cuda" else ["off"]
    rows = []
    for model, durations in (("rnnt", None), ("tdt", [0, 1, 2, 3, 4])):
        predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=64,
                                               durations=durations, blank_bias=blank_bias, logit_scale=4.0,
                                               device=device)
        for b in batches:
            enc = torch.randn(b, frames, 32, device=device)
            lengths = torch.full((b,), frames, device=device)
            methods = [("frame_looping", "off")] if durations is None else []
            base = None
            fused_rows = [(FUSED, m) for m in modes] if label_looping.resolve_kernels("auto", device=device)[0] != "torch" else []
            for algorithm, mode in methods + [("label_looping", m) for m in modes] + fused_rows:
                dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations,
                                              algorithm="label_looping" if algorithm == FUSED else algorithm,
                                              cuda_graphs=mode, kernels="triton_cudnn" if algorithm == FUSED else "torch")
                hyps = dec(enc, lengths)  # also the warm-up (and the graph capture)
                stats = dict(dec.last_stats)
                t = timed(lambda: dec(enc, lengths), repeat=repeat, warmup=0, device=device)
                base = t["median"] if algorithm == "frame_looping" else base
                row = {"model": model, "dtype": "float32", "batch": b, "audio_seconds": frames * FRAME_S,
                       "method": method_name(algorithm, mode), "time_s": t,
                       "audio_s_per_s": b * frames * FRAME_S / t["median"],
                       "speedup_vs_frame_looping_off": None if base is None else base / t["median"],
                       "labels_per_frame": sum(len(h.tokens) for h in hyps) / (b * frames)}
                if "outer_iterations" in stats:
                    row["seconds_per_outer_iteration"] = t["median"] / max(1, stats["outer_iterations"])
                    row["outer_iterations"] = stats["outer_iterations"]
                rows.append(row)
    return {"figures": {"rows": rows, "empty_while_iteration": {"seconds_per_iteration": None}}}


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
