"""The decoding records (``benchmarks/results/decoding*.json``): their fields and every reading of them.

``figures["rows"]``: one row per (model, dtype, B, T, method) with ``time_s`` (seconds per batch: median,
min, max, p25, p75, n), audio seconds per second, label-looping iteration counts, labels per frame and
agreement with label-looping off; our graph rows also ``graph_nodes`` (nodes and kernels per captured
stage) and ``kernels_per_outer_iteration``. ``decoding.json`` (our toy transducer): speedups over RNN-T
frame-looping off, and ``targets`` at B=16, 12 s, fp32. ``decoding_nemo.json`` (NeMo's modules, NeMo's
decoders measured in the same run): ``speedup_vs_nemo`` on our rows (NeMo's seconds over ours in the
same graph mode, and ``speedup_vs_nemo_method`` the NeMo row it is against), ``peer`` (NeMo's version)
and ``targets`` against NeMo at every size. ``targets["target_method"]`` names the method the targets judge
(the full graph with the default kernels: "label-looping fused full" on CUDA), ``targets["torch_stages"]``
the torch stages' full graph beside it; rows name the ``reference_method`` they were checked against and,
where they differ, carry ``first_difference``. A run with --kernel-profile puts ``kernel_profile``
(:class:`KernelProfile`) on the rows it profiled.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypedDict

import matplotlib.pyplot as plt
import pandas as pd

from workbench.records.results import load_result, times_faster
from workbench.decoding.methods import DecoderMethod
from workbench.palette import BUDGET_COLOUR, colour

TORCH_FULL = DecoderMethod("label_looping", "full").label  # the torch stages' full graph, reported beside a target judged on other kernels

NAME = "decoding"  # decoding*.json


class TorchStagesTargets(TypedDict, total=False):
    method: str  # "label-looping full": the torch stages' full graph, reported beside the target method
    rnnt_full_s: float | None
    tdt_full_s: float | None
    full_graph_rows_vs_nemo: int
    speedup_vs_nemo_missed: list[str]
    full_speedup_vs_frame_looping_off_rnnt: float | None


class DecodingTargets(TypedDict, total=False):
    target_method: str  # the method judged: the full graph with the default kernels
    torch_stages: TorchStagesTargets  # where the target method is not the torch stages' full graph
    rnnt_full_s: float | None  # our RNN-T full graph, B=16, 12 s, fp32, seconds per batch
    tdt_full_s: float | None
    full_speedup_vs_frame_looping_off_rnnt: float | None  # decoding.json
    nemo_rnnt_full_s: float | None  # decoding_nemo.json: NeMo's full graph, B=16, 12 s, fp32
    nemo_tdt_full_s: float | None
    speedup_vs_nemo_full_rnnt: float | None  # NeMo's seconds over ours: > 1 means we are faster
    speedup_vs_nemo_full_tdt: float | None
    min_speedup_vs_nemo: dict[str, float]  # model -> target ratio at every size
    full_graph_rows_vs_nemo: int
    speedup_vs_nemo_missed: list[str]  # the sizes below the target
    nemo_fp32_rows: int
    nemo_fp32_rows_unequal: list[str]  # NeMo rows whose fp32 hypotheses differ from ours
    goal: str


class KernelEntry(TypedDict):
    name: str  # the kernel's shortened name (kernel_profile.short_kernel_name)
    calls: int
    seconds: float  # total over the profiled decode
    share: float  # of total_s
    seconds_per_outer_iteration: float | None  # seconds / the decode's outer iterations
    calls_per_outer_iteration: float | None


class KernelProfile(TypedDict, total=False):
    method: str  # the profiled decoder: the default kernels' partial graphs (CPU: eager)
    mode_used: str
    activities: str  # "CUDA kernels and copies, device time" (CPU: "CPU operators, self CPU time")
    outer_iterations: int | None
    total_s: float  # all entries together
    calls: int
    seconds_per_outer_iteration: float | None
    calls_per_outer_iteration: float | None
    kernels: list[KernelEntry]  # by seconds, largest first
    profiling_wall_s: float  # what profiling the decode took, the profiler's own work included
    equal_to_reference: bool | None  # the profiled decode's hypotheses against the row's reference
    timed_seconds_per_outer_iteration: dict[str, float]  # method -> its timed row's (this row, the full graph)
    empty: str  # why no kernel was recorded
    unavailable: str  # the profiler raised


class DecodingFigures(TypedDict, total=False):
    rows: list[dict[str, Any]]
    empty_while_iteration: dict[str, float]  # seconds_per_iteration of an empty conditional WHILE node
    calibration: dict[str, dict]  # row tag -> blank_bias, labels_per_frame
    peer: dict[str, str]  # decoding_nemo.json: which NeMo ran
    targets: DecodingTargets
    failures: list[str]
    skipped_for_time: list[str]


METHOD_ORDER = ["frame-looping off", "label-looping off", "label-looping fused off", "NeMo no graphs",
                "label-looping partial", "label-looping fused partial", "NeMo partial graphs",
                "label-looping full window 1", "label-looping full", "label-looping fused full",
                "label-looping fused full window 16", "NeMo full graph",
                "torchaudio RNNTBeamSearch beam 1"]


def method_order(methods) -> list[str]:
    """The methods present in ``methods``, in METHOD_ORDER's order, then any other in the order first seen."""
    present = list(dict.fromkeys(methods))
    return [m for m in METHOD_ORDER if m in present] + [m for m in present if m not in METHOD_ORDER]


