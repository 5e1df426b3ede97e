"""The realistic style of the espeak-ng corpus: seeded speeds and silences, word lists, silences in the
audio, languages and voices in the supervisions, one-line errors."""

import dataclasses
import shutil

import numpy as np
import pytest

from workbench.data import tts
from workbench.data.corpus_stats import percentiles, silence_profile
from workbench.data.tts import (PRESETS, CorpusStyle, corpus_style, foreign_text, language_of, make_tts_corpus,
                                sentences_of, styled_speakers, utterance_shapes, word_list)

REALISTIC = PRESETS["realistic"]


def _style(**changes) -> CorpusStyle:
    return dataclasses.replace(REALISTIC, **changes)


def test_styled_speakers_follow_the_shares_and_are_seeded():
    one = _style(voices=(("de", 1.0),), speaker_wpm_sd=0.0)
    speakers = styled_speakers(one, 3, seed=1)
    assert [s.voice for s in speakers] == ["de+m1", "de+f1", "de+m3"] and {s.speed_wpm for s in speakers} == {155}
    many = styled_speakers(REALISTIC, 2000, seed=0)
    assert many == styled_speakers(REALISTIC, 2000, seed=0)
    share_en = np.mean([language_of(s.voice) == "en" for s in many])
    assert abs(share_en - 0.5) < 0.04  # English voices hold half the shares
    speeds = np.array([s.speed_wpm for s in many])
    assert speeds.min() >= 100 and speeds.max() <= 220 and abs(speeds.mean() - 155) < 2 and abs(speeds.std() - 20) < 2


def test_utterance_shapes_vary_around_the_speaker_and_stay_in_range():
    fixed = _style(utterance_rate_sd=0.0, lead_silence_s=(0.5, 0.5), trail_silence_s=(0.0, 0.0), pause_s=(0.2, 0.2))
    assert utterance_shapes(fixed, np.array([150, 230]), seed=3) == [
        tts.UtteranceShape(150, 0.5, 0.0, 0.2), tts.UtteranceShape(220, 0.5, 0.0, 0.2)]
    shapes = utterance_shapes(REALISTIC, np.full(4000, 160), seed=0)
    wpm = np.array([s.speed_wpm for s in shapes])
    assert abs(np.log(wpm / 160).std() - 0.08) < 0.01
    lead = np.array([s.lead_s for s in shapes])
    assert lead.min() >= 0.05 and lead.max() <= 1.0 and abs(lead.mean() - 0.525) < 0.02


def test_foreign_text_keeps_the_sentence_lengths():
    words = word_list("de")
    assert len(words) > 400 and all(w.isalpha() for w in words)
    english = "One two three. Four five! Six seven eight nine?"
    text = foreign_text(english, words, np.random.default_rng(0))
    assert [len(s.split()) for s in sentences_of(text)] == [3, 2, 4]
    assert text == foreign_text(english, words, np.random.default_rng(0)) and text[0].isupper()
    assert all(len(w) > 1 or w in "aeiouy" for w in word_list("es"))


@pytest.mark.parametrize("change, field", [
    (dict(voices=(("en", 0.5), ("de", 0.4))), "voices"),
    (dict(voices=(("en+f1", 1.0),)), "voices"),
    (dict(wpm_range=(50, 200)), "wpm_range"),
    (dict(speaker_wpm_mean=300.0), "speaker_wpm_mean"),
    (dict(lead_silence_s=(1.0, 0.5)), "lead_silence_s"),
    (dict(pause_s=(-0.1, 0.5)), "pause_s"),
    (dict(join=0), "join"),
    (dict(max_duration_s=0.0), "max_duration_s"),
])
def test_a_bad_style_is_one_line_naming_the_field(change, field):
    with pytest.raises(ValueError, match=field) as e:
        corpus_style(_style(**change))
    assert "\n" not in str(e.value)


def test_unknown_preset_and_language_are_one_line():
    with pytest.raises(ValueError, match=r"preset \(--preset\) 'real'.*realistic"):
        corpus_style("real")
    with pytest.raises(ValueError, match="'xx' has no word list"):
        word_list("xx")
    assert corpus_style(None) is None and corpus_style("realistic") is REALISTIC


def test_silence_profile_and_percentiles():
    audio = np.zeros(16000, dtype=np.float32)
    audio[4000:12000] = 0.5  # 0.25 s silence, 0.5 s sound, 0.25 s silence
    assert silence_profile(audio, 16000) == (0.25, 0.25, 0.5)
    assert percentiles([1, 2, 3, 4, 5]) == {"p10": 1.4, "p50": 3.0, "p90": 4.6, "max": 5.0}


def test_realistic_corpus_has_silences_languages_and_voices(tmp_path):
    if not (shutil.which("espeak-ng") or shutil.which("espeak")):
        pytest.skip("espeak-ng is not installed")
    from lhotse import load_manifest

    style = _style(voices=(("en-us", 0.5), ("de", 0.5)), lead_silence_s=(0.3, 0.4), max_duration_s=8.0,
                   num_speakers=4)
    paths = make_tts_corpus(tmp_path, num_utterances=6, preset=style, progress=False, num_workers=1)
    cuts = load_manifest(paths["cuts"])
    assert len(cuts) == 6
    languages = set()
    for cut in cuts:
        sup = cut.supervisions[0]
        languages.add(sup.language)
        assert sup.language == language_of(sup.custom["voice"]) and 0.3 <= sup.custom["lead_silence_s"] <= 0.4
        audio = cut.load_audio()[0]
        lead = int(sup.custom["lead_silence_s"] * 16000)
        assert np.abs(audio[:lead]).max() < 1e-3 and np.abs(audio[lead:]).max() > 0.05
        assert cut.duration <= 8.0 or len(sentences_of(sup.text)) == 1
    assert languages == {"en", "de"}
    with pytest.raises(ValueError, match="--speed-wpm"):
        make_tts_corpus(tmp_path / "x", num_utterances=1, preset="realistic", speed_wpm=150)
