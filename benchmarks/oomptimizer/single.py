"""The OOMptimizer bench's one-GPU run: the RNN-T part (profile, predictive vs bisect, true maxima, soak,
one-GPU DDP accounting) and the AED part, each recorded as it ends."""

from __future__ import annotations

from benchmarks.harness import Run
from benchmarks.oomptimizer import probes
from benchmarks.oomptimizer.buckets import aed_buckets, rnnt_buckets
from workbench.bucketing.profile import BucketProfile
from workbench.memory.oom import release_memory
from workbench.oomptimizer.run import soak
from workbench.records import oomptimizer as record

LATE_PART_MARGIN_S = 60  # the AED part and the DDP accounting start only with this much of --budget-s left
WHAT = {"all": "OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
               "{rnnt} 2D and {aed} on one GPU",
        "rnnt": "OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
                "{rnnt} 2D on one GPU",
        "aed": "OOMptimizer: predictive vs bisect probes and wall time; {aed} on one GPU"}


def part_name(parts: list[str]) -> str:
    """The record's ``part``: all (both models), rnnt or aed."""
    return "all" if {"rnnt", "aed"} <= set(parts) else parts[0]


def say(run: Run, message: str) -> None:
    """A progress line with the wall seconds so far (also kept in the record's ``wall_seconds``)."""
    run.figures["wall_seconds"] = run.seconds()
    print(f"[{run.seconds():5.0f} s] {message}", flush=True)


def prepare(run: Run) -> None:
    """The record's name, ``what``, parameters and first figures (models and buckets) for the selected parts."""
    args = run.args
    part = part_name(args.parts)
    buckets, bins_source = rnnt_buckets(args) if part != "aed" else ([], "not used by --parts aed")
    aed_bins = aed_buckets(args)
    run.figures.update({"smoke": bool(args.smoke), "complete": False, "part": part,
                        "rnnt": {"model": args.rnnt, "buckets": buckets, "bins_source": bins_source},
                        "aed": {"model": args.aed, "buckets": aed_bins,
                                "note": f"{len(aed_bins)} x 1 buckets (fewer than RNN-T to bound the run time)"}})
    run.name = "oomptimizer_aed" if part == "aed" else "oomptimizer"
    run.what = probes.smoke_what(args, WHAT[part].format(rnnt=args.rnnt, aed=args.aed))
    run.params.update(record_params(args, part))


def record_params(args, part: str) -> dict:
    """The record's own parameters (besides the options)."""
    return {"dtype": "bf16", "memory_fraction": args.memory_fraction, "rel_gap": 0.05,
            "max_batch_size": args.max_batch_size, "smoke": bool(args.smoke), "part": part,
            "time_limit_s": args.budget_s}


def run_single(run: Run) -> None:
    """The selected parts in turn; a part that raises is a failure and the later parts still run."""
    prepare(run)
    fig = run.figures
    if "rnnt" in run.args.parts:  # the profile search always runs: the first part
        rnnt_part(run)
    else:
        fig["rnnt"]["skipped"] = "--parts aed (the RNN-T part writes oomptimizer.json)"
    if "aed" in run.args.parts:
        aed_part(run)
    else:
        fig["aed"]["skipped"] = "--parts rnnt (the AED part writes oomptimizer_aed.json)"
    run.save()
    if "rnnt" in run.args.parts:
        ddp_accounting_part(run)
    fig["wall_seconds"], fig["complete"] = run.seconds(), True
    print("\n".join(record.table_lines(fig)))


def rnnt_part(run: Run) -> None:
    """Predictive search over every bucket (the profile), then the comparison, true maxima and soak."""
    args, rnnt = run.args, run.figures["rnnt"]
    model = probe = None
    with run.part(f"{args.rnnt} predictive search"):
        model = probes.build(args.rnnt)
        probe = probes.make_probe(model, args)
        rnnt["probe"] = type(probe).__name__
        say(run, f"{args.rnnt}: predictive over {len(rnnt['buckets'])} buckets")
        rnnt["predictive"] = pred = probes.run_search(probe, rnnt["buckets"], "predictive", args.max_batch_size)
        rnnt["probe_seconds"] = pred["probe_seconds"]
        run.failures += probes.search_failures("rnnt predictive", pred) + probes.too_many_probes("rnnt", pred)
    if "predictive" in rnnt:  # without the profile nothing else of the RNN-T part can run
        subset = compared_buckets(len(rnnt["buckets"]))
        rnnt["comparison"] = {"bucket_indices": subset,
                              "note": "predictive and bisect each run fresh on every fifth bucket"}
        with run.part(f"{args.rnnt} predictive vs bisect"):
            comparison(run, probe, subset)
        true_maxima_part(run, probe, subset)
        with run.part("soak"):
            soak_part(run, model)
    del model, probe
    release_memory()


