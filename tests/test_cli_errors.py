"""Ordinary failures of every command: exit 2, one line naming the file, option or field, nothing left behind."""

import builtins
import contextlib
import errno
import gzip
import io
import json
import os
from pathlib import Path

import pytest
import yaml

from workbench.bucketing import BucketProfile, estimate_2d_bins, load_profile, save_profile
from workbench.cli import main
from workbench.data import read_cut_arrays, write_synthetic_corpus
from workbench.data.tokenizer import add_token_counts

SUPERVISION = {"id": "s1", "recording_id": "r1", "start": 0.0, "duration": 2.5, "channel": 0, "text": "a b c"}
RECORDING = {"id": "r1", "sources": [{"type": "file", "channels": [0], "source": "r1.wav"}],
             "sampling_rate": 16000, "num_samples": 40000, "duration": 2.5}


def _cut(i: int, duration: float = 2.0, num_tokens=5) -> dict:
    return {"id": f"c{i}", "start": 0, "duration": duration, "channel": 0, "type": "MonoCut",
            "supervisions": [{"id": f"c{i}", "recording_id": f"c{i}", "start": 0, "duration": duration,
                              "channel": 0, "text": "ba de fi"}], "custom": {"num_tokens": num_tokens}}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_line_error(capsys, code: int, *needles: str) -> str:
    assert code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    assert "Traceback" not in err[0]
    return err[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_synthetic_corpus(tmp_path_factory.mktemp("syn"), 400, seed=2, progress=False)


# ---- A: silent wrong results -------------------------------------------------------------------------

@pytest.mark.parametrize("row,kind", [(SUPERVISION, "supervisions"), (RECORDING, "recordings")])
def test_supervisions_and_recordings_manifests_are_not_cuts(tmp_path, capsys, row, kind):
    path = _jsonl(tmp_path / f"{kind}.jsonl", [row, row])
    before = _tree(tmp_path)
    _one_line_error(capsys, main(["corpus", "stats", str(path)]), f"{kind}.jsonl:1", f"a {kind} manifest")
    _one_line_error(capsys, main(["bins", str(path), "--out", str(tmp_path / "p.yaml"), "-q"]),
                    f"{kind}.jsonl:1", "not a cuts manifest")
    _one_line_error(capsys, main(["corpus", "tokenizer", str(path), "--vocab-size", "128"]), f"a {kind} manifest")
    assert _tree(tmp_path) == before
    with pytest.raises(ValueError, match=f"{kind}.jsonl:1: this is a {kind} manifest"):
        read_cut_arrays(path, progress=False)
    with pytest.raises(ValueError, match=f"a {kind} manifest"):
        add_token_counts(path, None, tmp_path / "out.jsonl", progress=False)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("value,shown", [(7.9, "7.9"), ("seven", "'seven'"), (True, "True"), ([3], "[3]")])
def test_non_integer_token_counts_are_refused_with_file_line_and_field(tmp_path, capsys, value, shown):
    path = _jsonl(tmp_path / "cuts.jsonl", [_cut(0), _cut(1, num_tokens=value)])
    _one_line_error(capsys, main(["corpus", "stats", str(path)]),
                    "cuts.jsonl:2", f"'custom.num_tokens' = {shown}", "whole numbers")


@pytest.mark.parametrize("change,field,rule", [
    ({"num_tokens": 2 ** 63}, "'custom.num_tokens' = 9223372036854775808", "below 2^63"),
    ({"num_tokens": 1e30}, "'custom.num_tokens' = 1e+30", "below 2^63"),
    ({"custom": [5]}, "'custom' = [5]", "an object"),
    ({"custom": "5 tokens"}, "'custom' = '5 tokens'", "an object"),
    ({"supervisions": {"text": "a b"}}, "'supervisions' = {'text': 'a b'}", "a list of supervision objects"),
    ({"supervisions": "a b"}, "'supervisions' = 'a b'", "a list"),
    ({"supervisions": ["a b"]}, "'supervisions[0]' = 'a b'", "a supervision object"),
    ({"supervisions": [{"text": 42}]}, "'supervisions[0].text' = 42", "a string"),
    ({"supervisions": [{"text": ["a", "b"]}]}, "'supervisions[0].text' = ['a', 'b']", "a string"),
    ({"id": 7}, "'id' = 7", "a string"),
    ({"tracks": [{"cut": {"supervisions": [{"text": 3}]}}]}, "'tracks[0].cut.supervisions[0].text' = 3", "a string"),
    ({"tracks": {"cut": {}}}, "'tracks' = {'cut': {}}", "a list"),
    ({"start": "zero"}, "'start' = 'zero'", "a finite number of seconds >= 0"),
    ({"start": -1}, "'start' = -1", "a finite number of seconds >= 0"),
    ({"channel": [[0]]}, "'channel' = [[0]]", "a channel number or a list of them"),
    ({"recording": "r1.wav"}, "'recording' = 'r1.wav'", "an object"),
    ({"supervisions": [{"text": "a", "duration": "long"}]}, "'supervisions[0].duration' = 'long'", "a finite"),
    ({"supervisions": [{"text": "a", "speaker": 5}]}, "'supervisions[0].speaker' = 5", "a string"),
    ({"supervisions": [{"text": "a", "start": float("nan")}]}, "'supervisions[0].start' = nan", "a finite")])
def test_manifest_fields_of_the_wrong_type_or_range_name_file_line_and_field(tmp_path, capsys, change, field, rule):
    bad = _cut(1)
    if "num_tokens" in change:
        bad["custom"] = change
    else:
        bad.update(change)
    path = _jsonl(tmp_path / "cuts.jsonl", [_cut(0), bad, _cut(2)])
    before = _tree(tmp_path)
    for argv in (["corpus", "stats", str(path)], ["bins", str(path), "--out", str(tmp_path / "p.yaml"), "-q"]):
        _one_line_error(capsys, main(argv), "cuts.jsonl:2", field, rule)
    if "num_tokens" not in change:  # the transcripts are read for a tokenizer, and copied with counts
        _one_line_error(capsys, main(["corpus", "tokenizer", str(path), "--vocab-size", "128"]),
                        "cuts.jsonl:2", field)
        with pytest.raises(ValueError, match=r"cuts\.jsonl:2: .*" + rule):
            add_token_counts(path, None, tmp_path / "out.jsonl", progress=False)
    assert _tree(tmp_path) == before


def test_a_duration_too_short_for_its_tokens_is_blamed_on_the_input(tmp_path, capsys):
    """5 tokens in 1e-320 s: the tokens per second overflow; the manifest's cut is named, not the profile."""
    path = _jsonl(tmp_path / "cuts.jsonl", [_cut(i, duration=1e-320 if i == 3 else 1.0 + i) for i in range(10)])
    out = tmp_path / "p.yaml"
    line = _one_line_error(capsys, main(["bins", str(path), "--buckets", "2", "--out", str(out), "-q"]),
                           "cuts.jsonl: cut 'c3' has duration 1e-320 s, too short for its 5 tokens", "--min-duration")
    assert "p.yaml" not in line and not out.exists()
    assert main(["bins", str(path), "--buckets", "2", "--out", str(out), "-q", "--min-duration", "0.5"]) == 0
    durations = [1e-320 if i == 3 else 1.0 + i for i in range(10)]
    with pytest.raises(ValueError, match=r"durations\[3\] = 1e-320 s is too short for its 5 tokens"):
        estimate_2d_bins(durations, [5] * 10, 2, 1)


def test_integral_float_token_counts_are_read_as_integers(tmp_path):
    path = _jsonl(tmp_path / "cuts.jsonl", [_cut(0, num_tokens=8.0), _cut(1, num_tokens=3)])
    assert read_cut_arrays(path, progress=False).num_tokens.tolist() == [8, 3]


@pytest.mark.parametrize("option,value,rule", [
    ("--median-duration", "-1", "must be > 0 seconds"), ("--median-duration", "nan", "must be > 0 seconds"),
    ("--max-duration", "0", "must be > 0 seconds"), ("--outlier-share", "2", "must be in [0, 1]"),
    ("--outlier-share", "-0.1", "must be in [0, 1]"), ("--num-cuts", "0", "must be >= 1"),
    ("--num-cuts", "1.5", "must be an integer >= 1"), ("--seed", "-1", "must be >= 0")])
def test_corpus_synthetic_options_name_their_range(tmp_path, capsys, option, value, rule):
    out = tmp_path / "corpus"
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(out), option, value]),
                    f"argument {option}: {rule}", value)
    assert not out.exists()


