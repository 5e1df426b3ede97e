"""The OOMptimizer bench's ``--part rnnt-chunked``: large RNN-T's predictive search twice on the RNN-T part's
bins, the joint whole (joint_chunk_size 0) and over chunks of K utterances, in one run.

    python3 -m workbench.bench.oomptimizer --part rnnt-chunked [--joint-chunk-size 16] --time-limit-s 240

Writes ``oomptimizer_rnnt_chunked.json``: both searches (record.SearchFigures), per bucket the chunked /
unchunked batch size ratio with its min/median/max, the buckets at >= 2x and the target line, and the
unchunked sizes against the committed ``oomptimizer.json`` (across runs). Only the two searches run (no
bisect, true maxima, soak or DDP accounting). ``--time-limit-s``: the unchunked search starts no new
bucket after ``UNCHUNKED_SHARE`` of it, the chunked one none after all of it; the record says which
buckets were not searched, and the ratios cover the buckets both searched.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

import torch

from workbench.bench.oomptimizer import record
from workbench.bench.oomptimizer import run as bench
from workbench.bench.results import load_result, report_failures
from workbench.memory.oom import release_memory

PART = record.CHUNKED_PART
NAME = record.CHUNKED_NAME
TARGET_RATIO = 2.0  # the target: chunked batch size >= 2x the unchunked one at every bucket
UNCHUNKED_SHARE = 0.45  # of --time-limit-s for the unchunked search (the chunked one probes larger batches)
REFERENCE = "oomptimizer"  # the committed record whose rnnt predictive sizes the unchunked run is set against


def ratio_figures(unchunked: list[int | None], chunked: list[int | None],
                  buckets: list[tuple[float, float]], target: float = TARGET_RATIO) -> dict[str, Any]:
    """Per bucket chunked / unchunked batch size (None where either search did not reach the bucket), their
    min/median/max, the bucket indices at >= ``target``, and the target line."""
    if not (len(unchunked) == len(chunked) == len(buckets)):
        raise ValueError(f"need one batch size per bucket: {len(unchunked)} unchunked, {len(chunked)} chunked, "
                         f"{len(buckets)} buckets")
    ratios = [c / u if u and c else None for u, c in zip(unchunked, chunked)]
    compared = [i for i, r in enumerate(ratios) if r is not None]
    out: dict[str, Any] = {"ratios": ratios, "compared": len(compared), "buckets": len(buckets),
                           "at_least_target": [i for i in compared if ratios[i] >= target], "target": target}
    if compared:
        values = [ratios[i] for i in compared]
        out.update({"min": min(values), "median": statistics.median(values), "max": max(values),
                    "min_bucket": min(compared, key=lambda i: ratios[i])})
    out["target_met"] = bool(compared) and len(compared) == len(buckets) and len(out["at_least_target"]) == len(buckets)
    out["target_line"] = target_line(out, buckets)
    return out


def target_line(r: Mapping[str, Any], buckets: list[tuple[float, float]]) -> str:
    """"chunked >= 2x unchunked at every bucket: met" or missed, with the smallest ratio and how far below."""
    head = f"chunked >= {r['target']:g}x unchunked at every bucket"
    if not r["compared"]:
        return f"{head}: not measured (no bucket searched by both)"
    i = r["min_bucket"]
    d, u = buckets[i]
    smallest = f"smallest ratio {r['min']:.2f}x at bucket {i} ({d:g} s, {u:g} tokens)"
    if r["target_met"]:
        return f"{head}: met ({smallest})"
    below = r["compared"] - len(r["at_least_target"])
    parts = []
    if r["compared"] < r["buckets"]:
        parts.append(f"only {r['compared']} of {r['buckets']} buckets searched by both")
    if below:
        short = r["target"] - r["min"]
        parts.append(f"{below} of {r['compared']} compared buckets below {r['target']:g}x; {smallest}, "
                     f"{short:.2f} short ({short / r['target']:.0%})")
    else:
        parts.append(f"every compared bucket at >= {r['target']:g}x ({smallest})")
    return f"{head}: missed ({'; '.join(parts)})"


def across_runs(unchunked: list[int | None], buckets: list[tuple[float, float]],
                reference: Mapping[str, Any] | None) -> dict[str, Any]:
    """This run's unchunked batch sizes / the reference record's rnnt predictive ones per bucket (two runs,
    possibly at different commits), or ``skipped`` saying why they cannot be set side by side."""
    if reference is None:
        return {"skipped": f"no {REFERENCE}.json committed"}
    part = reference.get("figures", {}).get("rnnt", {})
    old = part.get("predictive", {}).get("batch_sizes")
    if old is None:
        return {"skipped": f"{REFERENCE}.json has no rnnt predictive batch sizes"}
    if [tuple(b) for b in part.get("buckets", [])] != [tuple(b) for b in buckets]:
        return {"skipped": f"buckets differ from {REFERENCE}.json's ({len(part.get('buckets', []))} there, "
                           f"{len(buckets)} here)"}
    ratios = [n / o if n and o else None for n, o in zip(unchunked, old)]
    values = [r for r in ratios if r is not None]
    out = {"label": f"across runs: this run's unchunked batch sizes / {REFERENCE}.json's "
                    f"(commit {str(reference.get('git_commit', '?'))[:12]}, {str(reference.get('date', '?'))[:10]})",
           "reference_batch_sizes": old, "ratios": ratios}
    if values:
        out.update({"min": min(values), "median": statistics.median(values), "max": max(values)})
    return out


def returned_peaks(search: Mapping[str, Any]) -> list[float | None]:
    """Per bucket the peak bytes of the probe at the returned batch size (None: not searched or no peak)."""
    peaks: dict[tuple[int, int], float] = {(i, b): p for i, b, p, _ in search["trace"] if p is not None}
    return [peaks.get((i, b)) if b is not None else None for i, b in enumerate(search["batch_sizes"])]


def search_part(parts: bench.Parts, label: str, joint_chunk_size: int, stop_at: float) -> dict:
    """One predictive search on the model with that joint chunking (built for it, freed after)."""
    args, fig = parts.args, parts.figures
    model = probe = None
    try:
        model = bench.build(args.rnnt, joint_chunk_size)
        probe = bench.make_probe(model, parts.dtype, args)
        fig["probe"], fig["budget_bytes"] = type(probe).__name__, probe.budget_bytes
        parts.say(f"{args.rnnt} joint_chunk_size={joint_chunk_size}: predictive over {len(fig['buckets'])} buckets")
        result = bench.run_search(probe, fig["buckets"], "predictive", args.max_batch_size, stop_at=stop_at)
        result["joint_chunk_size"] = joint_chunk_size
        peaks = returned_peaks(result)
        result["returned_peak_bytes"] = peaks
        result["max_peak_bytes"] = max((p for p in peaks if p is not None), default=None)
        bench.check_search(parts, f"{label} predictive", result)
        if "stopped" in result:
            parts.failures.append(f"{label} predictive: {result['stopped']}")
        if result["probes_per_bucket"] > 3 and "stopped" not in result:  # a prefix's first bucket costs more
            parts.failures.append(f"{label} predictive: {result['probes_per_bucket']:.2f} probes per bucket > 3")
    except Exception as e:  # noqa: BLE001 - the record keeps what ran
        bench.part_failed(parts.failures, f"{args.rnnt} {label} predictive search", e)
        result = {"error": f"{type(e).__name__}: {e}", "joint_chunk_size": joint_chunk_size}
    del model, probe
    release_memory()
    return result


def main_chunked(args) -> int:
    """Both searches, the ratios, the record (rewritten after each search, so a stage timeout keeps what
    ran); exit 1 on a failed check (a smoke run reports them only)."""
    buckets, bins_source = bench.rnnt_buckets(args)
    k = args.joint_chunk_size
    figures = {"smoke": bool(args.smoke), "complete": False, "part": PART, "model": args.rnnt,
               "joint_chunk_size": k, "buckets": buckets, "bins_source": bins_source}
    if args.smoke and not torch.cuda.is_available():
        figures["note"] = ("the CPU stand-in's modeled peak counts batch elements only, so chunking the joint "
                           "changes nothing here: the ratios are 1")
    what = (f"OOMptimizer predictive search for {args.rnnt} on the RNN-T part's {len(buckets)} 2D buckets, twice "
            f"in one run: the joint whole and over chunks of {k} utterances (joint_chunk_size); one GPU")
    parts = bench.Parts(args=args, t0=time.perf_counter(), dtype=torch.bfloat16, figures=figures,
                        failures=[], name=NAME, what=what)
    figures["unchunked"] = search_part(parts, "unchunked", 0, parts.t0 + UNCHUNKED_SHARE * args.time_limit_s)
    parts.save()
    figures["chunked"] = search_part(parts, f"joint_chunk_size={k}", k, parts.t0 + args.time_limit_s)
    un, ch = (figures[key].get("batch_sizes", [None] * len(buckets)) for key in ("unchunked", "chunked"))
    figures["comparison"] = ratio_figures(un, ch, buckets)
    figures["across_runs"] = across_runs(un, buckets, load_result(REFERENCE))
    figures["complete"] = True
    path = parts.save()
    print("\n".join(record.chunked_summary_lines(figures)))
    print(f"wrote {path}")
    return report_failures(parts.failures, smoke=args.smoke)
