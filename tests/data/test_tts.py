import shutil

import numpy as np
import pytest

from workbench.data import tts
from workbench.data.tts import (SAMPLE_RATE, SpeakerStyle, choose_sentences, default_text, join_sentences,
                                make_tts_corpus, resample, speaker_styles, split_sentences, synthesize)



def _espeak_or_skip() -> None:
    """Skip, saying why, without espeak-ng: tests never install system packages (the set-up does)."""
    if not (shutil.which("espeak-ng") or shutil.which("espeak")):
        pytest.skip("espeak-ng is not installed: `make setup` installs it where it can "
                    "(scripts/install_espeak.sh), or `sudo apt-get install -y espeak-ng`")


# ------------------------------------------------------------------------------------------------- text


def test_split_sentences_keeps_speakable_prose_only():
    text = (
        "The title\n"
        "*********\n"
        "\n"
        "This is the first sentence of prose.  It wraps\n"
        "over two lines, as prose does! Too short. Has 3 digits in it here.\n"
        "\n"
        "   code = indented(block)\n"
        "   which is never spoken.\n"
        "\n"
        'A "quoted" word is fine? This is the first sentence of prose.\n'
    )
    assert split_sentences(text) == [
        "This is the first sentence of prose.",
        "It wraps over two lines, as prose does!",
        "A quoted word is fine?",
    ]
    assert split_sentences(text, min_words=7, max_words=8) == ["This is the first sentence of prose.",
                                                               "It wraps over two lines, as prose does!"]
    with pytest.raises(ValueError, match="min_words"):
        split_sentences(text, min_words=5, max_words=4)


def test_default_text_gives_hundreds_of_sentences_within_bounds():
    sentences = split_sentences(default_text())
    assert len(sentences) >= 300
    assert len(set(sentences)) == len(sentences)
    words = np.array([len(s.split()) for s in sentences])
    assert words.min() >= 3 and words.max() <= 30


def test_choose_sentences_is_seeded_and_cycles():
    sentences = [f"Sentence number {w} here." for w in ("one", "two", "three", "four", "five")]
    a = choose_sentences(sentences, 3, seed=1)
    assert a == choose_sentences(sentences, 3, seed=1)
    assert len(set(a)) == 3 and set(a) <= set(sentences)
    assert sorted(choose_sentences(sentences, None, seed=2)) == sorted(sentences)
    twelve = choose_sentences(sentences, 12, seed=0)
    assert sorted(twelve[:5]) == sorted(sentences) and sorted(twelve[5:10]) == sorted(sentences)
    with pytest.raises(ValueError, match="num_utterances"):
        choose_sentences(sentences, 0)
    with pytest.raises(ValueError, match="0 found"):
        choose_sentences([], 3)


def test_speaker_styles_vary_and_are_seeded():
    styles = speaker_styles(8, voice="en", seed=5)
    assert styles == speaker_styles(8, voice="en", seed=5)
    assert len({s.voice for s in styles}) == 8 and all(s.voice.startswith("en+") for s in styles)
    assert all(130 <= s.speed_wpm <= 200 and 25 <= s.pitch <= 75 for s in styles)
    assert len({(s.speed_wpm, s.pitch) for s in styles}) > 4
    assert {s.speed_wpm for s in speaker_styles(4, speed_wpm=222)} == {222}
    with pytest.raises(ValueError, match="speed_wpm"):
        speaker_styles(2, speed_wpm=20)
    with pytest.raises(ValueError, match="num_speakers"):
        speaker_styles(0)


# ------------------------------------------------------------------------------------------- resampling


def _tone(freq_hz, rate, seconds=1.0):
    return np.sin(2 * np.pi * freq_hz * np.arange(int(rate * seconds)) / rate)


def test_resample_keeps_a_tone_and_its_length():
    y = resample(_tone(440, 22050), 22050, SAMPLE_RATE)
    assert y.dtype == np.float32 and len(y) == 16000
    expected = _tone(440, SAMPLE_RATE)
    assert np.abs(y - expected)[100:-100].max() < 1e-3
    assert len(resample(np.ones(7), 22050, 16000)) == 6  # ceil(7 * 320 / 441)
    up = resample(_tone(300, 8000), 8000, 16000)
    assert len(up) == 16000 and np.abs(up - _tone(300, 16000))[100:-100].max() < 1e-3
    odd = resample(_tone(440, 16001), 16001, SAMPLE_RATE)  # huge common period: the per-tap path
    assert len(odd) == 16000 and np.abs(odd - expected)[100:-100].max() < 1e-3