def test_corpus_synthetic_refuses_a_median_far_outside_the_duration_range(tmp_path, capsys):
    # log-normal, median 1000 s, sigma 0.8: P(d <= 40 s) = Phi(ln(40 / 1000) / 0.8) = Phi(-4.024) = 0.00287 %
    line = _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(tmp_path / "c"), "--median-duration",
                                         "1000"]), "median_duration_s must be such that at least 1 %")
    assert "puts 0.00287 % there" in line
    assert not (tmp_path / "c").exists()
    # the allocator bench's corpus (median 6 s, at most 3 s) keeps a fifth of the draws: allowed
    assert main(["corpus", "synthetic", "--out", str(tmp_path / "c"), "--max-duration", "3", "--num-cuts", "50"]) == 0


def test_corpus_synthetic_max_below_min_duration_is_refused(tmp_path, capsys):
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(tmp_path / "c"), "--max-duration", "0.3"]),
                    "max_duration_s must be > min_duration_s (0.5)")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("option,value,rule", [("--buckets", "0", "must be >= 1"),
                                               ("--sub-buckets", "x", "must be an integer >= 1"),
                                               ("--max-duration", "-3", "must be > 0 seconds")])
def test_bins_options_name_their_range(corpus, tmp_path, capsys, option, value, rule):
    _one_line_error(capsys, main(["bins", str(corpus), option, value, "--out", str(tmp_path / "p.yaml")]),
                    f"argument {option}: {rule}")
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("option,value", [("--sub-buckets", "3"), ("--tps-threshold", "2.5")])
def test_bins_refuses_2d_options_where_the_bins_are_1d(corpus, tmp_path, capsys, option, value):
    out = tmp_path / "p.yaml"
    no_tokens = _jsonl(tmp_path / "cuts.jsonl", [{**_cut(i, duration=1.0 + i), "custom": {}} for i in range(6)])
    _one_line_error(capsys, main(["bins", str(no_tokens), option, value, "--buckets", "2", "--out", str(out), "-q",
                                  "--strict"]), f"{option}: applies to 2D bins only", "has no token counts",
                    "--tokenizer")
    _one_line_error(capsys, main(["bins", str(corpus), option, value, "--1d", "--out", str(out), "-q"]),
                    f"{option}: applies to 2D bins only, and --1d asks for 1D bins")
    assert not out.exists()
    # without the option both make 1D bins, and with token counts the option applies
    assert main(["bins", str(no_tokens), "--buckets", "2", "--out", str(out), "-q"]) == 0
    assert not load_profile(out).is_2d
    assert main(["bins", str(corpus), option, value, "--out", str(out), "-q"]) == 0
    metadata = load_profile(out).metadata
    assert metadata[{"--sub-buckets": "num_subbuckets", "--tps-threshold": "tps_threshold"}[option]] == float(value)


