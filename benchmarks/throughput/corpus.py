"""The throughput study's corpus: spoken (or, under --smoke, toned) utterances, each listed ``--repeat`` times."""

from __future__ import annotations

import argparse
import fcntl
import math
import os
from pathlib import Path
from typing import Any

from benchmarks.throughput.settings import MAX_UTTERANCE_S, corpus_root


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
            "kind": "tone (smoke)" if args.smoke else "espeak-ng tts"}, arrays


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
    else:
        from workbench.data.tokenizer import train_tokenizer
        from workbench.data.tts import default_text, make_tts_corpus, split_sentences

        train_tokenizer(split_sentences(default_text()), root / "tokenizer", 256, progress=False)
        made = make_tts_corpus(root / "tts", num_utterances=args.utterances, join=args.join,
                               tokenizer=tokenizer_path, num_workers=max(1, (os.cpu_count() or 2) - 1),
                               progress=False)
        repeated_cuts(made["cuts"], cuts_path, args.repeat, max_duration=MAX_UTTERANCE_S)


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
