"""OOMptimizer on the GPU: predictive vs bisect search, true maxima, soak, xl AED, two-GPU DDP.

    python3 -m workbench.bench.oomptimizer --out benchmarks/results   # both parts; one the time limit skips fails
    python3 -m workbench.bench.oomptimizer --out DIR --part rnnt               # GPU 0 ...
    python3 -m workbench.bench.oomptimizer --out DIR --part aed                # ... and GPU 1, at once
    python3 -m workbench.bench.oomptimizer --out benchmarks/results --nproc 2  # two GPUs (torchrun), < 3 min

One GPU, RNN-T part: large RNN-T, 2D 15 x 2 buckets up to 40 s (bins from estimate_2d_bins over
synthetic_cut_arrays): predictive search on all 30 buckets (the profile); both strategies fresh on every
fifth bucket, side by side (bisection on all 30 would not fit the time); for five of those buckets the
true maximum by bisection to a gap of 1; a soak of the profile under training's limit (varied lengths,
shuffled buckets); after the AED part, the one-GPU DDP gradient-bucket accounting. AED part: xl AED on
8 x 1 buckets, predictive and bisect. ``--part all`` (default) runs both into oomptimizer.json; ``--part
aed`` writes oomptimizer_aed.json. ``--time-limit-s`` (default 300): no new part starts after it (the
JSON names what was skipped, and a skipped part fails the run, as true maxima not measured do). With --nproc 2 it relaunches under torchrun; each rank probes with DDP
gradient all-reduce, the largest peak decides; writes oomptimizer_ddp.json.
Fails (exit 1) when a returned size was not probed, predictive needs > 3 probes per bucket, a size is
> 3 % (and > 1) below the true maximum, the soak OOMs, or memory is left allocated.

    python3 -m workbench.bench.oomptimizer --smoke --out /tmp/smoke [--nproc 2]   # CPU, seconds

--smoke runs the same parts end to end with tiny-rnnt and tiny-aed on 4 and 2 short buckets. Without
CUDA the probe is ModeledMemoryProbe: the real make_batch + training_step + AdamW step on the CPU, the
peak modeled from the batch's element count (a CPU measures no allocator peak), DDP over gloo; with CUDA
the real probe, batch sizes capped at 16. The JSON is marked "smoke": true, goes only to --out (required),
and the checks are reported but do not set the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback

from workbench.memory import configure_allocator

configure_allocator()  # before CUDA is initialized

import torch  # noqa: E402

from workbench.bench.results import (bench_device, check_smoke_out, cpu_smoke_torch, cuda_missing,  # noqa: E402
                                     report_failures, summarize, write_result)
from workbench.bucketing.profile import BucketProfile  # noqa: E402
from workbench.oomptimizer.cli import without_option  # noqa: E402
from workbench.memory.oom import release_memory  # noqa: E402
from workbench.oomptimizer.probe import ModeledMemoryProbe, TrainingStepProbe  # noqa: E402
from workbench.oomptimizer.run import soak  # noqa: E402
from workbench.oomptimizer.search import search_batch_sizes  # noqa: E402
from workbench.oomptimizer.synthetic import demo_buckets  # noqa: E402

TIME_LIMIT_S = 300  # default --time-limit-s: no new part starts after this (skipped parts are named in the JSON)


SMOKE_BUDGET_BYTES = 64 << 20  # modeled activation budget above the weights in --smoke on a CPU
SMOKE_MAX_BATCH_SIZE = 16  # --smoke with CUDA: tiny models would fit huge batches


def build(name: str) -> torch.nn.Module:
    """A workbench model by name (built on the device, so an xl model is never initialized on the host),
    or ``module:Factory`` for any model with the same contract."""
    if ":" in name:
        module, attr = name.split(":")
        return getattr(importlib.import_module(module), attr)().to(bench_device())
    from workbench.models import build_model

    with bench_device():
        return build_model(name)


def make_probe(model, dtype: torch.dtype, args, *, ddp_gradient_buckets: bool = False):
    """The real GPU probe, or (smoke run without CUDA) the CPU stand-in with a modeled peak."""
    if torch.cuda.is_available():  # without CUDA, main has refused unless --smoke
        return TrainingStepProbe(model, dtype=dtype, memory_fraction=args.memory_fraction,
                                 ddp_gradient_buckets=ddp_gradient_buckets)
    weights = 4 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return ModeledMemoryProbe(model, dtype=dtype, budget_bytes=weights + SMOKE_BUDGET_BYTES,
                              ddp_gradient_buckets=ddp_gradient_buckets)


def allocated_bytes() -> int | None:
    """Allocated device bytes, or None on a CPU (nothing to measure)."""
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else None


def rnnt_bins(num_buckets: int = 15, num_subbuckets: int = 2, max_duration: float = 40.0,
              num_cuts: int = 200_000):
    """(bins, source): 2D bins estimated on the synthetic corpus."""
    from workbench.bucketing import estimate_2d_bins
    from workbench.data.synthetic import synthetic_cut_arrays

    arrays = synthetic_cut_arrays(num_cuts, seed=0)
    keep = arrays.durations <= max_duration
    est = estimate_2d_bins(arrays.durations[keep], arrays.num_tokens[keep], num_buckets, num_subbuckets)
    return ([(float(d), float(u)) for d, u in est.bins],
            f"estimate_2d_bins(synthetic_cut_arrays({num_cuts}), durations <= {max_duration:g} s)")


def run_search(probe, buckets, strategy: str, max_batch_size: int) -> dict:
    release_memory()
    before = allocated_bytes()
    result = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, strategy=strategy,
                                max_batch_size=max_batch_size)
    release_memory()
    fitted = {(p.bucket_index, p.batch_size) for p in result.probes if not p.oom}
    after = allocated_bytes()
    return {"batch_sizes": result.batch_sizes, "probes": result.num_probes, "ooms": result.num_ooms,
            "probes_per_bucket": round(result.probes_per_bucket, 3), "seconds": round(result.seconds, 2),
            "all_returned_probed": all((i, b) in fitted for i, b in enumerate(result.batch_sizes)),
            "leftover_bytes": None if before is None else after - before,  # None: not measurable (CPU)
            "probe_seconds": summarize([p.seconds for p in result.probes]),
            "trace": [[p.bucket_index, p.batch_size, p.peak_bytes, p.predicted_bytes] for p in result.probes]}


def true_maxima(probe, buckets, indices, start_sizes, max_batch_size: int) -> dict[int, int]:
    """Bisection to a gap of 1 from each bucket's predictive size: the true maximum."""
    out = {}
    for i in indices:
        r = search_batch_sizes([buckets[i]], probe, strategy="bisect", rel_gap=1e-9,
                               start_batch_size=start_sizes[i], max_batch_size=max_batch_size)
        out[i] = r.batch_sizes[0]
    return out