def test_bins_refuses_equal_count_for_2d_bins_and_names_buckets_by_option(corpus, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    _one_line_error(capsys, main(["bins", str(corpus), "--equal-count", "--out", str(out), "-q"]),
                    "--equal-count: applies to 1D bins only", "add --1d")
    _one_line_error(capsys, main(["bins", str(corpus), "--buckets", "401", "--out", str(out), "-q"]),
                    "--buckets=401 is more than the 400 utterances")
    assert not out.exists()


@pytest.mark.parametrize("command", [["corpus", "stats", "{corpus}", "--tokenizer", "{folder}"],
                                     ["bins", "{corpus}", "--tokenizer", "{folder}", "--out", "{folder}/p.yaml"]])
def test_a_folder_given_as_tokenizer_is_called_a_folder(corpus, tmp_path, capsys, command):
    argv = [a.format(corpus=corpus, folder=tmp_path) for a in command]
    _one_line_error(capsys, main(argv), f"{tmp_path}: is a folder; give the tokenizer's .model file")
    assert _tree(tmp_path) == []


def test_bins_does_not_write_bare_bins_over_a_profile_with_batch_sizes(corpus, tmp_path, capsys):
    out = save_profile(tmp_path / "profile.yaml", BucketProfile([2.0, 4.0], [16, 8]))
    before = out.read_text()
    _one_line_error(capsys, main(["bins", str(corpus), "--out", str(out), "-q"]),
                    f"--out {out}: holds a profile with batch sizes", "--overwrite")
    assert out.read_text() == before
    assert main(["bins", str(corpus), "--out", str(out), "-q", "--overwrite"]) == 0
    assert load_profile(out).bucket_batch_size is None
    assert main(["bins", str(corpus), "--out", str(out), "-q"]) == 0  # bare bins over bare bins: nothing lost


def test_bins_says_what_it_left_out_at_start_and_end_and_strict_refuses(corpus, tmp_path, capsys):
    durations = read_cut_arrays(corpus, progress=False).durations
    limit = float(sorted(durations)[len(durations) // 2])  # half the corpus is longer
    outside = int((durations > limit).sum())
    out = tmp_path / "p.yaml"
    assert main(["bins", str(corpus), "--max-duration", str(limit), "--out", str(out), "-q"]) == 0
    captured = capsys.readouterr()
    warnings = [ln for ln in captured.err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2 and warnings[0] == warnings[1]  # before anything else, and again at the end
    assert f"{outside} outside the duration window" in warnings[0] and "of 400 utterances" in warnings[0]
    assert out.exists()
    out.unlink()
    _one_line_error(capsys, main(["bins", str(corpus), "--max-duration", str(limit), "--out", str(out), "-q",
                                  "--strict"]), "--strict", f"{outside} outside the duration window")
    assert not out.exists()
    # nothing left out: no warning, and --strict passes
    assert main(["bins", str(corpus), "--out", str(out), "-q", "--strict", "--1d"]) == 0
    assert "warning" not in capsys.readouterr().err


# ---- B: OS errors -------------------------------------------------------------------------------------

@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A folder where every write fails as on a read-only file system (root ignores permission bits)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_open, real_mkdir, real_replace = builtins.open, os.mkdir, os.replace

    def inside(path) -> bool:
        return isinstance(path, (str, os.PathLike)) and Path(os.path.abspath(path)).is_relative_to(ro)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def fake_open(file, mode="r", *args, **kwargs):
        if inside(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if inside(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    def fake_replace(src, dst, *args, **kwargs):
        if inside(dst):
            refuse(dst)
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", fake_replace)
    return ro


def test_read_only_outputs_are_one_line_for_every_command(corpus, read_only, capsys):
    cases = [(["corpus", "synthetic", "--out", str(read_only), "--num-cuts", "50"], "cuts.jsonl.gz"),
             (["corpus", "synthetic", "--out", str(read_only / "new" / "deeper"), "--num-cuts", "50"], "new"),
             (["bins", str(corpus), "--out", str(read_only / "p.yaml"), "-q"], "p.yaml"),
             (["corpus", "tokenizer", str(corpus), "--vocab-size", "128", "--out", str(read_only / "tok")],
              "tok.model"),
             (["corpus", "tokenizer", str(corpus), "--vocab-size", "128", "--add-counts", str(read_only / "c.jsonl")],
              "c.jsonl"),
             (["report", "--out", str(read_only / "reports")], "reports")]
    for argv, name in cases:
        line = _one_line_error(capsys, main(argv), name, "Read-only file system", "write somewhere else")
        assert line.startswith(f"workbench {argv[0]}") and ": error: " in line
        assert _tree(read_only) == []


def test_output_path_that_is_a_folder(corpus, tmp_path, capsys):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    _one_line_error(capsys, main(["bins", str(corpus), "--out", str(folder), "-q"]), "a_folder", "is a folder",
                    "give a file path")
    (folder / "cuts.jsonl.gz").mkdir()
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(folder), "--num-cuts", "20"]),
                    "cuts.jsonl.gz", "is a folder")
    assert _tree(folder) == ["cuts.jsonl.gz"]


def test_output_under_a_file(corpus, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(a_file), "--num-cuts", "20"]),
                    "a_file", "is a file, not a folder")
    _one_line_error(capsys, main(["bins", str(corpus), "--out", str(a_file / "p.yaml"), "-q"]), "a_file")
    _one_line_error(capsys, main(["report", "--out", str(a_file)]), "a_file")
    assert _tree(tmp_path) == ["a_file"] and a_file.read_text() == "x"


def test_outputs_are_checked_before_the_work(tmp_path, capsys, monkeypatch):
    """A bad output path fails at once: oomptimize before it needs a GPU, report before any notebook runs,
    bins before it reads the manifest (here one that does not exist yet)."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"bucket_duration_bins": [1.0, 2.0]}))
    folder = tmp_path / "folder"
    folder.mkdir()
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(profile), "--out", str(folder)]),
                    "folder: is a folder")
    import workbench.reporting as reporting

    monkeypatch.setattr(reporting, "NOTEBOOK_DIR", tmp_path / "no_notebooks_here")
    _one_line_error(capsys, main(["report", "--out", str(profile)]), "profile.yaml")  # a file where a folder goes
    _one_line_error(capsys, main(["bins", str(tmp_path / "later.jsonl"), "--out", str(folder)]), "folder: is a folder")
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.f_flag = real_statvfs(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(tmp_path / "new"), "--num-cuts", "10"]),
                    str(tmp_path), "Read-only file system")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "profile.yaml"]


def test_oomptimize_refuses_a_folder_as_profile(tmp_path, capsys):
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(tmp_path)]),
                    str(tmp_path), "is a folder")


# ---- C: the profile is checked when it is read ----------------------------------------------------------

@pytest.mark.parametrize("fields,needle", [
    ({"bucket_duration_bins": [2.0, 1.0, 3.0]}, "bucket_duration_bins[1] = 1.0 comes after 2.0"),
    ({"bucket_duration_bins": [1.0, 2.0], "bucket_batch_size": 32}, "'bucket_batch_size' must be a list"),
    ({"bucket_duration_bins": [1.0, 2.0], "bucket_batch_size": [4, True]}, "bucket_batch_size[1] = True"),
    ({"bucket_duration_bins": [[1.0, 2.5], [2.0, 3]]}, "max_tokens must be a whole number"),
    ({"bucket_duration_bins": [[1.0, 5], [1.0, 3], [3.0, 9]]}, "bucket_duration_bins[1] = [1.0, 3] comes after"),
    ({"bucket_duration_bins": [[2.0, 5], [1.0, 8]]}, "bucket_duration_bins[1] = [1.0, 8] comes after"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, 3]], "max_tps": ["fast", 4.0]}, "max_tps[0] = 'fast'"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, 3]], "max_tps": "4"}, "max_tps = '4'"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, 3]], "max_tps": [4.0, float("inf")]}, "max_tps[1] = inf"),
    ({"bucket_duration_bins": [1.0, 2.0], "metadata": [1]}, "'metadata' must be a mapping"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, float("inf")]]},
     "bucket_duration_bins[1] = [2.0, inf] must be a finite"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, 1e30]]}, "a token count in [0, 2^63)"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, 2 ** 63]]}, "a token count in [0, 2^63)"),
    ({"bucket_duration_bins": [[1.0, 3], [2.0, "many"]]}, "bucket_duration_bins[1] = [2.0, 'many']"),
    ({"bucket_duration_bins": [[1.0, 3], [float("inf"), 4]]}, "must be a finite positive duration"),
    ({"bucket_duration_bins": [1.0, float("inf")]}, "bucket_duration_bins[1] = inf must be a finite positive"),
    ({"bucket_duration_bins": [1.0, None]}, "bucket_duration_bins[1] = None")])
def test_load_profile_refuses_what_train_would(tmp_path, capsys, fields, needle):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(fields))
    with pytest.raises(ValueError, match=r"profile\.yaml: ") as info:
        load_profile(path)
    assert needle in str(info.value)
    # oomptimize reads it before any GPU work, so this fails the same way on a machine without CUDA
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(path)]), "profile.yaml", needle)


def test_bins_from_many_equal_durations_writes_a_profile_that_loads(tmp_path):
    """lhotse's rule repeats a boundary that many utterances share; the profile keeps one of each."""
    path = tmp_path / "cuts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i in range(60):  # 20 cuts of 4 s, 40 of 10 s; 20 or 21 tokens
            f.write(json.dumps(_cut(i, duration=10.0 if i % 3 else 4.0, num_tokens=20 + i % 2)) + "\n")
    out = tmp_path / "p.yaml"
    assert main(["bins", str(path), "--buckets", "6", "--sub-buckets", "2", "--out", str(out), "-q"]) == 0
    # 80 s per bucket: the total before the 22nd cut (90 s) passes it, so every bound is 10 s: one group of
    # 6 x 2 sub-buckets over tokens 20 and 21, whose boundaries repeat
    raw = estimate_2d_bins([10.0 if i % 3 else 4.0 for i in range(60)], [20 + i % 2 for i in range(60)], 6, 2).bins
    profile = load_profile(out)
    assert profile.bucket_duration_bins == [[10.0, 20], [10.0, 21]]
    assert profile.metadata["repeated_bins_dropped"] == len(raw) - 2 > 0


def test_corpus_tts_failing_midway_leaves_nothing(tmp_path, capsys, monkeypatch):
    import shutil

    import workbench.data.tts as tts

    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    real, calls = tts._speak_to_file, []

    def disk_fills_up(job):
        calls.append(job)
        if len(calls) == 2:  # the first file is written, the second finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), job[2])
        return real(job)

    monkeypatch.setattr(tts, "_speak_to_file", disk_fills_up)
    out = tmp_path / "new" / "tts"
    _one_line_error(capsys, main(["corpus", "tts", "--out", str(out), "--num-utterances", "3", "--workers", "1"]),
                    "tts-000001.flac", "No space left on device", "free some space")
    assert _tree(tmp_path) == []


def test_repeated_bins_as_lhotse_and_nemo_write_them_load_and_stay_empty(tmp_path):
    # lhotse's 1D rule repeats a boundary that many utterances share; such profiles are users' files
    from workbench.bucketing.fit import make_fitter

    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"bucket_duration_bins": [1.0, 1.0, 3.0], "max_tps": 6.0,
                                    "bucket_batch_size": [8, 8, 4]}))
    profile = load_profile(path)
    fitter = make_fitter(profile.bucket_duration_bins, profile.max_tps)
    assert [fitter.select(d, 2)[0] for d in (0.5, 1.0, 2.0, 3.0)] == [0, 0, 2, 2]  # bucket 1 never chosen


