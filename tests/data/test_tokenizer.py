import gzip
import json

import numpy as np
import pytest

from workbench.data.synthetic import write_synthetic_corpus
from workbench.data.tokenizer import (add_token_counts, count_tokens, load_tokenizer, manifest_texts,
                                      tokenized_cut_arrays, train_tokenizer)
from workbench.data.tts import default_text, split_sentences


@pytest.fixture(scope="module")
def sentences():
    return split_sentences(default_text())


@pytest.fixture(scope="module")
def bpe_256(tmp_path_factory, sentences):
    return train_tokenizer(sentences, tmp_path_factory.mktemp("tok") / "prose", 256, progress=False)


def _read_jsonl_gz(path):
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_train_from_texts_round_trips_every_sentence(bpe_256, sentences):
    assert bpe_256.name == "prose.model" and bpe_256.is_file()
    vocab_lines = bpe_256.with_name("prose.vocab").read_text().splitlines()
    assert len(vocab_lines) == 256 and vocab_lines[0].startswith("<unk>")
    assert not [p for p in bpe_256.parent.iterdir() if ".tmp" in p.name]
    tok = load_tokenizer(bpe_256)
    assert tok.vocab_size() == 256
    assert tok.bos_id() == -1 and tok.eos_id() == -1 and tok.unk_id() == 0
    ids = tok.encode(sentences)
    assert all(tok.decode(x) == s for x, s in zip(ids, sentences))
    assert not any(0 in x for x in ids)  # nothing unknown in its own training text
    # sub-word units: fewer tokens than characters, more than words
    total = sum(map(len, ids))
    assert sum(s.count(" ") + 1 for s in sentences) < total < sum(map(len, sentences))


def test_unigram_model_type_and_vocab_size(tmp_path, sentences):
    path = train_tokenizer(sentences, tmp_path / "uni", 128, model_type="unigram", progress=False)
    assert load_tokenizer(path).vocab_size() == 128


def test_count_tokens_matches_encode_across_batches(bpe_256, sentences):
    tok = load_tokenizer(bpe_256)
    texts = sentences[:7] + ["", None]
    counts = count_tokens(tok, texts, batch_size=3)
    assert counts.dtype == np.int64 and counts.shape == (9,)
    assert counts[:7].tolist() == [len(tok.encode(s)) for s in sentences[:7]]
    assert counts[7:].tolist() == [0, 0]
    assert (counts[:7] > 0).all()
    assert count_tokens(tok, []).shape == (0,)


@pytest.mark.parametrize("vocab_size", [127, 1025])
def test_vocab_size_out_of_range(tmp_path, sentences, vocab_size):
    with pytest.raises(ValueError, match=r"vocab_size must be in 128\.\.1024"):
        train_tokenizer(sentences, tmp_path / "t", vocab_size, progress=False)


