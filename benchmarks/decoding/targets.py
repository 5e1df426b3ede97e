"""Speedups on the rows (over frame-looping off, over NeMo) and the targets a run is judged by."""

from __future__ import annotations

from typing import Any, Callable

from workbench.records.decoding import TORCH_FULL
from benchmarks.decoding.methods import FRAME_LOOPING_OFF
from benchmarks.decoding.methods import nemo as nemo_method
from workbench.decoding.methods import DecoderMethod

MIN_SPEEDUP_OVER_FRAME_LOOPING = 10.0  # the target: full graph vs frame-looping off, B=16, 12 s, fp32
MIN_SPEEDUP_OVER_NEMO = {"rnnt": 4.0, "tdt": 2.0}  # our full graph over NeMo's, every B, length and dtype


def add_speedups(group: list[dict], base_by_shape: dict[tuple, float]) -> None:
    """Speedup over RNN-T frame-looping off of the same B and T (TDT rows use the RNN-T baseline too)."""
    base = next((r for r in group if r["method"] == FRAME_LOOPING_OFF.label), None)
    if base is not None:
        base_by_shape[(base["batch"], base["frames"])] = base["time_s"]["median"]
    for row in group:
        if (row["batch"], row["frames"]) in base_by_shape:
            row["speedup_vs_frame_looping_off"] = base_by_shape[(row["batch"], row["frames"])] / row["time_s"]["median"]


def add_nemo_speedups(rows: list[dict]) -> None:
    """On each of our label-looping rows: NeMo's seconds over ours in the same graph mode (``speedup_vs_nemo``,
    > 1: we are faster) and which NeMo row that is; our full graph falls back to NeMo's partial graphs at the
    sizes where NeMo's full graph failed (a row of that size says ``nemo_full_graph: "failed"``), not where it
    only did not run."""
    nemo = {(r["model"], r["dtype"], r["batch"], r["frames"], r["method"]): r["time_s"]["median"]
            for r in rows if (m := DecoderMethod.of_label(r["method"])) and m.algorithm == "nemo"}
    failed = {(r["model"], r["dtype"], r["batch"], r["frames"]) for r in rows if r.get("nemo_full_graph") == "failed"}
    for r in rows:
        method = DecoderMethod.of_label(r["method"])
        if method is None or method.algorithm != "label_looping" or method.own_window:
            continue
        mode = method.graph_mode
        shape = (r["model"], r["dtype"], r["batch"], r["frames"])
        fallback = mode == "full" and shape in failed
        candidates = [nemo_method(mode).label] + ([nemo_method("partial").label] if fallback else [])
        against = next((m for m in candidates if (*shape, m) in nemo), None)
        if against is not None:
            r["speedup_vs_nemo"], r["speedup_vs_nemo_method"] = nemo[(*shape, against)] / r["time_s"]["median"], against




def _b16_median(rows: list[dict], model: str, method: str) -> float | None:
    r = next((r for r in rows if r.get("model") == model and r.get("dtype") == "float32" and r.get("batch") == 16
              and r.get("frames") == 150 and r.get("method") == method), None)
    return None if r is None else r["time_s"]["median"]


def _full_times(rows: list[dict], method: str) -> dict[str, float | None]:
    """``method``'s seconds per batch at B=16, 12 s, fp32: {"rnnt_full_s", "tdt_full_s"} (None without a row)."""
    return {"rnnt_full_s": _b16_median(rows, "rnnt", method), "tdt_full_s": _b16_median(rows, "tdt", method)}


def _with_torch_stages(targets: dict[str, Any], figures_of: Callable[[str], dict]) -> dict[str, Any]:
    """``targets``, and when their ``target_method`` is not the torch stages' full graph, ``figures_of`` that
    method beside them as ``torch_stages`` (reported, not judged)."""
    if targets["target_method"] != TORCH_FULL:
        targets["torch_stages"] = {"method": TORCH_FULL, **figures_of(TORCH_FULL)}
    return targets


