"""The OOMptimizer records (``benchmarks/results/oomptimizer*.json``): their fields and every reading of them.

``oomptimizer.json`` and ``oomptimizer_aed.json``: ``figures["rnnt"]`` and ``figures["aed"]``, each with
the model, its buckets ``[(duration s, tokens)]`` and per search (``predictive``, ``bisect``,
``comparison``, ``ddp_accounting``) a search's figures (below); RNN-T also ``true_max`` per bucket index
and the ``soak`` report. ``oomptimizer_ddp.json``: ``figures["predictive"]`` of a torchrun run on
``world_size`` GPUs; ``oomptimizer_ddp_one_gpu.json``: a one-GPU record of the same training step whose
``ddp_accounting`` search the DDP run is set against. ``oomptimizer_rnnt_chunked.json`` (``part``
"rnnt-chunked"): the buckets, the ``unchunked`` and ``chunked`` searches (batch size None for a bucket not
searched) each with its ``joint_chunk_size``, ``probe`` and ``budget_bytes``, and ``across_runs``
(chunked.across_runs); the chunked / unchunked comparison is derived when read (:func:`chunked_comparison`).

A search's figures: ``batch_sizes`` (one per bucket, each probed successfully; None: not searched, time
limit), ``stopped`` (only when the search stopped at its time limit: how many buckets it searched),
``probes``, ``ooms``, ``probes_per_bucket``, ``seconds`` (wall time), ``all_returned_probed``,
``leftover_bytes`` (allocated bytes after the search minus before; None: not measurable),
``probe_seconds`` (results.summarize() of one probe's seconds) and ``trace`` (rows of bucket index, batch
size, peak bytes or None for an OOM, predicted bytes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from workbench.records import oomptimizer_chunked as chunked
from workbench.records.results import RESULTS_DIR, load_result
from workbench.oomptimizer.plots import (bucket_label, meaning_of_search, plot_batch_sizes, plot_probe_trace,
                                         plot_strategy_comparison, styled_strategy_table)
from workbench.oomptimizer.run import describe_soak
from workbench.units import GiB

NAME = "oomptimizer"  # every oomptimizer*.json but the chunked ones
CHUNKED_NAME = "oomptimizer_rnnt_chunked"  # --parts rnnt-chunked (oomptimizer_chunked.py)
# the one-GPU search with DDP's gradient buckets accounted, of the same training step as oomptimizer_ddp.json
DDP_ONE_GPU_NAME = "oomptimizer_ddp_one_gpu"
CHUNKED_PART = "rnnt-chunked"


FUSED_NAME = "oomptimizer_rnnt_fused"  # --parts rnnt-chunked --joint-loss fused: the same figures


def chunked_name(start: int, stop: int, num_buckets: int, *, fused: bool = False) -> str:
    """The chunked record's name: CHUNKED_NAME (FUSED_NAME with the joint and loss fused) over every bucket,
    else that name _START_STOP."""
    name = FUSED_NAME if fused else CHUNKED_NAME
    return name if (start, stop) == (0, num_buckets) else f"{name}_{start}_{stop}"


def is_fused(figures: Mapping[str, Any]) -> bool:
    """Whether a chunked record's second search fused the joint and loss (rather than chunking the joint)."""
    return figures.get("joint_loss") == "fused"


def second_search(figures: Mapping[str, Any]) -> tuple[str, str]:
    """A chunked record's second search: its name ("fused" or "chunked") and its label ("joint and loss fused"
    or "joint_chunk_size K")."""
    if is_fused(figures):
        return "fused", "joint and loss fused"
    return "chunked", f"joint_chunk_size {figures['joint_chunk_size']}"


def _search_line(label: str, r: Mapping[str, Any]) -> str:
    return (f"- {label}: {len(r['batch_sizes'])} buckets, {r['probes']} probes ({r['probes_per_bucket']:.2f} per "
            f"bucket), {r['ooms']} OOMs, {r['seconds']:.0f} s")


