"""`workbench corpus synthetic | tts | tokenizer | stats`: make and inspect corpora."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workbench.atomic import check_writable
from workbench.data.corpus_folder import CORPUS_PARTS, check_corpus_target, remove_corpus_parts
from workbench.data.synthetic import write_synthetic_corpus
from workbench.data.tokenizer import add_token_counts, load_tokenizer, tokenized_cut_arrays, train_tokenizer
from workbench.data.tts import PRESETS, make_tts_corpus
from workbench.options import count_int, fraction, number_in, positive_int, seconds


def _synthetic(args: argparse.Namespace) -> int:
    check_writable(Path(args.out) / "cuts.jsonl.gz")
    check_corpus_target(args.out, overwrite=args.overwrite)
    path = write_synthetic_corpus(args.out, args.num_cuts, seed=args.seed,
                                  median_duration_s=args.median_duration,
                                  max_duration_s=args.max_duration, outlier_share=args.outlier_share,
                                  progress=sys.stderr.isatty())
    if args.overwrite:  # the new cuts are in place: what described the old corpus goes
        remove_corpus_parts(path.parent, keep=("cuts.jsonl.gz",))
    print(f"wrote {args.num_cuts} cuts to {path}")
    return 0


def _tts(args: argparse.Namespace) -> int:
    check_writable(Path(args.out) / "cuts.jsonl.gz")  # before minutes of speech synthesis
    check_corpus_target(args.out, overwrite=args.overwrite)
    paths = make_tts_corpus(args.out, text_file=args.text_file, num_utterances=args.num_utterances,
                            voice=args.voice, speed_wpm=args.speed_wpm, seed=args.seed,
                            tokenizer=args.tokenizer, num_speakers=args.num_speakers, num_workers=args.workers,
                            repeat=args.repeat, join=args.join, progress=sys.stderr.isatty(),
                            replace_corpus=args.overwrite, preset=args.preset)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    manifest = Path(args.manifest)
    prefix = Path(args.out) if args.out is not None else manifest.parent / f"tokenizer_{args.model_type}_{args.vocab_size}"
    model_path = check_writable(prefix.with_name(prefix.name + ".model"))
    if model_path.exists() and not args.overwrite:
        raise ValueError(f"{model_path}: a tokenizer is there already (token counts and runs made with it would no "
                         "longer match); pass --overwrite to replace it, or choose another --out")
    if args.add_counts:
        check_writable(args.add_counts)
        target = Path(args.add_counts)
        if target.exists() and target.resolve() != manifest.resolve() and not args.overwrite:
            raise ValueError(f"--add-counts {target}: a manifest is there already; pass --overwrite to replace it, "
                             "give the input manifest itself to add the counts in place, or choose another path")
    progress = sys.stderr.isatty()
    model_path = train_tokenizer(manifest, prefix, vocab_size=args.vocab_size, model_type=args.model_type,
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


def _parser(sub, name: str, help: str, description: str, examples: list[str]):
    """A sub-command whose --help shows ``description`` and ``examples`` with their line breaks kept."""
    return sub.add_parser(name, help=help, description=description,
                          epilog="examples:\n" + "\n".join("  " + e.replace("\n", "\n  ") for e in examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _overwrite_option(parser, when: str) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace the corpus an --out folder holds: its {', '.join(CORPUS_PARTS)} are removed "
                             f"{when}; other files stay (without it, a folder holding any manifest or audio "
                             "folder is refused)")


def register(sub) -> None:
    corpus = _parser(sub, "corpus", "make and inspect corpora (lhotse manifests)",
                     "Make and inspect corpora: lhotse cuts manifests (.jsonl.gz).",
                     ["workbench corpus synthetic --out work/demo --num-cuts 2000",
                      "workbench corpus stats work/demo/cuts.jsonl.gz",
                      "workbench corpus tokenizer work/demo/cuts.jsonl.gz --vocab-size 256"])
    csub = corpus.add_subparsers(dest="corpus_command", metavar="KIND", required=True)
    for register_command in (_register_synthetic, _register_tts, _register_tokenizer, _register_stats):
        register_command(csub)


def _register_synthetic(csub) -> None:
    p = _parser(csub, "synthetic", "synthetic corpus with realistic statistics (no audio)",
                "Write OUT/cuts.jsonl.gz: seeded synthetic cuts with log-normal durations, transcripts and\n"
                "custom.num_tokens, spread over speakers with their own speaking rates. No audio: the recordings\n"
                "point at files that do not exist; for statistics, bins and batch sizes, not for training.",
                ["workbench corpus synthetic --out work/demo --num-cuts 2000",
                 "workbench corpus synthetic --out work/big --num-cuts 1000000 --seed 1",
                 "workbench corpus synthetic --out work/short --median-duration 3 --max-duration 10 "
                 "--outlier-share 0"])
    p.add_argument("--out", required=True, help="output folder; writes cuts.jsonl.gz there")
    p.add_argument("--num-cuts", type=positive_int, default=10_000,
                   help="how many utterances (cuts), >= 1 (default 10000)")
    p.add_argument("--seed", type=count_int, default=0,
                   help="random seed, >= 0: the same seed writes the same corpus (default 0)")
    p.add_argument("--median-duration", type=seconds, default=6.0,
                   help="median utterance duration in seconds, > 0 (default 6)")
    p.add_argument("--max-duration", type=seconds, default=40.0,
                   help="longest utterance in seconds, > 0.5 (the shortest utterance) (default 40)")
    p.add_argument("--outlier-share", type=fraction, default=0.01,
                   help="share of cuts whose transcript is 3-8x too long for its audio, from 0 (none) to 1 "
                        "(all) (default 0.01)")
    _overwrite_option(p, "once the new cuts are written")
    p.set_defaults(func=_synthetic)


def _register_tts(csub) -> None:
    p = _parser(csub, "tts", "real 16 kHz audio spoken by espeak-ng, no downloads",
                "Speak sentences with espeak-ng into a 16 kHz corpus under OUT: audio files and lhotse\n"
                "recordings, supervisions and cuts manifests. Needs espeak-ng; downloads nothing.",
                ["workbench corpus tts --out work/tts --num-utterances 40",
                 "workbench corpus tts --out work/tts --num-utterances 2000 --join 4 --workers 8",
                 "workbench corpus tts --out work/tts --text-file my_prose.txt --voice en-us \\\n"
                 "    --tokenizer work/demo/tokenizer_bpe_256.model",
                 "workbench corpus tts --out work/real --num-utterances 2000 --preset realistic --workers 8"])
    p.add_argument("--out", required=True, help="output folder for audio and manifests")
    p.add_argument("--text-file", default=None,
                   help="UTF-8 text to take sentences from (default: the prose CPython ships, pydoc topics)")
    p.add_argument("--num-utterances", type=positive_int, default=None,
                   help="how many utterances, >= 1; more than there are sentences cycles through them again "
                        "(default: each sentence once)")
    p.add_argument("--voice", default="en",
                   help="espeak-ng base voice (no +variant: each speaker adds one), e.g. en, en-us, de; "
                        "list them with `espeak-ng --voices` (default en)")
    p.add_argument("--speed-wpm", type=number_in(int, 80, 450), default=None,
                   help="one speed for all speakers in words per minute, 80 to 450 (espeak-ng's range) "
                        "(default: each speaker its own, 130 to 200)")
    p.add_argument("--num-speakers", type=positive_int, default=None,
                   help="speaker styles (voice variant, speed, pitch) the utterances are spread over, >= 1 "
                        "(default 8, or the preset's)")
    p.add_argument("--workers", type=positive_int, default=2, help="espeak-ng processes, >= 1 (default 2)")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="list each utterance this many times in cuts.jsonl.gz (copies share the audio file), "
                        ">= 1 (default 1)")
    p.add_argument("--join", type=positive_int, default=None,
                   help="each utterance is 1 to N sentences joined (long utterances, as in real corpora), >= 1 "
                        "(default 1, or the preset's)")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="statistics like a real multi-source corpus: realistic = 9 voices in 6 languages (English "
                        "accents; de fr es it pl text from faker's word lists), a speed per speaker and per "
                        "utterance, 0.05-1 s silence before and after, pauses between sentences, up to 40 s "
                        "(docs/CORPUS.md); replaces --voice and --speed-wpm (default: none, the plain corpus)")
    p.add_argument("--tokenizer", default=None,
                   help="sentencepiece .model: fills custom.num_tokens (default: no token counts)")
    p.add_argument("--seed", type=count_int, default=0,
                   help="random seed for the sentence order and speakers, >= 0 (default 0)")
    _overwrite_option(p, "before the new audio is made")
    p.set_defaults(func=_tts)


def _register_tokenizer(csub) -> None:
    p = _parser(csub, "tokenizer", "train a sentencepiece tokenizer on a corpus's transcripts",
                "Train a sentencepiece tokenizer (BPE or unigram) on the transcripts of a cuts manifest;\n"
                "writes PREFIX.model and PREFIX.vocab, by default beside the manifest as\n"
                "tokenizer_<model-type>_<vocab-size>.",
                ["workbench corpus tokenizer work/tts/cuts.jsonl.gz --vocab-size 128",
                 "workbench corpus tokenizer work/demo/cuts.jsonl.gz --out work/tok --model-type unigram",
                 "workbench corpus tokenizer work/tts/cuts.jsonl.gz --add-counts work/tts/cuts_tok.jsonl.gz"])
    p.add_argument("manifest", help="cuts manifest (.jsonl or .jsonl.gz) whose transcripts train it")
    p.add_argument("--vocab-size", type=number_in(int, 128, 1024), default=256,
                   help="tokens in the vocabulary, 128 to 1024 (default 256)")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"],
                   help="sentencepiece algorithm (default bpe)")
    p.add_argument("--out", default=None,
                   help="model path prefix: writes PREFIX.model and PREFIX.vocab (default: beside the manifest)")
    p.add_argument("--add-counts", default=None, metavar="CUTS_OUT",
                   help="also write the cuts with custom.num_tokens (counted with the new model) to this "
                        "manifest")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a tokenizer already at the model path, and let --add-counts replace a manifest "
                        "other than the input (default: both refused)")
    p.set_defaults(func=_tokenizer)


def _register_stats(csub) -> None:
    p = _parser(csub, "stats", "count, hours, durations and token counts of a corpus",
                "Print, as JSON: cut count, hours, shortest/median/longest duration (seconds) and, with token\n"
                "counts, median and largest token count and median tokens per second.",
                ["workbench corpus stats work/demo/cuts.jsonl.gz",
                 "workbench corpus stats work/tts/cuts.jsonl.gz --tokenizer work/tts/tokenizer_bpe_128.model"])
    p.add_argument("manifest", help="cuts manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", default=None,
                   help="sentencepiece .model to count tokens with (default: custom.num_tokens from the "
                        "manifest, when there)")
    p.set_defaults(func=_stats)
