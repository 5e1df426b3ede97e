"""--kernel-profile: one more decode of each kept decoder under torch.profiler, after every timed row."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.decoding import kernel_profile
from benchmarks.decoding.cases import Case, Outcome
from benchmarks.decoding.methods import BLANK, default_method
from benchmarks.decoding.run_last import cuda_context_error, same_size
from benchmarks.profiling import profile_call
from workbench.decoding import GreedyTransducerDecoder
from workbench.decoding.toy_models import set_blank_bias

PROFILE_AFTER_BUDGET_S = 90.0   # no profile starts later than this after the budget


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


def add_kernel_profiles(outcome: Outcome, deadline: float = float("inf")) -> None:
    """Profile every decoder kept in ``outcome.to_profile`` (``profile_case``) and put it in its row as
    ``kernel_profile``, with ``timed_seconds_per_outer_iteration`` of that row and of the default method's
    full graph at the same size (where they have one); run after every timed row, so the profiler changes no
    timing. After a CUDA context failure, or from ``deadline`` (a ``time.perf_counter()`` value) on, the rest are
    listed as not run."""
    def row_of(case: Case, method: str) -> dict | None:
        return next((r for r in outcome.rows if same_size(r, case) and r.get("method") == method), None)

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

