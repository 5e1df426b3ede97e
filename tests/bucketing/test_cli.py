import gzip
import json
import re

import numpy as np
import pytest

from workbench.bucketing import estimate_2d_bins, estimate_duration_bins, load_profile
from workbench.cli import main
from workbench.data.manifest import read_cut_arrays
from workbench.data.synthetic import write_synthetic_corpus


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return write_synthetic_corpus(tmp_path_factory.mktemp("syn"), 3000, seed=4, progress=False)


def test_bins_2d_writes_the_estimate(manifest, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["bins", str(manifest), "--buckets", "6", "--sub-buckets", "3", "--tps-threshold", "3",
                 "--out", str(out)]) == 0  # not -q: it prints the profile and the padding summary
    arrays = read_cut_arrays(manifest, progress=False)
    est = estimate_2d_bins(arrays.durations, arrays.num_tokens, 6, 3, tps_threshold=3.0)
    profile = load_profile(out)
    assert [tuple(b) for b in profile.bucket_duration_bins] == est.bins
    assert profile.max_tps == est.max_tps
    assert profile.bucket_batch_size is None
    text = capsys.readouterr().out
    assert "bucket_duration_bins" in text and "padded_input_share" in text and "2D" in text


def test_bins_1d_with_duration_window(manifest, tmp_path):
    out = tmp_path / "p.yaml"
    assert main(["bins", str(manifest), "--buckets", "5", "--1d", "--min-duration", "2", "--max-duration", "20",
                 "--out", str(out), "-q", "--no-padding"]) == 0
    d = read_cut_arrays(manifest, progress=False).durations
    kept = d[(d >= 2) & (d <= 20)]
    profile = load_profile(out)
    assert profile.bucket_duration_bins == estimate_duration_bins(kept, 5)
    assert profile.metadata["excluded_by_duration"] == int(len(d) - len(kept))
    assert main(["bins", str(manifest), "--buckets", "5", "--1d", "--equal-count", "--out", str(out), "-q",
                 "--no-padding"]) == 0
    assert load_profile(out).bucket_duration_bins == estimate_duration_bins(d, 5, equal_count=True)


def test_bins_without_tokens_is_1d(tmp_path):
    path = tmp_path / "cuts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for i, d in enumerate([1.0, 2.0, 3.0, 4.0]):
            f.write(json.dumps({"id": f"c{i}", "start": 0, "duration": d, "channel": 0, "type": "MonoCut"}) + "\n")
    out = tmp_path / "p.yaml"
    assert main(["bins", str(path), "--buckets", "2", "--out", str(out), "-q"]) == 0
    # 5 s per bucket: the total before 4.0 is 6 > 5, so 4.0 is a boundary, then the max (4.0) again; the
    # profile keeps one of the two (the second bucket could never hold anything)
    assert estimate_duration_bins([1.0, 2.0, 3.0, 4.0], 2) == [4.0, 4.0]
    profile = load_profile(out)
    assert profile.bucket_duration_bins == [4.0] and profile.metadata["repeated_bins_dropped"] == 1


def _write_manifest(path, durations, tokens):
    with gzip.open(path, "wt") as f:
        for i, (d, t) in enumerate(zip(durations, tokens)):
            f.write(json.dumps({"id": f"c{i}", "start": 0, "duration": float(d), "channel": 0, "type": "MonoCut",
                                "custom": {"num_tokens": int(t)}}) + "\n")
    return path


