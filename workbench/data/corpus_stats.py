"""Statistics of a spoken corpus: durations, speaking rates, tokens per second, silences, languages.

Read from a cuts manifest and its audio (silences are measured on the samples), for comparing a corpus
with the published figures of real ones (docs/CORPUS.md, benchmarks/corpus).
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np

SILENCE_PEAK = 10 ** (-50 / 20)  # a 10 ms frame whose peak is below -50 dBFS is silent
FRAME_S = 0.01


def percentiles(values, qs=(10, 50, 90)) -> dict[str, float]:
    """``{"p10": ..., "p50": ..., "p90": ..., "max": ...}`` of ``values`` (linear interpolation), 4 digits."""
    x = np.asarray(values, dtype=np.float64)
    out = {f"p{q}": round(float(np.percentile(x, q)), 4) for q in qs}
    out["max"] = round(float(x.max()), 4)
    return out


def silence_profile(samples: np.ndarray, sample_rate: int) -> tuple[float, float, float]:
    """(leading silence s, trailing silence s, share of silent frames) of one utterance; a frame is
    ``FRAME_S`` long and silent when its peak is below ``SILENCE_PEAK`` (full scale 1.0)."""
    hop = int(round(FRAME_S * sample_rate))
    n = len(samples) // hop
    if n == 0:
        return 0.0, 0.0, 1.0
    peaks = np.abs(samples[:n * hop]).reshape(n, hop).max(axis=1)
    loud = np.flatnonzero(peaks >= SILENCE_PEAK)
    if len(loud) == 0:
        return n * FRAME_S, n * FRAME_S, 1.0
    return loud[0] * FRAME_S, (n - 1 - loud[-1]) * FRAME_S, float((peaks < SILENCE_PEAK).mean())


def corpus_statistics(cuts_path: str | os.PathLike, tokenizer) -> dict:
    """Percentiles (p10, p50, p90, max) over the utterances of ``cuts_path`` of: duration (s), speaking rate
    (words per minute over the whole cut, and over the speech between the first and last loud frame),
    tokens per second (``tokenizer``: a sentencepiece processor or ``.model`` path), leading and trailing
    silence (s) and silent share; plus the count, hours, and utterances per language, and the number of speakers."""
    from lhotse import load_manifest_lazy  # imports torch: seconds

    from workbench.data.tokenizer import count_tokens, load_tokenizer

    durations, words, texts, lead, trail, share, languages, speakers = [], [], [], [], [], [], Counter(), Counter()
    for cut in load_manifest_lazy(cuts_path):
        text = " ".join(s.text or "" for s in cut.supervisions)
        audio = cut.load_audio()[0]
        a, b, c = silence_profile(audio, cut.sampling_rate)
        durations.append(cut.duration)
        texts.append(text)
        words.append(len(text.split()))
        lead.append(a)
        trail.append(b)
        share.append(c)
        sup = cut.supervisions[0]
        languages[sup.language or "?"] += 1
        speakers[sup.speaker or "?"] += 1
    d, w = np.array(durations), np.array(words)
    speech = np.maximum(d - np.array(lead) - np.array(trail), 1e-3)
    tokens = count_tokens(load_tokenizer(tokenizer), texts)
    return {"utterances": len(d), "hours": round(float(d.sum()) / 3600, 3),
            "duration_s": percentiles(d), "speaking_rate_wpm": percentiles(w / d * 60),
            "articulation_rate_wpm": percentiles(w / speech * 60),
            "tokens_per_s": percentiles(np.asarray(tokens) / d),
            "leading_silence_s": percentiles(lead), "trailing_silence_s": percentiles(trail),
            "silent_share": percentiles(share),
            "languages": dict(sorted(languages.items())), "speakers": len(speakers)}