def part_runs(part: Mapping[str, Any]) -> dict[str, dict]:
    """label -> search figures of one model's part, those that ran: the profile's predictive search, both
    strategies on the compared buckets (on all of them where the part has no comparison, as xl-aed), and the DDP
    accounting."""
    comparison = part.get("comparison", {})
    runs = {"predictive, all buckets": part.get("predictive")}
    if comparison:  # both strategies fresh on a subset of the buckets
        runs.update({"predictive, compared buckets": comparison.get("predictive"),
                     "bisect, compared buckets": comparison.get("bisect")})
    else:
        runs["bisect, all buckets"] = part.get("bisect")
    runs["predictive with DDP gradient buckets"] = part.get("ddp_accounting")
    return {label: r for label, r in runs.items() if r and "probes" in r}


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The lines in benchmarks/SUMMARY.md of oomptimizer.json, oomptimizer_aed.json, oomptimizer_ddp.json."""
    out = []
    for name in ("rnnt", "aed"):
        p = figures.get(name, {})
        if "skipped" in p and "predictive" not in p:
            continue
        out += [_search_line(f"{p['model']} {label}", r) for label, r in part_runs(p).items()]
        for i, t in p.get("true_max", {}).items():
            out.append(f"  - bucket {i} {t['bucket']}: true maximum {t['true_max']}, predictive {t['predictive']} "
                       f"({t['predictive_below_true']:.1%} below), bisect {t['bisect']}")
        if soak_line(p):
            out.append(f"- {soak_line(p)}")
    if "world_size" in figures:
        out.append(_search_line(f"{figures['model']} DDP on {figures['world_size']} GPUs", figures["predictive"]))
    out.append(f"- failures: {figures.get('failures') or 'none'}")
    return out


def _spread(r: Mapping[str, Any]) -> str:
    return f"min {r['min']:.2f}x, median {r['median']:.2f}x, max {r['max']:.2f}x"


def search_sizes(figures: Mapping[str, Any], key: str) -> list[int | None]:
    """One search's batch size per bucket of a chunked record (all None when it failed or did not run)."""
    return (figures.get(key) or {}).get("batch_sizes", [None] * len(figures["buckets"]))


def bucket_indices(figures: Mapping[str, Any]) -> range:
    """The bucket indices a chunked record's searches covered (``bucket_range``; every bucket if absent)."""
    return range(*figures.get("bucket_range", (0, len(figures["buckets"]))))


def chunked_comparison(figures: Mapping[str, Any]) -> dict[str, Any]:
    """chunked.ratio_figures of a chunked record's two searches over the buckets it covered (a search that
    failed or did not run has no bucket searched); with the joint and loss fused, against the fused target
    over the buckets from ``chunked.FUSED_FROM_S`` up."""
    bs, covered = buckets(figures), bucket_indices(figures)
    if not is_fused(figures):
        return chunked.ratio_figures(search_sizes(figures, "unchunked"), search_sizes(figures, "chunked"), bs,
                                     indices=covered)
    # profiles list their buckets by duration: those from FUSED_FROM_S up are the last ones
    first = next((i for i, (d, _) in enumerate(bs) if d >= chunked.FUSED_FROM_S), len(bs))
    where = f"at every bucket from {chunked.FUSED_FROM_S:g} s"
    if len(covered) != len(bs):
        where += f" of {covered.start}-{covered.stop - 1}"
    return chunked.ratio_figures(search_sizes(figures, "unchunked"), search_sizes(figures, "chunked"), bs,
                                 chunked.FUSED_TARGET_RATIO, indices=range(max(first, covered.start), covered.stop),
                                 name="fused", where=where)


def chunked_records(results_dir=None) -> list[dict[str, Any]]:
    """The committed chunked records (``oomptimizer_rnnt_chunked*.json``: every bucket, or a range of them),
    newest first."""
    folder = Path(results_dir or RESULTS_DIR)
    records = [load_result(p.stem, folder) for p in sorted(folder.glob(f"{CHUNKED_NAME}*.json"))]
    return sorted(records, key=lambda r: r.get("date", ""), reverse=True)


def _run_kind(figures: Mapping[str, Any]) -> tuple:
    return figures.get("model"), figures.get("joint_chunk_size"), buckets(figures)


