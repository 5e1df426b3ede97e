"""`workbench bins MANIFEST`: estimate 1D or 2D bins from a lhotse manifest and write a bucket profile.

    python -m workbench bins data/cuts.jsonl.gz --buckets 30 --sub-buckets 2 --out bins.yaml

With token counts (``custom["num_tokens"]`` in the manifest, or ``--tokenizer MODEL``) the bins are 2D
with a ``max_tps`` per bin; without them (or with ``--1d``) they are duration-only. The profile has no
batch sizes yet (the OOMptimizer adds them). Then it prints how many utterances fit no bucket of the
new bins (strict 2D, as the sampler checks them) and why: TPS outliers (above their bucket's max_tps),
too long, too many tokens; the last two are 0 on the corpus the bins came from. A padding summary
(none / 1D / 2D) is printed last. With ``-q`` it prints only the path of the profile it wrote (warnings
about data left out still go to stderr).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from workbench.atomic import check_writable
from workbench.bucketing.estimate import (check_count, check_durations, check_tps_threshold, estimate_duration_bins,
                                         overflowing_tps, tps_blind_groups)
from workbench.bucketing.fit import unfit_table
from workbench.bucketing.padding import padding_comparison
from workbench.bucketing.profile import NoAliasLoader, profile_from_arrays, save_profile
from workbench.data.tokenizer import tokenized_cut_arrays
from workbench.options import (DROP_NOTICE_SHARE, check_dropped, dropped_data_line, number_in, positive_int,
                               seconds)
from workbench.plain import to_plain


def duration_window(durations: np.ndarray, min_duration: float | None, max_duration: float | None) -> np.ndarray:
    """Boolean mask of utterances with ``min_duration <= d <= max_duration`` (both inclusive, None: no limit)."""
    keep = np.ones(durations.shape[0], dtype=bool)
    if min_duration is not None:
        keep &= durations >= min_duration
    if max_duration is not None:
        keep &= durations <= max_duration
    return keep


def check_options(args: argparse.Namespace) -> None:
    """ValueError naming the first bucketing option outside its range (before any file is read)."""
    check_count(args.buckets, "--buckets")
    if args.sub_buckets is not None:
        check_count(args.sub_buckets, "--sub-buckets")
    if args.tps_threshold is not None:
        check_tps_threshold(args.tps_threshold, "--tps-threshold")
    if args.min_duration is not None and not args.min_duration >= 0:
        raise ValueError(f"--min-duration must be a number of seconds >= 0, got {args.min_duration!r}")
    if args.max_duration is not None and not args.max_duration > 0:
        raise ValueError(f"--max-duration must be a number of seconds > 0, got {args.max_duration!r}")
    if args.min_duration is not None and args.max_duration is not None and args.min_duration > args.max_duration:
        raise ValueError(f"--min-duration ({args.min_duration}) must be <= --max-duration ({args.max_duration})")
    inputs = [p for p in (args.manifest, args.tokenizer) if p is not None]
    if any(Path(args.out).resolve() == Path(p).resolve() for p in inputs):
        raise ValueError(f"--out {args.out}: is an input of this command; write the profile to another file")
    if not args.overwrite and holds_batch_sizes(args.out):
        raise ValueError(f"--out {args.out}: holds a profile with batch sizes (the OOMptimizer's GPU work); pass "
                         "--overwrite to replace it with bare bins, or choose another path")


def holds_batch_sizes(path: Path) -> bool:
    """True when ``path`` is a YAML file with a 'bucket_batch_size' field (read loosely: any other file is
    not a profile anyone measured)."""
    if not path.is_file():
        return False
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=NoAliasLoader)
    except (yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("bucket_batch_size") is not None


TWO_D_DEFAULTS = {"sub_buckets": 2, "tps_threshold": 4.0}  # --sub-buckets and --tps-threshold for 2D bins


def check_options_apply(args: argparse.Namespace, has_tokens: bool) -> None:
    """Refuse the 2D options (--sub-buckets, --tps-threshold) where the bins will be 1D, and --equal-count where
    they will be 2D, naming the option and why, rather than ignore them; fill in the 2D options' defaults."""
    for name, default in TWO_D_DEFAULTS.items():
        given = getattr(args, name) is not None
        option = "--" + name.replace("_", "-")
        if given and args.one_d:
            raise ValueError(f"{option}: applies to 2D bins only, and --1d asks for 1D bins; leave out one of them")
        if given and not has_tokens:
            raise ValueError(f"{option}: applies to 2D bins only, and {args.manifest} has no token counts "
                             "(custom.num_tokens) to make them; give --tokenizer to count them, or leave it out")
        if not given:
            setattr(args, name, default)
    if args.equal_count and has_tokens and not args.one_d:
        raise ValueError(f"--equal-count: applies to 1D bins only, and {args.manifest} has token counts, so the bins "
                         "are 2D; add --1d for 1D bins")


