"""The plan against the GPU: per model, the planned batch size per bucket (``oomptimize --plan`` for this
GPU's memory, traced on the CPU), the searched one (the real search), the plan's predicted peak against the
measured peak of every probe of that search, and the search started from the plan (probes per bucket).

    python -m benchmarks.plan_calibration [--models NAME ...] [--budget-s 300] [--out DIR]
    python -m benchmarks.plan_calibration --smoke --out /tmp/x    # CPU: a modeled peak, not a measurement
"""

from __future__ import annotations

import functools
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from benchmarks.byo_models.run import (SMOKE_MEMORY_BYTES, SMOKE_NOTE, add_search_options, bench_buckets, build,
                                       make_probe, model_spec)
from benchmarks.harness import Run, bench_device, bench_parser, start
from workbench.bucketing import BucketProfile
from workbench.memory import configure_allocator
from workbench.memory.oom import release_memory
from workbench.oomptimizer.plan import (build_fake_reference_model, build_fake_user_model, new_fake_mode,
                                        plan_profile, planned_peaks, parse_size)
from workbench.oomptimizer.search import search_batch_sizes
from workbench.adapters import user_model_spec

NAME = "plan_calibration"
DEFAULT_MODELS = ["large-rnnt", "xl-aed", "hf-whisper"]


def make_plan(name: str, buckets: list, memory_bytes: int, args) -> dict:
    """The plan of ``buckets`` for ``memory_bytes`` of GPU memory: sizes, lines, traced steps, seconds."""
    fake_mode = new_fake_mode()
    model_name = "tiny-rnnt" if args.smoke and user_model_spec(name) is None else name
    model = (build_fake_user_model(name, fake_mode) if user_model_spec(name) is not None else
             build_fake_reference_model(model_name, fake_mode))
    bins = BucketProfile([list(b) for b in buckets])
    t0 = time.perf_counter()
    profile, result = plan_profile(model, fake_mode, model_name, bins, gpu_memory=str(memory_bytes),
                                   memory_fraction=args.memory_fraction, margin_bytes=args.margin_bytes,
                                   rel_gap=args.rel_gap, merge=False)
    return {"sizes": profile.bucket_batch_size, "traced_steps": result.num_probes,
            "seconds": time.perf_counter() - t0, "budget_bytes": profile.metadata["budget_bytes"],
            "lines": profile.metadata["plan"], "profile": profile}


def start_plans(names: list[str], buckets: list, memory_bytes: int, args) -> dict:
    """{name: () -> plan}: the plans traced in ``--plan-workers`` processes started now, beside the GPU
    searches (0: each traced in this process when asked for)."""
    if args.plan_workers == 0:
        return {name: functools.partial(make_plan, name, buckets, memory_bytes, args) for name in names}
    pool = ProcessPoolExecutor(min(args.plan_workers, len(names)), mp_context=multiprocessing.get_context("spawn"))
    futures = {name: pool.submit(make_plan, name, buckets, memory_bytes, args) for name in names}
    pool.shutdown(wait=False)
    return {name: future.result for name, future in futures.items()}


def probe_rows(result, prior) -> list[dict]:
    """Every probe of a search with the plan's predicted peak at its bucket and size beside the measured one."""
    rows = []
    for p in result.probes:
        cost = prior.per_item_bytes[p.bucket_index]
        predicted = None if cost is None else prior.base_bytes + p.batch_size * cost
        rows.append({"bucket": p.bucket_index, "batch_size": p.batch_size, "measured_bytes": p.peak_bytes,
                     "planned_bytes": predicted,
                     "error": None if predicted is None or p.oom else predicted / p.peak_bytes - 1})
    return rows


def search_entry(result, buckets) -> dict:
    per_bucket = [sum(1 for p in result.probes if p.bucket_index == i) for i in range(len(buckets))]
    return {"sizes": result.batch_sizes, "probes_per_bucket": per_bucket,
            "mean_probes_per_bucket": result.num_probes / len(buckets), "seconds": result.seconds,
            "smallest_oom": [min((p.batch_size for p in result.probes if p.bucket_index == i and p.oom),
                                 default=None) for i in range(len(buckets))]}


def planned_size_fits(probe, bucket, planned: int, searched: int, smallest_oom: int | None) -> bool:
    """Whether the planned size fits: known from the search where it is at most the searched size or at least
    its smallest OOM, else one probe at the planned size."""
    if planned <= searched:
        return True
    if smallest_oom is not None and planned >= smallest_oom:
        return False
    try:
        probe(bucket, planned)
        return True
    except torch.OutOfMemoryError:
        return False


