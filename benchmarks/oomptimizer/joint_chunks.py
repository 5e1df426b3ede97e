"""The OOMptimizer bench's ``--parts rnnt-chunked``: the RNN-T predictive search twice, with the joint whole
and over chunks of ``--joint-chunk-size`` utterances, or (``--joint-loss fused``) with the joint and loss fused
(the record's figures: ``oomptimizer_chunked.py``)."""

from __future__ import annotations

import sys

import torch

from benchmarks.harness import Run
from benchmarks.oomptimizer import probes
from benchmarks.oomptimizer.buckets import bucket_range, rnnt_buckets
from benchmarks.oomptimizer.single import record_params, say
from workbench.memory.oom import release_memory
from workbench.records import oomptimizer as record, oomptimizer_chunked as chunked
from workbench.records.results import load_result


def prepare(run: Run) -> bool:
    """The record's name, ``what``, parameters and first figures; False (after saying why on stderr) for a
    bad ``--buckets``."""
    args = run.args
    buckets, bins_source = rnnt_buckets(args)
    fused = args.joint_loss == "fused"
    k = 0 if fused else args.joint_chunk_size
    try:
        start, stop = bucket_range(args.buckets, len(buckets))
    except ValueError as e:
        print(f"--buckets: {e}", file=sys.stderr)
        return False
    run.figures.update({"smoke": bool(args.smoke), "complete": False, "part": record.CHUNKED_PART,
                        "model": args.rnnt, "joint_chunk_size": k, "joint_loss": args.joint_loss,
                        "buckets": buckets, "bins_source": bins_source,
                        "bucket_range": [start, stop]})
    if args.smoke and not torch.cuda.is_available():
        run.figures["note"] = ("the CPU stand-in's modeled peak counts batch elements only, so "
                               + ("fusing the joint and loss" if fused else "chunking the joint")
                               + " changes nothing here: the ratios are 1")
    which = (f"{len(buckets)} 2D buckets" if (start, stop) == (0, len(buckets))
             else f"2D buckets {start}-{stop - 1} (of {len(buckets)})")
    run.name = record.chunked_name(start, stop, len(buckets), fused=fused)
    second = ("with the joint and loss fused (the logits never built)" if fused else
              f"over chunks of {k} utterances (joint_chunk_size)")
    run.what = probes.smoke_what(args, f"OOMptimizer predictive search for {args.rnnt} on the RNN-T part's "
                                       f"{which}, twice in one run: the joint whole and {second}; one GPU")
    run.params.update(record_params(args, record.CHUNKED_PART))
    return True


def run_chunked(run: Run) -> int:
    """Both searches (the unchunked one within its share of ``--budget-s``), then both sizes against the
    committed record; the record is saved after each search. Returns 2 for a bad ``--buckets``, else 0."""
    if not prepare(run):
        return 2
    args, fig = run.args, run.figures
    budget = args.budget_s
    unchunked_stop = run.started + chunked.UNCHUNKED_SHARE * budget if budget else None
    fig["unchunked"] = chunked_search(run, "unchunked", 0, unchunked_stop)
    run.save()
    name, label = record.second_search(fig)
    fig["chunked"] = chunked_search(run, label, fig["joint_chunk_size"], run.started + budget if budget else None,
                                    fig["joint_loss"])
    reference = load_result(chunked.REFERENCE)
    none = [None] * len(fig["buckets"])
    fig["across_runs"] = chunked.across_runs(fig["unchunked"].get("batch_sizes", none), fig["buckets"], reference)
    fig["chunked_across_runs"] = chunked.across_runs(fig["chunked"].get("batch_sizes", none), fig["buckets"],
                                                     reference, name)
    fig["wall_seconds"], fig["complete"] = run.seconds(), True
    print("\n".join(record.chunked_summary_lines(fig)))
    return 0


def chunked_search(run: Run, label: str, joint_chunk_size: int, stop_at: float | None,
                   joint_loss: str = "materialized") -> dict:
    """One predictive search on the model with that joint chunking or joint loss (built for it, freed after):
    a search's figures (the record module's docstring) with the joint chunk size, the joint loss, the probe's
    class and its budget (bytes); ``stop_at``: a ``time.perf_counter()`` value after which no bucket starts
    (None: none)."""
    args, fig = run.args, run.figures
    result = {"error": "not finished", "joint_chunk_size": joint_chunk_size, "joint_loss": joint_loss}
    with run.part(f"{args.rnnt} {label} predictive search"):
        try:
            model = probes.build(args.rnnt, joint_chunk_size, joint_loss)
            probe = probes.make_probe(model, args)
            start, stop = fig["bucket_range"]
            say(run, f"{args.rnnt} {label}: predictive over buckets {start}-{stop - 1} "
                     f"of {len(fig['buckets'])}")
            result = probes.run_search(probe, fig["buckets"], "predictive", args.max_batch_size, stop_at=stop_at,
                                       only=range(start, stop))
        except Exception as e:  # kept in the record too; run.part records the failure
            result["error"] = f"{type(e).__name__}: {e}"
            raise
        result.update(joint_chunk_size=joint_chunk_size, joint_loss=joint_loss, probe=type(probe).__name__,
                      budget_bytes=probe.budget_bytes)
        run.failures.extend(probes.search_failures(f"{label} predictive", result))
        if "stopped" in result:
            run.failures.append(f"{label} predictive: {result['stopped']}")
        run.failures.extend(probes.too_many_probes(label, result))
        del model, probe
    release_memory()
    return result
