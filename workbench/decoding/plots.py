"""Figures and tables for the decoding notebook, drawn from a benchmark record (benchmarks/results/decoding.json)."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

METHOD_ORDER = ["frame-looping off", "label-looping off", "label-looping partial", "label-looping full window 1",
                "label-looping full", "torchaudio RNNTBeamSearch beam 1"]


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
                     "outer_iterations": r.get("outer_iterations"),
                     "inner_iterations": r.get("inner_iterations"),
                     "us_per_outer_iteration": (r["seconds_per_outer_iteration"] * 1e6
                                                if r.get("seconds_per_outer_iteration") else None),
                     "labels_per_frame": r.get("labels_per_frame")})
    df = pd.DataFrame(rows)
    if not df.empty:
        df["method"] = pd.Categorical(df["method"], [m for m in METHOD_ORDER if m in set(df["method"])], ordered=True)
        df = df.sort_values(["model", "dtype", "audio_s", "B", "method"]).reset_index(drop=True)
    return df


def speed_bars(table: pd.DataFrame, *, model: str = "rnnt", dtype: str = "float32", audio_s: float = 12.0):
    """Bar chart: milliseconds per batch for each method and batch size (log scale), with IQR whiskers."""
    sub = table[(table["model"] == model) & (table["dtype"] == dtype) & (table["audio_s"].round(1) == audio_s)]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    methods = [m for m in METHOD_ORDER if m in set(sub["method"])]
    batches = sorted(sub["B"].unique())
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        m = sub[sub["method"] == method].set_index("B").reindex(batches)
        xs = [j + i * width for j in range(len(batches))]
        err = [m["ms"] - m["ms_p25"], m["ms_p75"] - m["ms"]]
        ax.bar(xs, m["ms"], width, yerr=err, label=method)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(batches))], [f"B={b}" for b in batches])
    return _finish(fig, ax, ylabel="ms per batch (median)", title=f"{model.upper()} {dtype}, {audio_s:g} s utterances")


def _finish(fig, ax, *, ylabel: str, title: str):
    """Log y axis, labels and a small legend: the common end of the speed figures."""
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def iteration_breakdown(table: pd.DataFrame, empty_iteration_s: float | None, *, dtype: str = "float32",
                        audio_s: float = 12.0):
    """Microseconds per outer label-looping iteration for each mode and B, against an empty while-node iteration."""
    sub = table[(table["dtype"] == dtype) & (table["audio_s"].round(1) == audio_s)
                & table["us_per_outer_iteration"].notna()]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for (model, method), g in sub.groupby(["model", "method"], observed=True):
        ax.plot(g["B"], g["us_per_outer_iteration"], marker="o", label=f"{model} {method}")
    if empty_iteration_s and not math.isnan(empty_iteration_s):
        ax.axhline(empty_iteration_s * 1e6, color="k", linestyle="--", label="empty while iteration")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    return _finish(fig, ax, ylabel="us per outer iteration", title=f"time per outer iteration ({dtype}, {audio_s:g} s)")


def live_speed_record(batches=(1, 4), frames: int = 20, repeat: int = 2, blank_bias: float = 4.0) -> dict[str, Any]:
    """A small measurement of the same table on this machine (CPU: eager modes only), in the record's shape."""
    import torch

    from workbench.bench.results import timer_for
    from workbench.decoding import GreedyTransducerDecoder, make_toy_transducer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ["off", "partial", "full"] if device == "cuda" else ["off"]
    rows = []
    for model, durations in (("rnnt", None), ("tdt", [0, 1, 2, 3, 4])):
        predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=64,
                                               durations=durations, blank_bias=blank_bias, logit_scale=4.0,
                                               device=device)
        for b in batches:
            enc = torch.randn(b, frames, 32, device=device)
            lengths = torch.full((b,), frames, device=device)
            methods = [("frame_looping", "off")] if durations is None else []
            methods += [("label_looping", m) for m in modes]
            base = None
            for algorithm, mode in methods:
                dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations,
                                              algorithm=algorithm, cuda_graphs=mode)
                hyps = dec(enc, lengths)  # also the warm-up (and the graph capture)
                stats = dict(dec.last_stats)
                t = timer_for(device)(lambda: dec(enc, lengths), repeat=repeat, warmup=0)
                name = f"{'frame' if algorithm == 'frame_looping' else 'label'}-looping {mode}"
                base = t["median"] if algorithm == "frame_looping" else base
                row = {"model": model, "dtype": "float32", "batch": b, "audio_seconds": frames * 0.08,
                       "method": name, "time_s": t, "audio_s_per_s": b * frames * 0.08 / t["median"],
                       "speedup_vs_frame_looping_off": None if base is None else base / t["median"],
                       "labels_per_frame": sum(len(h.tokens) for h in hyps) / (b * frames)}
                if "outer_iterations" in stats:
                    row["seconds_per_outer_iteration"] = t["median"] / max(1, stats["outer_iterations"])
                    row["outer_iterations"] = stats["outer_iterations"]
                rows.append(row)
    return {"figures": {"rows": rows, "empty_while_iteration": {"seconds_per_iteration": None}}}


def frame_looping_speedup_line(record: dict[str, Any]) -> str:
    """Ours and NeMo's full graph over frame-looping without graphs (B=16, 12 s, fp32), from the record."""
    t, nemo = record["figures"]["targets"], record["figures"]["nemo_reference"]
    ours = t.get("full_speedup_vs_frame_looping_off_rnnt")
    theirs = nemo["rnnt_frame_looping_no_graphs_s"] / nemo["rnnt_full_graph_s"]
    return (f"RNN-T full graph over frame-looping off: {'not measured' if ours is None else f'{ours:.1f}x'} "
            f"(NeMo 3.0.0: {theirs:.1f}x; goal: {t['goal']})")


def targets_table(record: dict[str, Any]) -> pd.DataFrame:
    """Our full graph at B=16, 12 s, fp32 against NeMo 3.0.0's published numbers (ratios > 1: we are faster)."""
    f = record["figures"]
    nemo, t = f["nemo_reference"], f["targets"]
    rows = [
        {"what": "RNN-T full graph (s)", "ours": t.get("rnnt_full_s"), "NeMo": nemo["rnnt_full_graph_s"]},
        {"what": "TDT full graph (s)", "ours": t.get("tdt_full_s"), "NeMo": nemo["tdt_full_graph_s"]},
    ]
    df = pd.DataFrame(rows)
    df["NeMo / ours"] = df["NeMo"] / df["ours"]
    df.attrs["source"] = nemo["source"]
    return df
