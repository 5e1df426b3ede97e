"""The corpus record (``benchmarks/results/corpus.json``): statistics of the espeak-ng corpora beside
published figures.

``corpora``: one entry per corpus (``plain``: the default of ``workbench corpus tts``; ``realistic``:
``--preset realistic``), each from ``workbench.data.corpus_stats.corpus_statistics``: ``duration_s``,
``speaking_rate_wpm`` (words over the whole cut), ``articulation_rate_wpm`` (words over the speech between
the silences), ``tokens_per_s``, ``leading_silence_s``, ``trailing_silence_s``, ``silent_share`` (each p10,
p50, p90, max), ``languages`` (utterances per language), ``speakers``, ``utterances``, ``hours``.
``references``: the published figures they are set against (:data:`REFERENCES`), each with its source.
"""

from __future__ import annotations

from typing import Any, Mapping

NAME = "corpus"

# Published figures, quoted from their sources (docs/CORPUS.md); "derived" ones are a ratio of two quoted.
REFERENCES: list[dict[str, Any]] = [
    {"what": "audiobook narration target speed (LibriVox volunteers)", "wpm": [150, 160],
     "note": "a self-described slow narrator reads at about 120 wpm",
     "source": "https://forum.librivox.org/viewtopic.php?f=23&t=87551"},
    {"what": "professional audiobook narration", "wpm": [130, 160],
     "source": "https://www.promptvo.com/blogs/whats-an-average-speaking-rate-how-many-words-per-minute-wpm-is-"
               "average-when-reading-an-audiobook-or-giving-a-presentation"},
    {"what": "public speaking (talks, speeches)", "wpm": [100, 130],
     "source": "https://www.promptvo.com/blogs/whats-an-average-speaking-rate-how-many-words-per-minute-wpm-is-"
               "average-when-reading-an-audiobook-or-giving-a-presentation"},
    {"what": "Audible narration at 1.0x", "wpm": [135, 180],
     "source": "https://techpenny.com/audible-reading-speed-answers/"},
    {"what": "LibriSpeech train-clean-100 mean utterance duration (derived: 100.6 h / 28,539 utterances)",
     "duration_s": 12.7,
     "source": "https://anilkeshwani.github.io/garden/Papers/Librispeech-An-ASR-corpus-based-on-public-domain-"
               "audio-books (hours); https://www.TensorFlow.org/datasets/catalog/librispeech (utterances)"},
    {"what": "LibriSpeech train-clean-360 mean utterance duration (derived: 363.6 h / 104,014 utterances)",
     "duration_s": 12.6, "source": "as above"},
    {"what": "LibriSpeech train-other-500 mean utterance duration (derived: 496.7 h / 148,688 utterances)",
     "duration_s": 12.0, "source": "as above"},
    {"what": "conversational speaking rate rises with turn length for turns of 1 to 7 words, older speakers "
             "are slower, men slightly faster (Yuan, Liberman, Cieri 2006; no figure quoted)",
     "source": "https://doi.org/10.21437/Interspeech.2006-204 (the DOI its ISCA page gives; docs/CORPUS.md)"},
]


def _p(s: Mapping[str, float], fmt: str = ".3g") -> str:
    return f"{s['p10']:{fmt}} / {s['p50']:{fmt}} / {s['p90']:{fmt}} (max {s['max']:{fmt}})"


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md: per corpus, p10 / p50 / p90 of each statistic."""
    lines = []
    for kind, c in figures.get("corpora", {}).items():
        langs = ", ".join(f"{k} {v}" for k, v in c["languages"].items())
        lines.append(f"- {kind}: {c['utterances']} utterances, {c['hours']:.2g} h, {c['speakers']} speakers ({langs}); "
                     f"p10 / p50 / p90: duration {_p(c['duration_s'])} s, speaking rate {_p(c['speaking_rate_wpm'])} "
                     f"wpm, tokens per second {_p(c['tokens_per_s'])}, leading silence "
                     f"{_p(c['leading_silence_s'], '.2g')} s, silent share {_p(c['silent_share'], '.2g')}")
    wpm = [r for r in figures.get("references", []) if "wpm" in r]
    if wpm:
        lines.append("- published speaking rates (wpm): " + "; ".join(f"{r['what']} {r['wpm'][0]}-{r['wpm'][1]}"
                                                                      for r in wpm))
    return lines