def speed_table(record: dict[str, Any]) -> pd.DataFrame:
    """One row per (model, dtype, B, T, method): milliseconds, audio s/s, speedup, time per outer iteration."""
    rows = []
    for r in record["figures"]["rows"]:
        if "time_s" not in r:
            continue
        rows.append({"model": r["model"], "dtype": r["dtype"], "B": r["batch"], "audio_s": r["audio_seconds"],
                     "method": r["method"], "ms": r["time_s"]["median"] * 1e3,
                     "ms_p25": r["time_s"]["p25"] * 1e3, "ms_p75": r["time_s"]["p75"] * 1e3,
                     "audio_s_per_s": r["audio_s_per_s"],
                     "x_frame_looping_off": r.get("speedup_vs_frame_looping_off"),
                     "x_nemo": r.get("speedup_vs_nemo"), "x_nemo_against": r.get("speedup_vs_nemo_method"),
                     "outer_iterations": r.get("outer_iterations"),
                     "inner_iterations": r.get("inner_iterations"),
                     "kernels_per_outer_iteration": r.get("kernels_per_outer_iteration"),
                     "us_per_outer_iteration": (r["seconds_per_outer_iteration"] * 1e6
                                                if r.get("seconds_per_outer_iteration") else None),
                     "labels_per_frame": r.get("labels_per_frame")})
    df = pd.DataFrame(rows)
    if not df.empty:
        df["method"] = pd.Categorical(df["method"], method_order(df["method"]), ordered=True)
        df = df.sort_values(["model", "dtype", "audio_s", "B", "method"]).reset_index(drop=True)
    return df


def speed_pivot(table: pd.DataFrame, value: str = "ms") -> pd.DataFrame:
    """The speed table as a reader scans it: one row per (model, dtype, audio s, method), one column per
    batch size, ``value`` (default milliseconds per batch) rounded to 3 significant digits."""
    if table.empty:
        return table
    pivot = table.pivot_table(index=["model", "dtype", "audio_s", "method"], columns="B", values=value,
                              observed=True, aggfunc="first")
    pivot.columns = [f"B={b}" for b in pivot.columns]
    return pivot.map(lambda v: v if pd.isna(v) else float(f"{v:.3g}"))


def empty_iteration_seconds(record: dict[str, Any]) -> float | None:
    """Seconds of one empty conditional-while iteration, None when it was not measured."""
    value = record["figures"]["empty_while_iteration"].get("seconds_per_iteration")
    return None if value is None or math.isnan(value) else value


def graph_mode(method: str) -> str | None:
    """The palette's graph mode of a method name: "graphs off", "partial graphs", "full graph"; None for one
    without (torchaudio's beam search)."""
    known = DecoderMethod.of_label(method)
    return PALETTE_MODES[known.graph_mode] if known else None


PALETTE_MODES = {"off": "graphs off", "partial": "partial graphs", "full": "full graph"}


def _algorithm(method: str) -> str | None:
    known = DecoderMethod.of_label(method)
    return known.algorithm if known else None


def method_style(method: str, position: int = 0) -> dict[str, Any]:
    """How a method is drawn in every decoding chart: its colour says the graph mode (frame-looping and NeMo
    their own, ``workbench.palette``); its hatch, line style and marker say the variant (torch stages, fused
    kernels, fused with the LSTM step, a blank window); NeMo's bars are outlined in their graph mode's colour."""
    mode, known = graph_mode(method), DecoderMethod.of_label(method)
    if _algorithm(method) == "nemo":
        face, edge = colour("NeMo"), colour(mode) if mode else colour("NeMo")
        return dict(color=face, edgecolor=edge, linewidth=1.6, hatch="", linestyle="-", marker="P")
    if _algorithm(method) == "frame_looping":
        face = colour("frame-looping")
    elif mode is None:
        face = colour(method, fallback=position)
    else:
        face = colour(mode)
    hatch, linestyle, marker = "", "-", "o"
    kernels = known.kernels if known else "torch"
    if kernels == "triton":
        hatch, linestyle, marker = "xx", ":", "^"
    elif kernels == "triton_cudnn":
        hatch, linestyle, marker = "//", "--", "s"
    if known and known.own_window:
        hatch, linestyle, marker = hatch + "..", "-.", "D"
    return dict(color=face, edgecolor="white", linewidth=0.4, hatch=hatch, linestyle=linestyle, marker=marker)


MODEL_NAMES = {"rnnt": "RNN-T", "tdt": "TDT"}
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}


