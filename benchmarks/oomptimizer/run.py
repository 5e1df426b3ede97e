"""The OOMptimizer bench's CLI: predictive vs bisect search, true maxima, soak, xl AED, two-GPU DDP.

    python3 -m benchmarks.oomptimizer --out benchmarks/results            # both parts, one GPU
    python3 -m benchmarks.oomptimizer --out DIR --part rnnt               # GPU 0 ...
    python3 -m benchmarks.oomptimizer --out DIR --part aed                # ... and GPU 1, at once
    python3 -m benchmarks.oomptimizer --out benchmarks/results --nproc 2  # two GPUs (torchrun)
    python3 -m benchmarks.oomptimizer --out DIR --part rnnt-chunked       # joint whole vs chunked
    python3 -m benchmarks.oomptimizer --smoke --out /tmp/smoke [--nproc 2]   # CPU, seconds

RNN-T part: large RNN-T on 15 x 2 2D buckets up to 40 s: predictive search on all buckets (the profile),
both strategies fresh on every fifth bucket, true maxima on five of them, a soak of the profile, then the
one-GPU DDP gradient-bucket accounting. AED part: xl AED on 8 x 1 buckets, predictive and bisect.
``--time-limit-s``: no new part starts after it; a skipped part fails the run. ``--nproc 2`` relaunches
under torchrun and writes oomptimizer_ddp.json. Exit 1 when a returned size was not probed, predictive
needs > 3 probes per bucket, a size is > 3 % (and > 1) below the true maximum, the soak OOMs, or memory
is left allocated. --smoke: tiny models on a few short buckets; without CUDA the probe is
``ModeledMemoryProbe`` (``modeled_probe.py``). ``record.py`` owns the record's fields.
``--part rnnt-chunked [--joint-chunk-size K]``: the RNN-T predictive search only, with the joint whole and
over chunks of K utterances (``main_chunked``; its figures in ``chunked.py``; oomptimizer_rnnt_chunked.json).
"""


from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from workbench.memory import configure_allocator

configure_allocator()  # before CUDA is initialized

import torch  # noqa: E402

from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe  # noqa: E402
from benchmarks.harness import (bench_device, check_smoke_out, cpu_smoke_torch, cuda_missing,  # noqa: E402
                                report_failures, write_result)
from workbench.records import oomptimizer as record, oomptimizer_chunked as chunked  # noqa: E402
from workbench.records.results import load_result  # noqa: E402
from workbench.timing import summarize  # noqa: E402
from workbench.bucketing import estimate_2d_bins  # noqa: E402
from workbench.bucketing.profile import BucketProfile  # noqa: E402
from workbench.data.synthetic import synthetic_cut_arrays  # noqa: E402
from workbench.memory.oom import release_memory  # noqa: E402
from workbench.models import build_model  # noqa: E402
from workbench.oomptimizer.cli import without_option  # noqa: E402
from workbench.oomptimizer.probe import TrainingStepProbe  # noqa: E402
from workbench.oomptimizer.run import soak  # noqa: E402
from workbench.oomptimizer.search import search_batch_sizes  # noqa: E402
from workbench.oomptimizer.synthetic import demo_buckets  # noqa: E402

TIME_LIMIT_S = 300  # default --time-limit-s: no new part starts after this (skipped parts are named in the JSON)


DEFAULT_JOINT_CHUNK_SIZE = 16  # --part rnnt-chunked: utterances per joint + loss chunk
SMOKE_BUDGET_BYTES = 64 << 20  # modeled activation budget above the weights in --smoke on a CPU
SMOKE_MAX_BATCH_SIZE = 16  # --smoke with CUDA: tiny models would fit huge batches
SMOKE_JOINT_CHUNK_SIZE = 2  # --smoke --part rnnt-chunked: smaller than the smoke batch sizes, so chunks run