def rnnt_buckets(args):
    """(buckets, source) of the RNN-T run: 15 x 2 up to 40 s, or 2 x 2 up to 3 s in a smoke run."""
    if args.smoke:
        return rnnt_bins(2, 2, 3.0, num_cuts=4000)
    return rnnt_bins()


def aed_buckets(args) -> list[tuple[float, float]]:
    return demo_buckets(2, 1, 2.0) if args.smoke else demo_buckets(8, 1, 40.0)


def main_single(args) -> int:
    """The one-GPU run. Each part that raises is a failure and the later parts still run; the JSON is
    rewritten after every part ("complete": false until the end), so a stage timeout keeps what ran."""
    t0 = time.perf_counter()
    failures: list[str] = []
    figures: dict = {"smoke": bool(args.smoke), "complete": False}
    dtype = torch.bfloat16
    what = {"all": f"OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
                   f"{args.rnnt} 2D and {args.aed} on one GPU",
            "rnnt": f"OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
                    f"{args.rnnt} 2D on one GPU",
            "aed": f"OOMptimizer: predictive vs bisect probes and wall time; {args.aed} on one GPU"}[args.part]

    name = "oomptimizer_aed" if args.part == "aed" else "oomptimizer"

    def save():
        figures["wall_seconds"] = time.perf_counter() - t0
        figures["failures"] = failures
        return write_result(name, what=smoke_what(args, what), figures=figures, out_dir=args.out,
                            params={"dtype": "bf16", "memory_fraction": args.memory_fraction, "rel_gap": 0.05,
                                    "max_batch_size": args.max_batch_size, "smoke": bool(args.smoke),
                                    "part": args.part, "time_limit_s": args.time_limit_s})

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - t0:5.0f} s] {message}", flush=True)

    buckets, bins_source = rnnt_buckets(args) if args.part != "aed" else ([], "not used by --part aed")
    figures["part"] = args.part
    figures["rnnt"] = rnnt = {"model": args.rnnt, "buckets": buckets, "bins_source": bins_source}
    aed_bins = aed_buckets(args)
    figures["aed"] = aed = {"model": args.aed, "buckets": aed_bins,
                            "note": f"{len(aed_bins)} x 1 buckets (fewer than RNN-T to bound the run time)"}
    if args.part in ("all", "rnnt"):
        rnnt_part(args, buckets, rnnt, failures, say, save, t0, dtype)
    else:
        rnnt["skipped"] = "--part aed (the RNN-T part writes oomptimizer.json)"
    if args.part in ("all", "aed"):
        aed_part(args, aed, failures, say, t0, dtype)
    else:
        aed["skipped"] = "--part rnnt (the AED part writes oomptimizer_aed.json)"
    save()
    if args.part in ("all", "rnnt"):
        ddp_accounting_part(args, buckets, rnnt, failures, say, t0, dtype)
    figures["complete"] = True
    path = save()
    print_table(figures)
    print(f"wrote {path}")
    return report_failures(failures, smoke=args.smoke)