@pytest.mark.parametrize("freq_hz", [200, 1000, 3000, 6000])
def test_resample_is_as_close_to_an_ideal_tone_as_lhotses_resampler(freq_hz):
    """The number that keeps the hand-written resampler: as exact as lhotse's with the same filter."""
    torch = pytest.importorskip("torch")
    from lhotse.augmentation.resample import Resample

    x = _tone(freq_hz, 22050, 2.0).astype(np.float32)
    ideal = _tone(freq_hz, SAMPLE_RATE, 2.0)
    ours = resample(x, 22050, SAMPLE_RATE)
    with torch.no_grad():
        theirs = Resample(22050, SAMPLE_RATE, resampling_method="sinc_interp_kaiser", lowpass_filter_width=16,
                          rolloff=0.95, beta=8.6)(torch.from_numpy(x)).numpy()
    assert len(ours) == len(theirs) == len(ideal)
    inner = slice(500, -500)
    assert np.abs(ours - ideal)[inner].max() < 5e-5
    assert np.abs(theirs - ideal)[inner].max() < 5e-5


def test_resample_removes_what_16k_cannot_hold():
    y = resample(_tone(10_000, 22050), 22050, SAMPLE_RATE)  # above the 8 kHz Nyquist: must not alias
    assert np.abs(y[100:-100]).max() < 1e-3


def test_resample_same_rate_and_bad_input():
    x = np.random.default_rng(0).standard_normal(100)
    np.testing.assert_allclose(resample(x, 16000, 16000), x.astype(np.float32))
    with pytest.raises(ValueError, match="1-D"):
        resample(np.zeros((2, 10)), 22050, 16000)
    with pytest.raises(ValueError, match="positive"):
        resample(x, 0, 16000)


# -------------------------------------------------------------------------------------- espeak + corpus


def test_missing_espeak_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(tts.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="apt-get install -y espeak-ng"):
        make_tts_corpus(tmp_path / "c", num_utterances=2)
    assert not (tmp_path / "c").exists()


def test_faster_speech_is_shorter():
    _espeak_or_skip()
    text = "Assignment statements are used to bind names to values."
    slow = synthesize(text, SpeakerStyle("a", "en", speed_wpm=120, pitch=50))
    fast = synthesize(text, SpeakerStyle("a", "en", speed_wpm=300, pitch=50))
    assert slow.dtype == np.float32 and np.abs(slow).max() <= 1.0
    assert 1.6 < len(slow) / len(fast) < 3.5  # 2.5x the words per minute
    assert np.sqrt(np.mean(slow ** 2)) > 0.01  # speech, not silence


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    _espeak_or_skip()
    from workbench.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("tts")
    model = train_tokenizer(split_sentences(default_text()), root / "tok", 128, progress=False)
    paths = make_tts_corpus(root / "corpus", num_utterances=5, seed=4, num_speakers=3, tokenizer=model,
                            progress=False)
    return paths, model


def test_corpus_audio_is_16k_and_matches_the_manifests(corpus):
    import soundfile
    from lhotse import CutSet, RecordingSet, SupervisionSet

    paths, _ = corpus
    cuts = CutSet.from_file(paths["cuts"]).to_eager()
    recordings = RecordingSet.from_file(paths["recordings"]).to_eager()
    supervisions = SupervisionSet.from_file(paths["supervisions"]).to_eager()
    assert len(cuts) == len(recordings) == len(supervisions) == 5
    assert sorted(p.name for p in paths["audio_dir"].iterdir()) == [f"tts-{i:06d}.flac" for i in range(5)]
    for cut in cuts:
        info = soundfile.info(cut.recording.sources[0].source)
        assert info.samplerate == SAMPLE_RATE and info.channels == 1
        assert cut.sampling_rate == SAMPLE_RATE
        assert cut.recording.num_samples == info.frames
        assert cut.duration == pytest.approx(info.frames / SAMPLE_RATE, abs=1e-9)
        audio = cut.load_audio()
        assert audio.shape == (1, info.frames)
        assert np.sqrt(np.mean(audio ** 2)) > 0.01
        words = len(cut.supervisions[0].text.split())
        assert 0.1 < cut.duration / words < 1.0  # seconds per spoken word at 130..200 wpm
        assert recordings[cut.id].num_samples == info.frames
        assert supervisions[cut.id].duration == pytest.approx(cut.duration)


