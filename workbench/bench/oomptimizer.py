"""OOMptimizer on the GPU: predictive vs bisect search, true maxima, soak, xl AED, two-GPU DDP.

    python3 -m workbench.bench.oomptimizer --out benchmarks/results            # one H200, < 6 min
    python3 -m workbench.bench.oomptimizer --out benchmarks/results --nproc 2  # two GPUs (torchrun), < 3 min

One GPU: large RNN-T, 2D 15 x 2 buckets up to 40 s (bins from workbench.bucketing.estimate_2d_bins over
workbench.data.synthetic.synthetic_cut_arrays when both exist, else a fixed grid): predictive and bisect
search in the same run (probes, OOMs, wall time, batch sizes: predictive on all 30 buckets for the
profile, then both strategies fresh on every third bucket, since bisection on all 30 would not fit the
time); for five of those buckets the true maximum by bisection to a gap of 1; a soak of the profile (varied lengths, shuffled buckets); the one-GPU DDP
gradient-bucket accounting; then xl AED on the first 8 of 8 x 1 buckets, predictive and bisect.
Writes oomptimizer.json. With --nproc 2 it relaunches under torchrun; each rank probes with DDP
gradient all-reduce, the largest peak decides; writes oomptimizer_ddp.json.
Fails (exit 1) when a returned size was not probed, predictive needs > 3 probes per bucket, a size is
> 3 % (and > 1) below the true maximum, the soak OOMs, or memory is left allocated.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time

from workbench.oomptimizer.probe import configure_allocator

configure_allocator()  # before CUDA is initialized

import torch  # noqa: E402

from workbench.bench.results import summarize, write_result  # noqa: E402
from workbench.bucketing.profile import BucketProfile  # noqa: E402
from workbench.oomptimizer.probe import TrainingStepProbe, release_memory  # noqa: E402
from workbench.oomptimizer.run import soak  # noqa: E402
from workbench.oomptimizer.search import search_batch_sizes  # noqa: E402
from workbench.oomptimizer.synthetic import demo_buckets  # noqa: E402

TIME_LIMIT_S = 300  # the one-GPU run starts no new part after this (parts it skips are named in the JSON)


def build(name: str) -> torch.nn.Module:
    """A workbench model by name, or ``module:Factory`` for any model with the same contract."""
    if ":" in name:
        module, attr = name.split(":")
        return getattr(importlib.import_module(module), attr)().cuda()
    from workbench.models import build_model

    return build_model(name).cuda()


def rnnt_bins(num_buckets: int = 15, num_subbuckets: int = 2, max_duration: float = 40.0):
    """(bins, source): 2D bins from the synthetic corpus when the data and bucketing parts exist."""
    try:
        from workbench.bucketing import estimate_2d_bins
        from workbench.data.synthetic import synthetic_cut_arrays

        arrays = synthetic_cut_arrays(200_000, seed=0)
        keep = arrays.durations <= max_duration
        est = estimate_2d_bins(arrays.durations[keep], arrays.num_tokens[keep], num_buckets, num_subbuckets)
        return [(float(d), float(u)) for d, u in est.bins], "estimate_2d_bins(synthetic_cut_arrays(200000))"
    except ImportError as e:
        return demo_buckets(num_buckets, num_subbuckets, max_duration), f"fixed grid (no bins: {e})"


MAX_BATCH_SIZE = [1 << 20]  # --max-batch-size (a cap for toy models whose tiny buckets fit huge batches)


def run_search(probe, buckets, strategy: str) -> dict:
    release_memory()
    before = torch.cuda.memory_allocated()
    result = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, strategy=strategy,
                                max_batch_size=MAX_BATCH_SIZE[0])
    release_memory()
    fitted = {(p.bucket_index, p.batch_size) for p in result.probes if not p.oom}
    return {"batch_sizes": result.batch_sizes, "probes": result.num_probes, "ooms": result.num_ooms,
            "probes_per_bucket": round(result.probes_per_bucket, 3), "seconds": round(result.seconds, 2),
            "all_returned_probed": all((i, b) in fitted for i, b in enumerate(result.batch_sizes)),
            "leftover_bytes": torch.cuda.memory_allocated() - before,
            "probe_seconds": summarize([p.seconds for p in result.probes]),
            "trace": [[p.bucket_index, p.batch_size, p.peak_bytes, p.predicted_bytes] for p in result.probes]}


def true_maxima(probe, buckets, indices, start_sizes) -> dict[int, int]:
    """Bisection to a gap of 1 from each bucket's predictive size: the true maximum."""
    out = {}
    for i in indices:
        r = search_batch_sizes([buckets[i]], probe, strategy="bisect", rel_gap=1e-9,
                               start_batch_size=start_sizes[i], max_batch_size=MAX_BATCH_SIZE[0])
        out[i] = r.batch_sizes[0]
    return out


