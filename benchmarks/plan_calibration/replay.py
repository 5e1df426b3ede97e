"""The plan against peaks a GPU measured, on the CPU: every probe of a record (plan_calibration.json,
byo_models*.json) traced again and its predicted peak set beside the measured one; for a plan_calibration
record, also the search replayed against those peaks, with and without the record's plan as its start, and
from this checkout's plan for that GPU's memory (``--no-replan`` skips it).

The replay's peaks: per bucket, the line base + n x cost fitted to the measured probes (one base for all
buckets); a probe runs out of memory above the midpoint between the largest peak that fitted and the
smallest predicted peak of a size that ran out of memory.

    python -m benchmarks.plan_calibration.replay [RECORD ...] [--models NAME ...] [--no-replan] [--out DIR]
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from workbench.adapters import user_model_spec
from benchmarks.byo_models.run import SMOKE_MEMORY_BYTES
from benchmarks.harness import Run, bench_parser, start
from workbench.records.results import RESULTS_DIR
from workbench.oomptimizer.plan import DEFAULT_MARGIN_BYTES, StepTracer, build_fake_reference_model, build_fake_user_model, new_fake_mode
from workbench.oomptimizer.search import PlannedPeaks, search_batch_sizes

NAME = "plan_replay"
DEFAULT_RECORDS = ("plan_calibration.json", "plan_calibration_h100.json", "byo_models_rest.json")


def measured_probes(entry: dict) -> list[tuple[int, int, float]]:
    """(bucket, batch size, measured peak bytes) of every probe that fitted, in either record's schema."""
    rows = [(r["bucket"], r["batch_size"], r.get("measured_bytes", r.get("peak_bytes"))) for r in entry["probes"]]
    return [(b, n, float(peak)) for b, n, peak in rows if peak]


def traced_rows(name: str, buckets: list, probes: list) -> list[dict]:
    """Each measured probe traced on the CPU: measured and traced peak (bytes) and the relative error."""
    fake_mode = new_fake_mode()
    model = (build_fake_user_model(name, fake_mode) if user_model_spec(name) is not None
             else build_fake_reference_model(name, fake_mode))
    tracer = StepTracer(model, fake_mode)
    rows = []
    for bucket, size, measured in probes:
        traced = tracer.trace(tuple(buckets[bucket]), size).peak_allocated_bytes
        rows.append({"bucket": bucket, "batch_size": size, "measured_bytes": measured, "traced_bytes": traced,
                     "error": traced / measured - 1})
    return rows


def measured_lines(num_buckets: int, probes: list) -> tuple[float, list[float | None]]:
    """(base bytes, per-item bytes per bucket or None) fitted by least squares to the measured probes."""
    design = np.zeros((len(probes), num_buckets + 1))
    for row, (bucket, size, _) in enumerate(probes):
        design[row, 0], design[row, 1 + bucket] = 1.0, size
    solution, *_ = np.linalg.lstsq(design, np.array([p for _, _, p in probes]), rcond=None)
    probed = {bucket for bucket, _, _ in probes}
    return float(solution[0]), [float(c) if b in probed else None for b, c in enumerate(solution[1:])]


def replayed_searches(entry: dict, buckets: list, budget_bytes: float, plan_now: dict | None = None) -> dict:
    """Probes per bucket of the search replayed against the measured lines, without and with the record's plan,
    and with ``plan_now`` (:func:`benchmarks.plan_calibration.run.make_plan`'s) when given."""
    base, costs = measured_lines(len(buckets), measured_probes(entry))
    fitted = [base + n * costs[b] for b, n, _ in measured_probes(entry)]
    ooms = [base + n * costs[b] for run in ("search", "from_plan") for b, n in enumerate(entry[run]["smallest_oom"])
            if n and costs[b] is not None]
    limit = (max(fitted) + min(ooms)) / 2 if ooms else max(fitted)

    def probe(bucket, size):
        cost = costs[buckets.index(list(bucket))]
        if cost is None:
            raise ValueError(f"bucket {bucket}: no measured probe to replay")
        if base + size * cost > limit:
            raise torch.OutOfMemoryError("replayed")
        return base + size * cost
    def prior_of(lines):
        return PlannedPeaks(lines["base_bytes"], lines["per_item_bytes"])
    priors = [("search", None), ("from_plan", prior_of(entry["plan"]["lines"]))]
    if plan_now is not None:
        priors.append(("from_checkout_plan", prior_of(plan_now["lines"])))
    out = {}
    for label, prior in priors:
        result = search_batch_sizes([tuple(b) for b in buckets], probe, budget_bytes=budget_bytes, prior=prior,
                                    max_batch_size=8192)
        out[label] = {"sizes": result.batch_sizes, "probes_per_bucket": round(result.probes_per_bucket, 3)}
        if label in entry:
            out[label]["recorded_probes_per_bucket"] = entry[label]["mean_probes_per_bucket"]
    if plan_now is not None:
        out["from_checkout_plan"]["planned_sizes"] = list(plan_now["sizes"])
        out["from_checkout_plan"]["planned_over_searched"] = [
            round(p / s, 4) if p and s else None for p, s in zip(plan_now["sizes"], entry["search"]["sizes"])]
    return out