@pytest.mark.parametrize("model", ["tiny-ctc", "large-aed"])
def test_oomptimize_refuses_a_joint_chunk_size_for_models_without_a_joint(tmp_path, capsys, model):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([2.0, 4.0]))
    before = bins.read_text()
    _one_line_error(capsys, main(["oomptimize", "--model", model, "--bins", str(bins), "--joint-chunk-size", "4"]),
                    f"--joint-chunk-size: applies to transducers (rnnt, tdt) only, not to --model {model}")
    assert bins.read_text() == before


def test_oomptimize_refuses_the_fused_loss_for_models_without_a_joint_or_beside_chunks(tmp_path, capsys):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([2.0, 4.0]))
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-ctc", "--bins", str(bins), "--loss", "fused"]),
                    "--loss fused: applies to the reference transducers (rnnt, tdt) only, not to --model tiny-ctc")
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), "--loss", "fused",
                                  "--joint-chunk-size", "2"]), "--loss fused: never builds the joint's logits")


@pytest.mark.parametrize("option,value,needle", [
    ("--rel-gap", "0", "--rel-gap: must be in (0, 1), got 0.0"),
    ("--start-batch-size", "0", "--start-batch-size: must be >= 1, got 0"),
    ("--nproc", "0", "--nproc: must be >= 1 GPUs, got 0")])
