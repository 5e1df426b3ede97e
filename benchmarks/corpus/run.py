"""Statistics of the espeak-ng corpora: the plain one the throughput study trains on, and --preset realistic.

    python -m benchmarks.corpus [--utterances 300] [--work DIR] [--out benchmarks/results]
    python -m benchmarks.corpus --smoke --out /tmp/x      # 12 utterances each

Writes <out>/corpus.json (``workbench/records/corpus.py`` owns its fields): for each corpus, durations,
speaking rates, tokens per second, silences and languages (``workbench.data.corpus_stats``), beside the
published figures of docs/CORPUS.md with their sources. Token counts use one sentencepiece BPE of 256
pieces per corpus, trained on CPython's pydoc sentences (as the throughput study's) plus that corpus's
transcripts. A CPU benchmark.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import bench_parser, start
from workbench.records import corpus as record

UTTERANCES, SMOKE_UTTERANCES = 300, 12
JOIN = 4  # the throughput study's default --join
CORPORA = {"plain": None, "realistic": "realistic"}  # corpus name -> make_tts_corpus preset


def measure(kind: str, preset: str | None, utterances: int, work: Path, workers: int) -> dict:
    """Make one corpus under ``work`` and return its statistics and how it was made."""
    from lhotse import load_manifest_lazy

    from workbench.data.corpus_stats import corpus_statistics
    from workbench.data.tokenizer import train_tokenizer
    from workbench.data.tts import default_text, make_tts_corpus, split_sentences

    made = make_tts_corpus(work / kind, num_utterances=utterances, join=JOIN, preset=preset, num_workers=workers,
                           progress=False, replace_corpus=True)
    texts = [s.text for s in load_manifest_lazy(made["supervisions"])]
    tokenizer = train_tokenizer(split_sentences(default_text()) + texts, work / f"tokenizer_{kind}", 256,
                                progress=False)
    return {"preset": preset, "join": JOIN, **corpus_statistics(made["cuts"], tokenizer)}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, parts=tuple(CORPORA))
    parser.add_argument("--utterances", type=int, default=None,
                        help=f"utterances per corpus (default {UTTERANCES}; {SMOKE_UTTERANCES} under --smoke)")
    parser.add_argument("--work", default=None, help="folder to keep the corpora in (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)),
                        help="espeak-ng processes (default: one per CPU)")
    run = start(parser, argv, name=record.NAME, what="statistics of the espeak-ng corpora (plain, and --preset "
                "realistic) beside published speaking rates and durations", needs_cuda=False)
    utterances = run.args.utterances or (SMOKE_UTTERANCES if run.smoke else UTTERANCES)
    run.params["utterances"] = utterances
    run.figures["references"] = record.REFERENCES
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(run.args.work or tmp)
        for kind, preset in CORPORA.items():
            if run.wants(kind):
                with run.part(kind):
                    run.figures.setdefault("corpora", {})[kind] = measure(kind, preset, utterances, work,
                                                                          run.args.workers)
    print("\n".join(record.summary_lines(run.figures)))
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