def speed_bars(table: pd.DataFrame, *, model: str = "rnnt", dtype: str = "float32", audio_s: float = 12.0):
    """Bar chart: milliseconds per batch (log scale) of each method measured at each batch size, with
    whiskers from the 25th to the 75th percentile; within a batch size the methods stand in METHOD_ORDER
    (graphs off, partial, full), a method not measured there leaves no gap."""
    sub = table[(table["model"] == model) & (table["dtype"] == dtype) & (table["audio_s"].round(1) == audio_s)]
    fig, ax = plt.subplots(figsize=(11, 3.8))
    methods = method_order(sub["method"])
    batches = sorted(sub["B"].unique())
    width = 0.85 / max(1, max((sub["B"] == b).sum() for b in batches) if batches else 1)
    drawn = set()
    for j, b in enumerate(batches):
        here = [m for m in methods if ((sub["B"] == b) & (sub["method"] == m)).any()]
        for k, method in enumerate(here):
            row = sub[(sub["B"] == b) & (sub["method"] == method)].iloc[0]
            style = method_style(method, methods.index(method))
            x = j + (k - (len(here) - 1) / 2) * width
            ax.bar(x, row["ms"], width, color=style["color"], edgecolor=style["edgecolor"],
                   linewidth=style["linewidth"], hatch=style["hatch"],
                   yerr=[[row["ms"] - row["ms_p25"]], [row["ms_p75"] - row["ms"]]], ecolor="#555555",
                   error_kw=dict(lw=0.8), label=None if method in drawn else method)
            drawn.add(method)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_yscale("log")
    ax.set_ylabel("ms per batch (median)")
    ax.set_title(f"{MODEL_NAMES.get(model, model)}, {DTYPE_NAMES.get(dtype, dtype)}, {audio_s:g} s utterances: "
                 "time per batch")
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: methods.index(labels[i]))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def iteration_breakdown(table: pd.DataFrame, empty_iteration_s: float | None, *, dtype: str = "float32",
                        audio_s: float = 12.0):
    """Microseconds per outer label-looping iteration for each method and batch size, one panel per model,
    against an empty conditional-while iteration (dashed)."""
    sub = table[(table["dtype"] == dtype) & (table["audio_s"].round(1) == audio_s)
                & table["us_per_outer_iteration"].notna()]
    models = sorted(sub["model"].unique()) or ["rnnt"]
    fig, axes = plt.subplots(1, len(models), figsize=(11, 3.8), sharey=True, squeeze=False)
    methods = method_order(sub["method"])
    for ax, model in zip(axes[0], models):
        for (method,), g in sub[sub["model"] == model].groupby(["method"], observed=True):
            style = method_style(method, methods.index(method))
            ax.plot(g["B"], g["us_per_outer_iteration"], color=style["color"], linestyle=style["linestyle"],
                    marker=style["marker"], markersize=5, label=method)
        if empty_iteration_s and not math.isnan(empty_iteration_s):
            ax.axhline(empty_iteration_s * 1e6, color=BUDGET_COLOUR, linestyle="--", lw=1,
                       label="empty while iteration")
        ax.set_xscale("log", base=2)
        batches = sorted(sub["B"].unique())
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_title(MODEL_NAMES.get(model, model))
    axes[0, 0].set_ylabel("µs per outer iteration")
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    ordered = [m for m in methods if m in handles] + [m for m in handles if m not in methods]
    fig.suptitle(f"Time per outer iteration, label-looping rows ({DTYPE_NAMES.get(dtype, dtype)}, {audio_s:g} s)")
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    fig.legend([handles[m] for m in ordered], ordered, fontsize=8, loc="upper left", bbox_to_anchor=(0.78, 0.9),
               frameon=False)
    return fig


def target_method(record_or_figures: dict[str, Any]) -> str:
    """The method a record's targets judge."""
    figures = record_or_figures.get("figures", record_or_figures)
    return figures["targets"]["target_method"]


def frame_looping_speedup_line(record: dict[str, Any]) -> str:
    """Our full graph over frame-looping without graphs (B=16, 12 s, fp32), from the record."""
    t = record["figures"]["targets"]
    ours = t.get("full_speedup_vs_frame_looping_off_rnnt")
    return (f"RNN-T {target_method(record)} vs frame-looping off: "
            f"{'not measured' if ours is None else f'{ours:.1f}x faster'} (goal: {t.get('goal', 'none recorded')})")


SPEED_RECORDS = ("decoding_nemo", "decoding", "decoding_quick")  # the fullest run first


def committed_speed_record(results_dir=None) -> dict[str, Any] | None:
    """The committed decoding record the speed tables come from: the run beside NeMo, else the whole grid, else
    the quick one; announced with its provenance (None, said in a line, when none is committed)."""
    from workbench.reporting import committed_result

    for name in SPEED_RECORDS:
        if load_result(name, results_dir) is not None:
            return committed_result(name, results_dir)
    print(f"No committed decoding result yet ({', '.join(SPEED_RECORDS)}): `bash scripts/gpu_run.sh decoding` "
          "on a GPU writes one.")
    return None


def committed_nemo_record(speed_record: dict[str, Any] | None, results_dir=None) -> dict[str, Any] | None:
    """The record of the NeMo comparison: ``speed_record`` when it has NeMo's rows, else the quick comparison
    (announced with its provenance), else None."""
    from workbench.reporting import committed_result

    if speed_record and has_nemo_rows(speed_record):
        return speed_record
    return committed_result("decoding_nemo_quick", results_dir)


def has_nemo_rows(record: dict[str, Any]) -> bool:
    return any(_algorithm(r.get("method", "")) == "nemo" for r in record["figures"]["rows"])


