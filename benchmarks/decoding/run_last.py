"""The rows run last (NeMo's full graph beside our full graphs, which may poison the CUDA context) and the
check that the context still runs work."""

from __future__ import annotations

import time

import torch

from benchmarks.decoding.cases import Case, Deferred, Outcome
from benchmarks.decoding.grid import NEMO_FULL_GRAPH_LAST_FROM_B
from benchmarks.decoding.methods import BLANK, nemo
from benchmarks.decoding.rows import finish_rows, measure_methods, print_group
from workbench.decoding.toy_models import set_blank_bias

DEFERRED_AFTER_BUDGET_S = 70.0  # no group run last starts later than this after the budget


def cuda_context_error(device: torch.device) -> str | None:
    """None while the device still runs work; else the error (an illegal memory access poisons the context)."""
    try:
        torch.ones(1, device=device).add_(1).item()
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def lost_context(case: Case, outcome: Outcome) -> bool:
    """After a pass over a case on CUDA: whether the methods it ran (``case.measured``) left the CUDA context
    unusable (an illegal memory access is sticky). If so the failure names the case and those methods (the
    first failure listed before it is the one that faulted), every later case is listed as not run, and
    ``outcome.context_lost`` is set."""
    if case.device.type != "cuda" or not (lost := cuda_context_error(case.device)):
        return False
    outcome.context_lost = lost
    outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                            f"{', '.join(m.label for m in case.measured)} ({lost}); the rest did not run")
    print(f"FAIL: {outcome.failures[-1]}", flush=True)
    return True


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
        names = ", ".join(m.label for m in item.methods)
        if lost or time.perf_counter() > deadline:
            why = f"the CUDA context failed earlier: {lost}" if lost else "past the time for the rows run last"
            outcome.skipped.append(f"{case.tag}: {names} not run ({why})")
            note_timed_without_nemo(outcome.rows, case, item, f"not run ({why})")
            continue
        set_blank_bias(case.joint, BLANK, case.blank_bias)  # later cases recalibrated the shared joint
        interleaved = measure_methods(case, item.methods, outcome)
        lost = cuda_context_error(case.device) if case.device.type == "cuda" else None
        if lost:
            outcome.context_lost = lost
            outcome.failures.append(f"{case.tag}: the CUDA context is unusable after "
                                    f"{', '.join(m.label for m in item.methods if m.algorithm == 'nemo')}: {lost}")
        if lost or nemo("full").label not in {r["method"] for r in interleaved}:
            note_timed_without_nemo(outcome.rows, case, item, "failed")  # ours keep their rows from the pass
            continue
        finish_rows(case, interleaved, outcome)
        by_method = {r["method"]: r for r in interleaved}
        for index, row in enumerate(outcome.rows):  # ours in their places, NeMo's returned
            if same_size(row, case) and row["method"] in by_method:
                outcome.rows[index] = by_method.pop(row["method"])
        print_group(f"{case.tag} (run last)", interleaved)
        rows += list(by_method.values())
    outcome.deferred.clear()
    return rows


def same_size(row: dict, case: Case) -> bool:
    """Whether ``row`` is of the case's model, dtype, B and T."""
    return (row.get("model"), row.get("dtype"), row.get("batch"), row.get("frames")) == (
        case.model, str(case.dtype)[6:], case.batch, case.frames)


def note_timed_without_nemo(rows: list[dict], case: Case, item: Deferred, why: str) -> None:
    """Mark our rows of the deferred group's methods at the case's size: NeMo's full graph did not run beside
    them; ``nemo_full_graph`` says why ("failed", or "not run (...)")."""
    names = {m.label for m in item.methods if m.algorithm != "nemo"}
    for row in rows:
        if same_size(row, case) and row["method"] in names:
            row["timing_note"] = "timed in the pass without NeMo's full graph beside it"
            row["nemo_full_graph"] = why

