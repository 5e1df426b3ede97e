"""A tiny learnable corpus for CPU tests and demos: each letter of the transcript is a short sine tone.

Letters "a".."h" map to tones of 300 + 150 * k Hz (k = letter index) lasting 160 ms; a space is 80 ms
of silence. A model can learn the mapping in a few dozen steps, so "the loss falls" is a real signal.
Written as lhotse manifests (16 kHz mono 16-bit WAV files), every file atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from workbench.atomic import atomic_path
from workbench.data.tokenizer import train_tokenizer
from workbench.units import SAMPLE_RATE

LETTERS = "abcdefgh"
TONE_S, GAP_S = 0.16, 0.08


def tone_audio(text: str, *, rng: np.random.Generator | None = None) -> np.ndarray:
    """float32 samples at 16 kHz for a text of letters a..h and spaces (small noise added)."""
    pieces = []
    for ch in text:
        if ch == " ":
            pieces.append(np.zeros(int(GAP_S * SAMPLE_RATE)))
            continue
        k = LETTERS.index(ch)
        t = np.arange(int(TONE_S * SAMPLE_RATE)) / SAMPLE_RATE
        pieces.append(0.5 * np.sin(2 * np.pi * (300 + 150 * k) * t))
    audio = np.concatenate(pieces)
    if rng is not None:
        audio = audio + 0.01 * rng.standard_normal(audio.shape)
    return audio.astype(np.float32)


def write_tone_corpus(out_dir: str | os.PathLike, num_cuts: int, *, seed: int = 0, min_letters: int = 3,
                      max_letters: int = 10) -> Path:
    """Write ``out_dir``/audio/*.wav and ``out_dir``/cuts.jsonl.gz (MonoCuts with one supervision);
    returns the cuts path. Transcripts are words of letters a..h, 3..10 letters (inclusive) in all."""
    import soundfile as sf
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    if num_cuts < 1:
        raise ValueError(f"num_cuts: need at least 1, got {num_cuts}")
    out = Path(out_dir)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    cuts = []
    for i in range(num_cuts):
        letters = "".join(rng.choice(list(LETTERS), size=int(rng.integers(min_letters, max_letters + 1))))
        split = int(rng.integers(1, len(letters)))
        text = f"{letters[:split]} {letters[split:]}"
        path = out / "audio" / f"tone-{i:05d}.wav"
        with atomic_path(path) as tmp:
            sf.write(tmp, tone_audio(text, rng=rng), SAMPLE_RATE, subtype="PCM_16", format="WAV")
        recording = Recording.from_file(path, recording_id=f"tone-{i:05d}")
        supervision = SupervisionSegment(id=recording.id, recording_id=recording.id, start=0.0,
                                         duration=recording.duration, text=text)
        cuts.append(MonoCut(id=recording.id, start=0.0, duration=recording.duration, channel=0,
                            recording=recording, supervisions=[supervision]))
    cuts_path = out / "cuts.jsonl.gz"
    with atomic_path(cuts_path) as tmp:
        CutSet.from_cuts(cuts).to_file(tmp)
    return cuts_path


def train_letter_tokenizer(out_prefix: str | os.PathLike) -> Path:
    """A sentencepiece character model over a..h (plus its word-boundary and unk pieces); returns .model."""
    texts = [" ".join(LETTERS[i:] + LETTERS[:i] for _ in range(3)) for i in range(len(LETTERS))]
    return train_tokenizer(texts, out_prefix, len(LETTERS) + 2, model_type="char", progress=False)