def nemo_comparison_table(record: dict[str, Any]) -> pd.DataFrame:
    """The target method (our full graph with the default kernels) against NeMo's, measured in the same run: one
    row per (model, dtype, audio s, B) with milliseconds per batch (3 significant digits; NaN where NeMo's full
    graph failed or the torch stages' full graph has no row), the ratio in words and the target. Empty for a
    record without NeMo rows."""
    if not has_nemo_rows(record):
        return pd.DataFrame()
    rows = record["figures"]["rows"]
    ms = {(r["model"], r["dtype"], r["batch"], r["frames"], r["method"]): r["time_s"]["median"] * 1e3
          for r in rows if "time_s" in r}
    targets = record["figures"]["targets"].get("min_speedup_vs_nemo", {})
    judged = target_method(record)
    out = []
    for r in rows:
        if r.get("method") != judged or "speedup_vs_nemo" not in r:
            continue
        shape = (r["model"], r["dtype"], r["batch"], r["frames"])
        target = targets.get(r["model"])
        torch_stages = {} if judged == TORCH_FULL else {
            "ours torch stages full graph (ms)": _round(ms.get((*shape, TORCH_FULL), math.nan))}
        out.append({"model": r["model"], "dtype": r["dtype"], "audio_s": r["audio_seconds"], "B": r["batch"],
                    "ours full graph (ms)": _round(ms[(*shape, judged)]), **torch_stages,
                    "NeMo full graph (ms)": _round(ms.get((*shape, "NeMo full graph"), math.nan)),
                    "NeMo partial graphs (ms)": _round(ms.get((*shape, "NeMo partial graphs"), math.nan)),
                    "ours vs NeMo": times_faster(r["speedup_vs_nemo"], r["speedup_vs_nemo_method"]),
                    "target": None if target is None else f">= {target:g}x",
                    "met": None if target is None else bool(r["speedup_vs_nemo"] >= target)})
    if not out:  # NeMo rows without a full graph of ours (a CPU smoke run)
        return pd.DataFrame()
    return pd.DataFrame(out).sort_values(["model", "dtype", "audio_s", "B"]).reset_index(drop=True)


def _round(value: float) -> float:
    """3 significant digits (NaN stays NaN)."""
    return value if value is None or math.isnan(value) else float(f"{value:.3g}")


def readable_speed_table(record: dict[str, Any]) -> pd.DataFrame:
    """The speed table as a reader scans it: one row per (model, dtype, utterance length, method), one column per
    batch size; each cell milliseconds per batch at 3 significant digits and, on our rows of a record with NeMo
    rows, how many times faster than NeMo's decoder in the same graph mode, written out."""
    table = speed_table(record)
    if table.empty:
        return table
    text = table.assign(
        length=table["audio_s"].map(lambda s: f"{s:g} s"),
        cell=[f"{_round(ms):g} ms" + ("" if pd.isna(x) else f", {times_faster(x, vs)}")
              for ms, x, vs in zip(table["ms"], table["x_nemo"], table["x_nemo_against"])])
    pivot = text.pivot_table(index=["model", "dtype", "length", "method"], columns="B", values="cell",
                             observed=True, aggfunc="first", sort=False)
    pivot.columns = [f"B={b}" for b in pivot.columns]
    return pivot[[f"B={b}" for b in sorted(table["B"].unique())]].fillna("")


def _spread(s: dict[str, float], scale: float = 1.0, unit: str = "s") -> str:
    """'6.24 s (6.23-6.46, n=3)' from a results.summarize() dict."""
    return (f"{s['median'] * scale:.4g} {unit} ({s['min'] * scale:.4g}-{s['max'] * scale:.4g}, "
            f"n={s.get('n', '?')})")


def _sizes_at_target(t: dict[str, Any]) -> str:
    """"5 of 6 sizes": of a method's full-graph rows with a NeMo ratio (targets' ``full_graph_rows_vs_nemo``),
    those not in its ``speedup_vs_nemo_missed``."""
    rows = t.get("full_graph_rows_vs_nemo", 0)
    return f"{rows - len(t.get('speedup_vs_nemo_missed', []))} of {rows} sizes"


