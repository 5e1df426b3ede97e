"""A real-audio corpus with no downloads: espeak-ng speaks sentences, written as lhotse manifests.

The default text is the English prose that every CPython ships (``pydoc_data.topics``), cleaned into
sentences of 3 to 30 words. Each utterance is spoken by one of a few 'speakers' (an espeak-ng voice
variant with its own speed and pitch), resampled from espeak's 22.05 kHz to 16 kHz mono with the
windowed-sinc polyphase resampler below (no torchaudio, no scipy), and saved as 16-bit FLAC.

A :class:`CorpusStyle` (``preset="realistic"``, docs/CORPUS.md) makes the statistics look like a real
multi-source corpus: speakers of several languages and accents, a speaking rate per speaker and per
utterance, leading and trailing silence, pauses between joined sentences, durations up to 40 s. Text
for languages other than English is drawn from the word lists of the ``faker`` package.

Layout written under ``out_dir`` (every file atomically: temp file, then rename)::

    audio/<cut_id>.flac       16 kHz mono, 16-bit
    recordings.jsonl.gz       lhotse RecordingSet (absolute audio paths)
    supervisions.jsonl.gz     lhotse SupervisionSet (one per recording, the spoken sentence as text)
    cuts.jsonl.gz             lhotse CutSet of MonoCuts; custom["num_tokens"] when a tokenizer is given
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import signal
import subprocess
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from workbench.atomic import atomic_path, new_folder
from workbench.data.corpus_folder import remove_corpus_parts
from workbench.data.tokenizer import count_tokens, load_tokenizer
from workbench.units import SAMPLE_RATE
from workbench.options import check_int

ESPEAK_INSTALL_HINT = ("espeak-ng is not installed (the text-to-speech corpus needs it). Install it with "
                       "`sudo apt-get install -y espeak-ng` (Debian/Ubuntu), `brew install espeak-ng` (macOS), "
                       "`conda install -c conda-forge espeak-ng`, or run scripts/install_espeak.sh.")
# Voice variants that sound clearly different from one another; each speaker gets one.
VOICE_VARIANTS = ("m1", "f1", "m3", "f2", "m2", "f3", "m4", "f4", "m5", "f5", "m6", "m7")
_ALLOWED_SENTENCE = re.compile(r"^[A-Za-z][A-Za-z ,.;:'?!-]*[.?!]$")


@dataclass(frozen=True)
class SpeakerStyle:
    """How one 'speaker' sounds: an espeak-ng voice (e.g. ``en+f2``), words per minute, pitch 0..99."""

    speaker: str
    voice: str
    speed_wpm: int
    pitch: int


@dataclass(frozen=True)
class CorpusStyle:
    """How a realistic corpus varies; every range is (low, high), drawn uniformly unless said otherwise."""

    voices: tuple[tuple[str, float], ...]  # (espeak-ng base voice, share of the speakers); shares sum to 1
    speaker_wpm_mean: float  # mean over speakers of their espeak-ng speed (-s), words per minute
    speaker_wpm_sd: float  # spread of the speakers' speeds (normal), words per minute
    utterance_rate_sd: float  # an utterance's speed is its speaker's times exp(N(0, sd)), natural log
    wpm_range: tuple[int, int]  # every speed is clipped to this, words per minute (espeak-ng: 80..450)
    lead_silence_s: tuple[float, float]  # silence added before the speech, seconds
    trail_silence_s: tuple[float, float]  # silence added after the speech, seconds
    pause_s: tuple[float, float]  # espeak-ng break between the sentences of a joined utterance, seconds
    join: int  # sentences per utterance, 1..join (see join_sentences)
    max_duration_s: float  # an utterance longer than this loses its last sentences until it fits
    num_speakers: int  # speakers, unless make_tts_corpus is given num_speakers


# The numbers and their sources: docs/CORPUS.md.
PRESETS: dict[str, CorpusStyle] = {
    "realistic": CorpusStyle(
        voices=(("en-us", 0.2), ("en", 0.15), ("en-gb-scotland", 0.075), ("en-029", 0.075),
                ("de", 0.1), ("fr", 0.1), ("es", 0.1), ("it", 0.1), ("pl", 0.1)),
        speaker_wpm_mean=155.0, speaker_wpm_sd=20.0, utterance_rate_sd=0.08, wpm_range=(100, 220),
        lead_silence_s=(0.05, 1.0), trail_silence_s=(0.05, 1.0), pause_s=(0.1, 0.8),
        join=4, max_duration_s=40.0, num_speakers=40),
}
# faker's lorem word lists, by espeak-ng language: the text of voices that are not English.
WORD_LIST_LOCALES = {"de": "de_DE", "fr": "fr_FR", "es": "es_ES", "it": "it_IT", "nl": "nl_NL", "pl": "pl_PL",
                     "cs": "cs_CZ", "da": "da_DK", "ru": "ru_RU", "uk": "uk_UA", "el": "el_GR"}


# ---------------------------------------------------------------------------------------------- text


def default_text() -> str:
    """The English prose that ships with CPython (the pydoc help topics), topics in sorted order."""
    from pydoc_data.topics import topics  # a 0.8 MB module of text: loaded only when the default text is asked for

    return "\n\n".join(topics[name] for name in sorted(topics))


def split_sentences(text: str, *, min_words: int = 3, max_words: int = 30) -> list[str]:
    """Speakable sentences of ``min_words..max_words`` words (both inclusive), in text order, no repeats.

    Paragraphs are separated by blank lines; indented paragraphs (code, grammar) and heading underlines
    are dropped; double quotes are removed; a sentence is kept only if it holds nothing but letters,
    spaces and ``,.;:'?!-`` and ends with ``.``, ``?`` or ``!`` (so the transcript is what is spoken).
    """
    if min_words < 1 or max_words < min_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got min_words={min_words}, max_words={max_words}")
    sentences: list[str] = []
    seen: set[str] = set()
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if line.strip()]
        if not lines or lines[0][:1].isspace():
            continue
        lines = [line for line in lines if not re.fullmatch(r"\s*([*=~^#+-])\1{2,}\s*", line)]
        flat = re.sub(r"\s+", " ", " ".join(lines).replace('"', "")).strip()
        for sentence in re.split(r"(?<=[.?!])\s+(?=[A-Z])", flat):
            sentence = sentence.strip()
            if not _ALLOWED_SENTENCE.match(sentence) or sentence in seen:
                continue
            if min_words <= len(sentence.split()) <= max_words:
                seen.add(sentence)
                sentences.append(sentence)
    return sentences


def choose_sentences(sentences: list[str], num_utterances: int | None, seed: int = 0) -> list[str]:
    """``num_utterances`` sentences in a seeded order (all of them once when None).

    Asking for more than there are cycles through them again, each pass in a new seeded order.
    """
    if not sentences:
        raise ValueError("no sentences to speak (0 found)")
    count = len(sentences) if num_utterances is None else num_utterances
    if count < 1:
        raise ValueError(f"num_utterances must be >= 1, got {num_utterances}")
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while len(order) < count:
        order.extend(rng.permutation(len(sentences)).tolist())
    return [sentences[i] for i in order[:count]]


def join_sentences(sentences: list[str], join: int, seed: int = 0) -> list[str]:
    """Utterances of 1..``join`` consecutive sentences each (a seeded count per utterance, uniform), joined
    with a space, in order; every sentence is used once. ``join`` 1 returns the sentences as they are."""
    check_int(join, "join (--join)", 1)
    if join == 1:
        return list(sentences)
    rng = np.random.default_rng([seed, 15485863])
    utterances, i = [], 0
    while i < len(sentences):
        k = int(rng.integers(1, join + 1))
        utterances.append(" ".join(sentences[i:i + k]))
        i += k
    return utterances


# -------------------------------------------------------------------------------------------- speakers


def speaker_styles(num_speakers: int, *, voice: str = "en", speed_wpm: int | None = None,
                   seed: int = 0) -> list[SpeakerStyle]:
    """``num_speakers`` seeded speaker styles: a voice variant each, speed 130..200 wpm, pitch 25..75.

    ``speed_wpm`` fixes every speaker's speed instead (espeak-ng accepts 80..450).
    """
    if num_speakers < 1:
        raise ValueError(f"num_speakers must be >= 1, got {num_speakers}")
    if speed_wpm is not None and not 80 <= speed_wpm <= 450:
        raise ValueError(f"speed_wpm must be in 80..450 words per minute, got {speed_wpm}")
    rng = np.random.default_rng([seed, 7919])
    speeds = rng.integers(130, 201, size=num_speakers)
    pitches = rng.integers(25, 76, size=num_speakers)
    return [SpeakerStyle(speaker=f"spk{i:02d}", voice=f"{voice}+{VOICE_VARIANTS[i % len(VOICE_VARIANTS)]}",
                         speed_wpm=int(speed_wpm if speed_wpm is not None else speeds[i]), pitch=int(pitches[i]))
            for i in range(num_speakers)]


# ------------------------------------------------------------------------------------ realistic style


def corpus_style(preset: str | CorpusStyle | None) -> CorpusStyle | None:
    """The style of a preset name (:data:`PRESETS`), a given style once checked, or None."""
    if preset is None:
        return None
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset (--preset) {preset!r} is unknown; presets: {', '.join(sorted(PRESETS))}")
        return PRESETS[preset]
    check_style(preset)
    return preset


def _check_range(value: tuple[float, float], name: str, low: float, high: float = math.inf) -> None:
    if len(value) != 2 or not low <= value[0] <= value[1] <= high:
        raise ValueError(f"CorpusStyle.{name} must be (low, high) with {low:g} <= low <= high <= {high:g}, "
                         f"got {value}")


def check_style(style: CorpusStyle) -> None:
    """ValueError, one line naming the field, unless every field of ``style`` is in its range."""
    if not style.voices or any(share <= 0 or "+" in voice for voice, share in style.voices):
        raise ValueError(f"CorpusStyle.voices must be (base voice, share > 0) pairs, got {style.voices}")
    if abs(sum(share for _, share in style.voices) - 1.0) > 1e-6:
        raise ValueError(f"CorpusStyle.voices: the shares must sum to 1, got {sum(s for _, s in style.voices):g}")
    _check_range(style.wpm_range, "wpm_range", 80, 450)
    if not style.wpm_range[0] <= style.speaker_wpm_mean <= style.wpm_range[1]:
        raise ValueError(f"CorpusStyle.speaker_wpm_mean must be within wpm_range {style.wpm_range}, "
                         f"got {style.speaker_wpm_mean}")
    if style.speaker_wpm_sd < 0 or style.utterance_rate_sd < 0:
        raise ValueError("CorpusStyle.speaker_wpm_sd and utterance_rate_sd must be >= 0, got "
                         f"{style.speaker_wpm_sd} and {style.utterance_rate_sd}")
    for name in ("lead_silence_s", "trail_silence_s", "pause_s"):
        _check_range(getattr(style, name), name, 0.0, 10.0)
    check_int(style.join, "CorpusStyle.join", 1)
    check_int(style.num_speakers, "CorpusStyle.num_speakers", 1)
    if not style.max_duration_s > 0:
        raise ValueError(f"CorpusStyle.max_duration_s must be > 0, got {style.max_duration_s}")


def language_of(voice: str) -> str:
    """The language of an espeak-ng voice: ``en-gb-scotland+f2`` -> ``en``."""
    return voice.split("+")[0].split("-")[0]


def word_list(language: str) -> list[str]:
    """The words of ``language`` from faker's lorem word list, for speakers of that language: letters only,
    and of one-letter words only vowels (some lists hold stray consonants)."""
    if language not in WORD_LIST_LOCALES:
        raise ValueError(f"voice language {language!r} has no word list; languages other than English: "
                         f"{', '.join(sorted(WORD_LIST_LOCALES))}")
    try:
        from importlib import import_module

        provider = import_module(f"faker.providers.lorem.{WORD_LIST_LOCALES[language]}").Provider
    except ImportError:
        raise ImportError("the text of voices that are not English comes from the faker package: "
                          "pip install faker") from None
    return [w for w in provider.word_list if w.isalpha() and (len(w) > 1 or w.lower() in "aeiouyàé")]


def sentences_of(text: str) -> list[str]:
    """``text`` split after each ``.``, ``?`` or ``!`` that a space follows."""
    return [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]


def foreign_text(english: str, words: list[str], rng: np.random.Generator) -> str:
    """One sentence for each sentence of ``english``, of as many words drawn (uniformly) from ``words``;
    capitalized, ending with a full stop."""
    out = []
    for sentence in sentences_of(english):
        drawn = " ".join(rng.choice(words, size=len(sentence.split())).tolist())
        out.append(drawn[:1].upper() + drawn[1:] + ".")
    return " ".join(out)


def styled_speakers(style: CorpusStyle, num_speakers: int, seed: int = 0) -> list[SpeakerStyle]:
    """``num_speakers`` seeded speakers: a voice drawn by the style's shares (with a variant each), a speed
    drawn from N(speaker_wpm_mean, speaker_wpm_sd) clipped to wpm_range (words per minute), pitch 25..75."""
    check_int(num_speakers, "num_speakers (--num-speakers)", 1)
    rng = np.random.default_rng([seed, 6151])
    names = [voice for voice, _ in style.voices]
    shares = np.array([share for _, share in style.voices])
    picks = rng.choice(len(names), size=num_speakers, p=shares / shares.sum())
    speeds = np.clip(np.rint(rng.normal(style.speaker_wpm_mean, style.speaker_wpm_sd, num_speakers)),
                     *style.wpm_range)
    pitches = rng.integers(25, 76, size=num_speakers)
    return [SpeakerStyle(speaker=f"spk{i:02d}", voice=f"{names[picks[i]]}+{VOICE_VARIANTS[i % len(VOICE_VARIANTS)]}",
                         speed_wpm=int(speeds[i]), pitch=int(pitches[i])) for i in range(num_speakers)]


@dataclass(frozen=True)
class UtteranceShape:
    """What one utterance of a styled corpus is given: its speed (words per minute) and silences (seconds)."""

    speed_wpm: int
    lead_s: float
    trail_s: float
    pause_s: float  # between its sentences


def utterance_shapes(style: CorpusStyle, speaker_wpm: np.ndarray, seed: int = 0) -> list[UtteranceShape]:
    """One seeded shape per utterance: speed = its speaker's (``speaker_wpm``) times exp(N(0,
    utterance_rate_sd)), rounded and clipped to wpm_range; silences uniform in their ranges, to the ms."""
    rng = np.random.default_rng([seed, 8191])
    n = len(speaker_wpm)
    wpm = np.clip(np.rint(np.asarray(speaker_wpm) * np.exp(rng.normal(0.0, style.utterance_rate_sd, n))),
                  *style.wpm_range)
    lead, trail, pause = (np.round(rng.uniform(*getattr(style, name), n), 3)
                          for name in ("lead_silence_s", "trail_silence_s", "pause_s"))
    return [UtteranceShape(int(wpm[i]), float(lead[i]), float(trail[i]), float(pause[i])) for i in range(n)]


# ------------------------------------------------------------------------------------------- resampling


def resample(signal: np.ndarray, from_hz: int, to_hz: int, *, zero_crossings: int = 16,
             rolloff: float = 0.95, kaiser_beta: float = 8.6) -> np.ndarray:
    """Band-limited resampling of a 1-D signal (polyphase windowed sinc), float32 out.

    The output has ``ceil(len(signal) * to_hz / from_hz)`` samples; output sample ``n`` sits at input
    time ``n * from_hz / to_hz`` samples. The low-pass cuts at ``rolloff`` times the lower Nyquist
    frequency, with a Kaiser window ``zero_crossings`` lobes wide on each side; each phase of the
    filter is normalized to unit DC gain.

    Kept by hand rather than lhotse's ``lhotse.augmentation.resample.Resample`` (torchaudio's sinc
    resampler): with the same filter (Kaiser, 16 zero crossings, rolloff 0.95, beta 8.6) both are within
    5e-5 of an ideal tone below 6 kHz at 22.05 -> 16 kHz (tests/data/test_tts.py), but they differ by up to
    6e-4 on espeak-ng speech (the transition band), not the 1e-4 a swap needs; and at 16001 -> 16000 Hz
    lhotse builds a 16000 x 16035 kernel (2 GB in float64) where this gathers one tap at a time.
    """
    x = np.asarray(signal, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"resample() takes a 1-D signal, got shape {x.shape}")
    if from_hz <= 0 or to_hz <= 0:
        raise ValueError(f"sample rates must be positive, got from_hz={from_hz}, to_hz={to_hz}")
    g = math.gcd(int(from_hz), int(to_hz))
    up, down = int(to_hz) // g, int(from_hz) // g
    if up == down:
        return x.astype(np.float32)
    num_out = -(-len(x) * up // down)
    cutoff = min(1.0, up / down) * rolloff  # in cycles per input sample, times two
    half_width = int(math.ceil(zero_crossings / cutoff))
    offsets = np.arange(-half_width + 1, half_width + 1)  # input taps around floor(position)
    t = np.arange(up)[:, None] / up - offsets[None, :]  # distance from each tap, per phase
    window = np.i0(kaiser_beta * np.sqrt(np.clip(1.0 - (t / half_width) ** 2, 0.0, None))) / np.i0(kaiser_beta)
    bank = cutoff * np.sinc(cutoff * t) * window
    bank /= bank.sum(axis=1, keepdims=True)
    block = np.arange(up) * down  # output r of a block sits at input (block[r] / up) past the block start
    frame = down + 2 * half_width
    if up * frame <= 4_000_000:
        # Outputs come in blocks of `up` that start every `down` inputs, so one matrix maps a block's input
        # window to its outputs: out[q, r] = padded[q * down : q * down + frame] @ matrix[:, r].
        matrix = np.zeros((frame, up))
        rows = (block // up)[:, None] + offsets[None, :] + half_width
        matrix[rows, np.arange(up)[:, None]] = bank[block % up]
        num_blocks = -(-num_out // up)
        padded = np.zeros(num_blocks * down + frame)
        padded[half_width:half_width + len(x)] = x
        windows = np.lib.stride_tricks.sliding_window_view(padded, frame)[::down][:num_blocks]
        out = (windows @ matrix).reshape(-1)[:num_out]
    else:  # rates with a huge common period (e.g. 16001 -> 16000): one gather per filter tap
        numer = np.arange(num_out, dtype=np.int64) * down
        base, phase = numer // up, numer % up
        padded = np.concatenate([np.zeros(half_width), x, np.zeros(half_width + 1)])
        out = np.zeros(num_out)
        for j, offset in enumerate(offsets):
            out += bank[phase, j] * padded[base + offset + half_width]
    return out.astype(np.float32)


# ------------------------------------------------------------------------------------------- espeak-ng


def espeak_binary() -> str:
    """Path of espeak-ng (or espeak); FileNotFoundError saying how to install it when neither exists."""
    for name in ("espeak-ng", "espeak"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(ESPEAK_INSTALL_HINT)


def synthesize(text: str, style: SpeakerStyle, *, espeak: str | None = None, pause_s: float = 0.0) -> np.ndarray:
    """``text`` spoken in ``style``: float32 samples at 16 kHz, mono, in [-1, 1]. ``pause_s`` > 0 puts an
    espeak-ng break of that many seconds between its sentences (SSML), on top of espeak-ng's own."""
    import soundfile  # optional heavy import (libsndfile via cffi): loaded on first use

    options = ["-v", style.voice, "-s", str(style.speed_wpm), "-p", str(style.pitch)]
    sentences = sentences_of(text) if pause_s > 0 else []
    if len(sentences) > 1:
        from xml.sax.saxutils import escape

        options.append("-m")
        text = "<speak>" + f'<break time="{round(pause_s * 1000)}ms"/>'.join(map(escape, sentences)) + "</speak>"
    cmd = [espeak or espeak_binary(), *options, "--stdout", "--", text]
    run = subprocess.run(cmd, capture_output=True, check=False)
    if run.returncode != 0 or len(run.stdout) <= 44:
        raise RuntimeError(f"espeak-ng failed (exit {run.returncode}) for voice {style.voice!r} on {text!r}: "
                           f"{run.stderr.decode(errors='replace').strip()}")
    audio, rate = soundfile.read(io.BytesIO(run.stdout), dtype="float32", always_2d=True)
    return resample(audio[:, 0], rate, SAMPLE_RATE)


