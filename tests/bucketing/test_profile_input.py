"""A profile file that is wrong in a way a user makes: one line naming the file and the field, never a hang."""

import re

import pytest

from workbench.bucketing import (BucketProfile, estimate_2d_bins, estimate_duration_bins, load_profile,
                                 save_profile)


def test_a_misspelled_field_is_refused_with_the_nearest_name(tmp_path):
    path = save_profile(tmp_path / "p.yaml", BucketProfile([[5.0, 40], [10.0, 80]], [8, 4], [9.0, 8.0]))
    path.write_text(path.read_text().replace("max_tps", "max_tsp"))
    with pytest.raises(ValueError, match=r"p.yaml: unknown field 'max_tsp'; did you mean 'max_tps'\?"):
        load_profile(path)


def test_yaml_aliases_are_refused_before_anything_expands_them(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    path = tmp_path / "p.yaml"
    path.write_text("bucket_duration_bins: [[5.0, 40]]\nmetadata:\n" + "".join("  " + line + "\n"
                                                                              for line in bomb.splitlines()))
    with pytest.raises(ValueError, match=r"p.yaml:\d+: not valid YAML: aliases \(\*name\) are not allowed"):
        load_profile(path)


def test_bins_never_writes_over_its_input(tmp_path, capsys):
    from workbench.cli import main

    assert main(["corpus", "synthetic", "--out", str(tmp_path), "--num-cuts", "200"]) == 0
    manifest = tmp_path / "cuts.jsonl.gz"
    before = manifest.read_bytes()
    assert main(["bins", str(manifest), "--buckets", "4", "--out", str(manifest)]) == 2
    assert "is an input of this command" in capsys.readouterr().err
    assert manifest.read_bytes() == before


def test_groups_too_small_for_the_tps_filter_are_named():
    import numpy as np

    from workbench.bucketing.estimate import estimate_2d_bins, tps_blind_groups

    durations = np.array([1.0] * 10 + [2.0] * 40)
    tokens = np.array([10] * 9 + [10_000] + [20] * 40)  # a 1000x outlier among 10 utterances
    tps = tokens[:10] / durations[:10]
    assert (tps[9] - tps.mean()) / tps.std() == pytest.approx(3.0)  # sqrt(10 - 1): never above 4, however far
    assert tps_blind_groups(durations, [1.0, 2.0, 2.0], 4.0) == [(1.0, 10)]  # the group of 40 can flag
    assert tps_blind_groups(durations, [1.0, 2.0], 2.9) == []  # 3 > 2.9: it can
    est = estimate_2d_bins(durations, tokens, 2, 1)  # bounds the estimator gives are taken as they are
    assert tps_blind_groups(durations, [d for d, _ in est.bins], 4.0) == []


def test_bins_warns_about_groups_the_tps_filter_cannot_see(tmp_path, capsys):
    from workbench.cli import main

    assert main(["corpus", "synthetic", "--out", str(tmp_path), "--num-cuts", "120"]) == 0
    capsys.readouterr()
    assert main(["bins", str(tmp_path / "cuts.jsonl.gz"), "--buckets", "12", "--out", str(tmp_path / "p.yaml"),
                 "-q"]) == 0
    err = capsys.readouterr().err
    assert "the TPS filter cannot flag an outlier in" in err and "--tps-threshold 4" in err


def test_the_allocator_settings_a_profile_was_searched_under_round_trip(tmp_path):
    searched = BucketProfile([[5.0, 40]], [8], allocator_settings="expandable_segments:True,max_split_size_mb:256")
    path = save_profile(tmp_path / "p.yaml", searched)
    assert "allocator_settings: expandable_segments:True,max_split_size_mb:256\n" in path.read_text()
    assert load_profile(path).allocator_settings == searched.allocator_settings
    defaults = load_profile(save_profile(tmp_path / "defaults.yaml", BucketProfile([5.0], [8], allocator_settings="")))
    assert defaults.allocator_settings == ""  # searched under torch's defaults: recorded, not missing
    old = save_profile(tmp_path / "old.yaml", BucketProfile([5.0], [8]))
    assert "allocator_settings" not in old.read_text() and load_profile(old).allocator_settings is None


@pytest.mark.parametrize("line, message", [
    ("allocator_setting: expandable_segments:True", r"unknown field 'allocator_setting'; did you mean "
                                                    r"'allocator_settings'\?"),
    ("allocator_settings: [1, 2]", r"field 'allocator_settings' must be a settings string like "
                                   r"'expandable_segments:True', got \[1, 2\]"),
    ("allocator_settings: expandable_segments", r"field 'allocator_settings': allocator setting "
                                                r"'expandable_segments' is not 'key:value'"),
])
def test_a_wrong_allocator_settings_field_is_named(tmp_path, line, message):
    path = save_profile(tmp_path / "p.yaml", BucketProfile([5.0], [8]))
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(ValueError, match=f"p.yaml: {message}"):
        load_profile(path)


def test_load_and_save_profile_name_an_argument_of_the_wrong_type(tmp_path):
    with pytest.raises(TypeError, match="path: expected a file path, got int"):
        load_profile(3)
    with pytest.raises(TypeError, match="profile: expected a BucketProfile, got dict"):
        save_profile(tmp_path / "p.yaml", {"bucket_duration_bins": [1.0]})
    with pytest.raises(TypeError, match="path: expected a file path, got BucketProfile"):
        save_profile(BucketProfile([1.0]), tmp_path / "p.yaml")  # arguments swapped
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call,needle", [
    (lambda: estimate_duration_bins([1.0, 2.0], 0), "num_buckets must be an integer >= 1, got 0"),
    (lambda: estimate_duration_bins([1.0, float("nan")], 1), "durations has 1 NaN or infinite values"),
    (lambda: estimate_2d_bins([1.0, 2.0], [1, 2], 1, 1.5), "num_subbuckets must be an integer >= 1, got 1.5"),
    (lambda: estimate_2d_bins([1.0, 2.0], [1, 2], 1, 1, tps_threshold=float("nan")),
     "tps_threshold must be a number > 0"),
    (lambda: estimate_2d_bins([1.0, 2.0], [1, "2"], 1, 1), "num_tokens must be numeric"),
    (lambda: estimate_2d_bins([1.0, 2.0], [1.0, 1e30], 1, 1),
     "num_tokens has 1 values at or past 2^63 (first at index 1"),
    (lambda: estimate_duration_bins([1.0, "two"], 1), "durations must be numbers of seconds"),
    (lambda: estimate_2d_bins([[1.0], [2.0]], [1, 2], 1, 1), "durations must be a 1-D array")])
def test_the_estimators_name_the_argument_that_is_wrong(call, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        call()
