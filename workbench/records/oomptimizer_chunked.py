"""The figures of the OOMptimizer bench's ``--parts rnnt-chunked`` (``joint_chunks.py`` runs it): large RNN-T's
predictive search twice on the RNN-T part's bins, the joint whole (joint_chunk_size 0) and over chunks of K utterances,
in one run.

    python3 -m benchmarks.oomptimizer --parts rnnt-chunked [--joint-chunk-size 16] [--buckets START:STOP] \
        --budget-s 240

Writes ``oomptimizer_rnnt_chunked.json`` (``oomptimizer_rnnt_chunked_START_STOP.json`` when ``--buckets``
picks buckets START..STOP-1: the other buckets get batch size None): both searches (a search's figures, as
the record module's docstring lists them, each with its probe and budget), and each search's sizes against the committed ``oomptimizer.json``'s rnnt
predictive ones (``across_runs``, ``chunked_across_runs``; fixed at run time, since that record may be
rerun; its commit is in the label). The reader derives per bucket the chunked / unchunked batch size ratio
with its min/median/max, the buckets at >= 2x and the target line (:func:`ratio_figures`, through
record.chunked_comparison), and puts several records together bucket by bucket (record.chunked_union).
With ``--joint-loss fused`` the second search fuses the joint and loss instead (the logits never built):
``oomptimizer_rnnt_fused.json``, the same figures with ``joint_loss: "fused"``, and the fused / unchunked
target ``FUSED_TARGET_RATIO`` at every bucket from ``FUSED_FROM_S`` up.
Only the two searches run (no bisect, true maxima, soak or DDP accounting). ``--budget-s`` (seconds): the
unchunked search starts no new bucket after ``UNCHUNKED_SHARE`` of it, the chunked one none after all of
it; the record says which buckets were not searched, and the ratios cover the buckets both searched.
"""

from __future__ import annotations

from typing import Any, Mapping

from workbench.timing import summarize

TARGET_RATIO = 2.0  # the target: chunked batch size >= 2x the unchunked one at every bucket
FUSED_TARGET_RATIO = 1.5  # with the joint and loss fused: >= 1.5x the unchunked one at every bucket from ...
FUSED_FROM_S = 10.0  # ... this many seconds up
UNCHUNKED_SHARE = 0.45  # of --budget-s for the unchunked search (the chunked one probes larger batches)
REFERENCE = "oomptimizer"  # the committed record whose rnnt predictive sizes the unchunked run is set against


def ratio_figures(unchunked: list[int | None], chunked: list[int | None],
                  buckets: list[tuple[float, float]], target: float = TARGET_RATIO, *,
                  indices: range | None = None, against: str = "unchunked", name: str = "chunked",
                  where: str | None = None) -> dict[str, Any]:
    """Per bucket chunked / ``against`` batch size (None where either size is missing), and over the bucket
    ``indices`` (default: all) their min/median/max, the indices at >= ``target``, whether every one of
    them is, and the target line. ``name``: the second search's ("chunked" or "fused"); ``where``: the
    target line's words for ``indices`` (default: every bucket, or every bucket of START-STOP)."""
    if not (len(unchunked) == len(chunked) == len(buckets)):
        raise ValueError(f"need one batch size per bucket: {len(unchunked)} {against}, {len(chunked)} chunked, "
                         f"{len(buckets)} buckets")
    indices = range(len(buckets)) if indices is None else indices
    ratios = [c / u if u and c else None for u, c in zip(unchunked, chunked)]
    compared = [i for i in indices if ratios[i] is not None]
    out: dict[str, Any] = {"ratios": ratios, "compared": len(compared), "considered": len(indices),
                           "at_least_target": [i for i in compared if ratios[i] >= target], "target": target,
                           "against": against, "name": name}
    if where is not None:
        out["where"] = where
    if len(indices) != len(buckets):
        out["scope"] = [indices.start, indices.stop]
    if compared:
        values = [ratios[i] for i in compared]
        out.update(summarize(values), min_bucket=min(compared, key=lambda i: ratios[i]))
    out["target_met"] = len(out["at_least_target"]) == len(indices) > 0
    out["target_line"] = target_line(out, buckets)
    return out


def target_line(r: Mapping[str, Any], buckets: list[tuple[float, float]]) -> str:
    """"chunked >= 2x unchunked at every bucket: met" or missed, with the smallest ratio and how far below
    (over buckets START-STOP only when the figures have a ``scope``)."""
    against = r.get("against", "unchunked")
    scope = r.get("scope")
    where = r.get("where") or ("at every bucket" if scope is None else f"at every bucket of {scope[0]}-{scope[1] - 1}")
    head = f"{r.get('name', 'chunked')} >= {r['target']:g}x {against} {where}"
    if not r["compared"]:
        return f"{head}: not measured (no bucket with both sizes)"
    i = r["min_bucket"]
    d, u = buckets[i]
    smallest = f"smallest ratio {r['min']:.2f}x at bucket {i} ({d:g} s, {u:g} tokens)"
    if r["target_met"]:
        return f"{head}: met ({smallest})"
    below = r["compared"] - len(r["at_least_target"])
    considered = r.get("considered", len(buckets))
    parts = []
    if r["compared"] < considered:
        parts.append(f"only {r['compared']} of {considered} buckets with both sizes")
    if below:
        short = r["target"] - r["min"]
        parts.append(f"{below} of {r['compared']} compared buckets below {r['target']:g}x; {smallest}, "
                     f"{short:.2f} short ({short / r['target']:.0%})")
    else:
        parts.append(f"every compared bucket at >= {r['target']:g}x ({smallest})")
    return f"{head}: missed ({'; '.join(parts)})"


def across_runs(sizes: list[int | None], buckets: list[tuple[float, float]],
                reference: Mapping[str, Any] | None, search: str = "unchunked") -> dict[str, Any]:
    """This run's ``search`` ("unchunked", "chunked" or "fused") batch sizes / the reference record's rnnt predictive
    ones per bucket (two runs, possibly at different commits), or ``skipped`` saying why they cannot be set
    side by side."""
    if reference is None:
        return {"skipped": f"{search}: no {REFERENCE}.json committed"}
    part = reference.get("figures", {}).get("rnnt", {})
    old = part.get("predictive", {}).get("batch_sizes")
    if old is None:
        return {"skipped": f"{search}: {REFERENCE}.json has no rnnt predictive batch sizes"}
    if [tuple(b) for b in part.get("buckets", [])] != [tuple(b) for b in buckets]:
        return {"skipped": f"{search}: buckets differ from {REFERENCE}.json's ({len(part.get('buckets', []))} there, "
                           f"{len(buckets)} here)"}
    ratios = [n / o if n and o else None for n, o in zip(sizes, old)]
    values = [r for r in ratios if r is not None]
    out = {"label": f"across runs: this run's {search} batch sizes / {REFERENCE}.json's "
                    f"(commit {str(reference.get('git_commit', '?'))[:12]}, {str(reference.get('date', '?'))[:10]})",
           "reference_batch_sizes": old, "ratios": ratios}
    if values:
        out.update(summarize(values))
    return out


def returned_peaks(search: Mapping[str, Any]) -> list[float | None]:
    """Per bucket the peak bytes of the probe at the returned batch size (None: not searched or no peak)."""
    peaks: dict[tuple[int, int], float] = {(i, b): p for i, b, p, _ in search["trace"] if p is not None}
    return [peaks.get((i, b)) if b is not None else None for i, b in enumerate(search["batch_sizes"])]