def chunked_union(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The chunked records put together bucket by bucket: each bucket's unchunked and chunked batch sizes,
    and the committed oomptimizer.json size that record was set against, come from the first record (in the
    given order) whose two searches both reached it, so every ratio is from one run. ``rows``: per bucket
    its duration (s), tokens, the three sizes, chunked / unchunked, chunked / reference, and the record
    (name, commit) it came from. ``comparison`` and ``reference``: chunked.ratio_figures of chunked against
    unchunked and against the reference sizes. Records of another model, joint chunk size or buckets than
    the first one's are left out (``left_out``: name and why)."""
    if not records:
        raise ValueError("no chunked record to put together")
    model, chunk, bs = kind = _run_kind(records[0]["figures"])
    kept, left_out = [], []
    for r in records:
        other = _run_kind(r["figures"])
        if other == kind:
            kept.append(r)
        else:
            why = [what for what, a, b in zip(("model", "joint_chunk_size", "buckets"), other, kind) if a != b]
            left_out.append(f"{r['name']} (other {', '.join(why)})")
    rows = []
    for i, (duration, tokens) in enumerate(bs):
        row: dict[str, Any] = {"bucket": i, "duration_s": duration, "tokens": int(tokens), "reference": None,
                               "unchunked": None, "chunked": None, "record": None, "commit": None}
        for r in kept:
            fig = r["figures"]
            u, c = search_sizes(fig, "unchunked")[i], search_sizes(fig, "chunked")[i]
            if u and c:
                old = fig.get("across_runs", {}).get("reference_batch_sizes")
                row.update(unchunked=u, chunked=c, reference=old[i] if old else None, record=r["name"],
                           commit=str(r.get("git_commit", "?"))[:12])
                break
        row["chunked_over_unchunked"] = row["chunked"] / row["unchunked"] if row["record"] else None
        row["chunked_over_reference"] = row["chunked"] / row["reference"] if row["reference"] else None
        rows.append(row)
    chunked_sizes = [row["chunked"] for row in rows]
    return {"rows": rows, "left_out": left_out, "records": [r["name"] for r in kept], "model": model,
            "joint_chunk_size": chunk,
            "comparison": chunked.ratio_figures([row["unchunked"] for row in rows], chunked_sizes, bs),
            "reference": chunked.ratio_figures([row["reference"] for row in rows], chunked_sizes, bs,
                                               against=f"{chunked.REFERENCE}.json's")}


def max_returned_peak_bytes(search: Mapping[str, Any]) -> float | None:
    """The largest peak of a search's probes at its returned batch sizes (None: no bucket searched)."""
    return max((p for p in chunked.returned_peaks(search) if p is not None), default=None)


def chunked_summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """``oomptimizer_rnnt_chunked.json`` or ``oomptimizer_rnnt_fused.json`` in lines: each search, the chunked
    (or fused) / unchunked ratios and the target, each search's sizes against the committed record (across
    runs), failures."""
    model = figures["model"]
    out = []
    for key, label in (("unchunked", "joint whole"), ("chunked", second_search(figures)[1])):
        r = figures.get(key)
        if r is None:
            out.append(f"- {model} predictive, {label}: not run")
        elif "error" in r:
            out.append(f"- {model} predictive, {label}: failed ({r['error'].splitlines()[0]})")
        else:
            done = sum(b is not None for b in r["batch_sizes"])
            max_peak = max_returned_peak_bytes(r)
            peak = "" if max_peak is None else f", peak {max_peak / GiB:.1f} GiB"
            covered = bucket_indices(figures)
            of = (f"{len(covered)} buckets" if len(covered) == len(r["batch_sizes"]) else
                  f"{len(covered)} buckets ({covered.start}-{covered.stop - 1} of {len(r['batch_sizes'])})")
            out.append(f"- {model} predictive, {label}: {done} of {of}, {r['probes']} "
                       f"probes ({r['probes_per_bucket']:.2f} per bucket), {r['ooms']} OOMs, {r['seconds']:.0f} s"
                       f"{peak}" + (f" (stopped: {r['stopped']})" if "stopped" in r else ""))
    comp = chunked_comparison(figures)
    if comp["compared"]:
        out.append(f"- {comp['name']} / unchunked batch size over {comp['compared']} buckets: {_spread(comp)}; "
                   f">= {comp['target']:g}x at buckets {comp['at_least_target'] or 'none'}")
    out.append(f"- target: {comp['target_line']}")
    for key in ("across_runs", "chunked_across_runs"):
        across = figures.get(key, {})
        if "min" in across:
            out.append(f"- {across['label']}: {_spread(across)}")
        elif "skipped" in across:
            out.append(f"- across runs against the committed record: not compared ({across['skipped']})")
    if figures.get("note"):
        out.append(f"- note: {figures['note']}")
    out.append(f"- failures: {figures.get('failures') or 'none'}")
    return out


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The one-GPU bench's stdout table: one line per search, the bisect/predictive ratios, true maxima."""
    out = ["\nmodel                 run                    buckets  probes  per-bucket  OOMs  seconds"]
    rnnt, aed = figures["rnnt"], figures["aed"]
    rows = [(rnnt["model"], "predictive (profile)", rnnt.get("predictive")),
            (rnnt["model"], "predictive (subset)", rnnt.get("comparison", {}).get("predictive")),
            (rnnt["model"], "bisect (subset)", rnnt.get("comparison", {}).get("bisect")),
            (rnnt["model"], "predictive + DDP acct", rnnt.get("ddp_accounting")),
            (aed["model"], "predictive", aed.get("predictive")), (aed["model"], "bisect", aed.get("bisect"))]
    for model, name, r in rows:
        if r and "probes" in r:
            out.append(f"{model[-21:]:21s} {name:22s} {len(r['batch_sizes']):7d}  {r['probes']:6d}  "
                       f"{r['probes_per_bucket']:10.2f}  {r['ooms']:4d}  {r['seconds']:7.1f}")
        else:
            why = (r or {}).get("skipped") or (r or {}).get("error") or "not run"
            out.append(f"{model[-21:]:21s} {name:22s} SKIPPED ({why})")
    ratios = rnnt.get("ratios", {})
    if ratios:
        out.append(f"bisect / predictive: {ratios['probes_bisect_over_predictive']:.2f}x probes, "
                   f"{ratios['seconds_bisect_over_predictive']:.2f}x wall time")
    for i, t in rnnt.get("true_max", {}).items():
        out.append(f"  bucket {i:>3} {t['bucket']}: true max {t['true_max']}, predictive {t['predictive']} "
                   f"({100 * t['predictive_below_true']:.1f}% below), bisect {t['bisect']}")
    return out


def buckets(part: Mapping[str, Any]) -> list[tuple[float, float]]:
    """A part's buckets as (duration s, tokens) tuples."""
    return [tuple(b) for b in part["buckets"]]


def search_budget_bytes(record: Mapping[str, Any]) -> float:
    """The bytes the one-GPU search had: its memory fraction of the device's memory."""
    return record["params"]["memory_fraction"] * record["device"]["gpu_memory_bytes"]


def aed_part(record: Mapping[str, Any] | None, aed_record: Mapping[str, Any] | None) -> dict | None:
    """The AED part with both searches' traces: from oomptimizer_aed.json when it ran on its own GPU, else
    from oomptimizer.json; None when neither has it."""
    aed = (aed_record or record or {}).get("figures", {}).get("aed", {})
    ok = "trace" in aed.get("predictive", {}) and "trace" in aed.get("bisect", {})
    return aed if ok else None


def soak_line(part: Mapping[str, Any]) -> str | None:
    """The soak of a part in one line, None when it did not run."""
    return describe_soak(part["soak"]) if "soak" in part else None


def rnnt_figures(record: Mapping[str, Any]) -> list:
    """The RNN-T part's figures: batch size per bucket, the predictive search's probes, and the two
    strategies on the compared buckets (each title says which buckets)."""
    part = record["figures"]["rnnt"]
    model, bs = part["model"], buckets(part)
    comparison = part["comparison"]
    return [plot_batch_sizes(bs, part["predictive"]["batch_sizes"], title=f"{model}: all buckets"),
            plot_probe_trace(part["predictive"], bs, search_budget_bytes(record),
                             title=f"{model}: predictive, all buckets"),
            plot_strategy_comparison({k: comparison[k] for k in ("predictive", "bisect")},
                                     title=f"{model}: probes per bucket, {len(comparison['bucket_indices'])} of "
                                           f"{len(bs)} buckets",
                                     buckets=[bs[i] for i in comparison["bucket_indices"]])]


# Notebook 02's reading of the records: sentences built from the figures, tables with human columns.

MISSING = "No committed {name}.json in benchmarks/results: run python3 -m benchmarks.oomptimizer on a GPU."


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _durations_text(bs: list[tuple[float, float]]) -> str:
    durations = sorted({d for d, _ in bs})
    per = len(bs) // len(durations)
    if per == 1:
        return f"{len(bs)} buckets, one per duration up to {max(durations):.0f} s"
    return f"{len(bs)} buckets ({len(durations)} durations up to {max(durations):.0f} s x {per} token sub-buckets)"


def search_intro(record: Mapping[str, Any], part: str = "rnnt") -> str:
    """What the one-GPU record searched, in a sentence: model, buckets, the budget and the device."""
    p, params, device = record["figures"][part], record["params"], record["device"]
    return (f"{p['model']}: {_durations_text(buckets(p))}, each probe one {params['dtype']} training step, "
            f"searched within {_gib(search_budget_bytes(record))} ({100 * params['memory_fraction']:.0f} % of one "
            f"{device['gpu']}'s {_gib(device['gpu_memory_bytes'])}), on {record['date'][:10]}.")


def soak_sentence(part: Mapping[str, Any]) -> str | None:
    """The soak in a sentence (None when it did not run): steps at the searched sizes, OOMs, and the peak
    allocated memory against the search's budget."""
    soak = part.get("soak")
    if soak is None:
        return None
    if "error" in soak:
        return f"The soak at the searched sizes failed: {soak['error'].splitlines()[0]}"
    line = (f"Soak: {soak['steps']} training steps at the searched sizes ran in {soak['seconds']:.0f} s with "
            f"{soak['ooms']} OOMs")
    if soak.get("peak_allocated_bytes") is None:
        return line + " (no GPU: peaks not measured)."
    total = soak["budget_bytes"] / soak["memory_fraction"]
    search_budget = soak.get("search_memory_fraction", soak["memory_fraction"]) * total
    return line + (f"; the peak allocated was {_gib(soak['peak_allocated_bytes'])}, "
                   f"{100 * soak['peak_allocated_bytes'] / search_budget:.1f} % of the search's budget.")


def search_table(part: Mapping[str, Any]):
    """The part's searches side by side (:func:`part_runs` without the DDP accounting), for display."""
    return styled_strategy_table({k: v for k, v in part_runs(part).items() if "DDP" not in k})


def true_max_styled(part: Mapping[str, Any]):
    """The buckets whose true maximum was probed (upwards until OOM): duration, tokens, the true maximum,
    each search's size, and how far the predictive size is below the true maximum, for display."""
    rows = [{"bucket": int(i), "max duration (s)": t["bucket"][0], "max tokens": int(t["bucket"][1]),
             "true max batch size": t["true_max"], "predictive": t["predictive"], "bisect": t["bisect"],
             "predictive below true max (%)": 100 * t["predictive_below_true"]}
            for i, t in sorted(part.get("true_max", {}).items(), key=lambda kv: int(kv[0]))]
    return (pd.DataFrame(rows).style.format({"max duration (s)": "{:.1f}", "predictive below true max (%)": "{:.1f}"})
            .hide(axis="index"))


def meaning_of_part(part: Mapping[str, Any]) -> str:
    """What one model's H200 searches mean, in one or two sentences: probes per bucket of each strategy on
    the buckets both searched, how far below the probed true maxima the predictive sizes stayed, the soak."""
    both = part.get("comparison") or part
    if "predictive" not in both or "bisect" not in both:
        return f"{part.get('model', 'The model')}: the two searches were not both run, so they are not compared."
    n = len(both.get("bucket_indices", part["buckets"]))
    line = meaning_of_search({k: both[k] for k in ("predictive", "bisect")})[:-1] + f", on the same {n} buckets"
    truth = part.get("true_max", {})
    if truth:
        worst = max(t["predictive_below_true"] for t in truth.values())
        line += (f"; at the {len(truth)} buckets probed up to their true maximum its sizes were at most "
                 f"{100 * worst:.1f} % below it")
    out = [line + "."]
    soak = part.get("soak")
    if soak and "error" not in soak:
        out.append(f"{soak['steps']} training steps at the searched sizes ran with "
                   f"{'no OOM' if soak['ooms'] == 0 else str(soak['ooms']) + ' OOMs'}.")
    return " ".join(out)


def size_table(part: Mapping[str, Any]):
    """Per bucket of a part: duration, tokens and each search's batch size, for display."""
    rows = [{"bucket": i, "max duration (s)": d, "max tokens": int(t),
             **{k: part[k]["batch_sizes"][i] for k in ("predictive", "bisect") if k in part}}
            for i, (d, t) in enumerate(buckets(part))]
    return pd.DataFrame(rows).style.format({"max duration (s)": "{:.1f}"}).hide(axis="index")


def ddp_rows(ddp_record: Mapping[str, Any], record: Mapping[str, Any] | None) -> list[dict]:
    """Per bucket of the DDP run: duration, tokens, its batch size and, when the one-GPU record has the DDP
    accounting, that search's size."""
    f = ddp_record["figures"]
    one = (record or {}).get("figures", {}).get("rnnt", {}).get("ddp_accounting", {}).get("batch_sizes")
    rows = []
    for i, (d, t) in enumerate(buckets(f)):
        row = {"bucket": i, "max duration (s)": d, "max tokens": int(t),
               f"{f['world_size']} GPUs (DDP)": f["predictive"]["batch_sizes"][i]}
        if one:
            row["1 GPU, DDP buckets accounted"] = one[i]
        rows.append(row)
    return rows


def ddp_table(ddp_record: Mapping[str, Any], record: Mapping[str, Any] | None):
    """:func:`ddp_rows` for display."""
    return pd.DataFrame(ddp_rows(ddp_record, record)).style.format({"max duration (s)": "{:.1f}"}).hide(axis="index")


def meaning_of_ddp(ddp_record: Mapping[str, Any], record: Mapping[str, Any] | None) -> str:
    """What the DDP run means, in a sentence: its probes, and at how many buckets the one-GPU search with
    the DDP gradient buckets accounted found the same size."""
    f = ddp_record["figures"]
    sizes = f["predictive"]["batch_sizes"]
    line = (f"On {f['world_size']} GPUs the predictive search needed {f['predictive']['probes']} probes for "
            f"{len(sizes)} buckets ({f['predictive']['probes'] / len(sizes):.1f} per bucket)")
    one = (record or {}).get("figures", {}).get("rnnt", {}).get("ddp_accounting", {}).get("batch_sizes")
    if not one:
        return line + "; no one-GPU search with the DDP accounting to set it against."
    same = sum(a == b for a, b in zip(sizes, one))
    if same == len(sizes):
        return line + (f", and one GPU that accounts for DDP's gradient buckets found the same size at all "
                       f"{same} buckets: one GPU is enough to size a DDP run.")
    return line + f"; one GPU that accounts for DDP's gradient buckets found the same size at {same} of {len(sizes)}."


def chunked_styled(union: Mapping[str, Any]):
    """chunked_union's rows for display: per bucket its duration, tokens, the batch size with the joint
    whole and over chunks (one run), and chunked / whole."""
    k = union["joint_chunk_size"]
    rows = [{"bucket": r["bucket"], "max duration (s)": r["duration_s"], "max tokens": r["tokens"],
             "joint whole": r["unchunked"], f"joint over chunks of {k}": r["chunked"],
             "chunked / whole (x)": r["chunked_over_unchunked"]} for r in union["rows"]]
    return (pd.DataFrame(rows).style.format({"max duration (s)": "{:.1f}", "chunked / whole (x)": "{:.2f}",
                                             "joint whole": "{:.0f}", f"joint over chunks of {k}": "{:.0f}"},
                                            na_rep="not searched").hide(axis="index"))


def meaning_of_chunked(union: Mapping[str, Any]) -> str:
    """What running the joint over chunks means, in a sentence: chunked / whole batch size over the buckets
    both searched (median and range), where the gain is least and most, and how many reach the target."""
    comp, k = union["comparison"], union["joint_chunk_size"]
    if not comp["compared"]:
        return "No bucket was searched both with the joint whole and over chunks, so nothing is compared."
    rows = [r for r in union["rows"] if r["chunked_over_unchunked"]]
    low = min(rows, key=lambda r: r["chunked_over_unchunked"])
    high = max(rows, key=lambda r: r["chunked_over_unchunked"])
    hit = [r for r in rows if r["chunked_over_unchunked"] >= comp["target"]]
    missed = [r for r in rows if r["chunked_over_unchunked"] < comp["target"]]
    line = (f"Running the joint and loss over chunks of {k} utterances raises the batch size by "
            f"{comp['median']:.2f}x at the median bucket, from {low['chunked_over_unchunked']:.2f}x at "
            f"{bucket_label((low['duration_s'], low['tokens']))} to {high['chunked_over_unchunked']:.2f}x at "
            f"{bucket_label((high['duration_s'], high['tokens']))}; {len(hit)} of {comp['compared']} buckets "
            f"reach the {comp['target']:g}x target")
    fewest = min((r["tokens"] for r in hit), default=None)
    if hit and missed and fewest > max(r["tokens"] for r in missed):
        line += (f", exactly those with {fewest} tokens or more, where the joint's [batch, frames, tokens, "
                 f"vocabulary] tensor is largest")
    return line + "."