def measure_model(name: str, buckets: list, args, device, planned) -> dict:
    """Real search, the plan (``planned()``), search from the plan, and whether each planned size fits."""
    model = build(name, device, args.smoke)
    probe = make_probe(model, args, device)
    search = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, rel_gap=args.rel_gap,
                                max_batch_size=args.max_batch_size)
    plan = planned()
    prior = planned_peaks(plan.pop("profile"), buckets)
    from_plan = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, rel_gap=args.rel_gap,
                                   max_batch_size=args.max_batch_size, prior=prior)
    entry = {"spec": model_spec(name), "plan": plan, "search": search_entry(search, buckets),
             "from_plan": search_entry(from_plan, buckets), "probes": probe_rows(search, prior)}
    entry["planned_over_searched"] = [p / s for p, s in zip(plan["sizes"], search.batch_sizes)]
    entry["planned_fits"] = [planned_size_fits(probe, b, p, s, o) for b, p, s, o in
                             zip(buckets, plan["sizes"], search.batch_sizes, entry["search"]["smallest_oom"])]
    errors = [abs(r["error"]) for r in entry["probes"] if r["error"] is not None]
    entry["largest_peak_error"] = max(errors, default=None)
    del probe, model
    release_memory()
    return entry


def checks(name: str, entry: dict, tolerance: float) -> list[str]:
    """The targets: planned sizes within ``tolerance`` of the searched ones, none that OOMs, and a search from
    the plan at <= 1.3 probes per bucket."""
    out = []
    off = [i for i, r in enumerate(entry["planned_over_searched"]) if abs(r - 1) > tolerance]
    if off:
        out.append(f"{name}: planned sizes off by more than {tolerance:.0%} at buckets {off}")
    ooms = [i for i, fits in enumerate(entry["planned_fits"]) if not fits]
    if ooms:
        out.append(f"{name}: planned sizes OOM at buckets {ooms}")
    if entry["from_plan"]["mean_probes_per_bucket"] > 1.3:
        out.append(f"{name}: the search from the plan took {entry['from_plan']['mean_probes_per_bucket']:.2f} "
                   "probes per bucket (target <= 1.3)")
    return out


def start_run(argv) -> Run:
    """The options parsed and checked (``args.margin_bytes`` from ``--margin``; a smoke run traces its plans in
    this process); a smoke run without CUDA goes on (a modeled peak), else exit 2."""
    parser = bench_parser(__doc__)
    parser.add_argument("--models", nargs="+", help=f"reference names, adapters or MODULE:CALLABLE (default: "
                        f"{' '.join(DEFAULT_MODELS)})")
    add_search_options(parser)
    parser.add_argument("--margin", default="1GiB", help="the plan's margin (default 1GiB)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="planned against searched (default 0.05)")
    parser.add_argument("--plan-workers", type=int, default=3,
                        help="processes that trace the plans beside the GPU searches (0: in turn; smoke: 0)")
    run = start(parser, argv, name=NAME, what="Plan against GPU: planned and searched batch sizes, predicted and "
                "measured peaks, the search from the plan")
    args = run.args
    try:
        args.margin_bytes = parse_size(args.margin) if not args.smoke else 2**20
    except ValueError as e:
        parser.error(f"--margin: {e}")
    if args.smoke:
        args.plan_workers = 0
    run.smoke_note = SMOKE_NOTE
    return run


def main(argv: list[str] | None = None) -> int:
    run = start_run(argv)
    args = run.args
    configure_allocator()  # expandable segments, as `workbench oomptimize` runs (before CUDA starts)
    device = bench_device()
    buckets = run.figures["buckets"] = bench_buckets(args)
    names = args.models or (["tiny-rnnt"] if args.smoke else DEFAULT_MODELS)
    memory_bytes = (torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
                    else SMOKE_MEMORY_BYTES / args.memory_fraction)
    plans = start_plans(names, buckets, int(memory_bytes), args)

    def measure(name: str) -> tuple[dict, list[str]]:
        print(f"{name}: planning and searching {len(buckets)} buckets", flush=True)
        entry = measure_model(name, buckets, args, device, plans[name])
        print(f"{name}: planned {entry['plan']['sizes']}, searched {entry['search']['sizes']}, from the plan "
              f"{entry['from_plan']['mean_probes_per_bucket']:.2f} probes per bucket", flush=True)
        return entry, checks(name, entry, args.tolerance)

    run.each(names, measure, spec_of=model_spec)
    return run.finish()
