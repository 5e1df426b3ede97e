"""Sentencepiece tokenizers trained on a corpus's transcripts, and token counts per cut.

Models are trained from an iterator of texts (no text file on disk) with no BOS/EOS pieces: id 0 is
``<unk>`` and every other id is a real piece, so ``vocab_size`` is what a model's output layer needs.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Iterable

import numpy as np
from tqdm.auto import tqdm

from workbench.atomic import atomic_path, write_bytes_atomically
from workbench.data.arrays import CutArrays
from workbench.data.manifest import cut_dict_text, iter_cut_blocks, read_cut_arrays

MIN_VOCAB_SIZE, MAX_VOCAB_SIZE = 128, 1024


def _is_path(source) -> bool:
    return isinstance(source, (str, os.PathLike))


def manifest_texts(path: str | os.PathLike, *, progress: bool = True) -> list[str]:
    """The transcript of every cut of a lhotse CutSet manifest (supervision texts joined by a space)."""
    return read_cut_arrays(path, with_texts=True, progress=progress).texts  # FileNotFoundError names the path


def train_tokenizer(source: Iterable[str] | str | os.PathLike, out_prefix: str | os.PathLike | None = None,
                    vocab_size: int = 256, model_type: str = "bpe", *, progress: bool = True,
                    max_sentences: int = 2_000_000) -> Path:
    """Train a sentencepiece model on texts, or on the transcripts of a CutSet manifest; returns its ``.model``.

    ``source``: an iterable of transcripts, or the path of a cuts manifest (``.jsonl``/``.jsonl.gz``).
    ``out_prefix``: where ``<out_prefix>.model`` (and a readable ``.vocab``) go; by default beside the
    manifest as ``tokenizer_<model_type>_<vocab_size>``. ``vocab_size`` in 128..1024 (inclusive) for
    ``bpe`` and ``unigram``; a ``char`` or ``word`` model takes what its text has (at least 2).
    At most ``max_sentences`` transcripts (sampled by sentencepiece) are used. Files are written
    atomically. ValueError when the text is too small for ``vocab_size``, saying the largest that fits.
    """
    import sentencepiece as spm  # heavy native module: loaded on first use, not by the CLI

    if model_type not in ("bpe", "unigram", "char", "word"):
        raise ValueError(f"model_type must be 'bpe', 'unigram', 'char' or 'word', got {model_type!r}")
    if model_type in ("bpe", "unigram") and not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be in {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE} for {model_type}, got {vocab_size}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2 (the unknown piece and one more), got {vocab_size}")
    if _is_path(source):
        origin = str(source)
        texts = manifest_texts(source, progress=progress)
        if out_prefix is None:
            out_prefix = Path(source).parent / f"tokenizer_{model_type}_{vocab_size}"
    else:
        origin = "the given texts"
        texts = list(source)
        if out_prefix is None:
            raise ValueError("out_prefix is required when training from texts (not from a manifest path)")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError(f"{origin}: no non-empty transcripts to train a tokenizer on (0 found)")
    if model_type == "char":  # one piece per character, plus unknown and word boundary: nothing else fits
        # counted after the NFKC normalization sentencepiece applies by default
        pieces = len({ch for t in texts for ch in unicodedata.normalize("NFKC", t) if not ch.isspace()}) + 2
        if vocab_size != pieces:
            raise ValueError(f"{origin}: a char model of this text has {pieces} pieces (its characters, unknown "
                             f"and word boundary), not vocab_size {vocab_size}; ask for {pieces}")
    out_prefix = Path(out_prefix)

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(tqdm(texts, desc="sentencepiece", unit="text", disable=not progress)),
            model_writer=model, vocab_size=vocab_size, model_type=model_type, character_coverage=1.0,
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, input_sentence_size=max_sentences,
            shuffle_input_sentence=True, minloglevel=2, num_threads=os.cpu_count() or 1)
    except RuntimeError as e:
        fits = re.search(r"value <= (\d+)", str(e))
        if fits:
            raise ValueError(f"{origin}: vocab_size {vocab_size} is too large for {len(texts)} transcripts; "
                             f"at most {fits.group(1)} fits this text (use more text or a smaller vocab)") from None
        raise

    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    if processor.vocab_size() != vocab_size:  # sentencepiece does not hold a char model to its size
        raise ValueError(f"{origin}: a {model_type} model of this text has {processor.vocab_size()} pieces, not "
                         f"vocab_size {vocab_size}; ask for {processor.vocab_size()}")
    model_path = out_prefix.with_name(out_prefix.name + ".model")
    write_bytes_atomically(model_path, model.getvalue())
    vocab = "".join(f"{processor.id_to_piece(i)}\t{processor.get_score(i)}\n" for i in range(processor.vocab_size()))
    write_bytes_atomically(out_prefix.with_name(out_prefix.name + ".vocab"), vocab.encode("utf-8"))
    return model_path



def load_tokenizer(path):
    """A ``sentencepiece.SentencePieceProcessor`` from a ``.model`` file. A processor is returned as it is,
    and None or "" as None (no tokenizer), so callers may take either a path or a processor."""
    import sentencepiece as spm  # heavy native module: loaded on first use, not by the CLI

    if path is None or isinstance(path, str) and not path:
        return None
    if not isinstance(path, (str, os.PathLike)):
        return path  # already a processor
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a folder; give the tokenizer's .model file (e.g. tokenizer_bpe_256.model)")
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer model {str(path)!r} does not exist")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{path}: not a sentencepiece model ({e})") from None


def tokenized_cut_arrays(path: str | os.PathLike, tokenizer=None, *, with_texts: bool = False,
                         progress: bool = True, workers: int | None = None) -> CutArrays:
    """:func:`workbench.data.manifest.read_cut_arrays`, with ``num_tokens`` counted by ``tokenizer`` (a
    sentencepiece processor or the path of its ``.model``) over the transcripts: the counts the model will
    see, whatever the manifest stores. With ``tokenizer`` None or "" the manifest's own counts are kept."""
    tokenizer = load_tokenizer(tokenizer)  # before reading: a wrong path fails at once
    arrays = read_cut_arrays(path, with_texts=with_texts or tokenizer is not None, progress=progress,
                             workers=workers)
    if tokenizer is None:
        return arrays
    arrays.num_tokens = count_tokens(tokenizer, arrays.texts)
    if not with_texts:
        arrays.texts = None
    return arrays


