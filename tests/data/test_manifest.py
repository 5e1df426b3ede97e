import gzip
import json

import numpy as np
import pytest
from lhotse import CutSet

from workbench.data import read_cut_arrays, synthetic_cut_arrays, write_synthetic_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_synthetic_corpus(tmp_path_factory.mktemp("syn"), 300, seed=3, progress=False)


def test_reader_matches_lhotse(corpus):
    arrays = read_cut_arrays(corpus, with_texts=True, progress=False)
    cuts = list(CutSet.from_jsonl_lazy(corpus))
    assert arrays.ids == [c.id for c in cuts]
    np.testing.assert_array_equal(arrays.durations, [c.duration for c in cuts])
    np.testing.assert_array_equal(arrays.num_tokens, [c.custom["num_tokens"] for c in cuts])
    assert arrays.texts == [" ".join(s.text for s in c.supervisions) for c in cuts]


def test_synthetic_arrays_equal_written_corpus(corpus):
    arrays = read_cut_arrays(corpus, progress=False)
    mem = synthetic_cut_arrays(300, seed=3)
    np.testing.assert_array_equal(arrays.durations, mem.durations)
    np.testing.assert_array_equal(arrays.num_tokens, mem.num_tokens)


def test_plain_jsonl_and_multi_member_gzip(tmp_path, corpus):
    lines = gzip.open(corpus, "rt").read().splitlines()
    plain = tmp_path / "cuts.jsonl"
    plain.write_text("\n".join(lines[:10]) + "\n\n")  # blank lines are fine
    assert len(read_cut_arrays(plain, progress=False)) == 10
    multi = tmp_path / "multi.jsonl.gz"
    with open(multi, "wb") as f:
        f.write(gzip.compress(("\n".join(lines[:5]) + "\n").encode()))
        f.write(gzip.compress(("\n".join(lines[5:12]) + "\n").encode()))
    assert len(read_cut_arrays(multi, progress=False)) == 12


def _write(tmp_path, rows, name="bad.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_malformed_json_names_file_and_line(tmp_path):
    path = _write(tmp_path, [{"id": "a", "duration": 1.0}, '{"id": "b", "duration": ', {"id": "c", "duration": 2}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed JSON"):
        read_cut_arrays(path, progress=False)


@pytest.mark.parametrize("bad", [0, -1.5, "NaN"])
def test_non_positive_duration_names_line_and_field(tmp_path, bad):
    row = '{"id": "b", "duration": NaN}' if bad == "NaN" else {"id": "b", "duration": bad}
    path = _write(tmp_path, [{"id": "a", "duration": 1.0}, {"id": "x", "duration": 2.0}, row])
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: .*'b'.*'duration'"):
        read_cut_arrays(path, progress=False)


def test_missing_duration(tmp_path):
    path = _write(tmp_path, [{"id": "a", "duration": 1.0}, {"id": "sup1", "start": 0}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*no field 'duration'"):
        read_cut_arrays(path, progress=False)


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl.gz"
    with gzip.open(empty, "wt"):
        pass
    with pytest.raises(ValueError, match="empty"):
        read_cut_arrays(empty, progress=False)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_cut_arrays(tmp_path / "nope.jsonl", progress=False)
    truncated = tmp_path / "trunc.jsonl.gz"
    truncated.write_bytes(gzip.compress(b'{"id": "a", "duration": 1.0}\n' * 1000)[:-20])
    with pytest.raises(ValueError, match="truncated|not a valid gzip"):
        read_cut_arrays(truncated, progress=False)


def test_partial_token_counts_are_an_error(tmp_path):
    path = _write(tmp_path, [{"id": "a", "duration": 1.0, "custom": {"num_tokens": 3}},
                             {"id": "b", "duration": 2.0}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'custom.num_tokens' is missing on 1 of 2"):
        read_cut_arrays(path, progress=False)
    ok = _write(tmp_path, [{"id": "a", "duration": 1.0}, {"id": "b", "duration": 2.0}], "ok.jsonl")
    assert read_cut_arrays(ok, progress=False).num_tokens is None


def test_worker_processes_give_the_same_columns_and_line_numbers(tmp_path):
    src = write_synthetic_corpus(tmp_path, 16_000, seed=5, progress=False)
    lines = gzip.open(src, "rt").read().splitlines()
    plain = tmp_path / "big.jsonl"  # over one 8 MB read: parsed by worker processes
    plain.write_text("\n".join(lines) + "\n")
    assert plain.stat().st_size > 8 << 20
    one = read_cut_arrays(plain, progress=False, workers=1)
    two = read_cut_arrays(plain, progress=False, workers=2)
    assert one.ids == two.ids
    np.testing.assert_array_equal(one.durations, two.durations)
    np.testing.assert_array_equal(one.num_tokens, two.num_tokens)
    lines[15_000] = lines[15_000].replace('"duration": ', '"duration": -', 1)
    plain.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"big\.jsonl:15001: .*'duration'"):
        read_cut_arrays(plain, progress=False, workers=2)
    lines[15_500] = lines[15_500][:40]
    plain.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"big\.jsonl:15501: malformed JSON"):
        read_cut_arrays(plain, progress=False, workers=2)


def test_garbage_gzip_is_one_error_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"this is not gzip at all\n" * 50)
    with pytest.raises(ValueError, match=r"garbage\.jsonl\.gz: not a valid gzip file"):
        read_cut_arrays(garbage, progress=False)
    corrupt = tmp_path / "corrupt.jsonl.gz"
    data = bytearray(gzip.compress(b'{"id": "a", "duration": 1.0}\n' * 5000))
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)  # a hole in the deflate stream
    corrupt.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"corrupt\.jsonl\.gz: (not a valid gzip file|gzip stream is truncated)"):
        read_cut_arrays(corrupt, progress=False)


def test_a_truncated_cut_whose_supervision_starts_before_it_reads(tmp_path):
    from lhotse import SupervisionSegment
    from lhotse.testing.dummies import dummy_cut

    cut = dummy_cut(0, duration=4.0, supervisions=[SupervisionSegment("s", "dummy-recording-0000", 0.0, 4.0,
                                                                      text="a b")])
    truncated = cut.truncate(offset=2.0, duration=2.0)  # keeps the supervision, which now starts at -2 s
    assert truncated.supervisions[0].start < 0
    path = tmp_path / "cuts.jsonl"
    CutSet.from_cuts([truncated]).to_file(path)
    arrays = read_cut_arrays(path, with_texts=True, progress=False)
    assert arrays.durations.tolist() == [2.0] and arrays.texts == ["a b"]
    line = json.loads(path.read_text())
    line["start"] = -1.0  # a cut itself cannot start before its recording
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"field 'start' = -1.0; it must be a finite number of seconds >= 0"):
        read_cut_arrays(path, progress=False)