def rnnt_part(args, buckets, rnnt, failures, say, save, t0, dtype) -> None:
    """Predictive search over every bucket (the profile), then the comparison, true maxima and soak."""
    model = probe = None
    try:
        model = build(args.rnnt)
        probe = make_probe(model, dtype, args)
        rnnt["probe"] = type(probe).__name__
        say(f"{args.rnnt}: predictive over {len(buckets)} buckets")
        rnnt["predictive"] = pred = run_search(probe, buckets, "predictive", args.max_batch_size)
        rnnt["probe_seconds"] = pred["probe_seconds"]
        if not pred["all_returned_probed"]:
            failures.append("rnnt predictive: a returned batch size was not probed successfully")
        if pred["leftover_bytes"] not in (0, None):
            failures.append(f"rnnt predictive: {pred['leftover_bytes']} bytes left allocated after search")
        if pred["probes_per_bucket"] > 3:
            failures.append(f"rnnt predictive: {pred['probes_per_bucket']:.2f} probes per bucket > 3")
    except Exception as e:  # noqa: BLE001 - without the profile nothing else of the RNN-T part can run
        part_failed(failures, f"{args.rnnt} predictive search", e)
        pred = None
    save()
    if pred is not None:
        rnnt_comparison(args, model, probe, buckets, pred, rnnt, failures, say, t0, dtype)
        save()
    del model, probe
    release_memory()


def ddp_accounting_part(args, buckets, rnnt, failures, say, t0, dtype) -> None:
    """Predictive search with one DDP gradient bucket's worth of memory held (one-GPU DDP accounting)."""
    if time.perf_counter() - t0 >= args.time_limit_s - 60:
        rnnt["ddp_accounting"] = {"skipped": "time limit"}
        failures.append("ddp accounting: not measured (time limit; run --part rnnt with more --time-limit-s)")
        return
    say("one-GPU DDP gradient-bucket accounting")
    model = ddp_probe = None
    try:
        model = build(args.rnnt)
        ddp_probe = make_probe(model, dtype, args, ddp_gradient_buckets=True)
        rnnt["ddp_accounting"] = run_search(ddp_probe, buckets, "predictive", args.max_batch_size)
    except Exception as e:  # noqa: BLE001
        rnnt["ddp_accounting"] = {"error": f"{type(e).__name__}: {e}"}
        part_failed(failures, "one-GPU DDP accounting", e)
    del model, ddp_probe
    release_memory()


def part_failed(failures: list[str], part: str, error: BaseException) -> None:
    """Record a part that raised (with its traceback on stderr); the run goes on."""
    traceback.print_exc()
    first_line = (str(error).splitlines() or [""])[0]
    failures.append(f"{part}: {type(error).__name__}: {first_line}")


