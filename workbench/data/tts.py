"""A real-audio corpus with no downloads: espeak-ng speaks sentences, written as lhotse manifests.

The default text is the English prose that every CPython ships (``pydoc_data.topics``), cleaned into
sentences of 3 to 30 words. Each utterance is spoken by one of a few 'speakers' (an espeak-ng voice
variant with its own speed and pitch), resampled from espeak's 22.05 kHz to 16 kHz mono with the
windowed-sinc polyphase resampler below (no torchaudio, no scipy), and saved as 16-bit FLAC.

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
from dataclasses import dataclass
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


def synthesize(text: str, style: SpeakerStyle, *, espeak: str | None = None) -> np.ndarray:
    """``text`` spoken in ``style``: float32 samples at 16 kHz, mono, in [-1, 1]."""
    import soundfile  # optional heavy import (libsndfile via cffi): loaded on first use

    cmd = [espeak or espeak_binary(), "-v", style.voice, "-s", str(style.speed_wpm), "-p", str(style.pitch),
           "--stdout", "--", text]
    run = subprocess.run(cmd, capture_output=True, check=False)
    if run.returncode != 0 or len(run.stdout) <= 44:
        raise RuntimeError(f"espeak-ng failed (exit {run.returncode}) for voice {style.voice!r} on {text!r}: "
                           f"{run.stderr.decode(errors='replace').strip()}")
    audio, rate = soundfile.read(io.BytesIO(run.stdout), dtype="float32", always_2d=True)
    return resample(audio[:, 0], rate, SAMPLE_RATE)


def _speak_to_file(job: tuple[str, SpeakerStyle, str, str]) -> int:
    """Worker: speak one sentence, write it atomically as 16-bit FLAC, return its number of samples."""
    import soundfile  # optional heavy import (libsndfile via cffi): loaded on first use

    text, style, path, espeak = job
    audio = np.clip(synthesize(text, style, espeak=espeak), -1.0, 1.0)
    with atomic_path(path) as tmp:
        soundfile.write(tmp, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
    return len(audio)


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


def speak_all(jobs: list, num_workers: int, progress: bool) -> list[int]:
    """Samples written per job (``_speak_to_file``), in ``num_workers`` processes; an error or Ctrl-C drops
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
                    seed: int = 0, progress: bool = True, tokenizer=None, num_speakers: int = 8,
                    num_workers: int = 2, min_words: int = 3, max_words: int = 30,
                    repeat: int = 1, join: int = 1, replace_corpus: bool = False) -> dict[str, Path]:
    """Speak sentences with espeak-ng into a 16 kHz lhotse corpus under ``out_dir``; returns its paths.

    ``text_file``: UTF-8 prose to take sentences from (default: CPython's pydoc topics). The sentences
    (``min_words..max_words`` words) are taken in a ``seed``-ed order; ``num_utterances=None`` speaks each
    once, more than there are cycles through them again. Utterance ``i`` goes to a seeded speaker among
    ``num_speakers`` styles of ``voice`` (see :func:`speaker_styles`; ``speed_wpm`` fixes the speed).
    ``tokenizer`` (a sentencepiece processor or the path of its ``.model``) fills
    ``custom["num_tokens"]`` on every cut. Audio is made by ``num_workers`` processes. ``repeat`` lists
    each utterance that many times in the cuts manifest (ids ``tts-000000-r1``, ...; the copies share
    one audio file): a large corpus for pipeline and throughput runs, in the time of a small one.
    ``join`` > 1 makes each utterance 1..``join`` sentences long (:func:`join_sentences`), so durations
    reach the 30-40 s of real corpora; ``num_utterances`` then counts the joined utterances.
    ``replace_corpus`` removes the corpus ``out_dir`` holds (:func:`workbench.data.corpus_folder.remove_corpus_parts`)
    once every new utterance is spoken (into a staging folder that then becomes ``audio``).

    Returns ``{"recordings", "supervisions", "cuts", "audio_dir"}`` paths.
    """
    check_int(repeat, "repeat (--repeat)", 1)
    join_sentences([], join)  # a bad join is one line now, before any synthesis
    espeak = espeak_binary()
    chosen = utterance_texts(text_file, num_utterances, seed, min_words=min_words, max_words=max_words, join=join)
    styles = speaker_styles(num_speakers, voice=voice, speed_wpm=speed_wpm, seed=seed)
    check_voice(espeak, voice)
    who = np.random.default_rng([seed, 104729]).integers(0, num_speakers, size=len(chosen))
    num_tokens = None
    if tokenizer is not None:
        num_tokens = count_tokens(load_tokenizer(tokenizer), chosen)

    out = Path(out_dir).resolve()
    audio_dir, staging = out / "audio", out / ".audio.partial"  # spoken into staging; an old corpus stays till then
    shutil.rmtree(staging, ignore_errors=True)  # what a killed run left
    with new_folder(staging):  # a failed or interrupted run removes the folders it made
        ids = [f"tts-{i:06d}" for i in range(len(chosen))]
        jobs = [(sentence, styles[k], str(staging / f"{cut_id}.flac"), espeak)
                for sentence, k, cut_id in zip(chosen, who, ids)]
        num_samples = speak_all(jobs, num_workers, progress)
        if replace_corpus:  # everything is spoken: the old corpus goes, whole, and the new audio takes its place
            remove_corpus_parts(out)
        staging.rename(audio_dir)
        utterances = [SpokenUtterance(cut_id, str(audio_dir / f"{cut_id}.flac"), num_samples[i], chosen[i],
                                      styles[who[i]].speaker, None if num_tokens is None else int(num_tokens[i]))
                      for i, cut_id in enumerate(ids)]
        return write_tts_manifests(out, utterances, language=voice.split("-")[0].split("+")[0], repeat=repeat)


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


def write_tts_manifests(out: Path, utterances: list[SpokenUtterance], *, language: str, repeat: int
                        ) -> dict[str, Path]:
    """Write the recordings, supervisions and cuts manifests (each cut listed ``repeat`` times) under
    ``out``, atomically; returns their paths and the audio folder's."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet  # imports torch: seconds
    from lhotse.audio import AudioSource
    from lhotse.cut import MonoCut

    recordings, supervisions, cuts = [], [], []
    for u in utterances:
        duration = u.num_samples / SAMPLE_RATE
        rec = Recording(id=u.cut_id, sources=[AudioSource(type="file", channels=[0], source=u.audio_path)],
                        sampling_rate=SAMPLE_RATE, num_samples=u.num_samples, duration=duration)
        sup = SupervisionSegment(id=u.cut_id, recording_id=u.cut_id, start=0.0, duration=duration, channel=0,
                                 text=u.text, speaker=u.speaker, language=language)
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