def main_single(args) -> int:
    t0 = time.perf_counter()
    failures: list[str] = []
    figures: dict = {}
    dtype = torch.bfloat16
    buckets, bins_source = rnnt_bins()
    model = build(args.rnnt)
    probe = TrainingStepProbe(model, dtype=dtype, memory_fraction=args.memory_fraction)
    figures["rnnt"] = rnnt = {"model": args.rnnt, "buckets": buckets, "bins_source": bins_source}
    print(f"[{time.perf_counter() - t0:5.0f} s] {args.rnnt}: predictive over {len(buckets)} buckets", flush=True)
    rnnt["predictive"] = pred = run_search(probe, buckets, "predictive")
    # Side by side in the same run on every third bucket (bisection on all 30 would not fit the time).
    subset = list(range(0, len(buckets), 3))
    sub_buckets = [buckets[i] for i in subset]
    rnnt["comparison"] = comp = {"bucket_indices": subset,
                                 "note": "predictive and bisect each run fresh on every third bucket"}
    for strategy in ("predictive", "bisect"):
        print(f"[{time.perf_counter() - t0:5.0f} s] {args.rnnt}: {strategy} over {len(subset)} buckets", flush=True)
        comp[strategy] = run_search(probe, sub_buckets, strategy)
    rnnt["bisect"] = bis = comp["bisect"]
    rnnt["ratios"] = {"probes_bisect_over_predictive": bis["probes"] / comp["predictive"]["probes"],
                      "seconds_bisect_over_predictive": bis["seconds"] / max(comp["predictive"]["seconds"], 1e-9)}
    bisect_full = [None] * len(buckets)
    for k, i in enumerate(subset):
        bisect_full[i] = bis["batch_sizes"][k]
    # True maxima for five buckets spread over the range.
    idx = sorted({subset[round(k * (len(subset) - 1) / 4)] for k in range(5)})
    print(f"[{time.perf_counter() - t0:5.0f} s] true maxima for buckets {idx}", flush=True)
    truth = true_maxima(probe, buckets, idx, pred["batch_sizes"]) if time.perf_counter() - t0 < TIME_LIMIT_S else {}
    if not truth:
        failures.append("true maxima: not measured (time limit)")
    rnnt["true_max"] = {str(i): {"bucket": buckets[i], "true_max": t, "predictive": pred["batch_sizes"][i],
                                 "bisect": bisect_full[i],
                                 "predictive_below_true": (t - pred["batch_sizes"][i]) / t}
                        for i, t in truth.items()}
    for i, t in truth.items():
        got = pred["batch_sizes"][i]
        if got < t - max(1, int(0.03 * t)):
            failures.append(f"rnnt bucket {i}: predictive {got} is > 3% below the true maximum {t}")
    for name in ("predictive", "bisect"):
        if not rnnt[name]["all_returned_probed"]:
            failures.append(f"rnnt {name}: a returned batch size was not probed successfully")
        if not comp[name]["all_returned_probed"]:
            failures.append(f"rnnt {name}: a returned batch size was not probed successfully")
        if rnnt[name]["leftover_bytes"] != 0:
            failures.append(f"rnnt {name}: {rnnt[name]['leftover_bytes']} bytes left allocated after search")
    rnnt["probe_seconds"] = pred["probe_seconds"]
    if pred["probes_per_bucket"] > 3:
        failures.append(f"rnnt predictive: {pred['probes_per_bucket']:.2f} probes per bucket > 3")
    print(f"[{time.perf_counter() - t0:5.0f} s] soak", flush=True)
    profile = BucketProfile([list(b) for b in buckets], list(pred["batch_sizes"]))
    try:
        rnnt["soak"] = soak(model, profile, dtype=dtype, memory_fraction=args.memory_fraction,
                            steps_per_bucket=2, progress=False)
    except RuntimeError as e:
        rnnt["soak"] = {"error": str(e)}
        failures.append(f"soak: {e}")
    release_memory()
    if time.perf_counter() - t0 < TIME_LIMIT_S - 90:
        print(f"[{time.perf_counter() - t0:5.0f} s] one-GPU DDP gradient-bucket accounting", flush=True)
        ddp_probe = TrainingStepProbe(model, dtype=dtype, memory_fraction=args.memory_fraction,
                                      ddp_gradient_buckets=True)
        rnnt["ddp_accounting"] = run_search(ddp_probe, buckets, "predictive")
    else:
        rnnt["ddp_accounting"] = {"skipped": "time limit"}
    del model, probe
    release_memory()
    figures["aed"] = aed = {"model": args.aed, "buckets": demo_buckets(8, 1, 40.0),
                            "note": "8 x 1 buckets (fewer than RNN-T to bound the run time)"}
    if time.perf_counter() - t0 < TIME_LIMIT_S - 60:
        model = build(args.aed)
        probe = TrainingStepProbe(model, dtype=dtype, memory_fraction=args.memory_fraction)
        for strategy in ("predictive", "bisect"):
            if time.perf_counter() - t0 > TIME_LIMIT_S:
                aed[strategy] = {"skipped": "time limit"}
                continue
            print(f"[{time.perf_counter() - t0:5.0f} s] {args.aed}: {strategy}", flush=True)
            aed[strategy] = run_search(probe, aed["buckets"], strategy)
            if not aed[strategy]["all_returned_probed"]:
                failures.append(f"aed {strategy}: a returned batch size was not probed successfully")
        del model, probe
    else:
        aed["skipped"] = "time limit"
    figures["wall_seconds"] = time.perf_counter() - t0
    figures["failures"] = failures
    path = write_result("oomptimizer", what="OOMptimizer: predictive vs bisect probes and wall time, true "
                        "maxima, soak, DDP accounting; large RNN-T 2D and xl AED on one GPU",
                        figures=figures, out_dir=args.out,
                        params={"dtype": "bf16", "memory_fraction": args.memory_fraction, "rel_gap": 0.05,
                                "max_batch_size": args.max_batch_size})
    print_table(figures)
    print(f"wrote {path}")
    return report_failures(failures)


