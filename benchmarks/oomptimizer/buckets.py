"""The OOMptimizer bench's buckets: 2D bins of the synthetic corpus for the RNN-T, a few 1D ones for the AED."""

from __future__ import annotations

from workbench.bucketing import estimate_2d_bins
from workbench.data.synthetic import synthetic_cut_arrays
from workbench.oomptimizer.synthetic import demo_buckets


def rnnt_bins(num_buckets: int = 15, num_subbuckets: int = 2, max_duration: float = 40.0,
              num_cuts: int = 200_000):
    """(bins, source): 2D bins (duration s, tokens) estimated on the synthetic corpus."""
    arrays = synthetic_cut_arrays(num_cuts, seed=0)
    keep = arrays.durations <= max_duration
    est = estimate_2d_bins(arrays.durations[keep], arrays.num_tokens[keep], num_buckets, num_subbuckets)
    return ([(float(d), float(u)) for d, u in est.bins],
            f"estimate_2d_bins(synthetic_cut_arrays({num_cuts}), durations <= {max_duration:g} s)")


def rnnt_buckets(args):
    """(buckets, source) of the RNN-T run: 15 x 2 up to 40 s, or 2 x 2 up to 3 s in a smoke run."""
    if args.smoke:
        return rnnt_bins(2, 2, 3.0, num_cuts=4000)
    return rnnt_bins()


def aed_buckets(args) -> list[tuple[float, float]]:
    """The AED's buckets: 8 x 1 up to 40 s, or 2 x 1 up to 2 s in a smoke run."""
    return demo_buckets(2, 1, 2.0) if args.smoke else demo_buckets(8, 1, 40.0)


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