def summary_lines(figures: DecodingFigures) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md."""
    t = figures["targets"]
    out = []
    judged = target_method(figures)
    if figures.get("peer"):
        for model, label in (("rnnt", "RNN-T"), ("tdt", "TDT")):
            ours, theirs = t.get(f"{model}_full_s"), t.get(f"nemo_{model}_full_s")
            if ours and theirs:
                out.append(f"- B=16, 12 s, fp32: {label} {judged} {ours * 1e3:.2f} ms, NeMo's "
                           f"{theirs * 1e3:.2f} ms ({times_faster(theirs / ours, 'NeMo')})")
        missed = t.get("speedup_vs_nemo_missed", [])
        out.append(f"- {judged} against NeMo's ({t.get('goal', '')}): "
                   f"{_sizes_at_target(t)} meet the target" + (f"; below: {'; '.join(missed)}" if missed else ""))
        not_judged = t.get("sizes_not_judged", [])
        if not_judged:
            out.append(f"- not judged against NeMo (no NeMo full-graph row, and it did not fail there): "
                       f"{'; '.join(not_judged)}")
        torch_stages = t.get("torch_stages")
        if torch_stages:
            out.append(f"- {torch_stages['method']} (the torch stages, reported, not judged): "
                       f"{_sizes_at_target(torch_stages)} at the target ratio")
        unequal = t.get("nemo_fp32_rows_unequal", [])
        out.append(f"- NeMo's fp32 hypotheses (tokens and frames) equal to ours in "
                   f"{t.get('nemo_fp32_rows', 0) - len(unequal)} of {t.get('nemo_fp32_rows', 0)} rows"
                   + (f"; differ: {'; '.join(unequal)}" if unequal else ""))
        out += [f"  - {line}" for line in difference_lines(figures)]
    elif None not in (t.get("rnnt_full_s"), t.get("tdt_full_s"), t.get("full_speedup_vs_frame_looping_off_rnnt")):
        frame = times_faster(t["full_speedup_vs_frame_looping_off_rnnt"], "frame-looping off")
        out.append(f"- B=16, 12 s, fp32: RNN-T {judged} {t['rnnt_full_s'] * 1e3:.2f} ms, TDT {judged} "
                   f"{t['tdt_full_s'] * 1e3:.2f} ms; RNN-T {judged} {frame}")
    for r in figures["rows"]:
        if r.get("batch") == 16 and r.get("frames") == 150 and "time_s" in r:
            extra = f", token disagreement {r['token_disagreement']:.3f}" if "token_disagreement" in r else ""
            if "speedup_vs_nemo" in r:
                extra += f", {times_faster(r['speedup_vs_nemo'], r['speedup_vs_nemo_method'])}"
            if "kernels_per_outer_iteration" in r:
                extra += f", {r['kernels_per_outer_iteration']:.1f} kernels per outer iteration"
            out.append(f"  - {r['model']} {r['dtype']} {r['method']}: {_spread(r['time_s'], 1e3, 'ms')}, "
                       f"{r['labels_per_frame']:.3f} labels/frame{extra}")
    for r in figures["rows"]:
        p = r.get("kernel_profile")
        if p and p.get("kernels"):
            top = ", ".join(f"{k['name'][:40]} {k['share']:.0%}" for k in p["kernels"][:3])
            out.append(f"  - kernel profile {r['model']} B={r['batch']} T={r['frames']} {p['method']}: "
                       f"{kernel_totals_text(p)}; largest: {top}")
    for r in figures["rows"]:
        if r.get("method", "").startswith("torchaudio") and "time_s" in r:
            out.append(f"  - torchaudio RNNTBeamSearch beam 1, B=1, {r['frames']} frames: "
                       f"{_spread(r['time_s'], 1e3, 'ms')}")
    out.append(f"- empty conditional-while iteration: {figures['empty_while_iteration']['seconds_per_iteration'] * 1e6:.2f}"
               f" us; failures: {figures['failures'] or 'none'}; skipped: {figures['skipped_for_time'] or 'none'}")
    return out


def difference_lines(figures: dict[str, Any], dtype: str = "float32") -> list[str]:
    """One line per row of ``dtype`` whose hypotheses differ from its reference: the row, then where (see
    :func:`describe_difference`). Empty for records without ``first_difference``."""
    return [f"{r['model']} B={r['batch']} T={r['frames']} {r['method']}: "
            f"{describe_difference(r['first_difference'], r.get('reference_method'))}"
            for r in figures["rows"] if r.get("first_difference") and r.get("dtype") == dtype]


def describe_difference(diff: dict[str, Any], reference_method: str | None = None) -> str:
    """One line for a row's ``first_difference``: where its hypotheses first depart from the reference's, and our
    joint's top-2 margins there (a small margin: a rounding near-tie)."""
    def side(token, frame):
        return "ended" if token is None else f"token {token} at frame {frame}"

    text = (f"utterance {diff['utterance']}, label {diff['label_index']}: {reference_method or 'reference'} "
            f"{side(diff['reference_token'], diff['reference_frame'])}, this row {side(diff['token'], diff['frame'])} "
            f"({diff['reference_labels']} vs {diff['labels']} labels)")
    if "top2_token_margin" in diff:
        text += (f"; our joint at frame {diff['at_frame']}: top-2 tokens {diff['top2_tokens']}, log-prob margin "
                 f"{diff['top2_token_margin']:.3g}")
        if "top2_duration_margin" in diff:
            text += f", top-2 durations {diff['top2_durations']}, margin {diff['top2_duration_margin']:.3g}"
    return text


def table_lines(figures: dict[str, Any]) -> list[str]:
    """The bench's stdout table: one line per timed row, then the empty iteration and the targets."""
    out = [f"\n{'model':5} {'dtype':8} {'B':>4} {'T':>4} {'method':28} {'ms':>9} {'audio s/s':>10} {'x frame':>8} "
           f"{'x NeMo':>7} {'us/outer':>9} {'outer':>6} {'inner':>6} {'lab/fr':>6} {'tok dis':>7}"]
    for r in figures["rows"]:
        if "time_s" not in r:
            continue
        per = r.get("seconds_per_outer_iteration")
        out.append(f"{r['model']:5} {r['dtype']:8} {r['batch']:>4} {r['frames']:>4} {r['method']:28} "
                   f"{r['time_s']['median'] * 1e3:9.2f} {r['audio_s_per_s']:10.0f} "
                   f"{r.get('speedup_vs_frame_looping_off', float('nan')):8.1f} "
                   f"{r.get('speedup_vs_nemo', float('nan')):7.2f} "
                   f"{'' if per is None else f'{per * 1e6:9.1f}'} "
                   f"{r.get('outer_iterations', ''):>6} {r.get('inner_iterations', ''):>6} "
                   f"{r.get('labels_per_frame', float('nan')):6.3f} {r.get('token_disagreement', float('nan')):7.3f}")
    targets = figures["targets"]
    out.append(f"empty while iteration: {figures['empty_while_iteration']['seconds_per_iteration'] * 1e6:.2f} us; "
               "targets: " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in targets.items() if k != "goal"))
    return out


