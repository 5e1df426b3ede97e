import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(cuts manifest, tokenizer) of 12 tone cuts of 3-6 letters (0.5-1 s) and a letter tokenizer."""
    from workbench.data.tone_corpus import train_letter_tokenizer, write_tone_corpus

    root = tmp_path_factory.mktemp("tones")
    return write_tone_corpus(root, 12, seed=0, min_letters=3, max_letters=6), train_letter_tokenizer(root / "letters")
