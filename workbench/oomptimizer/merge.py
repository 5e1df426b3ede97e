"""Merge neighbouring buckets whose batch sizes came out equal: fewer buckets, same batches."""

from __future__ import annotations


def merge_equal_buckets(bins: list, batch_sizes: list[int], max_tps: list[float] | None = None):
    """Merge runs of neighbouring buckets with equal batch size, keeping the larger (later) bound.

    1D ``bins`` ([max_duration_s, ...], ascending): any neighbours merge. 2D ``bins``
    ([[max_duration_s, max_tokens], ...]): only sub-buckets of one duration group (same max duration)
    merge. A merged bucket keeps the largest ``max_tps`` of its parts. Returns
    ``(bins, batch_sizes, max_tps)`` as new lists (``max_tps`` None when given None).
    """
    if len(bins) != len(batch_sizes):
        raise ValueError(f"batch_sizes: has {len(batch_sizes)} entries, bins has {len(bins)}")
    if max_tps is not None and len(max_tps) != len(bins):
        raise ValueError(f"max_tps: has {len(max_tps)} entries, bins has {len(bins)}")
    out_bins: list = []
    out_bs: list[int] = []
    out_tps: list[float] = []
    for k, (b, bs) in enumerate(zip(bins, batch_sizes)):
        is_2d = isinstance(b, (list, tuple))
        same_group = bool(out_bins) and (not is_2d or out_bins[-1][0] == b[0])
        if same_group and out_bs[-1] == bs:
            out_bins[-1] = list(b) if is_2d else b  # the larger bound covers both
            if max_tps is not None:
                out_tps[-1] = max(out_tps[-1], max_tps[k])
            continue
        out_bins.append(list(b) if is_2d else b)
        out_bs.append(bs)
        if max_tps is not None:
            out_tps.append(max_tps[k])
    return out_bins, out_bs, (out_tps if max_tps is not None else None)
