"""The throughput study's baseline: lhotse's DynamicBucketingSampler at the largest max_duration whose
worst-case batch fits every bucket (see run.py's docstring for the rule), checked by one pass."""

from __future__ import annotations

import bisect
import math
import time
from typing import Any

from benchmarks.throughput.settings import LHOTSE_NUM_BUCKETS, say


def lhotse_buckets(cuts_path: str, tokens_by_id: dict[str, int], max_duration: float = 100.0
                   ) -> tuple[list[float], list[dict]]:
    """lhotse's duration bins for this corpus (as DynamicBucketingSampler estimates them) and, per bucket
    (lhotse's rule: bisect_left), its cuts, shortest and longest cut (s) and most tokens."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler

    cuts = CutSet.from_file(cuts_path)
    sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, num_buckets=LHOTSE_NUM_BUCKETS,
                                      shuffle=True, seed=0)
    bins = [float(b) for b in sampler.duration_bins]
    buckets = [{"index": i, "cuts": 0, "shortest_s": math.inf, "longest_s": 0.0, "max_tokens": 0}
               for i in range(len(bins) + 1)]
    for cut in cuts:  # the cuts' own durations: the manifest's rounding decides ties at a bin as in lhotse
        duration, tokens = cut.duration, tokens_by_id[cut.id]
        b = buckets[bisect.bisect_left(bins, duration)]
        b["cuts"] += 1
        b["shortest_s"], b["longest_s"] = min(b["shortest_s"], duration), max(b["longest_s"], duration)
        b["max_tokens"] = max(b["max_tokens"], int(tokens))
    return bins, [b for b in buckets if b["cuts"]]


def find_baseline(run, corpus: dict, arrays, probe) -> dict[str, Any]:
    """The largest max_duration (s, 0.1 s below) whose worst-case batch fits every lhotse bucket, then a
    check pass; ``search_s``: wall seconds of the search."""
    from workbench.oomptimizer.search import search_batch_sizes

    started = time.perf_counter()
    tokens_by_id = dict(zip(arrays.ids, arrays.num_tokens.tolist()))
    bins, buckets = lhotse_buckets(corpus["cuts"], tokens_by_id)
    shapes = [(b["longest_s"], float(b["max_tokens"])) for b in buckets]
    result = search_batch_sizes(shapes, probe, budget_bytes=probe.budget_bytes)
    for b, size in zip(buckets, result.profile_batch_sizes()):
        b["max_batch_size"] = int(size)
    max_duration = math.floor(10 * min(b["max_batch_size"] * b["shortest_s"] for b in buckets)) / 10
    if max_duration <= 0:
        raise RuntimeError("baseline: not even one cut of the longest bucket fits the probe's budget")
    say(run, f"baseline: max_duration {max_duration:g} s over lhotse bins {[round(x, 1) for x in bins]}")
    return {"max_duration": max_duration, "lhotse_bins": bins, "buckets": buckets, "probes": result.num_probes,
            "search_s": time.perf_counter() - started,
            "pass": check_baseline_pass(corpus, tokens_by_id, bins, buckets, max_duration)}


def check_baseline_pass(corpus: dict, tokens_by_id: dict[str, int], bins: list[float], buckets: list[dict],
                        max_duration: float) -> dict:
    """One epoch of the baseline sampler (shapes only): batches, and those beyond their bucket's probed
    worst case (more cuts than B_b or floor(max_duration / shortest), a longer cut or more tokens)."""
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler

    by_index = {b["index"]: b for b in buckets}
    sampler = DynamicBucketingSampler(CutSet.from_file(corpus["cuts"]), max_duration=max_duration,
                                      num_buckets=LHOTSE_NUM_BUCKETS, shuffle=True, seed=0)
    batches, exceeding, largest = 0, 0, 0
    for batch in sampler:
        longest = max(c.duration for c in batch)
        b = by_index.get(bisect.bisect_left(bins, longest))
        n = len(batch)
        tokens = max(tokens_by_id[c.id] for c in batch)
        # lhotse yields a cut longer than max_duration alone: one cut is always a batch
        limit = 0 if b is None else min(b["max_batch_size"], max(1, math.floor(max_duration / b["shortest_s"])))
        exceeding += b is None or n > limit or longest > b["longest_s"] or tokens > b["max_tokens"]
        batches, largest = batches + 1, max(largest, n)
    return {"batches": batches, "exceeding": exceeding, "largest_batch": largest}