def test_vocab_too_large_for_text_says_what_fits(tmp_path):
    tiny = ["the cat sat on the mat.", "a dog ran far away.", "it rained."]
    with pytest.raises(ValueError, match=r"vocab_size 128 is too large for 3 transcripts; at most \d+ fits"):
        train_tokenizer(tiny, tmp_path / "t", 128, progress=False)
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="out_prefix is required"):
        train_tokenizer(["some words here"], None, 128)
    with pytest.raises(ValueError, match="no non-empty transcripts"):
        train_tokenizer(["", "  "], tmp_path / "t", 128)
    with pytest.raises(ValueError, match="model_type"):
        train_tokenizer(["x y"], tmp_path / "t", 128, model_type="wordpiece")
    with pytest.raises(FileNotFoundError, match="nope.jsonl.gz"):
        train_tokenizer(tmp_path / "nope.jsonl.gz", vocab_size=128)
    with pytest.raises(FileNotFoundError, match="missing.model"):
        load_tokenizer(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        load_tokenizer(junk)


def test_train_from_manifest_saves_beside_it_and_counts_tokens(tmp_path):
    cuts_path = write_synthetic_corpus(tmp_path / "corpus", 400, seed=3, progress=False)
    model = train_tokenizer(cuts_path, vocab_size=200, progress=False)
    assert model == cuts_path.parent / "tokenizer_bpe_200.model"
    tok = load_tokenizer(model)
    texts = manifest_texts(cuts_path, progress=False)
    assert len(texts) == 400

    out = add_token_counts(cuts_path, model, tmp_path / "counted.jsonl.gz", progress=False)
    before, after = _read_jsonl_gz(cuts_path), _read_jsonl_gz(out)
    assert [c["custom"]["num_tokens"] for c in after] == count_tokens(tok, texts).tolist()
    for b, a in zip(before, after):  # everything else is kept as it was
        b.pop("custom"), a.pop("custom")
        assert a == b

    from lhotse import CutSet

    cuts = CutSet.from_file(out)
    first = next(iter(cuts))
    assert first.custom["num_tokens"] == len(tok.encode(first.supervisions[0].text))


def test_add_token_counts_sums_supervisions_in_place_and_reports_bad_lines(tmp_path, bpe_256):
    tok = load_tokenizer(bpe_256)
    rec = {"id": "r", "sources": [{"type": "file", "channels": [0], "source": "x.wav"}], "sampling_rate": 16000,
           "num_samples": 32000, "duration": 2.0}

    def sup(i, text):
        return {"id": f"s{i}", "recording_id": "r", "start": 0.0, "duration": 1.0, "channel": 0, "text": text}

    cuts = [
        {"id": "two", "start": 0, "duration": 2.0, "channel": 0, "recording": rec, "type": "MonoCut",
         "supervisions": [sup(0, "The value is returned."), sup(1, "Names are bound.")], "custom": {"k": 1}},
        {"id": "none", "start": 0, "duration": 2.0, "channel": 0, "recording": rec, "type": "MonoCut",
         "supervisions": []},
    ]
    path = tmp_path / "cuts.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cuts))
    add_token_counts(path, tok, path, progress=False)  # in place
    got = [json.loads(line) for line in path.read_text().splitlines()]
    expected = len(tok.encode("The value is returned.")) + len(tok.encode("Names are bound."))
    assert got[0]["custom"] == {"k": 1, "num_tokens": expected}
    assert got[1]["custom"] == {"num_tokens": 0}

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(cuts[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON"):
        add_token_counts(bad, tok, tmp_path / "out.jsonl", progress=False)
    assert not (tmp_path / "out.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_corpus_arrays_reads_a_manifest_with_a_tokenizer_path_or_makes_a_synthetic_corpus(tmp_path):
    from workbench.data import corpus_arrays, synthetic_cut_arrays

    cuts_path = write_synthetic_corpus(tmp_path / "corpus", 300, seed=4, progress=False)
    model = train_tokenizer(cuts_path, vocab_size=150, progress=False)
    by_path = tokenized_cut_arrays(cuts_path, model, progress=False)  # the .model path is loaded
    by_processor = tokenized_cut_arrays(cuts_path, load_tokenizer(model), progress=False)
    assert by_path.num_tokens is not None and by_path.num_tokens.tolist() == by_processor.num_tokens.tolist()
    # "" means no tokenizer, as a notebook parameter or an unset CLI option gives it: the stored counts
    stored = [c["custom"]["num_tokens"] for c in _read_jsonl_gz(cuts_path)]
    assert tokenized_cut_arrays(cuts_path, "", progress=False).num_tokens.tolist() == stored
    assert stored != by_path.num_tokens.tolist()  # so the tokenizer's counts above are not the stored ones
    arrays = corpus_arrays(str(cuts_path), tokenizer=str(model))
    assert len(arrays) == 300 and arrays.num_tokens.tolist() == by_path.num_tokens.tolist()
    synthetic = corpus_arrays("", num_cuts=500, seed=2)
    assert corpus_arrays(None, num_cuts=500, seed=2).durations.tolist() == synthetic.durations.tolist()
    assert len(synthetic) == 500
    assert synthetic.durations.tolist() == synthetic_cut_arrays(500, seed=2).durations.tolist()
    with pytest.raises(FileNotFoundError, match="nope"):
        corpus_arrays(tmp_path / "nope.jsonl.gz")


def test_char_model_takes_the_vocab_its_text_has(tmp_path):
    path = train_tokenizer(["abc cab bca"] * 4, tmp_path / "chars", 5, model_type="char", progress=False)
    tok = load_tokenizer(path)
    assert path == tmp_path / "chars.model" and (tmp_path / "chars.vocab").exists()
    assert tok.vocab_size() == 5 and tok.decode(tok.encode("cab abc")) == "cab abc"
    with pytest.raises(ValueError, match="vocab_size must be >= 2"):
        train_tokenizer(["abc"], tmp_path / "one", 1, model_type="char", progress=False)
    for wrong in (50, 3):  # too many pieces, or too few (most characters would encode as unknown)
        with pytest.raises(ValueError, match=f"has 5 pieces .*, not vocab_size {wrong}; ask for 5"):
            train_tokenizer(["abc cab bca"] * 4, tmp_path / "wrong", wrong, model_type="char", progress=False)
    assert not [p for p in tmp_path.iterdir() if "wrong" in p.name]  # nothing half-written (temp files either)
    # characters are counted as sentencepiece sees them (NFKC: the full-width a is a)
    wide = train_tokenizer(["\uff41bc abc"] * 3, tmp_path / "wide", 5, model_type="char", progress=False)
    assert load_tokenizer(wide).vocab_size() == 5


def test_the_manifest_reader_knows_nothing_of_tokenizers():
    """data/tokenizer.py composes the reader and the tokenizer; data/manifest.py imports no workbench.data
    module but arrays (no circle, not even through function-local imports)."""
    import ast

    import workbench.data.manifest as manifest

    tree = ast.parse(open(manifest.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m.startswith("workbench")} == {"workbench.data.arrays"}


def test_tokenized_cut_arrays_keeps_texts_only_when_asked(tmp_path):
    cuts_path = write_synthetic_corpus(tmp_path / "corpus", 200, seed=5, progress=False)
    model = train_tokenizer(cuts_path, vocab_size=128, progress=False)
    plain = tokenized_cut_arrays(cuts_path, model, progress=False)
    with_texts = tokenized_cut_arrays(cuts_path, model, with_texts=True, progress=False)
    assert plain.texts is None
    assert with_texts.num_tokens.tolist() == count_tokens(load_tokenizer(model), with_texts.texts).tolist()
    assert plain.num_tokens.tolist() == with_texts.num_tokens.tolist()