def build(name: str, joint_chunk_size: int = 0) -> torch.nn.Module:
    """A workbench model by name (built on the device, so an xl model is never initialized on the host),
    or ``module:Factory`` for any model with the same contract; ``joint_chunk_size`` (transducers):
    utterances per joint + loss chunk, 0 for the whole batch at once."""
    if ":" in name:
        module, attr = name.split(":")
        model = getattr(importlib.import_module(module), attr)().to(bench_device())
        if joint_chunk_size:
            model.config.joint_chunk_size = joint_chunk_size
        return model
    with bench_device():
        return build_model(name, joint_chunk_size=joint_chunk_size)


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
    arrays = synthetic_cut_arrays(num_cuts, seed=0)
    keep = arrays.durations <= max_duration
    est = estimate_2d_bins(arrays.durations[keep], arrays.num_tokens[keep], num_buckets, num_subbuckets)
    return ([(float(d), float(u)) for d, u in est.bins],
            f"estimate_2d_bins(synthetic_cut_arrays({num_cuts}), durations <= {max_duration:g} s)")


def run_search(probe, buckets, strategy: str, max_batch_size: int, *, stop_at: float | None = None,
               only: range | None = None) -> dict:
    """One search's figures (their fields: the record module's docstring). ``stop_at`` (a
    ``time.perf_counter()`` value): no new bucket starts after it; the buckets not searched get batch size
    None and ``stopped`` says so. ``only``: search just these bucket indices (the others get None); sizes and trace keep the full
    list's indices."""
    only = range(len(buckets)) if only is None else only
    release_memory()
    before = allocated_bytes()
    stop = None if stop_at is None else (lambda: time.perf_counter() >= stop_at)
    result = search_batch_sizes([buckets[i] for i in only], probe, budget_bytes=probe.budget_bytes,
                                strategy=strategy, max_batch_size=max_batch_size, stop=stop)
    release_memory()
    after = allocated_bytes()
    batch_sizes: list[int | None] = [None] * len(buckets)
    for j, b in enumerate(result.batch_sizes):
        batch_sizes[only[j]] = b
    fitted = {(only[p.bucket_index], p.batch_size) for p in result.probes if not p.oom}
    searched = [(i, b) for i, b in enumerate(batch_sizes) if b is not None]
    out = {"batch_sizes": batch_sizes, "probes": result.num_probes, "ooms": result.num_ooms,
           "probes_per_bucket": round(result.probes_per_bucket, 3), "seconds": round(result.seconds, 2),
           "all_returned_probed": all(ib in fitted for ib in searched),
           "leftover_bytes": None if before is None else after - before,  # None: not measurable (CPU)
           "probe_seconds": summarize([p.seconds for p in result.probes]),
           "trace": [[only[p.bucket_index], p.batch_size, p.peak_bytes, p.predicted_bytes] for p in result.probes]}
    if result.not_searched:
        out["stopped"] = f"time limit: {result.num_searched} of {len(only)} buckets searched"
    return out


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


@dataclass
class Parts:
    """What the parts of the one-GPU run share: the options, the start time, the dtype of the steps, the
    record's figures and failures so far, and where the record goes."""
    args: argparse.Namespace
    t0: float  # time.perf_counter() at the start, seconds
    dtype: torch.dtype
    figures: dict
    failures: list[str]
    name: str  # the record's name: oomptimizer or oomptimizer_aed
    what: str

    @property
    def rnnt(self) -> dict:
        return self.figures["rnnt"]

    @property
    def aed(self) -> dict:
        return self.figures["aed"]

    @property
    def buckets(self) -> list:
        return self.rnnt["buckets"]

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, message: str) -> None:
        print(f"[{self.elapsed():5.0f} s] {message}", flush=True)

    def save(self) -> Path:
        """Rewrite the record with what ran so far ("complete" stays false until the end)."""
        args = self.args
        self.figures["wall_seconds"] = self.elapsed()
        self.figures["failures"] = self.failures
        return write_result(self.name, what=smoke_what(args, self.what), figures=self.figures, out_dir=args.out,
                            params={"dtype": "bf16", "memory_fraction": args.memory_fraction, "rel_gap": 0.05,
                                    "max_batch_size": args.max_batch_size, "smoke": bool(args.smoke),
                                    "part": args.part, "time_limit_s": args.time_limit_s})


WHAT = {"all": "OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
               "{rnnt} 2D and {aed} on one GPU",
        "rnnt": "OOMptimizer: predictive vs bisect probes and wall time, true maxima, soak, DDP accounting; "
                "{rnnt} 2D on one GPU",
        "aed": "OOMptimizer: predictive vs bisect probes and wall time; {aed} on one GPU"}