def _vs_frame_looping(rows: list[dict], method: str) -> dict[str, float | None]:
    """``method``'s :func:`_full_times` and its RNN-T speedup over frame-looping off there (None without both)."""
    times = _full_times(rows, method)
    ours, frame = times["rnnt_full_s"], _b16_median(rows, "rnnt", FRAME_LOOPING_OFF.label)
    return {"full_speedup_vs_frame_looping_off_rnnt": None if not (ours and frame) else frame / ours, **times}


def targets_of(rows: list[dict], failures: list[str], target_method: str = TORCH_FULL) -> dict[str, Any]:
    """The targets at B=16, 12 s, fp32, judged on ``target_method`` (the default kernels' full graph); a missed
    one is added to ``failures``."""
    targets = _with_torch_stages(
        {"target_method": target_method, **_vs_frame_looping(rows, target_method),
         "goal": f"{target_method} >= {MIN_SPEEDUP_OVER_FRAME_LOOPING:g}x frame-looping off"},
        lambda method: _vs_frame_looping(rows, method))
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


def _nemo_figures(rows: list[dict], method: str) -> dict[str, Any]:
    """``method``'s :func:`_full_times`, how many of its rows have a NeMo ratio and those below the target."""
    full, misses = _vs_nemo(rows, method)
    return {**_full_times(rows, method), "full_graph_rows_vs_nemo": len(full), "speedup_vs_nemo_missed": misses}


def nemo_targets_of(rows: list[dict], failures: list[str], *, smoke: bool,
                    target_method: str = TORCH_FULL) -> dict[str, Any]:
    """``target_method`` (the default kernels' full graph) against NeMo's full graph at every (model, dtype, B,
    T), the torch stages' full graph beside it, and the fp32 equality of NeMo's hypotheses with ours; a missed
    target is added to ``failures`` (on CPU, where no graph runs, only the equality is checked)."""
    ours = _nemo_figures(rows, target_method)
    judged, misses = ours["full_graph_rows_vs_nemo"], ours["speedup_vs_nemo_missed"]
    not_judged = [f"{r['model']} {r['dtype']} B={r['batch']} T={r['frames']}: {r.get('nemo_full_graph', 'no NeMo row')}"
                  for r in rows if r["method"] == target_method and "speedup_vs_nemo" not in r]
    nemo32 = [r for r in rows if r["method"].startswith("NeMo") and r["dtype"] == "float32"]
    unequal = [f"{r['model']} B={r['batch']} T={r['frames']} {r['method']}" for r in nemo32
               if not r.get("equal_to_reference", r.get("equal_to_label_looping_off"))]
    rnnt_full, tdt_full = ours["rnnt_full_s"], ours["tdt_full_s"]
    nemo_rnnt, nemo_tdt = (_b16_median(rows, model, nemo_method("full").label) for model in ("rnnt", "tdt"))
    targets = _with_torch_stages({
        "target_method": target_method, **ours, "nemo_rnnt_full_s": nemo_rnnt, "nemo_tdt_full_s": nemo_tdt,
        "speedup_vs_nemo_full_rnnt": nemo_rnnt / rnnt_full if rnnt_full and nemo_rnnt else None,
        "speedup_vs_nemo_full_tdt": nemo_tdt / tdt_full if tdt_full and nemo_tdt else None,
        "min_speedup_vs_nemo": dict(MIN_SPEEDUP_OVER_NEMO), "sizes_not_judged": not_judged,
        "nemo_fp32_rows": len(nemo32), "nemo_fp32_rows_unequal": unequal,
        "goal": f"{target_method} >= " + ", ".join(f"{k.upper()} {v:g}x" for k, v in MIN_SPEEDUP_OVER_NEMO.items())
                + " NeMo's full graph at every size; NeMo's hypotheses equal to ours in fp32",
    }, lambda method: _nemo_figures(rows, method))
    if misses:
        failures.append(f"{target_method} below the NeMo target at {len(misses)} of {judged} sizes: {misses}")
    if not nemo32:
        failures.append("no fp32 NeMo row to compare hypotheses with")
    if not smoke and not judged:
        failures.append(f"no {target_method} row with a NeMo time to compare with")
    if not smoke and not_judged:
        failures.append(f"{target_method} not judged against NeMo at {len(not_judged)} sizes: {not_judged}")
    return targets
