"""A synthetic corpus with realistic statistics, in memory or written as a lhotse CutSet manifest.

Durations are log-normal (median ``median_duration_s``), truncated to [``min_duration_s``,
``max_duration_s``] by redrawing; each speaker has a speaking rate in tokens per second (log-normal
around ``tokens_per_second``) with per-utterance jitter; a share ``outlier_share`` of transcripts is far
too long for its audio (3x to 8x the tokens), the kind of example a TPS filter exists to catch.
Everything is seeded: the same arguments give the same corpus.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from workbench.atomic import atomic_path
from workbench.data.arrays import CutArrays
from workbench.data.tokenizer import tokenized_cut_arrays
from workbench.units import SAMPLE_RATE


@dataclass
class SyntheticSpec:
    num_cuts: int = 10_000  # how many utterances
    seed: int = 0  # RNG seed; same seed, same corpus
    median_duration_s: float = 6.0  # median of the log-normal duration distribution, seconds
    duration_sigma: float = 0.8  # log-space standard deviation of durations
    min_duration_s: float = 0.5  # shortest utterance, seconds (inclusive)
    max_duration_s: float = 40.0  # longest utterance, seconds (inclusive)
    num_speakers: int = 200  # speakers, each with its own speaking rate
    tokens_per_second: float = 4.0  # median speaking rate over speakers, output tokens per second
    speaker_rate_sigma: float = 0.25  # log-space spread of speaking rate across speakers
    utterance_rate_sigma: float = 0.1  # log-space jitter of the rate within a speaker
    outlier_share: float = 0.01  # share of transcripts 3x-8x too long for their audio

    def __post_init__(self) -> None:
        """Refuse a field out of its range, naming the field and the range."""
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        for name in ("num_cuts", "num_speakers", "seed"):
            value = getattr(self, name)
            need(isinstance(value, (int, np.integer)) and not isinstance(value, bool), name, "an integer")
        need(self.num_cuts >= 1, "num_cuts", ">= 1")
        need(self.num_speakers >= 1, "num_speakers", ">= 1")
        need(self.seed >= 0, "seed", ">= 0")
        for name in ("median_duration_s", "min_duration_s", "max_duration_s", "tokens_per_second"):
            need(0 < getattr(self, name) < np.inf, name, "a finite number > 0")
        for name in ("duration_sigma", "speaker_rate_sigma", "utterance_rate_sigma"):
            need(0 <= getattr(self, name) < np.inf, name, "a finite number >= 0")
        need(0 <= self.outlier_share <= 1, "outlier_share", "in [0, 1]")
        need(self.min_duration_s < self.max_duration_s, "max_duration_s",
             f"> min_duration_s ({self.min_duration_s})")
        share = self.share_in_range()
        need(share >= 0.01, "median_duration_s", f"such that at least 1 % of the log-normal durations (sigma "
             f"{self.duration_sigma}) lie in [{self.min_duration_s}, {self.max_duration_s}] s (this one puts "
             f"{100 * share:.3g} % there, and redrawing the rest would take forever)")

    def share_in_range(self) -> float:
        """The share of the untruncated log-normal durations inside [min_duration_s, max_duration_s]."""
        mu, sigma = math.log(self.median_duration_s), self.duration_sigma
        if sigma == 0:
            return float(self.min_duration_s <= self.median_duration_s <= self.max_duration_s)

        def cdf(x: float) -> float:
            return 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))

        return cdf(self.max_duration_s) - cdf(self.min_duration_s)


def _draw(spec: SyntheticSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    n = spec.num_cuts
    mu = np.log(spec.median_duration_s)
    dur = rng.lognormal(mu, spec.duration_sigma, n)
    bad = (dur < spec.min_duration_s) | (dur > spec.max_duration_s)
    while bad.any():
        dur[bad] = rng.lognormal(mu, spec.duration_sigma, int(bad.sum()))
        bad = (dur < spec.min_duration_s) | (dur > spec.max_duration_s)
    # Whole samples at 16 kHz, so the manifest's duration equals num_samples / sampling_rate exactly.
    samples = np.maximum(np.round(dur * SAMPLE_RATE), 1).astype(np.int64)
    dur = samples / SAMPLE_RATE
    speaker = rng.integers(0, spec.num_speakers, n)
    speaker_rate = rng.lognormal(np.log(spec.tokens_per_second), spec.speaker_rate_sigma, spec.num_speakers)
    rate = speaker_rate[speaker] * rng.lognormal(0.0, spec.utterance_rate_sigma, n)
    tokens = np.maximum(np.round(rate * dur), 1)
    outliers = rng.random(n) < spec.outlier_share
    tokens[outliers] *= rng.uniform(3.0, 8.0, int(outliers.sum()))
    return dur, np.round(tokens).astype(np.int64), speaker


def synthetic_cut_arrays(num_cuts: int, seed: int = 0, **spec_fields) -> CutArrays:
    """The synthetic corpus as arrays (no text), fast: 1M cuts in well under a second."""
    spec = SyntheticSpec(num_cuts=num_cuts, seed=seed, **spec_fields)
    dur, tokens, _ = _draw(spec)
    ids = [f"syn-{seed}-{i:08d}" for i in range(num_cuts)]
    return CutArrays(ids=ids, durations=dur, num_tokens=tokens, source=f"synthetic(n={num_cuts}, seed={seed})")


def cuts_from_arrays(durations, num_tokens=None, *, prefix: str = "c"):
    """An in-memory lhotse CutSet: one MonoCut per duration (seconds), ids ``<prefix><i>``, each with a
    dummy recording (no audio); ``num_tokens[i]`` goes to ``custom["num_tokens"]`` when given. A
    :class:`CutArrays` gives both (and its ids).

    For tests and notebooks that need a sampler over a handful of chosen lengths."""
    from lhotse import CutSet, MonoCut  # imports torch (seconds): loaded on first use, not by the CLI
    from lhotse.testing.dummies import dummy_recording

    ids = None
    if isinstance(durations, CutArrays):
        if num_tokens is not None:
            raise ValueError("num_tokens: leave it out when passing CutArrays (it has its own)")
        ids, num_tokens, durations = durations.ids, durations.num_tokens, durations.durations
    bad = [i for i, d in enumerate(durations) if not d > 0]
    if bad:
        raise ValueError(f"durations: {len(bad)} not > 0 seconds (first at index {bad[0]}: {durations[bad[0]]})")
    if num_tokens is not None and len(num_tokens) != len(durations):
        raise ValueError(f"num_tokens has {len(num_tokens)} values for {len(durations)} durations")
    cuts = []
    for i, d in enumerate(durations):
        cut_id = ids[i] if ids is not None else f"{prefix}{i}"
        recording = dummy_recording(i, duration=float(d))
        recording.id = cut_id
        custom = {"num_tokens": int(num_tokens[i])} if num_tokens is not None else None
        cuts.append(MonoCut(id=cut_id, start=0.0, duration=float(d), channel=0, recording=recording,
                            custom=custom))
    return CutSet.from_cuts(cuts)


def _word_list(rng: np.random.Generator, size: int = 3000) -> list[str]:
    onsets = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "pl"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    words = set()
    while len(words) < size:
        k = int(rng.integers(1, 4))
        words.add("".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                          for _ in range(k)))
    return sorted(words)


def write_synthetic_corpus(out_dir: str | os.PathLike, num_cuts: int, seed: int = 0, *,
                           progress: bool = True, **spec_fields) -> Path:
    """Write ``<out_dir>/cuts.jsonl.gz``: lhotse MonoCuts with one supervision each.

    Each cut's text has pseudo-words (about 1.4 tokens per word) and ``custom["num_tokens"]`` holds its
    token count. Recordings point at files that do not exist: the corpus is for statistics, not audio.
    Written atomically (temp file, then rename).
    """
    spec = SyntheticSpec(num_cuts=num_cuts, seed=seed, **spec_fields)
    dur, tokens, speaker = _draw(spec)
    rng = np.random.default_rng(seed + 1)
    words = _word_list(rng)
    num_words = np.maximum(np.round(tokens / 1.4), 1).astype(np.int64)
    # Python lists, not numpy arrays, in the loop: joining numpy strings can swallow a KeyboardInterrupt (Ctrl-C)
    text_words = [words[j] for j in rng.integers(0, len(words), int(num_words.sum())).tolist()]
    ends = np.cumsum(num_words).tolist()
    path = Path(out_dir) / "cuts.jsonl.gz"
    with atomic_path(path) as tmp, gzip.open(tmp, "wt", compresslevel=1) as f:
        start = 0
        for i in tqdm(range(num_cuts), desc="synthetic cuts", unit="cut", disable=not progress,
                      mininterval=1.0):
            text = " ".join(text_words[start:ends[i]])
            start = ends[i]
            cid = f"syn-{seed}-{i:08d}"
            d = float(dur[i])
            n = int(round(d * SAMPLE_RATE))
            # Formatted by hand: building the dict and orjson.dumps(..., OPT_APPEND_NEWLINE) took 2.8-3.5 s per
            # 300k cuts against 1.0 s for this f-string (same parsed JSON; measured on the 2-core CPU dev box).
            f.write(
                f'{{"id": "{cid}", "start": 0, "duration": {d}, "channel": 0, "supervisions": '
                f'[{{"id": "{cid}", "recording_id": "{cid}", "start": 0, "duration": {d}, "channel": 0, '
                f'"text": {json.dumps(text)}, "language": "en", "speaker": "spk{int(speaker[i]):04d}"}}], '
                f'"recording": {{"id": "{cid}", "sources": [{{"type": "file", "channels": [0], '
                f'"source": "synthetic/{cid}.wav"}}], "sampling_rate": {SAMPLE_RATE}, '
                f'"num_samples": {n}, "duration": {d}, "channel_ids": [0]}}, '
                f'"custom": {{"num_tokens": {int(tokens[i])}}}, "type": "MonoCut"}}\n')
    return path


def corpus_arrays(manifest: str | os.PathLike | None = "", *, tokenizer: str | os.PathLike = "", num_cuts: int = 200_000,
                  seed: int = 0) -> CutArrays:
    """The notebooks' corpus: ``manifest`` read with :func:`workbench.data.tokenizer.tokenized_cut_arrays`
    (token counts from ``tokenizer``, a sentencepiece ``.model``, when given), or with no manifest a
    synthetic corpus of ``num_cuts`` utterances."""
    if manifest not in (None, ""):
        return tokenized_cut_arrays(manifest, tokenizer)
    return synthetic_cut_arrays(num_cuts, seed=seed)