def unfit_line(durations: np.ndarray, num_tokens: np.ndarray | None, profile) -> str:
    """One line: how many utterances fit no bucket of ``profile`` (strict 2D) and why."""
    bins = [tuple(b) for b in profile.bucket_duration_bins] if profile.is_2d else profile.bucket_duration_bins
    counts, _ = unfit_table(durations, num_tokens, bins, profile.max_tps, max_examples=0)
    why = ", ".join(f"{counts[k]} {label}" for k, label in (("tps_over_limit", "TPS outliers"),
                                                             ("too_long", "too long"),
                                                             ("too_many_tokens", "too many tokens")))
    return f"# fit no bucket: {sum(counts.values())} of {durations.shape[0]} utterances ({why})"


def run_bins(args: argparse.Namespace) -> int:
    check_options(args)
    check_writable(args.out)  # before reading a large manifest
    t0 = time.perf_counter()
    arrays = tokenized_cut_arrays(args.manifest, args.tokenizer, progress=not args.quiet and sys.stderr.isatty())
    t_read = time.perf_counter() - t0
    dur = check_durations(arrays.durations, name=f"{args.manifest}: durations")
    tok = arrays.num_tokens
    check_options_apply(args, has_tokens=tok is not None)
    keep = duration_window(dur, args.min_duration, args.max_duration)
    if not keep.any():
        raise ValueError(f"no utterance of {args.manifest} lies in [{args.min_duration}, {args.max_duration}] s")
    check_count(args.buckets, "--buckets", int(keep.sum()))
    if tok is not None and not args.one_d:
        overflow = [i for i in overflowing_tps(dur, tok).tolist() if keep[i]]  # inside the duration window
        if overflow:
            i = overflow[0]
            raise ValueError(f"{args.manifest}: cut {arrays.ids[i]!r} has duration {float(dur[i])!r} s, too short for "
                             f"its {int(tok[i])} tokens: the tokens per second overflow ({len(overflow)} such cuts); "
                             "fix or drop them, or raise --min-duration")
    dur_k = dur[keep]
    tok_k = tok[keep] if tok is not None else None
    profile = profile_from_arrays(
        dur_k, tok_k, num_buckets=args.buckets, num_subbuckets=args.sub_buckets,
        tps_threshold=args.tps_threshold, equal_count=args.equal_count, one_d=args.one_d,
        metadata={"manifest": str(args.manifest), "utterances": int(dur.shape[0]),
                  "excluded_by_duration": int((~keep).sum()), "min_duration": args.min_duration,
                  "max_duration": args.max_duration, "tokenizer": args.tokenizer,
                  "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
    window = (f"outside the duration window [{args.min_duration or 0}, "
              f"{'inf' if args.max_duration is None else args.max_duration}] s")
    reasons = {window: int((~keep).sum()),
               f"TPS outliers (z-score > {args.tps_threshold})": int(profile.metadata.get("tps_outliers", 0))}
    dropped = dropped_data_line(dur.shape[0], reasons)
    check_dropped(dropped, strict=args.strict)  # before any output; refused with --strict, nothing written
    out = save_profile(args.out, profile)
    t_bins = time.perf_counter() - t0 - t_read
    if profile.is_2d:
        blind = tps_blind_groups(dur_k, [d for d, _ in profile.bucket_duration_bins], args.tps_threshold)
        if blind:
            print(f"note: the TPS filter cannot flag an outlier in {len(blind)} duration group(s) of at most "
                  f"{max(n for _, n in blind)} utterances (in a group of n, a z-score is at most sqrt(n - 1) <= "
                  f"--tps-threshold {args.tps_threshold:g}): they keep every utterance; use fewer --buckets or a "
                  "lower --tps-threshold", file=sys.stderr)
    if args.quiet:  # one line naming the file; the dropped-data warning below still goes to stderr
        print(f"wrote {out}")
        check_dropped(dropped, strict=False)
        return 0
    print(yaml.safe_dump(to_plain({k: v for k, v in profile.to_dict().items() if k != "metadata"}),
                         sort_keys=False, default_flow_style=None, width=120).rstrip())
    print(f"# wrote {out}: {profile.num_buckets} buckets from {int(keep.sum())} utterances "
          f"({int((~keep).sum())} outside the duration window); read {t_read:.2f} s, bins {t_bins:.2f} s")
    print(unfit_line(dur_k, tok_k, profile))
    if not args.no_padding:
        setups = {"none": None, "1D": estimate_duration_bins(dur_k, args.buckets)}
        if profile.is_2d:
            setups["2D"] = ([tuple(b) for b in profile.bucket_duration_bins], profile.max_tps)
        table = padding_comparison(dur_k, tok_k, setups)
        print("# padding (each utterance padded to its bucket's bound):")
        print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    check_dropped(dropped, strict=False)  # again at the end, where a reader looks
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "bins", help="estimate 1D/2D bucket bins from a manifest and write a profile",
        description="Estimate 1D or 2D bucket bins from a lhotse manifest and write a bucket profile (no batch\n"
        "sizes yet: `workbench oomptimize` adds them).\n\n"
        "2D bins (duration x tokens, with a max_tps per bin) when the manifest has custom.num_tokens or\n"
        "--tokenizer is given, else duration-only. Prints the profile, how many utterances fit no bucket\n"
        "and why, and a padding summary (none / 1D / 2D); -q prints only the file written.",
        epilog="examples:\n"
               "  workbench bins work/demo/cuts.jsonl.gz --buckets 8 --sub-buckets 2 --out work/demo/profile.yaml\n"
               "  workbench bins cuts.jsonl.gz --tokenizer tok.model --max-duration 40 --strict -q\n"
               "  workbench bins cuts.jsonl.gz --1d --equal-count --buckets 20 --no-padding --out bins_1d.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("manifest", type=Path, help="lhotse cuts manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", help="sentencepiece .model to count tokens with (default: custom.num_tokens "
                                       "from the manifest, when there)")
    p.add_argument("--buckets", type=positive_int, default=30,
                   help="duration buckets, >= 1 (default 30)")
    p.add_argument("--sub-buckets", type=positive_int, default=None,
                   help="token sub-buckets per duration bucket (2D bins only), >= 1 (default 2)")
    p.add_argument("--tps-threshold", type=float, default=None,
                   help="2D bins only: tokens-per-second z-score within a duration bucket, > 0, above which an "
                        "utterance is a TPS outlier, left out of the bins (default 4)")
    p.add_argument("--min-duration", type=number_in(float, 0, unit=" seconds"), default=None,
                   help="leave out utterances shorter than this, seconds, >= 0 (default: none)")
    p.add_argument("--max-duration", type=seconds, default=None,
                   help="leave out utterances longer than this, seconds, > 0 (default: none)")
    p.add_argument("--1d", dest="one_d", action="store_true", help="duration-only bins even with token counts")
    p.add_argument("--equal-count", action="store_true",
                   help="1D: the same number of utterances per bucket (default: the same total duration)")
    p.add_argument("--out", type=Path, default=Path("bucket_profile.yaml"),
                   help="profile YAML to write (default bucket_profile.yaml)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an --out profile that holds batch sizes (default: refused, so the OOMptimizer's "
                        "results are not lost)")
    p.add_argument("--no-padding", action="store_true", help="skip the padding summary")
    p.add_argument("--strict", action="store_true",
                   help=f"fail (exit 2, no profile) when more than {100 * DROP_NOTICE_SHARE:g}%% of the utterances "
                        "are left out (default: a warning)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the file written (one line; warnings still go to stderr), no progress bar")
    p.set_defaults(func=run_bins)