def test_oomptimize_search_options_are_checked_before_any_work(tmp_path, capsys, option, value, needle):
    bins = save_profile(tmp_path / "bins.yaml", BucketProfile([2.0, 4.0]))
    before = bins.read_text()
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), option, value]),
                    needle)
    assert bins.read_text() == before


# ---- D: no command writes over another command's corpus -------------------------------------------------

def _spoken_corpus(folder: Path) -> dict[str, bytes]:
    """A folder as `corpus tts` leaves it (manifests, audio/), with a tokenizer beside: {relative path: bytes}."""
    (folder / "audio").mkdir(parents=True)
    files = {"cuts.jsonl.gz": gzip.compress(json.dumps(_cut(0)).encode() + b"\n"),
             "recordings.jsonl.gz": gzip.compress(json.dumps(RECORDING).encode() + b"\n"),
             "supervisions.jsonl.gz": gzip.compress(json.dumps(SUPERVISION).encode() + b"\n"),
             "audio/tts-000000.flac": b"fLaC old audio", "tokenizer_bpe_128.model": b"a tokenizer"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", [["corpus", "synthetic", "--num-cuts", "20"],
                                     ["corpus", "tts", "--num-utterances", "1", "--workers", "1"]])
def test_corpus_commands_refuse_a_folder_holding_a_corpus(tmp_path, capsys, command):
    spoken = tmp_path / "spoken"
    before = _spoken_corpus(spoken)
    _one_line_error(capsys, main([*command, "--out", str(spoken)]), f"--out {spoken}: holds a corpus",
                    "audio/, cuts.jsonl.gz, recordings.jsonl.gz, supervisions.jsonl.gz", "--overwrite")
    assert _contents(spoken) == before
    other = tmp_path / "other"  # any manifest counts, whatever its name
    other.mkdir()
    _jsonl(other / "dev.jsonl", [_cut(0)])
    _one_line_error(capsys, main([*command, "--out", str(other)]), "holds a corpus (dev.jsonl)")
    assert _tree(other) == ["dev.jsonl"]


