"""Corpora: manifest readers, synthetic corpora, a text-to-speech corpus, tokenizers."""

from workbench.data.arrays import CutArrays
from workbench.data.manifest import iter_cut_blocks, read_cut_arrays
from workbench.data.synthetic import (SyntheticSpec, corpus_arrays, cuts_from_arrays, synthetic_cut_arrays,
                                      write_synthetic_corpus)
from workbench.data.tokenizer import tokenized_cut_arrays

__all__ = ["CutArrays", "SyntheticSpec", "corpus_arrays", "cuts_from_arrays", "iter_cut_blocks", "read_cut_arrays",
           "synthetic_cut_arrays", "tokenized_cut_arrays", "write_synthetic_corpus"]