def rnnt_comparison(args, model, probe, buckets, pred, rnnt, failures, say, t0, dtype) -> None:
    """Predictive vs bisect on every fifth bucket, true maxima, soak."""
    # Side by side in the same run on every fifth bucket (bisection on all 30 would not fit the time).
    subset = list(range(0, len(buckets), max(1, min(5, len(buckets) // 2))))  # >= 2 buckets, <= every fifth
    sub_buckets = [buckets[i] for i in subset]
    rnnt["comparison"] = comp = {"bucket_indices": subset,
                                 "note": "predictive and bisect each run fresh on every fifth bucket"}
    try:
        for strategy in ("predictive", "bisect"):
            say(f"{args.rnnt}: {strategy} over {len(subset)} buckets")
            comp[strategy] = run_search(probe, sub_buckets, strategy, args.max_batch_size)
            if not comp[strategy]["all_returned_probed"]:
                failures.append(f"rnnt {strategy} (subset): a returned batch size was not probed successfully")
            if comp[strategy]["leftover_bytes"] not in (0, None):
                failures.append(f"rnnt {strategy} (subset): {comp[strategy]['leftover_bytes']} bytes left allocated")
        rnnt["bisect"] = bis = comp["bisect"]
        rnnt["ratios"] = {"probes_bisect_over_predictive": bis["probes"] / comp["predictive"]["probes"],
                          "seconds_bisect_over_predictive": bis["seconds"] / max(comp["predictive"]["seconds"], 1e-9)}
    except Exception as e:  # noqa: BLE001
        part_failed(failures, f"{args.rnnt} predictive vs bisect", e)
    bisect_full = [None] * len(buckets)
    for k, i in enumerate(subset):
        if "bisect" in comp:
            bisect_full[i] = comp["bisect"]["batch_sizes"][k]
    # True maxima for five buckets spread over the range.
    idx = sorted({subset[round(k * (len(subset) - 1) / 4)] for k in range(5)})
    truth = {}
    if time.perf_counter() - t0 < args.time_limit_s:
        say(f"true maxima for buckets {idx}")
        try:
            truth = true_maxima(probe, buckets, idx, pred["batch_sizes"], args.max_batch_size)
        except Exception as e:  # noqa: BLE001
            part_failed(failures, "true maxima", e)
    else:
        failures.append("true maxima: not measured (time limit)")
    rnnt["true_max"] = {str(i): {"bucket": buckets[i], "true_max": t, "predictive": pred["batch_sizes"][i],
                                 "bisect": bisect_full[i],
                                 "predictive_below_true": (t - pred["batch_sizes"][i]) / t}
                        for i, t in truth.items()}
    for i, t in truth.items():
        got = pred["batch_sizes"][i]
        if got < t - max(1, int(0.03 * t)):
            failures.append(f"rnnt bucket {i}: predictive {got} is > 3% below the true maximum {t}")
    say("soak")
    profile = BucketProfile([list(b) for b in buckets], list(pred["batch_sizes"]))
    try:
        rnnt["soak"] = soak(model, profile, dtype=dtype, search_memory_fraction=args.memory_fraction,
                            steps_per_bucket=2, progress=False)
    except Exception as e:  # noqa: BLE001 - an OOM in the soak is a RuntimeError naming the step
        rnnt["soak"] = {"error": f"{type(e).__name__}: {e}"}
        part_failed(failures, "soak", e)
    release_memory()


def aed_part(args, aed, failures, say, t0, dtype) -> None:
    """Predictive and bisect for the AED model on its few buckets."""
    if time.perf_counter() - t0 >= args.time_limit_s - 60:
        aed["skipped"] = "time limit"
        failures.append("aed: not measured (time limit; run --part aed on its own)")
        return
    model = probe = None
    try:
        model = build(args.aed)
        probe = make_probe(model, dtype, args)
        for strategy in ("predictive", "bisect"):
            if time.perf_counter() - t0 > args.time_limit_s:
                aed[strategy] = {"skipped": "time limit"}
                failures.append(f"aed {strategy}: not measured (time limit)")
                continue
            say(f"{args.aed}: {strategy}")
            aed[strategy] = run_search(probe, aed["buckets"], strategy, args.max_batch_size)
            if not aed[strategy]["all_returned_probed"]:
                failures.append(f"aed {strategy}: a returned batch size was not probed successfully")
    except Exception as e:  # noqa: BLE001
        part_failed(failures, f"{args.aed} search", e)
    del model, probe
    release_memory()


def smoke_what(args, what: str) -> str:
    """``what`` of the JSON; a smoke run says first what it stood in for."""
    if not args.smoke:
        return what
    if torch.cuda.is_available():
        return f"SMOKE RUN (tiny models, few short buckets, batch sizes <= {args.max_batch_size}): {what}"
    return ("SMOKE RUN on a CPU, nothing measured: the real make_batch + training_step + AdamW step ran, but "
            "peaks come from a memory model (4 x parameter bytes + 256 bytes per batch element, budget "
            f"{SMOKE_BUDGET_BYTES >> 20} MiB above that; ModeledMemoryProbe), leftover bytes are not "
            f"measurable, DDP over gloo: {what}")


def main_ddp(args) -> int:
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    elif cuda_missing(args.smoke):
        return 2
    else:
        torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    t0 = time.perf_counter()
    buckets, bins_source = rnnt_buckets(args)
    model = build(args.rnnt)
    probe = make_probe(model, torch.bfloat16, args, ddp_gradient_buckets=True)
    res = run_search(probe, buckets, "predictive", args.max_batch_size)
    failures = [] if res["all_returned_probed"] else ["ddp: a returned batch size was not probed"]
    if res["probes_per_bucket"] > 3:
        failures.append(f"ddp predictive: {res['probes_per_bucket']:.2f} probes per bucket > 3")
    torch.distributed.barrier()
    if rank == 0:
        figures = {"smoke": bool(args.smoke), "probe": type(probe).__name__, "model": args.rnnt,
                   "world_size": world, "buckets": buckets, "bins_source": bins_source,
                   "predictive": res, "wall_seconds": time.perf_counter() - t0, "failures": failures}
        what = (f"OOMptimizer under torchrun with DDP gradient all-reduce on {world} GPUs (largest peak across "
                "ranks decides)")
        path = write_result("oomptimizer_ddp", what=smoke_what(args, what), figures=figures,
                            out_dir=args.out, params={"dtype": "bf16", "memory_fraction": args.memory_fraction,
                                                      "smoke": bool(args.smoke)})
        print(f"{args.rnnt} DDP x{world}: {res['probes']} probes ({res['probes_per_bucket']:.2f}/bucket), "
              f"{res['seconds']:.1f} s, batch sizes {res['batch_sizes']}")
        print(f"wrote {path}")
    torch.distributed.destroy_process_group()
    return report_failures(failures, smoke=args.smoke)


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
            why = (r or {}).get("skipped") or (r or {}).get("error") or "not run"
            print(f"{model[-21:]:21s} {name:22s} SKIPPED ({why})")
    ratios = figures["rnnt"].get("ratios", {})
    if ratios:
        print(f"bisect / predictive: {ratios['probes_bisect_over_predictive']:.2f}x probes, "
              f"{ratios['seconds_bisect_over_predictive']:.2f}x wall time")
    for i, t in figures["rnnt"].get("true_max", {}).items():
        print(f"  bucket {i:>3} {t['bucket']}: true max {t['true_max']}, predictive {t['predictive']} "
              f"({100 * t['predictive_below_true']:.1f}% below), bisect {t['bisect']}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the JSON (default: benchmarks/results)")
    parser.add_argument("--smoke", action="store_true", help="tiny models, few buckets, seconds on a CPU; "
                        "needs --out (never benchmarks/results)")
    parser.add_argument("--rnnt", default="large-rnnt", help="RNN-T model name (or module:Factory)")
    parser.add_argument("--aed", default="xl-aed", help="AED model name (or module:Factory)")
    parser.add_argument("--memory-fraction", type=float, default=0.9)
    parser.add_argument("--time-limit-s", type=float, default=TIME_LIMIT_S,
                        help="one-GPU run: start no new part after this many seconds")
    parser.add_argument("--part", choices=["all", "rnnt", "aed"], default="all",
                        help="one-GPU run: both models (oomptimizer.json), or one; 'aed' writes "
                             "oomptimizer_aed.json, so the two parts can run side by side on two GPUs")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs for the DDP run (torchrun)")
    parser.add_argument("--max-batch-size", type=int, default=1 << 20, help="cap on any batch size probed")
    args = parser.parse_args(argv)
    if args.smoke:
        check_smoke_out(parser, args.out)
        if args.rnnt == parser.get_default("rnnt"):
            args.rnnt = "tiny-rnnt"
        if args.aed == parser.get_default("aed"):
            args.aed = "tiny-aed"
        if args.max_batch_size == parser.get_default("max_batch_size") and torch.cuda.is_available():
            args.max_batch_size = SMOKE_MAX_BATCH_SIZE
    cpu_smoke = cpu_smoke_torch(args.smoke and not torch.cuda.is_available())
    if "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        with cpu_smoke:
            return main_ddp(args)
    if args.nproc > 1 and (args.part != "all" or args.time_limit_s != TIME_LIMIT_S):
        parser.error("--part and --time-limit-s belong to the one-GPU run, not to --nproc")
    if args.nproc > 1:
        # Without --nproc: torchrun's own parser would reject it as an ambiguous prefix of --nproc-per-node.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "-m", "workbench.bench.oomptimizer", *without_option(argv, "--nproc")]
        return subprocess.call(cmd)
    if cuda_missing(args.smoke):
        return 2
    with cpu_smoke:
        return main_single(args)


if __name__ == "__main__":
    sys.exit(main())
