"""`workbench corpus synthetic | tts | tokenizer | stats`: make and inspect corpora."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench.atomic import check_writable
from workbench.data.synthetic import write_synthetic_corpus
from workbench.data.tokenizer import add_token_counts, load_tokenizer, tokenized_cut_arrays, train_tokenizer
from workbench.data.tts import make_tts_corpus
from workbench.options import count_int, fraction, number_in, positive_int, seconds


def _synthetic(args: argparse.Namespace) -> int:
    check_writable(Path(args.out) / "cuts.jsonl.gz")
    path = write_synthetic_corpus(args.out, args.num_cuts, seed=args.seed,
                                  median_duration_s=args.median_duration,
                                  max_duration_s=args.max_duration, outlier_share=args.outlier_share,
                                  progress=sys.stderr.isatty())
    print(f"wrote {args.num_cuts} cuts to {path}")
    return 0


def _tts(args: argparse.Namespace) -> int:
    check_writable(Path(args.out) / "cuts.jsonl.gz")  # before minutes of speech synthesis
    paths = make_tts_corpus(args.out, text_file=args.text_file, num_utterances=args.num_utterances,
                            voice=args.voice, speed_wpm=args.speed_wpm, seed=args.seed,
                            tokenizer=args.tokenizer, num_speakers=args.num_speakers, num_workers=args.workers,
                            repeat=args.repeat, join=args.join, progress=sys.stderr.isatty())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    if args.out is not None:
        check_writable(Path(args.out + ".model"))
    if args.add_counts:
        check_writable(args.add_counts)
    progress = sys.stderr.isatty()
    model_path = train_tokenizer(manifest, args.out, vocab_size=args.vocab_size, model_type=args.model_type,
                                 progress=progress)
    print(f"tokenizer: {model_path}")
    if args.add_counts:
        out = add_token_counts(manifest, load_tokenizer(model_path), args.add_counts, progress=progress)
        print(f"cuts with custom.num_tokens: {out}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    arrays = tokenized_cut_arrays(args.manifest, args.tokenizer, progress=sys.stderr.isatty())
    print(json.dumps(arrays.summary(), indent=2))
    return 0


def register(sub) -> None:
    corpus = sub.add_parser("corpus", help="make and inspect corpora (lhotse manifests)")
    csub = corpus.add_subparsers(dest="corpus_command", metavar="KIND", required=True)

    p = csub.add_parser("synthetic", help="synthetic corpus with realistic statistics (no audio)")
    p.add_argument("--out", required=True, help="output folder; writes cuts.jsonl.gz there")
    p.add_argument("--num-cuts", type=positive_int, default=10_000, help=">= 1")
    p.add_argument("--seed", type=count_int, default=0, help=">= 0")
    p.add_argument("--median-duration", type=seconds, default=6.0, help="seconds, > 0")
    p.add_argument("--max-duration", type=seconds, default=40.0, help="seconds, > 0.5 (the shortest cut)")
    p.add_argument("--outlier-share", type=fraction, default=0.01, help="share of too-long transcripts, in [0, 1]")
    p.set_defaults(func=_synthetic)

    p = csub.add_parser("tts", help="real 16 kHz audio spoken by espeak-ng, no downloads")
    p.add_argument("--out", required=True, help="output folder for audio and manifests")
    p.add_argument("--text-file", default=None, help="sentences to speak (default: prose CPython ships)")
    p.add_argument("--num-utterances", type=positive_int, default=None, help="default: each sentence once")
    p.add_argument("--voice", default="en")
    p.add_argument("--speed-wpm", type=number_in(int, 80, 450), default=None,
                   help="one speed for all speakers, words/minute, in [80, 450] (espeak-ng's range)")
    p.add_argument("--num-speakers", type=positive_int, default=8, help=">= 1")
    p.add_argument("--workers", type=positive_int, default=2, help="espeak-ng processes, >= 1")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="list each utterance this many times in cuts.jsonl.gz (copies share the audio file), >= 1")
    p.add_argument("--join", type=positive_int, default=1,
                   help="each utterance is 1..N sentences joined (long utterances, as in real corpora), >= 1")
    p.add_argument("--tokenizer", default=None, help="sentencepiece model: fills custom.num_tokens")
    p.add_argument("--seed", type=count_int, default=0, help=">= 0")
    p.set_defaults(func=_tts)

    p = csub.add_parser("tokenizer", help="train a sentencepiece BPE tokenizer on a corpus's transcripts")
    p.add_argument("manifest", help="cuts manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--vocab-size", type=number_in(int, 128, 1024), default=256, help="in [128, 1024]")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--out", default=None, help="model path prefix (default: beside the manifest)")
    p.add_argument("--add-counts", default=None, metavar="CUTS_OUT",
                   help="also write the cuts with custom.num_tokens to this manifest")
    p.set_defaults(func=_tokenizer)

    p = csub.add_parser("stats", help="count, hours, shortest/median/longest duration, median and largest "
                                      "token count, median tokens per second")
    p.add_argument("manifest")
    p.add_argument("--tokenizer", default=None, help="sentencepiece model to count tokens with")
    p.set_defaults(func=_stats)