def main_ddp(args) -> int:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    t0 = time.perf_counter()
    buckets, bins_source = rnnt_bins()
    model = build(args.rnnt)
    probe = TrainingStepProbe(model, dtype=torch.bfloat16, memory_fraction=args.memory_fraction,
                              ddp_gradient_buckets=True)
    res = run_search(probe, buckets, "predictive")
    failures = [] if res["all_returned_probed"] else ["ddp: a returned batch size was not probed"]
    if res["probes_per_bucket"] > 3:
        failures.append(f"ddp predictive: {res['probes_per_bucket']:.2f} probes per bucket > 3")
    torch.distributed.barrier()
    if rank == 0:
        figures = {"model": args.rnnt, "world_size": world, "buckets": buckets, "bins_source": bins_source,
                   "predictive": res, "wall_seconds": time.perf_counter() - t0, "failures": failures}
        path = write_result("oomptimizer_ddp", what=f"OOMptimizer under torchrun with DDP gradient all-reduce "
                            f"on {world} GPUs (largest peak across ranks decides)", figures=figures,
                            out_dir=args.out, params={"dtype": "bf16", "memory_fraction": args.memory_fraction})
        print(f"{args.rnnt} DDP x{world}: {res['probes']} probes ({res['probes_per_bucket']:.2f}/bucket), "
              f"{res['seconds']:.1f} s, batch sizes {res['batch_sizes']}")
        print(f"wrote {path}")
    torch.distributed.destroy_process_group()
    return report_failures(failures)


def print_table(figures: dict) -> None:
    print("\nmodel                 run                    buckets  probes  per-bucket  OOMs  seconds")
    rnnt, aed = figures["rnnt"], figures["aed"]
    rows = [(rnnt["model"], "predictive (profile)", rnnt.get("predictive")),
            (rnnt["model"], "predictive (subset)", rnnt.get("comparison", {}).get("predictive")),
            (rnnt["model"], "bisect (subset)", rnnt.get("comparison", {}).get("bisect")),
            (rnnt["model"], "predictive + DDP acct", rnnt.get("ddp_accounting")),
            (aed["model"], "predictive", aed.get("predictive")), (aed["model"], "bisect", aed.get("bisect"))]
    for model, name, r in rows:
        if r and "probes" in r:
            print(f"{model[-21:]:21s} {name:22s} {len(r['batch_sizes']):7d}  {r['probes']:6d}  "
                  f"{r['probes_per_bucket']:10.2f}  {r['ooms']:4d}  {r['seconds']:7.1f}")
        else:
            print(f"{model[-21:]:21s} {name:22s} SKIPPED ({(r or {}).get('skipped', 'not run')})")
    ratios = figures["rnnt"].get("ratios", {})
    if ratios:
        print(f"bisect / predictive: {ratios['probes_bisect_over_predictive']:.2f}x probes, "
              f"{ratios['seconds_bisect_over_predictive']:.2f}x wall time")
    for i, t in figures["rnnt"].get("true_max", {}).items():
        print(f"  bucket {i:>3} {t['bucket']}: true max {t['true_max']}, predictive {t['predictive']} "
              f"({100 * t['predictive_below_true']:.1f}% below), bisect {t['bisect']}")


def report_failures(failures: list[str]) -> int:
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results)")
    parser.add_argument("--rnnt", default="large-rnnt", help="RNN-T model name (or module:Factory)")
    parser.add_argument("--aed", default="xl-aed", help="AED model name (or module:Factory)")
    parser.add_argument("--memory-fraction", type=float, default=0.9)
    parser.add_argument("--nproc", type=int, default=1, help="GPUs for the DDP run (torchrun)")
    parser.add_argument("--max-batch-size", type=int, default=1 << 20, help="cap on any batch size probed")
    args = parser.parse_args()
    MAX_BATCH_SIZE[0] = args.max_batch_size
    if "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return main_ddp(args)
    if args.nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "-m", "workbench.bench.oomptimizer", *sys.argv[1:]]
        return subprocess.call(cmd)
    if not torch.cuda.is_available():
        print("FAIL: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 1
    return main_single(args)


if __name__ == "__main__":
    sys.exit(main())