def start_parts(args) -> Parts:
    buckets, bins_source = rnnt_buckets(args) if args.part != "aed" else ([], "not used by --part aed")
    aed_bins = aed_buckets(args)
    figures = {"smoke": bool(args.smoke), "complete": False, "part": args.part,
               "rnnt": {"model": args.rnnt, "buckets": buckets, "bins_source": bins_source},
               "aed": {"model": args.aed, "buckets": aed_bins,
                       "note": f"{len(aed_bins)} x 1 buckets (fewer than RNN-T to bound the run time)"}}
    return Parts(args=args, t0=time.perf_counter(), dtype=torch.bfloat16, figures=figures, failures=[],
                 name="oomptimizer_aed" if args.part == "aed" else "oomptimizer",
                 what=WHAT[args.part].format(rnnt=args.rnnt, aed=args.aed))


def main_single(args) -> int:
    """The one-GPU run. Each part that raises is a failure and the later parts still run; the JSON is
    rewritten after every part, so a stage timeout keeps what ran."""
    parts = start_parts(args)
    if args.part in ("all", "rnnt"):
        rnnt_part(parts)
    else:
        parts.rnnt["skipped"] = "--part aed (the RNN-T part writes oomptimizer.json)"
    if args.part in ("all", "aed"):
        aed_part(parts)
    else:
        parts.aed["skipped"] = "--part rnnt (the AED part writes oomptimizer_aed.json)"
    parts.save()
    if args.part in ("all", "rnnt"):
        ddp_accounting_part(parts)
    parts.figures["complete"] = True
    path = parts.save()
    print("\n".join(record.table_lines(parts.figures)))
    print(f"wrote {path}")
    return report_failures(parts.failures, smoke=args.smoke)


MAX_PROBES_PER_BUCKET = 3  # a predictive search that needs more has predicted badly


def too_many_probes(label: str, result: dict) -> list[str]:
    """The failure of a predictive search that took more than MAX_PROBES_PER_BUCKET probes per bucket; none
    for a search stopped early (a prefix of buckets: its first bucket costs more than the average)."""
    if result["probes_per_bucket"] <= MAX_PROBES_PER_BUCKET or "stopped" in result:
        return []
    return [f"{label} predictive: {result['probes_per_bucket']:.2f} probes per bucket > {MAX_PROBES_PER_BUCKET}"]


def check_search(parts: Parts, label: str, result: dict) -> None:
    """A search's failures: a returned size not probed, bytes left allocated."""
    if not result["all_returned_probed"]:
        parts.failures.append(f"{label}: a returned batch size was not probed successfully")
    if result["leftover_bytes"] not in (0, None):
        parts.failures.append(f"{label}: {result['leftover_bytes']} bytes left allocated after search")


def rnnt_part(parts: Parts) -> None:
    """Predictive search over every bucket (the profile), then the comparison, true maxima and soak."""
    args, rnnt = parts.args, parts.rnnt
    model = probe = None
    try:
        model = build(args.rnnt)
        probe = make_probe(model, parts.dtype, args)
        rnnt["probe"] = type(probe).__name__
        parts.say(f"{args.rnnt}: predictive over {len(parts.buckets)} buckets")
        rnnt["predictive"] = pred = run_search(probe, parts.buckets, "predictive", args.max_batch_size)
        rnnt["probe_seconds"] = pred["probe_seconds"]
        check_search(parts, "rnnt predictive", pred)
        parts.failures += too_many_probes("rnnt", pred)
    except Exception as e:  # noqa: BLE001 - without the profile nothing else of the RNN-T part can run
        part_failed(parts.failures, f"{args.rnnt} predictive search", e)
        pred = None
    parts.save()
    if pred is not None:
        subset = rnnt_comparison(parts, probe)
        rnnt_true_maxima(parts, probe, pred, subset)
        rnnt_soak(parts, model, pred)
        parts.save()
    del model, probe
    release_memory()


