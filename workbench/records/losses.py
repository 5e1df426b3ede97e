"""The losses bench's record: its schema, the ratios and targets read from it, its summary lines and table.

A record's ``figures`` are :class:`LossesRecord` as a dict. Times are seconds of one forward + backward
(loss and the gradient w.r.t. the logits) as :func:`benchmarks.harness.summarize` dicts; memory is
the peak allocated above what was allocated before the call (the inputs), in bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

TDT_OVER_RNNT_LIMIT = 1.3  # the target: our TDT loss within 1.3x our RNN-T loss's time
FUSED_JOINT_MEMORY_LIMIT = 0.1  # the targets: the fused joint + loss at most 1/10 of the materialized path's memory
FUSED_JOINT_TIME_LIMIT = 0.5    # and at most half its time


@dataclass
class LossRun:
    """One loss implementation on one shape."""
    impl: str                            # ours-rnnt | ours-tdt | torchaudio-rnnt
    shape: list[int]                     # [B, T, U, V]: batch, frames, labels, vocabulary (blank not counted)
    dtype: str                           # logits dtype
    backend: str                         # ours: loss_backend's reason line; torchaudio: "torchaudio"
    logit_elements: int                  # B * T * (U + 1) * classes
    time_s: dict | None = None           # forward + backward, summarize() of the repeats
    peak_above_inputs_bytes: int | None = None  # None off a GPU
    loss_sum: float | None = None        # summed loss of the measured logits
    error: str | None = None             # why it did not run (e.g. torchaudio past 2**31 elements)
    in_subprocess: bool = False          # run by worker.py (an illegal memory access cannot poison this run)
    kernel_work: list[dict] | None = None  # ours: cost.kernel_work per launch (bytes, sequential steps)
    kernels: dict | None = None          # ours on CUDA: one profiled call's kernels (benchmarks.profiling.top_kernels)


@dataclass
class Agreement:
    """Ours vs torchaudio on the same fp32 logits, and each one's gradient error against float64."""
    shape: list[int]
    max_rel_loss_diff: float
    max_abs_grad_diff: float
    agree: bool
    our_grad_error_vs_fp64: float | None = None
    their_grad_error_vs_fp64: float | None = None


@dataclass
class ChunkedStep:
    """One training step (forward + loss + backward) of a transducer model with a joint chunk size."""
    model: str
    batch_size: int
    duration_s: float
    num_tokens: int
    dtype: str
    joint_chunk_size: int                # 0: the whole batch's joint at once
    joint_loss: str = "materialized"     # "fused": the joint's output layer and the loss in tiles, no logits
    step_s: dict | None = None
    host_s: dict | None = None           # wall seconds until the step's call returns, the device idle before it
    peak_bytes: int | None = None        # max_memory_allocated over the steps (None off a GPU)
    loss: float | None = None
    error: str | None = None
    kernels: dict | None = None          # one more step profiled: benchmarks.profiling.top_kernels's ranking


@dataclass
class JointLossRun:
    """The joint and loss alone on a reference model's encoder and predictor outputs: forward + backward to
    the gradients of those outputs and of the joint's weights."""
    impl: str                            # materialized (logits, then our loss) | fused | torchaudio (fp32 logits)
    model: str
    batch_size: int
    duration_s: float
    num_tokens: int
    frames: int                          # T, the encoder's frames
    outputs: int                         # the joint's outputs (V + 1, plus durations)
    logit_elements: int                  # B * T * (U + 1) * outputs: what the materialized path builds
    dtype: str                           # the joint's (autocast) dtype
    time_s: dict | None = None
    peak_above_inputs_bytes: int | None = None  # None off a GPU
    loss: float | None = None
    max_rel_loss_diff: float | None = None   # against the materialized path's, on the same inputs
    max_rel_grad_diff: float | None = None   # largest |difference| / largest |gradient| over enc, pred, weights
    error: str | None = None
    gemm_flops: float | None = None      # the output layer's GEMMs over every node (3 passes; fused: 4)
    gemm_flops_per_s: float | None = None  # that layer's rate as one GEMM of 2**20 rows, in the same run
    kernels: dict | None = None          # CUDA kernels by device time (benchmarks.profiling.top_kernels)


