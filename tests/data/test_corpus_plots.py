"""The corpus notebook's tables and sentences, from small hand-made corpora."""

import numpy as np

from workbench.data.arrays import CutArrays
from workbench.data.plots import corpus_source_line, corpus_table, distribution_meaning, quantiles_meaning


def _arrays(durations, tokens=None):
    ids = [f"c{i}" for i in range(len(durations))]
    return CutArrays(ids, np.asarray(durations, dtype=np.float64),
                     None if tokens is None else np.asarray(tokens, dtype=np.int64), source="hand-made")


def test_corpus_table_has_human_rows_and_columns():
    table = corpus_table(_arrays([1.0, 2.0, 3.0, 4.0], [4, 8, 12, 40]))
    assert list(table.index) == ["duration (s)", "output tokens", "tokens per second"]
    assert list(table.columns) == ["min", "1 %", "25 %", "median", "75 %", "99 %", "max"]
    assert table.loc["duration (s)", "max"] == 4.0 and table.loc["tokens per second", "max"] == 10.0


def test_sentences_come_from_the_corpus():
    arrays = _arrays([2.0] * 98 + [20.0, 40.0], [8] * 98 + [400, 40])
    assert quantiles_meaning(arrays).startswith("Half the utterances are shorter than 2.0 s")
    assert "about 5 % of the memory" in quantiles_meaning(arrays)  # 2 s of 40 s
    assert "1.0 % exceed 10" in distribution_meaning(arrays)  # only the 20 tokens/s utterance
    assert "2D bins need" in distribution_meaning(_arrays([1.0, 2.0]))
    assert corpus_source_line(arrays) == "hand-made: 100 utterances, 0.1 h of audio."