def compared_buckets(num_buckets: int) -> list[int]:
    """The indices of the buckets both strategies search: every fifth, at least two."""
    return list(range(0, num_buckets, max(1, min(5, num_buckets // 2))))


def comparison(run: Run, probe, subset: list[int]) -> None:
    """Predictive vs bisect, each fresh, on ``subset`` (bisection on all 30 buckets would not fit the time)."""
    args, rnnt = run.args, run.figures["rnnt"]
    comp = rnnt["comparison"]
    for strategy in ("predictive", "bisect"):
        say(run, f"{args.rnnt}: {strategy} over {len(subset)} buckets")
        comp[strategy] = probes.run_search(probe, [rnnt["buckets"][i] for i in subset], strategy,
                                           args.max_batch_size)
        run.failures += probes.search_failures(f"rnnt {strategy} (subset)", comp[strategy])
    rnnt["bisect"] = bis = comp["bisect"]
    rnnt["ratios"] = {"probes_bisect_over_predictive": bis["probes"] / comp["predictive"]["probes"],
                      "seconds_bisect_over_predictive": bis["seconds"] / max(comp["predictive"]["seconds"], 1e-9)}


def true_maxima_part(run: Run, probe, subset: list[int]) -> None:
    """True maxima (bisection to a gap of 1) for five of the compared buckets, spread over the range; a
    predictive size more than 3 % (and more than 1) below one fails."""
    args, rnnt = run.args, run.figures["rnnt"]
    buckets, pred, comp = rnnt["buckets"], rnnt["predictive"]["batch_sizes"], rnnt["comparison"]
    bisect_full = [None] * len(buckets)
    for k, i in enumerate(subset):
        if "bisect" in comp:
            bisect_full[i] = comp["bisect"]["batch_sizes"][k]
    idx = sorted({subset[round(k * (len(subset) - 1) / 4)] for k in range(5)})
    truth = {}
    if probes.in_budget(run):
        say(run, f"true maxima for buckets {idx}")
        with run.part("true maxima"):
            truth = probes.true_maxima(probe, buckets, idx, pred, args.max_batch_size)
    else:
        run.failures.append("true maxima: not measured (time limit)")
    rnnt["true_max"] = {str(i): {"bucket": buckets[i], "true_max": t, "predictive": pred[i], "bisect": bisect_full[i],
                                 "predictive_below_true": (t - pred[i]) / t}
                        for i, t in truth.items()}
    for i, t in truth.items():
        if pred[i] < t - max(1, int(0.03 * t)):
            run.failures.append(f"rnnt bucket {i}: predictive {pred[i]} is > 3% below the true maximum {t}")


def soak_part(run: Run, model) -> None:
    """Training steps on the profile under training's memory limit; an error is kept in the record too."""
    rnnt = run.figures["rnnt"]
    say(run, "soak")
    profile = BucketProfile([list(b) for b in rnnt["buckets"]], list(rnnt["predictive"]["batch_sizes"]))
    try:
        rnnt["soak"] = soak(model, profile, dtype=probes.DTYPE, search_memory_fraction=run.args.memory_fraction,
                            steps_per_bucket=2, progress=False)
    except Exception as e:  # an OOM in the soak is a RuntimeError naming the step; run.part records it
        rnnt["soak"] = {"error": f"{type(e).__name__}: {e}"}
        raise
    finally:
        release_memory()


def ddp_accounting_part(run: Run) -> None:
    """Predictive search with one DDP gradient bucket's worth of memory held (one-GPU DDP accounting)."""
    args, rnnt = run.args, run.figures["rnnt"]
    if not probes.in_budget(run, LATE_PART_MARGIN_S):
        rnnt["ddp_accounting"] = {"skipped": "time limit"}
        run.failures.append("ddp accounting: not measured (time limit; run --parts rnnt with more --budget-s)")
        return
    say(run, "one-GPU DDP gradient-bucket accounting")
    with run.part("one-GPU DDP accounting"):
        try:
            model = probes.build(args.rnnt)
            ddp_probe = probes.make_probe(model, args, ddp_gradient_buckets=True)
            rnnt["ddp_accounting"] = probes.run_search(ddp_probe, rnnt["buckets"], "predictive", args.max_batch_size)
        except Exception as e:  # kept in the record too; run.part records the failure
            rnnt["ddp_accounting"] = {"error": f"{type(e).__name__}: {e}"}
            raise


def aed_part(run: Run) -> None:
    """Predictive and bisect for the AED model on its few buckets."""
    args, aed = run.args, run.figures["aed"]
    if not probes.in_budget(run, LATE_PART_MARGIN_S):
        aed["skipped"] = "time limit"
        run.failures.append("aed: not measured (time limit; run --parts aed on its own)")
        return
    with run.part(f"{args.aed} search"):
        model = probes.build(args.aed)
        probe = probes.make_probe(model, args)
        for strategy in ("predictive", "bisect"):
            if not probes.in_budget(run):
                aed[strategy] = {"skipped": "time limit"}
                run.failures.append(f"aed {strategy}: not measured (time limit)")
                continue
            say(run, f"{args.aed}: {strategy}")
            aed[strategy] = probes.run_search(probe, aed["buckets"], strategy, args.max_batch_size)
            if not aed[strategy]["all_returned_probed"]:
                run.failures.append(f"aed {strategy}: a returned batch size was not probed successfully")
        del model, probe
