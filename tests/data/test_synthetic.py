import numpy as np
import pytest
from lhotse import CutSet

from workbench.data import SyntheticSpec, synthetic_cut_arrays, write_synthetic_corpus


def test_seeded_and_realistic():
    a = synthetic_cut_arrays(50_000, seed=7)
    b = synthetic_cut_arrays(50_000, seed=7)
    c = synthetic_cut_arrays(50_000, seed=8)
    np.testing.assert_array_equal(a.durations, b.durations)
    assert not np.array_equal(a.durations, c.durations)
    assert a.durations.min() >= 0.5 and a.durations.max() <= 40.0
    assert 5.0 < np.median(a.durations) < 7.0  # log-normal around 6 s
    assert (a.durations > 20).mean() > 0.01  # a real long tail
    tps = a.tokens_per_second
    assert 3.5 < np.median(tps) < 4.5
    # the injected outliers: ~1% of transcripts more than 2.5x the median rate
    share = (tps > 2.5 * np.median(tps)).mean()
    assert 0.005 < share < 0.02


def test_bad_spec():
    with pytest.raises(ValueError, match="num_cuts"):
        synthetic_cut_arrays(0)
    with pytest.raises(ValueError, match="min_duration_s"):
        synthetic_cut_arrays(10, min_duration_s=5, max_duration_s=1)


def test_written_corpus_is_a_lhotse_cutset(tmp_path):
    path = write_synthetic_corpus(tmp_path, 50, seed=1, progress=False)
    cuts = CutSet.from_file(path)
    assert len(cuts) == 50
    cut = next(iter(cuts))
    assert cut.duration == cut.recording.num_samples / 16000
    assert cut.supervisions[0].text and cut.custom["num_tokens"] >= 1
    assert not list(tmp_path.glob(".tmp*"))  # workbench.atomic's temp files: .tmp<pid>-<name>
    assert SyntheticSpec().max_duration_s == 40.0


def test_cuts_from_arrays_builds_an_in_memory_cutset():
    from workbench.data import cuts_from_arrays

    cuts = cuts_from_arrays([1.5, 3.0], [4, 9], prefix="u")
    assert [c.id for c in cuts] == ["u0", "u1"]
    assert [c.duration for c in cuts] == [1.5, 3.0]
    assert [c.custom["num_tokens"] for c in cuts] == [4, 9]
    assert all(c.custom is None for c in cuts_from_arrays([2.0]))
    with pytest.raises(ValueError, match="num_tokens has 1 values for 2 durations"):
        cuts_from_arrays([1.0, 2.0], [3])
    with pytest.raises(ValueError, match=r"durations: 1 not > 0 seconds \(first at index 1: 0.0\)"):
        cuts_from_arrays([1.0, 0.0])
    arrays = synthetic_cut_arrays(5, seed=2)
    from_arrays = cuts_from_arrays(arrays)
    assert [c.id for c in from_arrays] == arrays.ids
    assert [c.custom["num_tokens"] for c in from_arrays] == list(arrays.num_tokens)