def replay_record(path: Path, models: list[str] | None, replan: bool = True) -> dict:
    """{"<model> (<record>)": {"record", "traced": rows, "error_range", "replayed"?}} for the models of one
    record (a model may be in several records); ``replan``: a plan_calibration record's models are planned again
    for its GPU's memory with its options."""
    record = json.loads(path.read_text())
    figures, params = record["figures"], record.get("params", {})
    gpu_bytes = record["device"].get("gpu_memory_bytes")  # none in a smoke run: its modeled probe's budget
    budget = params.get("memory_fraction", 0.9) * gpu_bytes if gpu_bytes else SMOKE_MEMORY_BYTES
    out = {}
    for name, entry in figures["models"].items():
        if "probes" not in entry or (models and name not in models):
            continue
        rows = traced_rows(name, figures["buckets"], measured_probes(entry))
        key = f"{name} ({path.name})"
        out[key] = {"record": path.name, "traced": rows,
                    "error_range": [min(r["error"] for r in rows), max(r["error"] for r in rows)]}
        if "from_plan" in entry:
            plan_now = plan_for_record(name, figures["buckets"], params, budget) if replan else None
            out[key]["replayed"] = replayed_searches(entry, figures["buckets"], budget, plan_now)
        print(f"{key}: traced peaks {out[key]['error_range'][0]:+.1%} to {out[key]['error_range'][1]:+.1%} of "
              f"{len(rows)} measured probes", flush=True)
    return out


def plan_for_record(name: str, buckets: list, params: dict, budget_bytes: float) -> dict:
    """This checkout's plan with a calibration record's options, for its GPU's memory (``budget_bytes`` = memory
    x fraction)."""
    from benchmarks.plan_calibration.run import make_plan

    fraction = params.get("memory_fraction", 0.9)
    options = SimpleNamespace(smoke=bool(params.get("smoke")), memory_fraction=fraction,
                              margin_bytes=params.get("margin_bytes", DEFAULT_MARGIN_BYTES),
                              rel_gap=params.get("rel_gap", 0.05))
    return make_plan(name, buckets, int(budget_bytes / fraction), options)


def start_run(argv=None) -> Run:
    """The options parsed: the records to replay, the models to keep, the harness's options (no GPU needed)."""
    parser = bench_parser(__doc__)
    parser.prog = "python -m benchmarks.plan_calibration.replay"
    parser.add_argument("records", nargs="*", help=f"records with measured probes (default: {' '.join(DEFAULT_RECORDS)} "
                                                   "in benchmarks/results)")
    parser.add_argument("--models", nargs="+", help="only these models of the records")
    parser.add_argument("--no-replan", dest="replan", action="store_false",
                        help="skip this checkout's plans (the search from them is not replayed)")
    return start(parser, argv, name=NAME, needs_cuda=False,
                 what="Plan against measured peaks: every recorded GPU probe traced again on the CPU, and the search "
                      "from the plan replayed against the measured peaks")


def main(argv=None) -> int:
    run = start_run(argv)
    paths = [Path(p) for p in run.args.records] or [RESULTS_DIR / name for name in DEFAULT_RECORDS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"plan replay: error: no such record: {', '.join(missing)}")
        return 2
    run.params["records"] = [p.name for p in paths]
    models = run.figures["models"] = {}
    for path in paths:
        if run.wants(path.name):
            with run.part(path.name):
                models.update(replay_record(path, run.args.models, run.args.replan))
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
