"""`workbench bins MANIFEST`: estimate 1D or 2D bins from a lhotse manifest and write a bucket profile.

    python -m workbench bins data/cuts.jsonl.gz --buckets 30 --sub-buckets 2 --out bins.yaml

With token counts (``custom["num_tokens"]`` in the manifest, or ``--tokenizer MODEL``) the bins are 2D
with a ``max_tps`` per bin; without them (or with ``--1d``) they are duration-only. The profile has no
batch sizes yet (the OOMptimizer adds them). A padding summary (none / 1D / 2D) is printed last.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
from pathlib import Path

import numpy as np
import yaml

from workbench.bucketing.estimate import check_durations, estimate_duration_bins
from workbench.bucketing.padding import padding_comparison
from workbench.bucketing.profile import profile_from_arrays, save_profile
from workbench.data.manifest import read_cut_arrays


def duration_window(durations: np.ndarray, min_duration: float | None, max_duration: float | None) -> np.ndarray:
    """Boolean mask of utterances with ``min_duration <= d <= max_duration`` (both inclusive, None: no limit)."""
    keep = np.ones(durations.shape[0], dtype=bool)
    if min_duration is not None:
        keep &= durations >= min_duration
    if max_duration is not None:
        keep &= durations <= max_duration
    return keep


def run_bins(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    arrays = read_cut_arrays(args.manifest, tokenizer=args.tokenizer, progress=not args.quiet)
    t_read = time.perf_counter() - t0
    dur = check_durations(arrays.durations, name=f"{args.manifest}: durations")
    tok = arrays.num_tokens
    keep = duration_window(dur, args.min_duration, args.max_duration)
    if not keep.any():
        raise ValueError(f"no utterance of {args.manifest} lies in [{args.min_duration}, {args.max_duration}] s")
    dur_k = dur[keep]
    tok_k = tok[keep] if tok is not None else None
    profile = profile_from_arrays(
        dur_k, tok_k, num_buckets=args.buckets, num_subbuckets=args.sub_buckets,
        tps_threshold=args.tps_threshold, equal_count=args.equal_count, one_d=args.one_d,
        metadata={"manifest": str(args.manifest), "utterances": int(dur.shape[0]),
                  "excluded_by_duration": int((~keep).sum()), "min_duration": args.min_duration,
                  "max_duration": args.max_duration, "tokenizer": args.tokenizer,
                  "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
    out = save_profile(args.out, profile)
    t_bins = time.perf_counter() - t0 - t_read
    print(yaml.safe_dump({k: v for k, v in profile.to_dict().items() if k != "metadata"},
                         sort_keys=False, default_flow_style=None, width=120).rstrip())
    print(f"# wrote {out}: {profile.num_buckets} buckets from {int(keep.sum())} utterances "
          f"({int((~keep).sum())} outside the duration window); read {t_read:.2f} s, bins {t_bins:.2f} s")
    if not args.no_padding:
        setups = {"none": None, "1D": estimate_duration_bins(dur_k, args.buckets)}
        if profile.is_2d:
            setups["2D"] = ([tuple(b) for b in profile.bucket_duration_bins], profile.max_tps)
        table = padding_comparison(dur_k, tok_k, setups)
        print("# padding (each utterance padded to its bucket's bound):")
        print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    return 0


def register(sub) -> None:
    p = sub.add_parser("bins", help="estimate 1D/2D bucket bins from a manifest and write a profile",
                       description=__doc__.splitlines()[0])
    p.add_argument("manifest", type=Path, help="lhotse cuts manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", help="sentencepiece .model: count tokens with it (else custom.num_tokens from the manifest)")
    p.add_argument("--buckets", type=int, default=30, help="duration buckets (default 30)")
    p.add_argument("--sub-buckets", type=int, default=2, help="token sub-buckets per duration bucket (default 2)")
    p.add_argument("--tps-threshold", type=float, default=4.0,
                   help="TPS z-score above which an utterance is an outlier (default 4)")
    p.add_argument("--min-duration", type=float, default=None, help="leave out shorter utterances (seconds)")
    p.add_argument("--max-duration", type=float, default=None, help="leave out longer utterances (seconds)")
    p.add_argument("--1d", dest="one_d", action="store_true", help="duration-only bins even with token counts")
    p.add_argument("--equal-count", action="store_true", help="1D: same number of utterances per bucket")
    p.add_argument("--out", type=Path, default=Path("bucket_profile.yaml"),
                   help="profile YAML to write (default bucket_profile.yaml)")
    p.add_argument("--no-padding", action="store_true", help="skip the padding summary")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_bins)
