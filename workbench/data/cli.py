"""`workbench corpus synthetic | tts | tokenizer | stats`: make and inspect corpora."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _synthetic(args: argparse.Namespace) -> int:
    from workbench.data.synthetic import write_synthetic_corpus

    path = write_synthetic_corpus(args.out, args.num_cuts, seed=args.seed,
                                  median_duration_s=args.median_duration,
                                  max_duration_s=args.max_duration, outlier_share=args.outlier_share)
    print(f"wrote {args.num_cuts} cuts to {path}")
    return 0


def _tts(args: argparse.Namespace) -> int:
    from workbench.data.tts import make_tts_corpus

    paths = make_tts_corpus(args.out, text_file=args.text_file, num_utterances=args.num_utterances,
                            voice=args.voice, speed_wpm=args.speed_wpm, seed=args.seed,
                            tokenizer=args.tokenizer, num_speakers=args.num_speakers, num_workers=args.workers,
                            repeat=args.repeat)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    from workbench.data.tokenizer import add_token_counts, load_tokenizer, train_tokenizer

    manifest = Path(args.manifest)
    model_path = train_tokenizer(manifest, args.out, vocab_size=args.vocab_size, model_type=args.model_type)
    print(f"tokenizer: {model_path}")
    if args.add_counts:
        out = add_token_counts(manifest, load_tokenizer(model_path), args.add_counts)
        print(f"cuts with custom.num_tokens: {out}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from workbench.data.manifest import read_cut_arrays

    arrays = read_cut_arrays(args.manifest, tokenizer=args.tokenizer)
    print(json.dumps(arrays.summary(), indent=2))
    return 0


def register(sub) -> None:
    corpus = sub.add_parser("corpus", help="make and inspect corpora (lhotse manifests)")
    csub = corpus.add_subparsers(dest="corpus_command", metavar="KIND", required=True)

    p = csub.add_parser("synthetic", help="synthetic corpus with realistic statistics (no audio)")
    p.add_argument("--out", required=True, help="output folder; writes cuts.jsonl.gz there")
    p.add_argument("--num-cuts", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--median-duration", type=float, default=6.0, help="seconds")
    p.add_argument("--max-duration", type=float, default=40.0, help="seconds")
    p.add_argument("--outlier-share", type=float, default=0.01, help="share of too-long transcripts")
    p.set_defaults(func=_synthetic)

    p = csub.add_parser("tts", help="real 16 kHz audio spoken by espeak-ng, no downloads")
    p.add_argument("--out", required=True, help="output folder for audio and manifests")
    p.add_argument("--text-file", default=None, help="sentences to speak (default: prose CPython ships)")
    p.add_argument("--num-utterances", type=int, default=None, help="default: each sentence once")
    p.add_argument("--voice", default="en")
    p.add_argument("--speed-wpm", type=int, default=None, help="one speed for all speakers, words/minute")
    p.add_argument("--num-speakers", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="espeak-ng processes")
    p.add_argument("--repeat", type=int, default=1,
                   help="list each utterance this many times in cuts.jsonl.gz (copies share the audio file)")
    p.add_argument("--tokenizer", default=None, help="sentencepiece model: fills custom.num_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_tts)

    p = csub.add_parser("tokenizer", help="train a sentencepiece BPE tokenizer on a corpus's transcripts")
    p.add_argument("manifest", help="cuts manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--vocab-size", type=int, default=256, help="128 to 1024")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--out", default=None, help="model path prefix (default: beside the manifest)")
    p.add_argument("--add-counts", default=None, metavar="CUTS_OUT",
                   help="also write the cuts with custom.num_tokens to this manifest")
    p.set_defaults(func=_tokenizer)

    p = csub.add_parser("stats", help="count, hours, duration and token quantiles of a cuts manifest")
    p.add_argument("manifest")
    p.add_argument("--tokenizer", default=None, help="sentencepiece model to count tokens with")
    p.set_defaults(func=_stats)
