"""The bucket profile: bins (1D or 2D), per-bucket batch sizes and TPS limits, as one YAML file.

The file is shaped so that a NeMo or lhotse config takes ``bucket_duration_bins`` and
``bucket_batch_size`` unchanged: 1D bins are a list of max durations in seconds; 2D bins are a list of
``[max_duration_s, max_tokens]`` pairs. ``bucket_batch_size`` is absent until the OOMptimizer has run.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.atomic import write_text_atomically
from workbench.bucketing.estimate import estimate_2d_bins, estimate_duration_bins
from workbench.data.manifest import MAX_TOKENS
from workbench.memory.settings import parse_settings
from workbench.plain import to_plain


@dataclass
class BucketProfile:
    bucket_duration_bins: list  # 1D: [max_duration_s, ...]; 2D: [[max_duration_s, max_tokens], ...]
    bucket_batch_size: list[int] | None = None  # one per bucket, once the OOMptimizer has run
    max_tps: list[float] | float | None = None  # tokens-per-second limit, per bucket (2D) or one value
    metadata: dict[str, Any] = field(default_factory=dict)  # model, dtype, GPU, torch version, date...
    allocator_settings: str | None = None  # CUDA allocator settings the sizes were searched under ("": torch's
    #                                        defaults; None: not recorded)

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_duration_bins)

    @property
    def is_2d(self) -> bool:
        return bool(self.bucket_duration_bins) and isinstance(self.bucket_duration_bins[0], (list, tuple))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_buckets": self.num_buckets,
                               "bucket_duration_bins": [list(b) if isinstance(b, (list, tuple)) else b
                                                        for b in self.bucket_duration_bins]}
        if self.bucket_batch_size is not None:
            out["bucket_batch_size"] = list(self.bucket_batch_size)
        if self.max_tps is not None:
            out["max_tps"] = self.max_tps
        if self.allocator_settings is not None:
            out["allocator_settings"] = self.allocator_settings
        if self.metadata:
            out["metadata"] = self.metadata
        return out


def save_profile(path: str | os.PathLike, profile: BucketProfile) -> Path:
    """Write the profile as YAML of built-in types, atomically (temp file in the same folder, then rename)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {type(path).__name__}")
    if not isinstance(profile, BucketProfile):
        raise TypeError(f"profile: expected a BucketProfile, got {type(profile).__name__}")
    data = to_plain(profile.to_dict())  # numpy scalars, str subclasses (torch.__version__) -> built-ins
    validate_profile(BucketProfile(data["bucket_duration_bins"], data.get("bucket_batch_size"),
                                   data.get("max_tps"), data.get("metadata") or {}, data.get("allocator_settings")),
                     source=str(path))
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return write_text_atomically(path, text)


PROFILE_FIELDS = ("num_buckets", "bucket_duration_bins", "bucket_batch_size", "max_tps", "allocator_settings",
                  "metadata")


class NoAliasLoader(yaml.SafeLoader):
    """YAML's safe loader without anchors and aliases: a profile never needs them, and nested aliases can
    expand to billions of nodes (a file of a few hundred bytes that hangs whatever walks it)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a profile",
                                              event.start_mark)
        return super().compose_node(parent, index)


def load_profile(path: str | os.PathLike) -> BucketProfile:
    """Read a profile YAML; errors name the file and the field that is wrong."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {type(path).__name__}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such profile file")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give the profile YAML file (e.g. bucket_profile.yaml)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=NoAliasLoader)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a YAML text file (byte {e.start} is not UTF-8)") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f":{where.line + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path}{line}: not valid YAML: {problem}") from None
    if not isinstance(data, dict) or "bucket_duration_bins" not in data:
        raise ValueError(f"{path}: missing field 'bucket_duration_bins'")
    unknown = sorted(set(data) - set(PROFILE_FIELDS))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), PROFILE_FIELDS, n=1)
        raise ValueError(f"{path}: unknown field {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else
                         f" (the fields: {', '.join(PROFILE_FIELDS)})"))
    profile = BucketProfile(bucket_duration_bins=data["bucket_duration_bins"],
                            bucket_batch_size=data.get("bucket_batch_size"),
                            max_tps=data.get("max_tps"), metadata=data.get("metadata") or {},
                            allocator_settings=data.get("allocator_settings"))
    validate_profile(profile, source=str(path))
    if "num_buckets" in data and data["num_buckets"] != profile.num_buckets:
        raise ValueError(f"{path}: field 'num_buckets' is {data['num_buckets']} but "
                         f"'bucket_duration_bins' has {profile.num_buckets} entries")
    return profile