def count_tokens(tokenizer, texts: Iterable[str | None], *, batch_size: int = 8192) -> np.ndarray:
    """Number of tokens of each text (int64; None or empty text is 0), encoded in batches of ``batch_size``."""
    texts = [t or "" for t in texts]
    counts = np.zeros(len(texts), dtype=np.int64)
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        counts[start:start + len(batch)] = [len(ids) for ids in tokenizer.encode(batch)]
    return counts


def _write_with_counts(out, cuts: list[dict], tokenizer) -> None:
    """Write cut dicts as JSON lines, each with custom["num_tokens"] = the tokens of its transcript."""
    counts = count_tokens(tokenizer, [cut_dict_text(c) for c in cuts])
    for cut, n in zip(cuts, counts.tolist()):
        cut["custom"] = {**(cut.get("custom") or {}), "num_tokens": n}
        out.write(json.dumps(cut, ensure_ascii=False))
        out.write("\n")


def add_token_counts(manifest_in: str | os.PathLike, tokenizer, manifest_out: str | os.PathLike, *,
                     progress: bool = True) -> Path:
    """Copy a CutSet manifest with ``custom["num_tokens"]`` set on every cut; returns ``manifest_out``.

    A cut's count is that of its transcript (:func:`workbench.data.manifest.cut_dict_text`; 0 with no text),
    the text training tokenizes. ``tokenizer`` is a
    sentencepiece processor or the path of its ``.model``. The output (gzip when it ends in ``.gz``) is
    written atomically, so ``manifest_out`` may be ``manifest_in``. Every other field is kept as it was.
    """
    tokenizer = load_tokenizer(tokenizer)
    dst = Path(manifest_out)
    written = 0
    with atomic_path(dst) as tmp:
        with (gzip.open(tmp, "wt", encoding="utf-8", compresslevel=5) if dst.suffix == ".gz"
              else open(tmp, "w", encoding="utf-8")) as out:
            for cuts, _ in iter_cut_blocks(manifest_in, progress=progress):
                _write_with_counts(out, cuts, tokenizer)
                written += len(cuts)
        if not written:
            raise ValueError(f"{manifest_in}: the manifest is empty (no cuts)")
    return dst