def kernel_profile_lines(figures: dict[str, Any], top: int = 8) -> list[str]:
    """The kernel profiles of a record's rows (none: no line): per profiled row its totals per outer iteration
    beside the row's timed seconds per outer iteration, then its ``top`` kernels by time."""
    out = []
    for r in figures["rows"]:
        p = r.get("kernel_profile")
        if p is None:
            continue
        head = f"kernel profile, {r['model']} {r['dtype']} B={r['batch']} T={r['frames']} {p['method']}"
        if "unavailable" in p or "empty" in p:
            out.append(f"{head}: {p.get('unavailable') or p['empty']}")
            continue
        out.append(f"{head}: {p['activities']}, {kernel_totals_text(p)}")
        out.append(f"  {'kernel':60} {'calls':>7} {'ms':>8} {'share':>6} {'us/outer':>9}")
        for k in p["kernels"][:top]:
            per = k["seconds_per_outer_iteration"]
            out.append(f"  {k['name'][:60]:60} {k['calls']:>7} {k['seconds'] * 1e3:8.3f} {k['share']:6.1%} "
                       f"{'' if per is None else f'{per * 1e6:9.2f}'}")
        if len(p["kernels"]) > top:
            rest = p["kernels"][top:]
            out.append(f"  ({len(rest)} more: {sum(k['share'] for k in rest):.1%} of the time)")
    return out


def kernel_totals_text(profile: dict[str, Any]) -> str:
    """'412 outer iterations; per outer iteration 21.7 calls taking 38.2 us (timed: label-looping fused partial
    120.0 us, label-looping fused full 95.0 us)'."""
    per = profile.get("seconds_per_outer_iteration")
    if per is None:
        return f"{profile['calls']} calls taking {profile['total_s'] * 1e3:.3f} ms (no outer iteration counted)"
    timed = profile.get("timed_seconds_per_outer_iteration") or {}
    return (f"{profile['outer_iterations']} outer iterations; per outer iteration "
            f"{profile['calls_per_outer_iteration']:.1f} calls taking {per * 1e6:.1f} us"
            + (" (timed: " + ", ".join(f"{m} {s * 1e6:.1f} us" for m, s in timed.items()) + ")" if timed else ""))


def describe_targets(name: str, record: dict[str, Any]) -> str:
    """What the notebook prints above the comparison table: the record, what it compares, the failed checks."""
    f = record["figures"]
    peer = f.get("peer")
    what = (f"ours against {peer['name']} {peer['version']} in the same run ({peer['decoders']}; {peer['modules']})"
            if peer else frame_looping_speedup_line(record))
    return (f"{name}.json (commit {record['git_commit'][:8]}): {what}\n"
            f"the targets judge: {target_method(record)}"
            + (f" (the default kernels: {record['params']['default_kernels']})" if "default_kernels" in record.get(
                "params", {}) else "") + "\n"
            f"failed checks: {f['failures'] or 'none'}")


# What notebooks/04_decoding.ipynb shows, as a reader scans it: tables with human headers and sentences built
# from the record's figures.

def _times(ratio: float) -> str:
    """A speed ratio (their time over ours) in words, to the digits it carries: 7.14 -> '7.1× faster',
    1.03 -> '1.03× faster', 0.78 -> '1.3× slower'."""
    r = ratio if ratio >= 1 else 1 / ratio
    return f"{r:.{2 if r < 1.1 else 1}f}× {'faster' if ratio >= 1 else 'slower'}"


def speed_cells(record: dict[str, Any], dtype: str) -> pd.DataFrame:
    """The ``dtype`` rows of the speed table: one row per (model, utterance length, method), one column per
    batch size; each cell milliseconds per batch at 3 significant digits and, in brackets, how many times
    faster than NeMo's decoder in the same graph mode (records with NeMo rows) or than frame-looping without
    graphs (records without)."""
    table = speed_table(record)
    if table.empty:
        return table
    table = table[table["dtype"] == dtype]
    against = "x_nemo" if has_nemo_rows(record) else "x_frame_looping_off"
    cells = table.assign(
        Model=table["model"].map(lambda m: MODEL_NAMES.get(m, m)),
        Utterance=table["audio_s"].map(lambda s: f"{s:g} s"), Decoder=table["method"].astype(str),
        cell=[f"{_round(ms):g}" + ("" if pd.isna(x) or x is None or (against == "x_frame_looping_off" and
                                                                     _algorithm(m) == "frame_looping")
                                   else f" ({_times(x)})")
              for ms, x, m in zip(table["ms"], table[against], table["method"].astype(str))])
    pivot = cells.pivot_table(index=["Model", "Utterance", "Decoder"], columns="B", values="cell", aggfunc="first",
                              sort=False)
    by_method = cells.sort_values(["model", "audio_s", "method"])  # METHOD_ORDER within each length
    pivot = pivot.reindex(list(dict.fromkeys(zip(by_method["Model"], by_method["Utterance"], by_method["Decoder"]))))
    pivot = pivot[sorted(table["B"].unique())]
    pivot.columns = [f"batch {b}" for b in pivot.columns]
    return pivot.fillna("")


def styled_speed_table(record: dict[str, Any], dtype: str):
    """:func:`speed_cells` for display, captioned with what the brackets compare."""
    peer = record["figures"].get("peer")
    than = (f"{peer['name']} {peer['version']}'s decoder in the same graph mode" if has_nemo_rows(record) and peer
            else "NeMo's decoder in the same graph mode" if has_nemo_rows(record) else "frame-looping without graphs")
    return (speed_cells(record, dtype).style
            .set_caption(f"{DTYPE_NAMES.get(dtype, dtype)}: milliseconds per batch (median); in brackets, on our "
                         f"rows, how many times faster than {than}"))