def test_corpus_synthetic_overwrite_replaces_the_whole_corpus_and_keeps_other_files(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["corpus", "synthetic", "--out", str(out), "--num-cuts", "20", "--seed", "1"]) == 0
    first = (out / "cuts.jsonl.gz").read_bytes()
    _one_line_error(capsys, main(["corpus", "synthetic", "--out", str(out), "--num-cuts", "30"]), "holds a corpus")
    assert (out / "cuts.jsonl.gz").read_bytes() == first  # its own earlier corpus is not written over either
    assert main(["corpus", "synthetic", "--out", str(out), "--num-cuts", "30", "--overwrite"]) == 0
    assert len(read_cut_arrays(out / "cuts.jsonl.gz", progress=False)) == 30
    spoken = tmp_path / "spoken"
    _spoken_corpus(spoken)
    assert main(["corpus", "synthetic", "--out", str(spoken), "--num-cuts", "25", "--overwrite"]) == 0
    # no recordings, supervisions or audio of the spoken corpus are left beside the synthetic cuts
    assert _tree(spoken) == ["cuts.jsonl.gz", "tokenizer_bpe_128.model"]
    assert len(read_cut_arrays(spoken / "cuts.jsonl.gz", progress=False)) == 25
    assert (spoken / "tokenizer_bpe_128.model").read_bytes() == b"a tokenizer"