def ddp_accounting_part(parts: Parts) -> None:
    """Predictive search with one DDP gradient bucket's worth of memory held (one-GPU DDP accounting)."""
    args, rnnt = parts.args, parts.rnnt
    if parts.elapsed() >= args.time_limit_s - 60:
        rnnt["ddp_accounting"] = {"skipped": "time limit"}
        parts.failures.append("ddp accounting: not measured (time limit; run --part rnnt with more --time-limit-s)")
        return
    parts.say("one-GPU DDP gradient-bucket accounting")
    model = ddp_probe = None
    try:
        model = build(args.rnnt)
        ddp_probe = make_probe(model, parts.dtype, args, ddp_gradient_buckets=True)
        rnnt["ddp_accounting"] = run_search(ddp_probe, parts.buckets, "predictive", args.max_batch_size)
    except Exception as e:  # noqa: BLE001
        rnnt["ddp_accounting"] = {"error": f"{type(e).__name__}: {e}"}
        part_failed(parts.failures, "one-GPU DDP accounting", e)
    del model, ddp_probe
    release_memory()


def part_failed(failures: list[str], part: str, error: BaseException) -> None:
    """Record a part that raised (with its traceback on stderr); the run goes on."""
    traceback.print_exc()
    first_line = (str(error).splitlines() or [""])[0]
    failures.append(f"{part}: {type(error).__name__}: {first_line}")