def test_bins_reports_what_fits_no_bucket_on_a_tied_corpus(tmp_path, capsys):
    # whole seconds and two common durations: many 1D bounds fall on ties
    rng = np.random.default_rng(3)
    d = np.where(rng.random(3000) < 0.6, rng.choice([2.0, 9.0], 3000), rng.integers(1, 16, 3000))
    t = (d * rng.uniform(1, 5, 3000)).astype(int) + (rng.random(3000) < 0.01) * 80
    manifest = _write_manifest(tmp_path / "cuts.jsonl.gz", d, t)
    out = tmp_path / "p.yaml"
    assert main(["bins", str(manifest), "--buckets", "12", "--sub-buckets", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    m = re.search(r"# fit no bucket: (\d+) of 3000 utterances \((\d+) TPS outliers, (\d+) too long, "
                  r"(\d+) too many tokens\)", text)
    assert m, text
    total, tps, too_long, too_many = map(int, m.groups())
    outliers = load_profile(out).metadata["tps_outliers"]
    assert outliers > 0
    assert (total, tps, too_long, too_many) == (outliers, outliers, 0, 0)
    est = estimate_2d_bins(d, t, 12, 3)
    assert outliers == int(est.outliers.sum())


def test_bins_reports_unfit_for_1d_bins(manifest, tmp_path, capsys):
    assert main(["bins", str(manifest), "--buckets", "5", "--1d", "--out", str(tmp_path / "p.yaml"),
                 "--no-padding"]) == 0
    assert "# fit no bucket: 0 of 3000 utterances (0 TPS outliers, 0 too long, 0 too many tokens)" in \
        capsys.readouterr().out


@pytest.mark.parametrize("option, value, message", [
    ("--tps-threshold", "0", "--tps-threshold must be a number > 0 (a tokens-per-second z-score), got 0.0"),
    ("--tps-threshold", "-1", "--tps-threshold must be a number > 0 (a tokens-per-second z-score), got -1.0"),
    ("--tps-threshold", "nan", "--tps-threshold must be a number > 0"),
    ("--buckets", "0", "argument --buckets: must be >= 1, got 0"),
    ("--sub-buckets", "-2", "argument --sub-buckets: must be >= 1, got -2"),
    ("--min-duration", "-1", "argument --min-duration: must be >= 0 seconds, got -1"),
    ("--max-duration", "0", "argument --max-duration: must be > 0 seconds, got 0"),
])
def test_bins_rejects_options_out_of_range(manifest, tmp_path, capsys, option, value, message):
    out = tmp_path / "p.yaml"
    assert main(["bins", str(manifest), option, value, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench bins: error: {message}") and err.count("\n") == 1, err
    assert not out.exists()
    # checked where the option enters, before the manifest is read
    assert main(["bins", str(tmp_path / "missing.jsonl.gz"), option, value, "--out", str(out)]) == 2
    assert option in capsys.readouterr().err


def test_bins_rejects_an_empty_duration_window(manifest, tmp_path, capsys):
    assert main(["bins", str(manifest), "--min-duration", "9", "--max-duration", "3",
                 "--out", str(tmp_path / "p.yaml"), "-q"]) == 2
    assert "--min-duration (9.0) must be <= --max-duration (3.0)" in capsys.readouterr().err


def test_bins_user_errors(manifest, tmp_path, capsys):
    assert main(["bins", str(tmp_path / "missing.jsonl.gz"), "--out", str(tmp_path / "p.yaml")]) == 2
    assert "missing.jsonl.gz" in capsys.readouterr().err  # the error names the file
    assert main(["bins", str(manifest), "--buckets", "5000", "--out", str(tmp_path / "p.yaml"), "-q"]) == 2
    assert "more than the 3000 utterances" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


def test_bins_with_tokenizer_counts_tokens(manifest, tmp_path):
    from workbench.data.tokenizer import count_tokens, load_tokenizer, train_tokenizer

    # the same cuts without custom.num_tokens: the tokenizer must count them
    stripped = tmp_path / "cuts.jsonl.gz"
    with gzip.open(manifest, "rt") as src, gzip.open(stripped, "wt") as dst:
        for line in src:
            cut = json.loads(line)
            cut.pop("custom", None)
            dst.write(json.dumps(cut) + "\n")
    model = train_tokenizer(stripped, tmp_path / "tok", 128, progress=False)
    out = tmp_path / "p.yaml"
    assert main(["bins", str(stripped), "--tokenizer", str(model), "--buckets", "4", "--out", str(out), "-q",
                 "--no-padding"]) == 0
    arrays = read_cut_arrays(stripped, with_texts=True, progress=False)
    tokens = count_tokens(load_tokenizer(model), arrays.texts)
    est = estimate_2d_bins(arrays.durations, tokens, 4, 2)
    assert [tuple(b) for b in load_profile(out).bucket_duration_bins] == est.bins