def styled_nemo_comparison(record: dict[str, Any]):
    """:func:`nemo_comparison_table` for display: human headers with units, 3 significant digits, the target
    met as yes/no."""
    table = nemo_comparison_table(record)
    if table.empty:
        return table
    judged = target_method(record)
    table = table.assign(model=table["model"].map(lambda m: MODEL_NAMES.get(m, m)),
                         dtype=table["dtype"].map(lambda d: DTYPE_NAMES.get(d, d)),
                         target=table["target"].map(lambda t: "" if t is None else t.replace(">=", "≥").replace(
                             "x", "×")),
                         met=table["met"].map(lambda m: "" if m is None else "yes" if m else "no"),
                         **{"ours vs NeMo": table["ours vs NeMo"].str.replace(" than NeMo full graph", "")})
    table = table.rename(columns={
        "model": "Model", "dtype": "Precision", "audio_s": "Utterance (s)", "B": "Batch",
        "ours full graph (ms)": f"Ours: {judged} (ms)", "ours torch stages full graph (ms)": "Ours: torch stages "
        "full graph (ms)", "ours vs NeMo": "Ours against NeMo's full graph", "target": "Target", "met": "Met"})
    ms = [c for c in table.columns if c.endswith("(ms)")]
    return table.style.format({**{c: "{:.3g}" for c in ms}, "Utterance (s)": "{:g}"}, na_rep="").hide(axis="index")


def difference_table(figures: dict[str, Any], dtype: str = "float32") -> pd.DataFrame:
    """The rows of ``dtype`` whose hypotheses differ from their reference: where they first depart (utterance,
    label, each side's token and frame) and our joint's top-2 log-prob margin there (a small margin: a rounding
    near-tie). Empty for records without ``first_difference``."""
    def side(token, frame):
        return "ended" if token is None else f"{token} at frame {frame}"

    rows = [{"Model": MODEL_NAMES.get(r["model"], r["model"]), "Batch": r["batch"],
             "Utterance (s)": r["audio_seconds"], "Decoder": r["method"],
             "Checked against": r.get("reference_method") or "reference", "Utterance": d["utterance"],
             "Label": d["label_index"], "Reference token": side(d["reference_token"], d["reference_frame"]),
             "This row's token": side(d["token"], d["frame"]), "Top-2 log-prob margin": d.get("top2_token_margin")}
            for r in figures["rows"] if (d := r.get("first_difference")) and r.get("dtype") == dtype]
    return pd.DataFrame(rows)


def styled_differences(figures: dict[str, Any], dtype: str = "float32"):
    """:func:`difference_table` for display."""
    return (difference_table(figures, dtype).style.format({"Utterance (s)": "{:g}", "Top-2 log-prob margin": "{:.2g}"},
                                                          na_rep="").hide(axis="index"))


def _listed(text: str) -> str:
    """A failure line with its Python list of strings written out, separated by semicolons."""
    import ast

    def join(match):
        try:
            items = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError):
            return match.group(0)
        return "; ".join(map(str, items)) if all(isinstance(i, str) for i in items) else match.group(0)

    return re.sub(r"\[(?:'[^']*'(?:, )?|\"[^\"]*\"(?:, )?)+\]", join, text)


def describe_run(name: str, record: dict[str, Any]) -> str:
    """What the notebook prints above a record's tables, in sentences: what it compares, the method the targets
    judge, and the checks that failed, one per line."""
    f = record["figures"]
    peer = f.get("peer")
    kernels = record.get("params", {}).get("default_kernels")
    what = (f"{name}.json: our decoders against {peer['name']} {peer['version']}'s ({peer['decoders']}) on its "
            f"{peer['modules']}, timed in the same run." if peer else
            f"{name}.json: our decoders on our toy transducer, no NeMo rows; {frame_looping_speedup_line(record)}.")
    judge = f" The targets judge {target_method(record)}" + (f", the kernels a user gets by default ({kernels})."
                                                              if kernels else ".")
    failures = f.get("failures", [])
    return (what + judge + (f"\n{len(failures)} check(s) failed:" + "".join(f"\n  - {_listed(x)}" for x in failures)
                            if failures else "\nEvery check passed."))


def _at_16(record: dict[str, Any], model: str, method: str) -> dict[str, Any] | None:
    """The row of ``method`` at batch 16, 12 s, fp32 (the targets' size), None when not measured."""
    return next((r for r in record["figures"]["rows"] if r.get("model") == model and r.get("method") == method
                 and r.get("batch") == 16 and r.get("dtype") == "float32" and "time_s" in r
                 and round(r.get("audio_seconds", 0), 1) == 12.0), None)


def meaning_of_speed(record: dict[str, Any]) -> str:
    """What the speed tables mean: our full graph at the targets' size against NeMo's in the same run, or
    (records without NeMo rows) against frame-looping without graphs."""
    f, t = record["figures"], record["figures"]["targets"]
    ours, theirs = t.get("rnnt_full_s"), t.get("nemo_rnnt_full_s")
    head = (f"With CUDA graphs ({target_method(record)}) the label-looping RNN-T decoder runs a batch of 16 12-s "
            "utterances (fp32) in ")
    peer = f.get("peer")
    if peer and ours and theirs:
        text = f"{head}{ours * 1e3:.3g} ms, {_times(theirs / ours)} than {peer['name']} {peer['version']}'s in the same run"
        tdt, nemo_tdt = t.get("tdt_full_s"), t.get("nemo_tdt_full_s")
        if tdt and nemo_tdt:
            text += f"; the TDT decoder in {tdt * 1e3:.3g} ms, {_times(nemo_tdt / tdt)} than NeMo's"
        return text + "."
    frame = t.get("full_speedup_vs_frame_looping_off_rnnt")
    if ours and frame:
        return f"{head}{ours * 1e3:.3g} ms, {_times(frame)} than frame-looping without graphs."
    return "This record has no full-graph time at batch 16, 12 s, fp32, so it does not say how fast graphs decode."