def test_corpus_tokenizer_add_counts_does_not_replace_another_manifest(corpus, tmp_path, capsys):
    other = _jsonl(tmp_path / "other.jsonl", [_cut(0)])
    before = other.read_bytes()
    args = ["corpus", "tokenizer", str(corpus), "--vocab-size", "128", "--out", str(tmp_path / "tok")]
    _one_line_error(capsys, main([*args, "--add-counts", str(other)]),
                    f"--add-counts {other}: a manifest is there already", "--overwrite")
    assert _tree(tmp_path) == ["other.jsonl"] and other.read_bytes() == before
    assert main([*args, "--add-counts", str(other), "--overwrite"]) == 0
    assert len(read_cut_arrays(other, progress=False)) == 400
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(gzip.decompress(corpus.read_bytes()))
    in_place = ["corpus", "tokenizer", str(copy), "--vocab-size", "128", "--out", str(tmp_path / "tok2")]
    assert main([*in_place, "--add-counts", str(copy)]) == 0  # the input itself: counts added in place


def test_corpus_tokenizer_does_not_replace_a_tokenizer(corpus, tmp_path, capsys):
    args = ["corpus", "tokenizer", str(corpus), "--vocab-size", "128", "--out", str(tmp_path / "tok")]
    assert main(args) == 0
    model = tmp_path / "tok.model"
    model.write_bytes(b"a tokenizer some run was trained with")
    _one_line_error(capsys, main(args), f"{model}: a tokenizer is there already", "--overwrite")
    assert model.read_bytes() == b"a tokenizer some run was trained with"
    beside = corpus.parent / "tokenizer_bpe_128.model"  # the default path, beside the manifest
    beside.write_bytes(b"another")
    try:
        _one_line_error(capsys, main(args[:5]), f"{beside}: a tokenizer is there already")
        assert beside.read_bytes() == b"another"
    finally:
        beside.unlink()  # the corpus is shared with other tests
    assert main([*args, "--overwrite"]) == 0
    from workbench.data.tokenizer import load_tokenizer

    assert load_tokenizer(model).vocab_size() == 128


@pytest.mark.parametrize("bad", [["--text-file", "no_such_prose.txt"], ["--voice", "en+f2"]])
def test_corpus_tts_overwrite_keeps_the_old_corpus_when_its_input_is_refused(tmp_path, capsys, bad):
    spoken = tmp_path / "spoken"
    before = _spoken_corpus(spoken)
    assert main(["corpus", "tts", "--out", str(spoken), "--num-utterances", "1", "--overwrite", *bad]) == 2
    assert _contents(spoken) == before


def test_corpus_tts_overwrite_leaves_no_audio_of_the_old_corpus(tmp_path):
    import shutil

    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    spoken = tmp_path / "spoken"
    _spoken_corpus(spoken)
    assert main(["corpus", "tts", "--out", str(spoken), "--num-utterances", "1", "--workers", "1",
                 "--overwrite"]) == 0
    assert (spoken / "audio" / "tts-000000.flac").read_bytes() != b"fLaC old audio"
    assert _tree(spoken) == ["audio", "audio/tts-000000.flac", "cuts.jsonl.gz", "recordings.jsonl.gz",
                             "supervisions.jsonl.gz", "tokenizer_bpe_128.model"]