def validate_profile(profile: BucketProfile, source: str = "profile") -> None:
    """Raise ValueError naming the field when the profile is inconsistent."""
    bins = profile.bucket_duration_bins
    if not isinstance(bins, list) or not bins:
        raise ValueError(f"{source}: field 'bucket_duration_bins' must be a non-empty list")
    for i, b in enumerate(bins):
        values = b if isinstance(b, (list, tuple)) else [b]
        if isinstance(b, (list, tuple)) and len(b) != 2:
            raise ValueError(f"{source}: bucket_duration_bins[{i}] must be [max_duration, max_tokens]")
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in values) \
                or values[0] <= 0 or (len(values) == 2 and not 0 <= values[1] < MAX_TOKENS):
            raise ValueError(f"{source}: bucket_duration_bins[{i}] = {b!r} must be a finite positive duration"
                             f"{' and a token count in [0, 2^63)' if len(values) == 2 else ''}")
    if profile.is_2d != all(isinstance(b, (list, tuple)) for b in bins):
        raise ValueError(f"{source}: field 'bucket_duration_bins' mixes 1D and 2D entries")
    keys = [tuple(b) if profile.is_2d else (b,) for b in bins]
    for i, b in enumerate(bins):
        if profile.is_2d and b[1] != int(b[1]):
            raise ValueError(f"{source}: bucket_duration_bins[{i}] = {b!r}: max_tokens must be a whole number")
    for i in range(1, len(keys)):  # a repeated bin (lhotse's and NeMo's estimators make them) stays empty
        if keys[i] < keys[i - 1]:
            order = "by duration, then by max_tokens within one duration" if profile.is_2d else "ascending"
            raise ValueError(f"{source}: bucket_duration_bins[{i}] = {bins[i]!r} comes after {bins[i - 1]!r}; "
                             f"bins must be sorted {order}")
    bs = profile.bucket_batch_size
    if bs is not None:
        if not isinstance(bs, list):
            raise ValueError(f"{source}: field 'bucket_batch_size' must be a list of one batch size per bucket, "
                             f"got {bs!r}")
        if len(bs) != len(bins):
            raise ValueError(f"{source}: field 'bucket_batch_size' has {len(bs)} entries, "
                             f"'bucket_duration_bins' has {len(bins)}")
        for i, b in enumerate(bs):
            if not isinstance(b, int) or isinstance(b, bool) or b < 1:
                raise ValueError(f"{source}: bucket_batch_size[{i}] = {b!r} must be a positive integer")
    tps = profile.max_tps
    if isinstance(tps, list) and len(tps) != len(bins):
        raise ValueError(f"{source}: field 'max_tps' has {len(tps)} entries, "
                         f"'bucket_duration_bins' has {len(bins)}")
    for i, v in enumerate(tps if isinstance(tps, list) else [] if tps is None else [tps]):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            where = f"max_tps[{i}]" if isinstance(tps, list) else "max_tps"
            raise ValueError(f"{source}: {where} = {v!r} must be a finite number >= 0 (tokens per second)")
    settings = profile.allocator_settings
    if settings is not None:
        if not isinstance(settings, str):
            raise ValueError(f"{source}: field 'allocator_settings' must be a settings string like "
                             f"'expandable_segments:True', got {settings!r}")
        try:
            parse_settings(settings)
        except ValueError as e:
            raise ValueError(f"{source}: field 'allocator_settings': {e}") from None
    if not isinstance(profile.metadata, dict):
        raise ValueError(f"{source}: field 'metadata' must be a mapping, got {type(profile.metadata).__name__}")


def profile_from_arrays(durations, num_tokens=None, *, num_buckets: int = 30, num_subbuckets: int = 2,
                        tps_threshold: float = 4.0, equal_count: bool = False,
                        one_d: bool = False, metadata: dict | None = None) -> BucketProfile:
    """A profile without batch sizes from per-utterance ``durations`` (seconds) and ``num_tokens``: 2D bins
    with a per-bin max_tps when token counts are given (and not ``one_d``), else 1D duration bins."""
    meta = dict(metadata or {})
    if num_tokens is not None and not one_d:
        if equal_count:
            raise ValueError("equal_count (--equal-count) applies to 1D bins only (one_d, --1d)")
        est = estimate_2d_bins(durations, num_tokens, num_buckets, num_subbuckets, tps_threshold=tps_threshold)
        meta.update(kind="2d", num_duration_buckets=num_buckets, num_subbuckets=num_subbuckets,
                    tps_threshold=tps_threshold,
                    tps_outliers=int(sum(g.num_outliers for g in est.groups)))
        keep = _first_of_repeats(est.bins)
        if len(keep) < len(est.bins):
            meta.update(repeated_bins_dropped=len(est.bins) - len(keep))
        return BucketProfile(bucket_duration_bins=[list(est.bins[i]) for i in keep],
                             max_tps=[float(est.max_tps[i]) for i in keep], metadata=meta)
    bins = estimate_duration_bins(durations, num_buckets, equal_count=equal_count)
    meta.update(kind="1d", rule="equal_count" if equal_count else "equal_duration")
    keep = _first_of_repeats(bins)
    if len(keep) < len(bins):
        meta.update(repeated_bins_dropped=len(bins) - len(keep))
    return BucketProfile(bucket_duration_bins=[bins[i] for i in keep], metadata=meta)


def _first_of_repeats(bins: list) -> list[int]:
    """Indices of the bins that differ from the one before: a repeated bin (lhotse's estimator repeats a
    boundary many utterances share) has a bucket nothing ever goes to, since the first equal bin takes all."""
    return [i for i in range(len(bins)) if i == 0 or bins[i] != bins[i - 1]]