def meaning_of_iterations(record: dict[str, Any]) -> str:
    """What the time per outer iteration means at the targets' size (RNN-T, batch 16, 12 s, fp32): the full
    graph's iteration against the same kernels without graphs, and the empty while-node's share of it."""
    judged = target_method(record)
    off_name = judged.replace(" full", " off").replace(" window 16", "")
    full, off = _at_16(record, "rnnt", judged), _at_16(record, "rnnt", off_name)
    if not full or not full.get("seconds_per_outer_iteration"):
        return "This record has no outer-iteration time for the full graph at batch 16, 12 s, fp32."
    full_us = full["seconds_per_outer_iteration"] * 1e6
    text = f"At batch 16 (RNN-T, 12 s, fp32) one outer iteration of {judged} takes {full_us:.0f} µs"
    if off and off.get("seconds_per_outer_iteration"):
        text += f" against {off['seconds_per_outer_iteration'] * 1e6:.0f} µs without graphs ({off_name})"
        if full.get("kernels_per_outer_iteration") and off.get("kernels_per_outer_iteration"):
            text += (f", launching {full['kernels_per_outer_iteration']:.0f} kernels per iteration instead of "
                     f"{off['kernels_per_outer_iteration']:.0f}")
    empty = empty_iteration_seconds(record)
    if empty:
        text += (f"; an empty conditional-while iteration costs {empty * 1e6:.1f} µs, "
                 f"{empty * 1e6 / full_us:.0%} of it")
    return text + "."


def _size_words(record: dict[str, Any], missed: str) -> str:
    """'rnnt float32 B=1 T=150: 3.26x NeMo full graph' -> 'RNN-T fp32 batch 1, 12 s (3.3×)'."""
    m = re.match(r"(\w+) (\w+) B=(\d+) T=(\d+): ([\d.]+)x", missed)
    if not m:
        return missed
    model, dtype, batch, frames, ratio = m.groups()
    seconds = next((r["audio_seconds"] for r in record["figures"]["rows"] if r.get("frames") == int(frames)
                    and "audio_seconds" in r), None)
    length = f", {seconds:g} s" if seconds else f", {frames} frames"
    return f"{MODEL_NAMES.get(model, model)} {DTYPE_NAMES.get(dtype, dtype)} batch {batch}{length} ({float(ratio):.1f}×)"


def meaning_of_nemo(record: dict[str, Any]) -> str:
    """What the comparison with NeMo means: at how many sizes the judged method meets its target, where it
    falls short, and how many of NeMo's fp32 hypotheses equal ours."""
    t = record["figures"]["targets"]
    rows, missed = t.get("full_graph_rows_vs_nemo", 0), t.get("speedup_vs_nemo_missed", [])
    goals = ", ".join(f"{MODEL_NAMES.get(m, m)} ≥ {v:g}×" for m, v in t.get("min_speedup_vs_nemo", {}).items())
    text = (f"{target_method(record)} meets its target against NeMo's full graph ({goals}) at {rows - len(missed)} "
            f"of {rows} sizes" + (f"; it falls short at {'; '.join(_size_words(record, x) for x in missed)}"
                                  if missed else "") + ".")
    if "nemo_fp32_rows" in t:
        equal = t["nemo_fp32_rows"] - len(t.get("nemo_fp32_rows_unequal", []))
        text += f" NeMo's fp32 hypotheses equal ours in {equal} of {t['nemo_fp32_rows']} rows."
    return text


def meaning_of_live(live: dict[str, Any], cuda: bool) -> str:
    """What the small live run shows on this machine: on a CPU which eager decoders ran (not their GPU speed);
    on a GPU the full graph against no graphs at the largest batch."""
    rows = [r for r in live["figures"]["rows"] if "time_s" in r]
    methods = method_order(r["method"] for r in rows)
    if not cuda:
        return (f"On this CPU only the eager decoders ran ({', '.join(methods)}) on a tiny model: the rows show that "
                "they run here, not how fast they are on a GPU; on a CUDA machine this section adds the partial- and "
                "full-graph rows.")
    batch = max(r["batch"] for r in rows)
    ms = {r["method"]: r["time_s"]["median"] for r in rows if r["model"] == "rnnt" and r["batch"] == batch}
    full, off = ms.get("label-looping full"), ms.get("label-looping off")
    if not (full and off):
        return f"On this GPU the decoders ran ({', '.join(methods)}); the tiny model's times are in the table."
    return (f"On this GPU the tiny RNN-T decoder's full graph takes {full * 1e3:.3g} ms at batch {batch} against "
            f"{off * 1e3:.3g} ms without graphs ({_times(off / full)}).")


def finding(record: dict[str, Any]) -> str:
    """The notebook's one line for the report's index."""
    f, t = record["figures"], record["figures"]["targets"]
    peer = f.get("peer")
    ratios = {m: t.get(f"speedup_vs_nemo_full_{m}") for m in ("rnnt", "tdt")}
    if peer and all(ratios.values()):
        rows, missed = t.get("full_graph_rows_vs_nemo", 0), t.get("speedup_vs_nemo_missed", [])
        return (f"With CUDA graphs our label-looping decoders run a batch of 16 12-s utterances "
                f"{_times(ratios['rnnt'])} (RNN-T) and {_times(ratios['tdt'])} (TDT) than {peer['name']} "
                f"{peer['version']}'s in the same run, meeting their targets at {rows - len(missed)} of {rows} sizes")
    return meaning_of_speed(record)
