import pytest

from workbench.memory.settings import (backend_setting, effective_env_settings, expandable_segments_setting,
                                       format_settings, merge_settings, parse_settings,
                                       settings_differences)


def test_parse_keeps_order_and_bracketed_lists():
    text = "max_split_size_mb:256, roundup_power2_divisions:[256:1,512:2,>:1],garbage_collection_threshold:0.6"
    assert parse_settings(text) == {"max_split_size_mb": "256",
                                    "roundup_power2_divisions": "[256:1,512:2,>:1]",
                                    "garbage_collection_threshold": "0.6"}
    assert list(parse_settings(text)) == ["max_split_size_mb", "roundup_power2_divisions",
                                          "garbage_collection_threshold"]


def test_parse_empty_and_none():
    assert parse_settings(None) == {}
    assert parse_settings("") == {}
    assert parse_settings(" , ") == {}


@pytest.mark.parametrize("bad, words", [("max_split_size_mb", "key:value"), (":3", "key:value"),
                                        ("a:1,a:2", "2 times"), ("r:[1:2", "unclosed"), ("r:1]", "unmatched")])
def test_parse_rejects_bad_strings_naming_the_problem(bad, words):
    with pytest.raises(ValueError, match=words):
        parse_settings(bad)


def test_format_is_inverse_of_parse():
    text = "backend:native,roundup_power2_divisions:[256:1,>:2],max_split_size_mb:128"
    assert format_settings(parse_settings(text)) == text


def test_merge_keeps_every_user_option_and_replaces_in_place():
    user = "max_split_size_mb:256,garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,>:4]"
    merged = merge_settings(user, expandable_segments="True")
    assert merged == user + ",expandable_segments:True"
    assert merge_settings("expandable_segments:False,max_split_size_mb:64", expandable_segments="True") == \
        "expandable_segments:True,max_split_size_mb:64"
    assert merge_settings(None, expandable_segments="True") == "expandable_segments:True"


def test_expandable_and_backend_values():
    assert expandable_segments_setting({}) is None
    assert expandable_segments_setting({"expandable_segments": "True"}) is True
    assert expandable_segments_setting({"expandable_segments": "False"}) is False
    with pytest.raises(ValueError, match="expandable_segments"):
        expandable_segments_setting({"expandable_segments": "yes"})
    assert backend_setting({}) == "native"
    assert backend_setting(parse_settings("backend:cudaMallocAsync")) == "cudaMallocAsync"


def test_env_precedence_follows_torch():
    assert effective_env_settings({}) == (None, None)
    assert effective_env_settings({"PYTORCH_CUDA_ALLOC_CONF": "a:1"}) == ("PYTORCH_CUDA_ALLOC_CONF", "a:1")
    assert effective_env_settings({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"}) == \
        ("PYTORCH_ALLOC_CONF", "b:2")
    assert effective_env_settings({"PYTORCH_ALLOC_CONF": ""}) == ("PYTORCH_ALLOC_CONF", "")


def test_settings_differences_read_what_a_string_leaves_out_as_torch_does():
    assert settings_differences("expandable_segments:True", "expandable_segments:True") == []
    assert settings_differences("", None) == []  # both torch's defaults
    assert settings_differences("", "expandable_segments:False,backend:native") == []
    assert settings_differences("expandable_segments:True", "") == ["expandable_segments: True -> False"]
    assert settings_differences("expandable_segments:True,max_split_size_mb:256", "expandable_segments:True") == [
        "max_split_size_mb: 256 -> (unset)"]
    assert settings_differences(None, "backend:cudaMallocAsync,roundup_power2_divisions:4") == [
        "backend: native -> cudaMallocAsync", "roundup_power2_divisions: (unset) -> 4"]
    with pytest.raises(ValueError, match="'expandable_segments' is not 'key:value'"):
        settings_differences("expandable_segments", "")