def speak_shaped(text: str, style: SpeakerStyle, shape: UtteranceShape | None, *, espeak: str) -> np.ndarray:
    """``text`` in ``style``; with a ``shape``, at its speed, with its pauses, between its silences (zeros)."""
    if shape is None:
        return synthesize(text, style, espeak=espeak)
    speech = synthesize(text, replace(style, speed_wpm=shape.speed_wpm), espeak=espeak, pause_s=shape.pause_s)
    lead, trail = (np.zeros(round(s * SAMPLE_RATE), dtype=np.float32) for s in (shape.lead_s, shape.trail_s))
    return np.concatenate([lead, speech, trail])


def _speak_to_file(job: tuple) -> tuple[int, str]:
    """Worker: speak one utterance, write it atomically as 16-bit FLAC; returns its number of samples and the
    text spoken. Job: (text, style, path, espeak[, shape, max_duration_s]); an utterance longer than
    ``max_duration_s`` loses its last sentences until it fits (one sentence is always kept)."""
    import soundfile  # optional heavy import (libsndfile via cffi): loaded on first use

    text, style, path, espeak = job[:4]
    shape, max_duration_s = job[4:6] if len(job) > 4 else (None, None)
    audio = speak_shaped(text, style, shape, espeak=espeak)
    while max_duration_s and len(audio) > max_duration_s * SAMPLE_RATE and len(sentences_of(text)) > 1:
        text = " ".join(sentences_of(text)[:-1])
        audio = speak_shaped(text, style, shape, espeak=espeak)
    audio = np.clip(audio, -1.0, 1.0)
    with atomic_path(path) as tmp:
        soundfile.write(tmp, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    return len(audio), text


# ---------------------------------------------------------------------------------------------- corpus


def _write_manifest_atomically(manifest, path: Path) -> None:
    with atomic_path(path) as tmp:  # keeps the .jsonl.gz suffix lhotse reads
        manifest.to_file(tmp)


def read_prose(text_file: str | os.PathLike | None) -> tuple[str, str]:
    """(the text, where it came from): ``text_file`` read as UTF-8, or CPython's pydoc topics for None."""
    if text_file is None:
        return default_text(), "pydoc_data.topics"
    text_path = Path(text_file)
    if not text_path.is_file():
        raise FileNotFoundError(f"text_file {str(text_path)!r} does not exist")
    try:
        return text_path.read_text(encoding="utf-8"), str(text_path)
    except UnicodeDecodeError as e:
        raise ValueError(f"{text_path}: not UTF-8 text (byte {e.start}); convert it, e.g. with iconv") from None


def speak_all(jobs: list, num_workers: int, progress: bool) -> list[tuple[int, str]]:
    """Samples written and text spoken per job (``_speak_to_file``), in ``num_workers`` processes; an error or Ctrl-C drops
    the jobs not yet begun."""
    bar = dict(total=len(jobs), desc="espeak-ng", unit="utt", disable=not progress)
    if num_workers <= 1 or len(jobs) == 1:
        return [_speak_to_file(job) for job in tqdm(jobs, **bar)]
    # the workers leave Ctrl-C (SIGINT, sent to the whole process group) to this process, which stops them
    pool = ProcessPoolExecutor(max_workers=num_workers, mp_context=get_context("spawn"),
                               initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        return list(tqdm(pool.map(_speak_to_file, jobs, chunksize=4), **bar))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def make_tts_corpus(out_dir: str | os.PathLike, *, text_file: str | os.PathLike | None = None,
                    num_utterances: int | None = None, voice: str = "en", speed_wpm: int | None = None,
                    seed: int = 0, progress: bool = True, tokenizer=None, num_speakers: int | None = None,
                    num_workers: int = 2, min_words: int = 3, max_words: int = 30,
                    repeat: int = 1, join: int | None = None, replace_corpus: bool = False,
                    preset: str | CorpusStyle | None = None) -> dict[str, Path]:
    """Speak sentences with espeak-ng into a 16 kHz lhotse corpus under ``out_dir``; returns its paths.

    ``text_file``: UTF-8 prose to take sentences from (default: CPython's pydoc topics). The sentences
    (``min_words..max_words`` words) are taken in a ``seed``-ed order; ``num_utterances=None`` speaks each
    once, more than there are cycles through them again. Utterance ``i`` goes to a seeded speaker among
    ``num_speakers`` (default 8) styles of ``voice`` (see :func:`speaker_styles`; ``speed_wpm`` fixes the
    speed). ``tokenizer`` (a sentencepiece processor or the path of its ``.model``) fills
    ``custom["num_tokens"]`` on every cut. Audio is made by ``num_workers`` processes. ``repeat`` lists
    each utterance that many times in the cuts manifest (ids ``tts-000000-r1``, ...; the copies share
    one audio file): a large corpus for pipeline and throughput runs, in the time of a small one.
    ``join`` > 1 makes each utterance 1..``join`` sentences long (:func:`join_sentences`), so durations
    reach the 30-40 s of real corpora; ``num_utterances`` then counts the joined utterances.
    ``replace_corpus`` removes the corpus ``out_dir`` holds (:func:`workbench.data.corpus_folder.remove_corpus_parts`)
    once every new utterance is spoken (into a staging folder that then becomes ``audio``).

    ``preset`` (a name of :data:`PRESETS`, e.g. ``"realistic"``, or a :class:`CorpusStyle`) replaces
    ``voice`` and ``speed_wpm``: speakers of the style's voices and speeds (:func:`styled_speakers`), a
    speed and silences per utterance (:func:`utterance_shapes`), non-English text from word lists
    (:func:`foreign_text`), ``join`` and ``num_speakers`` from the style unless given; each supervision
    records its language and, in ``custom``, the voice, speed and silences.

    Returns ``{"recordings", "supervisions", "cuts", "audio_dir"}`` paths.
    """
    style = corpus_style(preset)
    if style is not None and (voice != "en" or speed_wpm is not None):
        raise ValueError("preset (--preset) sets the voices and speeds: leave voice (--voice) and speed_wpm "
                         "(--speed-wpm) unset")
    check_int(repeat, "repeat (--repeat)", 1)
    join = join if join is not None else (style.join if style is not None else 1)
    num_speakers = num_speakers if num_speakers is not None else (style.num_speakers if style is not None else 8)
    join_sentences([], join)  # a bad join is one line now, before any synthesis
    espeak = espeak_binary()
    chosen = utterance_texts(text_file, num_utterances, seed, min_words=min_words, max_words=max_words, join=join)
    styles, who, chosen, shapes = assign_speakers(espeak, chosen, style, num_speakers, voice=voice,
                                                  speed_wpm=speed_wpm, seed=seed)
    max_duration_s = style.max_duration_s if style is not None else None

    out = Path(out_dir).resolve()
    audio_dir, staging = out / "audio", out / ".audio.partial"  # spoken into staging; an old corpus stays till then
    shutil.rmtree(staging, ignore_errors=True)  # what a killed run left
    with new_folder(staging):  # a failed or interrupted run removes the folders it made
        ids = [f"tts-{i:06d}" for i in range(len(chosen))]
        jobs = [(text, styles[k], str(staging / f"{cut_id}.flac"), espeak, shape, max_duration_s)
                for text, k, cut_id, shape in zip(chosen, who, ids, shapes)]
        spoken = speak_all(jobs, num_workers, progress)
        texts = [text for _, text in spoken]
        num_tokens = count_tokens(load_tokenizer(tokenizer), texts) if tokenizer is not None else None
        if replace_corpus:  # everything is spoken: the old corpus goes, whole, and the new audio takes its place
            remove_corpus_parts(out)
        staging.rename(audio_dir)
        utterances = [spoken_utterance(cut_id, audio_dir, spoken[i], texts[i], styles[who[i]], shapes[i],
                                       None if num_tokens is None else int(num_tokens[i]))
                      for i, cut_id in enumerate(ids)]
        return write_tts_manifests(out, utterances, language=language_of(voice), repeat=repeat)


def assign_speakers(espeak: str, texts: list[str], style: CorpusStyle | None, num_speakers: int, *, voice: str,
                    speed_wpm: int | None, seed: int) -> tuple[list, np.ndarray, list[str], list]:
    """(speaker styles, the speaker of each text, the texts, each one's shape or None): without a style,
    ``num_speakers`` variants of ``voice``; with one, its voices, non-English texts replaced by words of
    their language (:func:`foreign_text`) and a speed and silences per utterance (:func:`utterance_shapes`)."""
    if style is None:
        styles = speaker_styles(num_speakers, voice=voice, speed_wpm=speed_wpm, seed=seed)
        check_voice(espeak, voice)
    else:
        styles = styled_speakers(style, num_speakers, seed)
        for base, _ in style.voices:
            check_voice(espeak, base)
    who = np.random.default_rng([seed, 104729]).integers(0, num_speakers, size=len(texts))
    if style is None:
        return styles, who, texts, [None] * len(texts)
    words = {language_of(v): word_list(language_of(v)) for v, _ in style.voices if language_of(v) != "en"}
    rng = np.random.default_rng([seed, 3571])
    texts = [text if language_of(styles[k].voice) == "en" else foreign_text(text, words[language_of(styles[k].voice)], rng)
             for text, k in zip(texts, who)]
    return styles, who, texts, utterance_shapes(style, np.array([styles[k].speed_wpm for k in who]), seed)


def spoken_utterance(cut_id: str, audio_dir: Path, spoken: tuple, text: str, speaker, shape,
                     num_tokens: int | None) -> SpokenUtterance:
    """One spoken utterance's manifest entry; a styled one (``shape``) records its language, and its voice,
    speed (words per minute) and silences (s) in ``custom``."""
    custom = None if shape is None else {"voice": speaker.voice, "speed_wpm": shape.speed_wpm,
                                         "lead_silence_s": shape.lead_s, "trail_silence_s": shape.trail_s,
                                         "pause_s": shape.pause_s}
    return SpokenUtterance(cut_id, str(audio_dir / f"{cut_id}.flac"), spoken[0], text, speaker.speaker, num_tokens,
                           language=None if shape is None else language_of(speaker.voice), custom=custom)


def utterance_texts(text_file: str | os.PathLike | None, num_utterances: int | None, seed: int, *,
                    min_words: int, max_words: int, join: int) -> list[str]:
    """The texts to speak, in order: sentences of ``text_file`` (see :func:`make_tts_corpus`), each of
    ``join`` > 1 joined from 1..join sentences."""
    text, source = read_prose(text_file)
    sentences = split_sentences(text, min_words=min_words, max_words=max_words)
    if not sentences:
        raise ValueError(f"{source}: no sentences of {min_words}-{max_words} words made only of letters "
                         "and ,.;:'?!- (0 found)")
    if join == 1:
        return choose_sentences(sentences, num_utterances, seed)
    # enough sentences for num_utterances joined ones (each takes at most join), then cut to that
    pool = choose_sentences(sentences, None if num_utterances is None else num_utterances * join, seed)
    return join_sentences(pool, join, seed)[:num_utterances]


def check_voice(espeak: str, voice: str) -> None:
    """ValueError unless ``voice`` is a base espeak-ng voice (no '+variant': each speaker adds one)."""
    if "+" in voice:
        raise ValueError(f"voice {voice!r} must be a base voice without a '+variant' (each speaker adds one)")
    if subprocess.run([espeak, "-v", voice, "-q", "--", "test"], capture_output=True).returncode != 0:
        raise ValueError(f"voice {voice!r} is not an espeak-ng voice (list them with `espeak-ng --voices`)")


@dataclass(frozen=True)
class SpokenUtterance:
    cut_id: str
    audio_path: str  # its FLAC file
    num_samples: int  # at SAMPLE_RATE
    text: str
    speaker: str
    num_tokens: int | None  # None without a tokenizer
    language: str | None = None  # None: the corpus's language (write_tts_manifests)
    custom: dict | None = None  # the supervision's custom fields (voice, speed, silences), if any


def write_tts_manifests(out: Path, utterances: list[SpokenUtterance], *, language: str, repeat: int
                        ) -> dict[str, Path]:
    """Write the recordings, supervisions and cuts manifests (each cut listed ``repeat`` times) under
    ``out``, atomically; ``language`` for the utterances that name none; returns their paths and the audio folder's."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet  # imports torch: seconds
    from lhotse.audio import AudioSource
    from lhotse.cut import MonoCut

    recordings, supervisions, cuts = [], [], []
    for u in utterances:
        duration = u.num_samples / SAMPLE_RATE
        rec = Recording(id=u.cut_id, sources=[AudioSource(type="file", channels=[0], source=u.audio_path)],
                        sampling_rate=SAMPLE_RATE, num_samples=u.num_samples, duration=duration)
        sup = SupervisionSegment(id=u.cut_id, recording_id=u.cut_id, start=0.0, duration=duration, channel=0,
                                 text=u.text, speaker=u.speaker, language=u.language or language, custom=u.custom)
        custom = {"num_tokens": u.num_tokens} if u.num_tokens is not None else None
        recordings.append(rec)
        supervisions.append(sup)
        cuts.extend(MonoCut(id=u.cut_id if copy == 0 else f"{u.cut_id}-r{copy}", start=0.0, duration=duration,
                            channel=0, recording=rec, supervisions=[sup], custom=custom)
                    for copy in range(repeat))
    result = {"recordings": out / "recordings.jsonl.gz", "supervisions": out / "supervisions.jsonl.gz",
              "cuts": out / "cuts.jsonl.gz", "audio_dir": out / "audio"}
    _write_manifest_atomically(RecordingSet.from_recordings(recordings), result["recordings"])
    _write_manifest_atomically(SupervisionSet.from_segments(supervisions), result["supervisions"])
    _write_manifest_atomically(CutSet.from_cuts(cuts), result["cuts"])
    return result
