"""The throughput study's corpus: spoken (or, under --smoke, toned) utterances, each listed ``--repeat`` times.

``--corpus-preset realistic`` (the default) speaks ``make_tts_corpus(..., preset="realistic")``: speakers of
several languages and accents, speaking rates per speaker and utterance, silences (docs/CORPUS.md); its
tokenizer is trained on CPython's pydoc sentences plus the corpus's transcripts, as ``benchmarks.corpus``
measures it. ``plain`` is espeak-ng's English at a few fixed speeds, the tokenizer on pydoc's sentences only.
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
from pathlib import Path
from typing import Any

from benchmarks.throughput.settings import HISTOGRAM_BINS, MAX_UTTERANCE_S, corpus_root


def make_corpus(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The corpus in :func:`corpus_root` (made once, kept when already there): its paths and statistics
    (durations in s, tokens as its tokenizer counts them; 0/10/50/90/100th percentiles), and its CutArrays."""
    root = corpus_root(args)
    cuts_path, tokenizer_path = root / "cuts.jsonl.gz", root / "tokenizer.model"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:  # two studies in parallel make it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_corpus_files(args, root, cuts_path, tokenizer_path)
    from workbench.data.tokenizer import tokenized_cut_arrays

    arrays = tokenized_cut_arrays(cuts_path, tokenizer_path, progress=False)
    d, u = arrays.durations, arrays.num_tokens
    return {"cuts": str(cuts_path), "tokenizer": str(tokenizer_path), "num_cuts": int(len(d)),
            "unique_utterances": int(len(d) // args.repeat), "repeat": args.repeat, "join": args.join,
            "hours": float(d.sum() / 3600), "duration_s": [float(x) for x in _percentiles(d)],
            "tokens": [float(x) for x in _percentiles(u)], "max_tokens_per_second": float((u / d).max()),
            "preset": args.corpus_preset, **tokens_per_second(u / d, args.repeat),
            "kind": "tone (smoke)" if args.smoke else f"espeak-ng tts ({args.corpus_preset})"}, arrays


def tokens_per_second(rates, repeat: int, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """``tokens_per_second``: p10/p50/p90/max of the cuts' tokens per second; ``tokens_per_second_histogram``:
    ``edges`` (tokens/s, ``bins`` + 1) and ``utterances`` per bin, each utterance counted once (every one is
    listed ``repeat`` times)."""
    import numpy as np

    from workbench.data.corpus_stats import percentiles

    counts, edges = np.histogram(rates, bins=bins)
    return {"tokens_per_second": percentiles(rates),
            "tokens_per_second_histogram": {"edges": [round(float(e), 4) for e in edges],
                                            "utterances": [int(c) // repeat for c in counts]}}


def make_corpus_files(args: argparse.Namespace, root: Path, cuts_path: Path, tokenizer_path: Path) -> None:
    """Speak (or, under --smoke, tone) the corpus into ``root`` unless its cuts are already there."""
    if cuts_path.is_file():  # written last (atomically), so a corpus with cuts is whole
        return
    root.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus

        made = write_tone_corpus(root / "tones", args.utterances, seed=0, min_letters=3, max_letters=24)
        train_letter_tokenizer(root / "tokenizer")  # writes tokenizer_path
        repeated_cuts(made, cuts_path, args.repeat, max_duration=math.inf)
    elif args.corpus_preset == "plain":
        from workbench.data.tokenizer import train_tokenizer
        from workbench.data.tts import default_text, make_tts_corpus, split_sentences

        train_tokenizer(split_sentences(default_text()), root / "tokenizer", 256, progress=False)
        made = make_tts_corpus(root / "tts", num_utterances=args.utterances, join=args.join,
                               tokenizer=tokenizer_path, num_workers=_workers(), progress=False)
        repeated_cuts(made["cuts"], cuts_path, args.repeat, max_duration=MAX_UTTERANCE_S)
    else:
        speak_realistic(args, root)  # writes tokenizer_path
        repeated_cuts(root / "tts" / "cuts.jsonl.gz", cuts_path, args.repeat, max_duration=MAX_UTTERANCE_S)


def speak_realistic(args: argparse.Namespace, root: Path) -> None:
    """The realistic preset's corpus in ``root``/tts, its tokenizer (pydoc's sentences and the corpus's
    transcripts, 256 pieces) in ``root``/tokenizer.model and each cut's token count in its manifest."""
    from lhotse import load_manifest_lazy

    from workbench.data.tokenizer import add_token_counts, train_tokenizer
    from workbench.data.tts import default_text, make_tts_corpus, split_sentences

    made = make_tts_corpus(root / "tts", num_utterances=args.utterances, join=args.join, preset="realistic",
                           num_workers=_workers(), progress=False, replace_corpus=True)
    texts = [s.text for s in load_manifest_lazy(made["supervisions"])]
    tokenizer = train_tokenizer(split_sentences(default_text()) + texts, root / "tokenizer", 256, progress=False)
    add_token_counts(made["cuts"], tokenizer, made["cuts"], progress=False)


def _workers() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


def _percentiles(x):
    import numpy as np

    return np.percentile(x, [0, 10, 50, 90, 100])


def repeated_cuts(source: str | os.PathLike, out: Path, repeat: int, *, max_duration: float) -> Path:
    """Write ``out``: the cuts of ``source`` up to ``max_duration`` seconds, each listed ``repeat`` times
    (ids suffixed -r1, -r2, ...; copies share the audio), interleaved so that the copies of one utterance
    are a corpus apart."""
    from lhotse import CutSet

    from workbench.atomic import atomic_path

    kept = [c for c in CutSet.from_file(source) if c.duration <= max_duration]
    if not kept:
        raise ValueError(f"{source}: no cut of at most {max_duration:g} s")
    copies = [c if r == 0 else c.with_id(f"{c.id}-r{r}") for r in range(repeat) for c in kept]
    with atomic_path(out) as tmp:
        CutSet.from_cuts(copies).to_file(tmp)
    return out