@dataclass
class RowsComparison:
    """Our RNN-T loss (forward + backward) with one lattice node per program of the per-node kernels against
    the tiles it takes by default, on the same logits, timed alternately in one run."""
    shape: list[int]                     # [B, T, U, V]
    dtype: str                           # logits dtype
    backend: str                         # loss_backend's reason line (the torch backend has no kernels)
    default_rows: int                    # nodes per program by default (losses_triton.node_rows)
    one_row_s: dict | None = None        # summarize() of the one-row calls
    default_rows_s: dict | None = None   # summarize() of the default-tile calls
    default_over_one_row: float | None = None  # median time ratio (below 1: the tiles are faster)
    by_rows_s: dict | None = None        # nodes per program (str) -> summarize() of its calls, the sweep's too
    error: str | None = None


@dataclass
class LossesRecord:
    smoke: bool
    runs: list[LossRun] = field(default_factory=list)
    agreements: list[Agreement] = field(default_factory=list)
    chunked: list[ChunkedStep] = field(default_factory=list)
    rows: list[RowsComparison] = field(default_factory=list)
    joint: list[JointLossRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

    def to_figures(self) -> dict:
        """The JSON figures: the fields, plus the ratios and targets read from them."""
        figures = dataclasses.asdict(self)
        figures["ratios"] = ratios(figures)
        figures["targets"] = targets(figures)
        return figures


def _run(figures: dict, impl: str, shape: list[int], dtype: str = "float32") -> dict | None:
    return next((r for r in figures["runs"] if r["impl"] == impl and list(r["shape"]) == list(shape)
                 and r["dtype"] == dtype), None)


def _median(run: dict | None) -> float | None:
    return _median_of(run["time_s"]) if run else None


def _median_of(summary: dict | None) -> float | None:
    return summary["median"] if summary else None


def ratios(figures: dict) -> dict:
    """Per shape: ours/torchaudio time and memory, TDT/RNN-T time; per chunk size, and for the fused joint
    and loss: memory and time against the unchunked step. None where a side did not run or memory was not
    measured."""
    out: dict = {"ours_over_torchaudio": [], "tdt_over_rnnt": [], "chunked_over_whole": []}
    for run in (r for r in figures["runs"] if r["impl"] == "ours-rnnt" and r["dtype"] == "float32"):
        shape = run["shape"]
        theirs = _run(figures, "torchaudio-rnnt", shape)
        if theirs is not None:
            out["ours_over_torchaudio"].append({
                "shape": shape, "time": _ratio(_median(run), _median(theirs)),
                "memory": _ratio(run["peak_above_inputs_bytes"], theirs["peak_above_inputs_bytes"])})
        tdt = _run(figures, "ours-tdt", shape)
        if tdt is not None:
            out["tdt_over_rnnt"].append({"shape": shape, "time": _ratio(_median(tdt), _median(run))})
    def fused(step: dict) -> bool:
        return step.get("joint_loss") == "fused"
    whole = {(s["model"], s["batch_size"], s["dtype"]): s for s in figures["chunked"]
             if s["joint_chunk_size"] == 0 and not fused(s)}
    for step in (s for s in figures["chunked"] if s["joint_chunk_size"] > 0 or fused(s)):
        base = whole.get((step["model"], step["batch_size"], step["dtype"]))
        if base is not None:
            key = "fused_over_whole" if fused(step) else "chunked_over_whole"
            out.setdefault(key, []).append({
                "model": step["model"], "batch_size": step["batch_size"], "joint_chunk_size": step["joint_chunk_size"],
                "time": _ratio(_median_of(step["step_s"]), _median_of(base["step_s"])),
                "peak_memory": _ratio(step["peak_bytes"], base["peak_bytes"])})
    out["joint_over_materialized"] = joint_ratios(figures.get("joint", []))
    return out


def joint_ratios(runs: list[dict]) -> list[dict]:
    """Per joint + loss shape, each other implementation's time and peak memory over the materialized path's."""
    def key(run):
        return run["model"], run["batch_size"], run["duration_s"], run["num_tokens"], run["dtype"]
    base = {key(r): r for r in runs if r["impl"] == "materialized" and not r["error"]}
    out = []
    for run in runs:
        ref = base.get(key(run))
        if run["impl"] == "materialized" or ref is None or run["error"]:
            continue
        out.append({"impl": run["impl"], "model": run["model"], "batch_size": run["batch_size"],
                    "duration_s": run["duration_s"], "num_tokens": run["num_tokens"], "dtype": run["dtype"],
                    "time": _ratio(_median_of(run["time_s"]), _median_of(ref["time_s"])),
                    "memory": _ratio(run["peak_above_inputs_bytes"], ref["peak_above_inputs_bytes"]),
                    "gemm_floor": _ratio(gemm_floor_seconds(run), _median_of(ref["time_s"]))})
    return out


def gemm_floor_seconds(run: dict) -> float | None:
    """The least time a joint + loss run can take: its output-layer GEMMs at the rate measured beside it; None
    without that rate, or where the run took less (the rate's GEMM ran slower than the run's, so it bounds
    nothing)."""
    flops, rate = run.get("gemm_flops"), run.get("gemm_flops_per_s")
    if not flops or not rate:
        return None
    measured = _median_of(run.get("time_s"))
    return None if measured is not None and flops / rate > measured else flops / rate


def _ratio(a, b) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def targets(figures: dict) -> dict:
    """The targets, each True / False, or None where the figures to decide are missing."""
    r = ratios(figures) if "ratios" not in figures else figures["ratios"]
    compared = [x for x in r["ours_over_torchaudio"] if x["time"] is not None]

    def all_at_most(values, limit):
        values = [v for v in values if v is not None]
        return None if not values else all(v <= limit for v in values)

    fused = [x for x in r.get("joint_over_materialized", []) if x["impl"] == "fused"]
    large = [run for run in figures["runs"] if run["logit_elements"] > 2**31 and run["impl"] == "ours-rnnt"]
    large_theirs = [run for run in figures["runs"] if run["logit_elements"] > 2**31 and run["impl"] == "torchaudio-rnnt"]
    return {
        "rnnt_time_at_most_torchaudio": all_at_most([x["time"] for x in compared], 1.0),
        "rnnt_memory_at_most_torchaudio": all_at_most([x["memory"] for x in compared], 1.0),
        "tdt_within_1.3x_rnnt": all_at_most([x["time"] for x in r["tdt_over_rnnt"]], TDT_OVER_RNNT_LIMIT),
        "ours_past_2_31_elements": (all(run["error"] is None for run in large) if large else None),
        "torchaudio_past_2_31_elements": (all(run["error"] is None for run in large_theirs) if large_theirs
                                          else None),
        "fused_joint_memory_at_most_tenth": all_at_most([x["memory"] for x in fused], FUSED_JOINT_MEMORY_LIMIT),
        "fused_joint_time_at_most_half": all_at_most([x["time"] for x in fused], FUSED_JOINT_TIME_LIMIT),
    }


def _ms(run: dict | None, error_chars: int = 60) -> str:
    if not run or run.get("error"):
        return f"failed ({run['error'][:error_chars]})" if run else "-"
    t = run["time_s"]
    return f"{t['median'] * 1e3:.2f} ms ({t['min'] * 1e3:.2f}-{t['max'] * 1e3:.2f})" if t else "-"


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


def _step_setting(step: dict) -> str:
    fused = " joint_loss=fused" if step.get("joint_loss") == "fused" else ""
    return f"joint_chunk_size={step['joint_chunk_size']}{fused}"


def _step_result(step: dict) -> str:
    if step["error"]:
        return f"failed ({step['error'][:60]})"
    out = f"{step['step_s']['median'] * 1e3:.1f} ms, peak {_gib(step['peak_bytes'])}"
    kernels = step.get("kernels") or {}
    if kernels.get("total_s"):  # the profiled step's summed kernel time: what the GPU did of the wall time
        out += f"; GPU kernels {kernels['total_s'] * 1e3:.1f} ms ({kernels['total_s'] / step['step_s']['median']:.0%})"
    if step.get("host_s"):  # near the step's time: the host's launches (or a wait for the GPU) set the pace
        out += f"; host {step['host_s']['median'] * 1e3:.1f} ms to launch"
    return out


def summary_lines(figures: dict) -> list[str]:
    """Markdown lines for benchmarks/SUMMARY.md (each quotes a field of the record)."""
    out = []
    for run in figures["runs"]:
        b, t, u, v = run["shape"]
        where = ", subprocess" if run["in_subprocess"] else ""
        out.append(f"- {run['impl']} {run['dtype']} B={b} T={t} U={u} V={v} ({run['logit_elements']:.3g} logits"
                   f"{where}): {_ms(run)}, {_gib(run['peak_above_inputs_bytes'])} above inputs")
    for a in figures["agreements"]:
        out.append(f"- ours vs torchaudio at {a['shape']}: max relative loss difference {a['max_rel_loss_diff']:.2e}, "
                   f"max gradient difference {a['max_abs_grad_diff']:.2e}"
                   + (f"; gradient error vs float64: ours {a['our_grad_error_vs_fp64']:.2e}, torchaudio "
                      f"{a['their_grad_error_vs_fp64']:.2e}" if a.get("our_grad_error_vs_fp64") is not None else "")
                   + f" (agree: {a['agree']})")
    for step in figures["chunked"]:
        out.append(f"- {step['model']} {step['dtype']} B={step['batch_size']} {step['duration_s']:g} s "
                   f"U={step['num_tokens']} {_step_setting(step)}: {_step_result(step)}")
    out += [f"- {rows_line(c)}" for c in figures.get("rows", [])]  # absent when the rows part did not run
    out += [f"- {joint_line(run, figures)}" for run in figures.get("joint", [])]
    out.append(f"- targets: {figures['targets']}")
    out.append(f"- failures: {figures['failures'] or 'none'}")
    return out


def rows_line(comparison: dict) -> str:
    """One rows comparison: "ours-rnnt rows per program bf16 B=.. T=.. U=.. V=..: 1 row X, N rows (default) Y,
    the ratio; other rows: R: Z, ..."."""
    c = comparison
    b, t, u, v = c["shape"]
    head = f"ours-rnnt rows per program {c['dtype']} B={b} T={t} U={u} V={v}"
    if c["error"]:
        return f"{head}: failed ({c['error'][:60]})"
    ratio = "-" if c["default_over_one_row"] is None else f"{c['default_over_one_row']:.2f}"
    others = [f"{rows}: {_ms({'time_s': t})}" for rows, t in (c.get("by_rows_s") or {}).items()
              if int(rows) not in (1, c["default_rows"])]
    return (f"{head}: 1 row {_ms({'time_s': c['one_row_s']})}, {c['default_rows']} rows (default) "
            f"{_ms({'time_s': c['default_rows_s']})}, {c['default_rows']} rows / 1 row {ratio}"
            + (f"; other rows {', '.join(others)}" if others else "") + f" ({c['backend']})")


def joint_line(run: dict, figures: dict) -> str:
    """One joint + loss run: "joint + loss <impl> model B=.. s U=..: time, memory above inputs; ratios to the
    materialized path; differences from it"."""
    head = (f"joint + loss {run['impl']} {run['model']} {run['dtype']} B={run['batch_size']} {run['duration_s']:g} s "
            f"U={run['num_tokens']} ({run['logit_elements']:.3g} logits)")
    if run["error"]:
        return f"{head}: {run['error'][:80]}"
    out = f"{head}: {_ms(run)}, {_gib(run['peak_above_inputs_bytes'])} above inputs"
    def shape(x):
        return x["model"], x["batch_size"], x["duration_s"], x["num_tokens"], x.get("dtype", run["dtype"])
    computed = figures.get("ratios", {}).get("joint_over_materialized")  # absent in a record before the part
    ratio = next((x for x in (computed if computed is not None else joint_ratios(figures.get("joint", [])))
                  if x["impl"] == run["impl"] and shape(x) == shape(run)), None)
    if ratio:
        parts = [f"{k} {ratio[k]:.2f}x" for k in ("time", "memory") if ratio[k] is not None]
        out += f"; {', '.join(parts)} the materialized path's" if parts else ""
    if run["max_rel_loss_diff"] is not None:
        out += (f"; loss differs by {run['max_rel_loss_diff']:.1e} (relative), gradients by "
                f"{run['max_rel_grad_diff']:.1e} of their largest")
    floor = gemm_floor_seconds(run)
    if floor is not None:
        out += (f"; its {run['gemm_flops'] / 1e12:.2f} TFLOP of output-layer GEMMs take at least "
                f"{floor * 1e3:.2f} ms at {run['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s")
        if ratio and ratio.get("gemm_floor") is not None:
            out += f" ({ratio['gemm_floor']:.2f}x the materialized path's time)"
    elif run.get("gemm_flops") and run.get("gemm_flops_per_s"):
        out += (f"; its {run['gemm_flops'] / 1e12:.2f} TFLOP of output-layer GEMMs ran faster than the "
                f"{run['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s measured beside it, so that rate gives no floor")
    return out


def kernel_line(run: dict, top: int = 4) -> str:
    """One run's profiled kernels: "impl dtype shape: name ms (share), ..." for the ``top`` largest."""
    kernels = ", ".join(f"{k['name'][:40]} {k['self_s'] * 1e3:.3f} ms ({k['share']:.0%})"
                        for k in run["kernels"]["top"][:top])
    shape = (",".join(map(str, run["shape"])) if "shape" in run else
             f"joint + loss {run['model']} B={run['batch_size']} {run['duration_s']:g} s U={run['num_tokens']}")
    return f"{run['impl']} {run['dtype']} {shape} kernels: {kernels}"


def table(figures: dict) -> str:
    """Plain-text tables: the loss runs (one line per shape, side by side), then the chunked-joint steps."""
    shapes = []
    for run in figures["runs"]:
        if list(run["shape"]) not in shapes:
            shapes.append(list(run["shape"]))
    columns = [("ours rnnt", "ours-rnnt", "float32"), ("ours rnnt bf16", "ours-rnnt", "bfloat16"),
               ("torchaudio", "torchaudio-rnnt", "float32"), ("ours tdt", "ours-tdt", "float32")]
    header = f"{'shape B,T,U,V':<18}" + "".join(f"{name:>28}" for name, _, _ in columns) + f"{'mem ours/ta':>13}"
    lines = [header, "-" * len(header)]
    for shape in shapes:
        ours, theirs = _run(figures, "ours-rnnt", shape), _run(figures, "torchaudio-rnnt", shape)
        memory = _ratio(ours and ours["peak_above_inputs_bytes"], theirs and theirs["peak_above_inputs_bytes"])
        lines.append(f"{','.join(map(str, shape)):<18}"
                     + "".join(f" {_ms(_run(figures, impl, shape, dtype), 16):>27}" for _, impl, dtype in columns)
                     + f"{'-' if memory is None else f'{memory:.2f}':>13}")
    lines += [kernel_line(run) for run in figures["runs"] if run.get("kernels") and run["kernels"].get("top")]
    lines += [rows_line(c) for c in figures.get("rows", [])]
    for step in figures["chunked"]:
        lines.append(f"{step['model']} B={step['batch_size']} {_step_setting(step)}: {_step_result(step)}")
    lines += [joint_line(run, figures) for run in figures.get("joint", [])]
    lines += [kernel_line(run) for run in figures.get("joint", []) if run.get("kernels") and run["kernels"].get("top")]
    return "\n".join(lines)