def test_corpus_texts_speakers_and_token_counts(corpus):
    from lhotse import CutSet

    from workbench.data.tokenizer import load_tokenizer

    paths, model = corpus
    tok = load_tokenizer(model)
    cuts = CutSet.from_file(paths["cuts"]).to_eager()
    texts = [c.supervisions[0].text for c in cuts]
    assert texts == choose_sentences(split_sentences(default_text()), 5, seed=4)
    assert {c.supervisions[0].speaker for c in cuts} <= {"spk00", "spk01", "spk02"}
    assert [c.custom["num_tokens"] for c in cuts] == [len(tok.encode(t)) for t in texts]
    assert not [p for p in paths["cuts"].parent.rglob("*") if ".tmp" in p.name]


def test_corpus_from_a_text_file(tmp_path):
    _espeak_or_skip()
    text = tmp_path / "story.txt"
    text.write_text("The river ran past the old mill. Nobody had seen the miller for years.\n")
    paths = make_tts_corpus(tmp_path / "c", text_file=text, num_utterances=3, speed_wpm=250, num_workers=1,
                            progress=False)
    from lhotse import CutSet

    cuts = CutSet.from_file(paths["cuts"]).to_eager()
    texts = [c.supervisions[0].text for c in cuts]
    assert len(texts) == 3 and set(texts) == {"The river ran past the old mill.",
                                             "Nobody had seen the miller for years."}
    assert all("num_tokens" not in (c.custom or {}) for c in cuts)
    empty = tmp_path / "empty.txt"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match="0 found"):
        make_tts_corpus(tmp_path / "d", text_file=empty, num_utterances=1)
    with pytest.raises(ValueError, match="'xx' is not an espeak-ng voice"):
        make_tts_corpus(tmp_path / "d", num_utterances=1, voice="xx")
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        make_tts_corpus(tmp_path / "d", text_file=tmp_path / "nothing.txt")


def test_corpus_repeat_lists_each_utterance_again_with_the_same_audio(tmp_path):
    _espeak_or_skip()
    from lhotse import CutSet

    text = tmp_path / "story.txt"
    text.write_text("The river ran past the old mill. Nobody had seen the miller for years.\n")
    paths = make_tts_corpus(tmp_path / "c", text_file=text, num_utterances=2, speed_wpm=250, num_workers=1,
                            progress=False, repeat=3)
    cuts = CutSet.from_file(paths["cuts"]).to_eager()
    assert [c.id for c in cuts] == ["tts-000000", "tts-000000-r1", "tts-000000-r2",
                                    "tts-000001", "tts-000001-r1", "tts-000001-r2"]
    assert len({c.recording.sources[0].source for c in cuts}) == 2 == len(list(paths["audio_dir"].iterdir()))
    assert np.array_equal(cuts[0].load_audio(), cuts[2].load_audio())
    with pytest.raises(ValueError, match="--repeat"):
        make_tts_corpus(tmp_path / "d", text_file=text, repeat=0)


def test_join_sentences_groups_consecutive_sentences_using_each_once():
    sentences = [f"Sentence {i}." for i in range(20)]
    joined = join_sentences(sentences, 3, seed=1)
    assert " ".join(joined) == " ".join(sentences)  # in order, each once
    counts = [u.count(".") for u in joined]
    assert all(1 <= c <= 3 for c in counts) and len(set(counts)) > 1
    assert joined == join_sentences(sentences, 3, seed=1) != join_sentences(sentences, 3, seed=2)
    assert join_sentences(sentences, 1) == sentences
    with pytest.raises(ValueError, match="--join"):
        join_sentences(sentences, 0)


def test_corpus_join_speaks_longer_utterances(tmp_path):
    _espeak_or_skip()
    from lhotse import CutSet

    text = tmp_path / "story.txt"
    text.write_text("The river ran past the old mill. Nobody had seen the miller for years. "
                    "The wheel still turned at night. Children said it sang.\n")
    single = CutSet.from_file(make_tts_corpus(tmp_path / "a", text_file=text, speed_wpm=250, num_workers=1,
                                              progress=False)["cuts"]).to_eager()
    joined = CutSet.from_file(make_tts_corpus(tmp_path / "b", text_file=text, speed_wpm=250, num_workers=1,
                                              progress=False, join=4, num_utterances=2)["cuts"]).to_eager()
    assert len(single) == 4 and len(joined) <= 2
    assert max(c.duration for c in joined) > max(c.duration for c in single)
    assert all(c.supervisions[0].text.endswith(".") for c in joined)
    with pytest.raises(ValueError, match="--join"):
        make_tts_corpus(tmp_path / "d", text_file=text, join=0)