def test_corpus_tts_overwrite_keeps_the_old_corpus_when_speaking_fails(tmp_path, monkeypatch):
    import shutil

    from workbench.data import tts

    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    spoken = tmp_path / "spoken"
    before = _spoken_corpus(spoken)
    speak, calls = tts._speak_to_file, []

    def fail_on_second(job):
        calls.append(job)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the new audio is being spoken
        return speak(job)

    monkeypatch.setattr(tts, "_speak_to_file", fail_on_second)
    assert main(["corpus", "tts", "--out", str(spoken), "--num-utterances", "3", "--workers", "1",
                 "--overwrite"]) == 130
    assert _contents(spoken) == before  # the old corpus is whole, and nothing of the new one is left


# ---- E: Ctrl-C always stops ------------------------------------------------------------------------------

def _interrupt_when_writing(argv: list[str], out: Path, sign: str = ".tmp*") -> tuple[int, list[str]]:
    """Run `python -m workbench ARGV` in its own process group, send the group SIGINT three times, as a terminal
    does on Ctrl-C, once a file named like ``sign`` appears under ``out`` (the command is writing its output),
    and return the exit code and stderr lines."""
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and any(out.rglob(sign))):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never started writing"
            time.sleep(0.01)
        for _ in range(3):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, [ln for ln in err.splitlines() if ln.strip()]


def test_ctrl_c_stops_corpus_synthetic_at_once_and_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "corpus"
    code, err = _interrupt_when_writing(["corpus", "synthetic", "--out", str(out), "--num-cuts", "1000000"], out)
    assert code == 130 and len(err) == 1, err
    assert err[0] == ("workbench corpus synthetic: interrupted; stopped, and what it had not finished writing "
                      "was removed")
    assert _tree(tmp_path) == []  # the folders it made are gone too


def test_ctrl_c_during_an_overwrite_keeps_the_old_corpus(tmp_path):
    spoken = tmp_path / "spoken"
    before = _spoken_corpus(spoken)
    code, err = _interrupt_when_writing(["corpus", "synthetic", "--out", str(spoken), "--num-cuts", "1000000",
                                         "--overwrite"], spoken)
    assert code == 130 and len(err) == 1 and "interrupted" in err[0], err
    assert _contents(spoken) == before


def test_ctrl_c_stops_corpus_tts_and_its_worker_processes(tmp_path):
    import shutil

    if not shutil.which("espeak-ng"):
        pytest.skip("needs espeak-ng, which is not installed")
    out = tmp_path / "tts"
    code, err = _interrupt_when_writing(["corpus", "tts", "--out", str(out), "--num-utterances", "2000",
                                         "--workers", "2"], out, sign="*.flac")
    assert code == 130 and len(err) == 1, err  # no traceback from a worker either
    assert err[0].startswith("workbench corpus tts: interrupted")
    assert _tree(tmp_path) == []


# ---- F: messages that name the file ----------------------------------------------------------------------

def test_undecodable_inputs_name_their_file(tmp_path, capsys):
    profile = tmp_path / "profile.yaml"
    profile.write_bytes(b"bucket_duration_bins: [1.0, 2.0]\nmetadata: {note: \xff\xfe}\n")
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(profile)]),
                    "profile.yaml: not a YAML text file (byte 50 is not UTF-8)")
    profile.write_text("bucket_duration_bins: [1.0, 2.0\nmax_tps: 3\n")
    _one_line_error(capsys, main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(profile)]),
                    "profile.yaml:2: not valid YAML")
    text = tmp_path / "prose.txt"
    text.write_bytes("Caf\xe9 au lait is what we drink here.".encode("latin-1"))
    _one_line_error(capsys, main(["corpus", "tts", "--out", str(tmp_path / "tts"), "--text-file", str(text)]),
                    "prose.txt: not UTF-8 text (byte 3)")
    for name, data in (("cuts.jsonl.gz", b"\x1f\x8b not really gzip"), ("cuts.jsonl", b'{"id": "a", "dur\n')):
        (tmp_path / name).write_bytes(data)
        _one_line_error(capsys, main(["corpus", "stats", str(tmp_path / name)]), name)
    assert _tree(tmp_path) == ["cuts.jsonl", "cuts.jsonl.gz", "profile.yaml", "prose.txt"]