def rnnt_comparison(parts: Parts, probe) -> list[int]:
    """Predictive vs bisect, each fresh, on every fifth bucket (bisection on all 30 would not fit the time);
    returns those buckets' indices."""
    args, rnnt, buckets = parts.args, parts.rnnt, parts.buckets
    subset = list(range(0, len(buckets), max(1, min(5, len(buckets) // 2))))  # >= 2 buckets, <= every fifth
    rnnt["comparison"] = comp = {"bucket_indices": subset,
                                 "note": "predictive and bisect each run fresh on every fifth bucket"}
    try:
        for strategy in ("predictive", "bisect"):
            parts.say(f"{args.rnnt}: {strategy} over {len(subset)} buckets")
            comp[strategy] = run_search(probe, [buckets[i] for i in subset], strategy, args.max_batch_size)
            check_search(parts, f"rnnt {strategy} (subset)", comp[strategy])
        rnnt["bisect"] = bis = comp["bisect"]
        rnnt["ratios"] = {"probes_bisect_over_predictive": bis["probes"] / comp["predictive"]["probes"],
                          "seconds_bisect_over_predictive": bis["seconds"] / max(comp["predictive"]["seconds"], 1e-9)}
    except Exception as e:  # noqa: BLE001
        part_failed(parts.failures, f"{args.rnnt} predictive vs bisect", e)
    return subset


def rnnt_true_maxima(parts: Parts, probe, pred: dict, subset: list[int]) -> None:
    """True maxima (bisection to a gap of 1) for five of the compared buckets, spread over the range."""
    args, rnnt, buckets = parts.args, parts.rnnt, parts.buckets
    comp = rnnt["comparison"]
    bisect_full = [None] * len(buckets)
    for k, i in enumerate(subset):
        if "bisect" in comp:
            bisect_full[i] = comp["bisect"]["batch_sizes"][k]
    idx = sorted({subset[round(k * (len(subset) - 1) / 4)] for k in range(5)})
    truth = {}
    if parts.elapsed() < args.time_limit_s:
        parts.say(f"true maxima for buckets {idx}")
        try:
            truth = true_maxima(probe, buckets, idx, pred["batch_sizes"], args.max_batch_size)
        except Exception as e:  # noqa: BLE001
            part_failed(parts.failures, "true maxima", e)
    else:
        parts.failures.append("true maxima: not measured (time limit)")
    rnnt["true_max"] = {str(i): {"bucket": buckets[i], "true_max": t, "predictive": pred["batch_sizes"][i],
                                 "bisect": bisect_full[i],
                                 "predictive_below_true": (t - pred["batch_sizes"][i]) / t}
                        for i, t in truth.items()}
    for i, t in truth.items():
        got = pred["batch_sizes"][i]
        if got < t - max(1, int(0.03 * t)):
            parts.failures.append(f"rnnt bucket {i}: predictive {got} is > 3% below the true maximum {t}")


def rnnt_soak(parts: Parts, model, pred: dict) -> None:
    """Training steps on the profile under training's memory limit."""
    parts.say("soak")
    profile = BucketProfile([list(b) for b in parts.buckets], list(pred["batch_sizes"]))
    try:
        parts.rnnt["soak"] = soak(model, profile, dtype=parts.dtype, search_memory_fraction=parts.args.memory_fraction,
                                  steps_per_bucket=2, progress=False)
    except Exception as e:  # noqa: BLE001 - an OOM in the soak is a RuntimeError naming the step
        parts.rnnt["soak"] = {"error": f"{type(e).__name__}: {e}"}
        part_failed(parts.failures, "soak", e)
    release_memory()


def aed_part(parts: Parts) -> None:
    """Predictive and bisect for the AED model on its few buckets."""
    args, aed = parts.args, parts.aed
    if parts.elapsed() >= args.time_limit_s - 60:
        aed["skipped"] = "time limit"
        parts.failures.append("aed: not measured (time limit; run --part aed on its own)")
        return
    model = probe = None
    try:
        model = build(args.aed)
        probe = make_probe(model, parts.dtype, args)
        for strategy in ("predictive", "bisect"):
            if parts.elapsed() > args.time_limit_s:
                aed[strategy] = {"skipped": "time limit"}
                parts.failures.append(f"aed {strategy}: not measured (time limit)")
                continue
            parts.say(f"{args.aed}: {strategy}")
            aed[strategy] = run_search(probe, aed["buckets"], strategy, args.max_batch_size)
            if not aed[strategy]["all_returned_probed"]:
                parts.failures.append(f"aed {strategy}: a returned batch size was not probed successfully")
    except Exception as e:  # noqa: BLE001
        part_failed(parts.failures, f"{args.aed} search", e)
    del model, probe
    release_memory()


def chunked_search(parts: Parts, label: str, joint_chunk_size: int, stop_at: float) -> dict:
    """One predictive search on the model with that joint chunking (built for it, freed after): a search's
    figures (the record module's docstring) with the joint chunk size, the probe's class and its budget (bytes)."""
    args, fig = parts.args, parts.figures
    model = probe = None
    try:
        model = build(args.rnnt, joint_chunk_size)
        probe = make_probe(model, parts.dtype, args)
        start, stop = fig["bucket_range"]
        parts.say(f"{args.rnnt} joint_chunk_size={joint_chunk_size}: predictive over buckets {start}-{stop - 1} "
                  f"of {len(fig['buckets'])}")
        result = run_search(probe, fig["buckets"], "predictive", args.max_batch_size, stop_at=stop_at,
                            only=range(*fig["bucket_range"]))
        result.update(joint_chunk_size=joint_chunk_size, probe=type(probe).__name__, budget_bytes=probe.budget_bytes)
        check_search(parts, f"{label} predictive", result)
        if "stopped" in result:
            parts.failures.append(f"{label} predictive: {result['stopped']}")
        parts.failures += too_many_probes(label, result)
    except Exception as e:  # noqa: BLE001 - the record keeps what ran
        part_failed(parts.failures, f"{args.rnnt} {label} predictive search", e)
        result = {"error": f"{type(e).__name__}: {e}", "joint_chunk_size": joint_chunk_size}
    del model, probe
    release_memory()
    return result


def main_chunked(args) -> int:
    """Both searches, the unchunked sizes against the committed record, the record (rewritten after each
    search, so a stage timeout keeps what ran; the ratios are read from it, record.chunked_comparison);
    exit 1 on a failed check (a smoke run reports them only)."""
    buckets, bins_source = rnnt_buckets(args)
    k = args.joint_chunk_size
    try:
        start, stop = bucket_range(args.buckets, len(buckets))
    except ValueError as e:
        print(f"--buckets: {e}", file=sys.stderr)
        return 2
    figures = {"smoke": bool(args.smoke), "complete": False, "part": record.CHUNKED_PART, "model": args.rnnt,
               "joint_chunk_size": k, "buckets": buckets, "bins_source": bins_source,
               "bucket_range": [start, stop]}
    if args.smoke and not torch.cuda.is_available():
        figures["note"] = ("the CPU stand-in's modeled peak counts batch elements only, so chunking the joint "
                           "changes nothing here: the ratios are 1")
    which = (f"{len(buckets)} 2D buckets" if (start, stop) == (0, len(buckets))
             else f"2D buckets {start}-{stop - 1} (of {len(buckets)})")
    what = (f"OOMptimizer predictive search for {args.rnnt} on the RNN-T part's {which}, twice "
            f"in one run: the joint whole and over chunks of {k} utterances (joint_chunk_size); one GPU")
    parts = Parts(args=args, t0=time.perf_counter(), dtype=torch.bfloat16, figures=figures, failures=[],
                  name=record.chunked_name(start, stop, len(buckets)), what=what)
    unchunked_stop = parts.t0 + chunked.UNCHUNKED_SHARE * args.time_limit_s
    figures["unchunked"] = chunked_search(parts, "unchunked", 0, unchunked_stop)
    parts.save()
    figures["chunked"] = chunked_search(parts, f"joint_chunk_size={k}", k, parts.t0 + args.time_limit_s)
    unchunked_sizes = figures["unchunked"].get("batch_sizes", [None] * len(buckets))
    reference = load_result(chunked.REFERENCE)
    figures["across_runs"] = chunked.across_runs(unchunked_sizes, buckets, reference)
    chunked_sizes = figures["chunked"].get("batch_sizes", [None] * len(buckets))
    figures["chunked_across_runs"] = chunked.across_runs(chunked_sizes, buckets, reference, "chunked")
    figures["complete"] = True
    path = parts.save()
    print("\n".join(record.chunked_summary_lines(figures)))
    print(f"wrote {path}")
    return report_failures(parts.failures, smoke=args.smoke)


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
    failures += too_many_probes("ddp", res)
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


def bucket_range(text: str | None, num_buckets: int) -> tuple[int, int]:
    """--buckets START:STOP (non-negative bucket indices, STOP excluded; either may be left out) -> (start, stop)
    within ``num_buckets``; None: every bucket. ValueError names what is wrong."""
    if text is None:
        return 0, num_buckets
    head, sep, tail = text.partition(":")
    if not sep:
        raise ValueError(f"expected START:STOP (bucket indices, STOP excluded), got {text!r}")
    try:
        start = int(head) if head.strip() else 0
        stop = int(tail) if tail.strip() else num_buckets
    except ValueError:
        raise ValueError(f"expected integer bucket indices START:STOP, got {text!r}") from None
    if not 0 <= start < stop <= num_buckets:
        raise ValueError(f"need 0 <= START < STOP <= {num_buckets} (the number of buckets), got {text!r}")
    return start, stop


def joint_chunk_size(text: str) -> int:
    """--joint-chunk-size's value: an integer >= 1 (argparse reports the error in one line)."""
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 utterance per chunk, got {k}")
    return k


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
    parser.add_argument("--part", choices=["all", "rnnt", "aed", record.CHUNKED_PART], default="all",
                        help="one-GPU run: both models (oomptimizer.json), or one; 'aed' writes "
                             "oomptimizer_aed.json, so the two parts can run side by side on two GPUs; "
                             f"'{record.CHUNKED_PART}': the RNN-T predictive search with the joint whole and "
                             f"chunked, nothing else ({record.CHUNKED_NAME}.json)")
    parser.add_argument("--joint-chunk-size", type=joint_chunk_size, default=None,
                        help=f"--part {record.CHUNKED_PART}: utterances per joint + loss chunk in the chunked "
                             "search (default 16; 2 with --smoke)")
    parser.add_argument("--buckets", default=None, metavar="START:STOP",
                        help=f"--part {record.CHUNKED_PART}: search only the buckets with these indices (STOP "
                             f"excluded); the record is then named {record.CHUNKED_NAME}_START_STOP.json")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs for the DDP run (torchrun)")
    parser.add_argument("--max-batch-size", type=int, default=1 << 20, help="cap on any batch size probed")
    args = parser.parse_args(argv)
    if args.joint_chunk_size is not None and args.part != record.CHUNKED_PART:
        parser.error(f"--joint-chunk-size belongs to --part {record.CHUNKED_PART}")
    if args.buckets is not None and args.part != record.CHUNKED_PART:
        parser.error(f"--buckets belongs to --part {record.CHUNKED_PART}")
    if args.part == record.CHUNKED_PART and args.joint_chunk_size is None:  # smoke: below the tiny batches
        args.joint_chunk_size = SMOKE_JOINT_CHUNK_SIZE if args.smoke else DEFAULT_JOINT_CHUNK_SIZE
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
               "-m", "benchmarks.oomptimizer", *without_option(argv, "--nproc")]
        return subprocess.call(cmd)
    if cuda_missing(args.smoke):
        return 2
    with cpu_smoke:
        if args.part == record.CHUNKED_PART:
            return main_chunked(args)
        return main_single(args)


if __name__ == "__main__":
    sys.exit(main())
