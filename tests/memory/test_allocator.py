"""The settings logic of configure_allocator against a runtime that behaves like torch's allocator config:
the setter replaces the whole string and resets max_split_size_mb, garbage_collection_threshold and
roundup_power2_divisions when they are left out."""

import warnings

import pytest

from workbench.memory import allocator as allocator_module
from workbench.memory.allocator import AllocatorRuntime, configure_allocator
from workbench.memory.settings import RESET_BY_SETTER, parse_settings


class TorchLikeConfig:
    """Mimics torch: the last settings string, the effective options, and what was called."""

    def __init__(self, settings=None, *, initialized=True, available=True, backend="native", platform="linux"):
        self.settings = settings
        self.effective = parse_settings(settings)
        self.initialized, self.available, self.backend_name, self.platform = initialized, available, backend, platform
        self.set_calls, self.release_calls = [], 0

    def set(self, text):
        self.set_calls.append(text)
        new = parse_settings(text)
        for key in RESET_BY_SETTER:  # torch resets these to defaults when absent
            self.effective.pop(key, None)
        self.effective.update(new)
        self.settings = text

    def release(self):
        self.release_calls += 1

    def runtime(self):
        return AllocatorRuntime(platform=self.platform, cuda_available=lambda: self.available,
                                cuda_initialized=lambda: self.initialized, backend=lambda: self.backend_name,
                                get_settings=lambda: self.settings, set_settings=self.set,
                                release_cached=self.release, setter_name="fake")


@pytest.fixture(autouse=True)
def fresh_warnings():
    allocator_module._warned_user_disabled.clear()
    yield
    allocator_module._warned_user_disabled.clear()


def test_before_cuda_init_writes_both_env_vars_keeping_user_options():
    cfg = TorchLikeConfig(initialized=False)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256,garbage_collection_threshold:0.7"}
    status = configure_allocator(environ=env, runtime=cfg.runtime())
    expected = "max_split_size_mb:256,garbage_collection_threshold:0.7,expandable_segments:True"
    assert status.action == "set_env" and status.changed and status.expandable_segments is True
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": expected, "PYTORCH_ALLOC_CONF": expected}
    assert status.source == "PYTORCH_CUDA_ALLOC_CONF" and status.settings_after == expected
    assert cfg.set_calls == [] and cfg.release_calls == 0  # no runtime call before init


def test_before_init_new_env_var_wins_like_in_torch():
    cfg = TorchLikeConfig(initialized=False)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}
    status = configure_allocator(environ=env, runtime=cfg.runtime())
    assert status.source == "PYTORCH_ALLOC_CONF"
    assert env["PYTORCH_ALLOC_CONF"] == env["PYTORCH_CUDA_ALLOC_CONF"] == \
        "max_split_size_mb:512,expandable_segments:True"


def test_before_init_with_nothing_set():
    env = {"OTHER": "x"}
    status = configure_allocator(environ=env, runtime=TorchLikeConfig(initialized=False).runtime())
    assert status.source == "defaults" and status.settings_before is None
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True" and env["OTHER"] == "x"


def test_after_init_uses_runtime_setter_and_keeps_user_options():
    user = "max_split_size_mb:256,garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,>:4]"
    cfg = TorchLikeConfig(user)
    env = {}
    status = configure_allocator(environ=env, runtime=cfg.runtime())
    assert status.action == "set_runtime" and status.released_cache
    assert cfg.set_calls == [user + ",expandable_segments:True"]
    assert cfg.effective == {"max_split_size_mb": "256", "garbage_collection_threshold": "0.6",
                             "roundup_power2_divisions": "[256:1,>:4]", "expandable_segments": "True"}
    assert cfg.release_calls == 1
    assert env == {}  # env is left alone after init: torch does not read it again


def test_after_init_can_skip_release():
    cfg = TorchLikeConfig(None)
    status = configure_allocator(environ={}, runtime=cfg.runtime(), release_cached=False)
    assert status.action == "set_runtime" and not status.released_cache and cfg.release_calls == 0
    assert cfg.set_calls == ["expandable_segments:True"]


def test_runtime_settings_win_over_env_after_init():
    cfg = TorchLikeConfig("max_split_size_mb:128")
    env = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:999"}  # changed after init: torch ignores it
    configure_allocator(environ=env, runtime=cfg.runtime())
    assert cfg.set_calls == ["max_split_size_mb:128,expandable_segments:True"]


@pytest.mark.parametrize("initialized", [False, True])
def test_idempotent(initialized):
    cfg = TorchLikeConfig("max_split_size_mb:256" if initialized else None, initialized=initialized)
    env = {} if initialized else {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}
    first = configure_allocator(environ=env, runtime=cfg.runtime())
    env_after_first, calls_after_first = dict(env), list(cfg.set_calls)
    second = configure_allocator(environ=env, runtime=cfg.runtime())
    third = configure_allocator(environ=env, runtime=cfg.runtime())
    assert first.changed
    assert second.action == third.action == "already_active" and not second.changed
    assert env == env_after_first and cfg.set_calls == calls_after_first
    assert cfg.release_calls == (1 if initialized else 0)


def test_env_set_before_init_is_seen_after_init():
    env = {}
    configure_allocator(environ=env, runtime=TorchLikeConfig(initialized=False).runtime())
    cfg = TorchLikeConfig(env["PYTORCH_ALLOC_CONF"])  # what torch read at init
    status = configure_allocator(environ=env, runtime=cfg.runtime())
    assert status.action == "already_active" and cfg.set_calls == []


@pytest.mark.parametrize("initialized", [False, True])
def test_user_false_is_respected_with_one_warning(initialized):
    user = "expandable_segments:False,max_split_size_mb:64"
    cfg = TorchLikeConfig(user if initialized else None, initialized=initialized)
    env = {} if initialized else {"PYTORCH_ALLOC_CONF": user}
    with pytest.warns(UserWarning, match="expandable_segments:False"):
        status = configure_allocator(environ=env, runtime=cfg.runtime())
    assert status.skip_reason == "user_disabled" and status.expandable_segments is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        again = configure_allocator(environ=env, runtime=cfg.runtime())
    assert again.skip_reason == "user_disabled"
    assert cfg.set_calls == [] and env == ({} if initialized else {"PYTORCH_ALLOC_CONF": user})


def test_opt_out_touches_nothing():
    cfg = TorchLikeConfig(None, initialized=False)
    env = {}
    status = configure_allocator(False, environ=env, runtime=cfg.runtime())
    assert status.action == "skipped" and status.skip_reason == "opt_out"
    assert env == {} and cfg.set_calls == []


@pytest.mark.parametrize("kwargs, env, reason", [
    (dict(available=False), {}, "no_cuda"),
    (dict(platform="win32"), {}, "unsupported_platform"),
    (dict(platform="darwin"), {}, "unsupported_platform"),
    (dict(backend="cudaMallocAsync"), {}, "cudaMallocAsync"),
    (dict(backend="pluggable"), {}, "pluggable"),
    (dict(initialized=False), {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, "cudaMallocAsync"),
])
def test_every_skip_reason_changes_nothing(kwargs, env, reason):
    cfg = TorchLikeConfig(None, **kwargs)
    env_before = dict(env)
    status = configure_allocator(environ=env, runtime=cfg.runtime())
    assert status.action == "skipped" and status.skip_reason == reason and not status.changed
    assert str(status).startswith("allocator skipped: ") and len(status.reason) > 20
    assert env == env_before and cfg.set_calls == [] and cfg.release_calls == 0


def test_bad_user_settings_raise_naming_the_field():
    cfg = TorchLikeConfig(None, initialized=False)
    with pytest.raises(ValueError, match="expandable_segments"):
        configure_allocator(environ={"PYTORCH_ALLOC_CONF": "expandable_segments:yes"}, runtime=cfg.runtime())


def test_real_torch_without_cuda_skips_and_leaves_env(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    status = configure_allocator()
    assert status.skip_reason == "no_cuda"
    import os
    assert "PYTORCH_ALLOC_CONF" not in os.environ


def test_preview_shows_the_decision_for_the_users_settings_and_touches_nothing(monkeypatch):
    import os
    import warnings

    from workbench.memory import AllocatorRuntime, configure_allocator, preview_configure_allocator
    from workbench.memory.settings import ENV_VARS

    before = {name: os.environ.get(name) for name in ENV_VARS}
    status = preview_configure_allocator("max_split_size_mb:256")
    assert status.action == "set_env" and status.settings_after == "max_split_size_mb:256,expandable_segments:True"
    assert preview_configure_allocator("expandable_segments:False").skip_reason == "user_disabled"
    assert preview_configure_allocator("backend:cudaMallocAsync").skip_reason == "cudaMallocAsync"
    assert {name: os.environ.get(name) for name in ENV_VARS} == before
    # a real run with those settings still gets its one warning
    rt = AllocatorRuntime(platform="linux", cuda_available=lambda: True, cuda_initialized=lambda: False,
                          backend=lambda: "native", get_settings=lambda: None, set_settings=lambda s: None,
                          release_cached=lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_allocator(environ={ENV_VARS[0]: "expandable_segments:False"}, runtime=rt)
    assert any("expandable_segments:False" in str(w.message) for w in caught)


def test_switch_forces_either_way_keeping_other_options_and_releases():
    from workbench.memory.allocator import switch_expandable_segments

    user = "max_split_size_mb:256,expandable_segments:False,garbage_collection_threshold:0.6"
    cfg = TorchLikeConfig(user)
    assert switch_expandable_segments(True, runtime=cfg.runtime()) == \
        "max_split_size_mb:256,expandable_segments:True,garbage_collection_threshold:0.6"
    assert switch_expandable_segments(False, runtime=cfg.runtime()).count("expandable_segments:False") == 1
    assert cfg.effective == {"max_split_size_mb": "256", "expandable_segments": "False",
                             "garbage_collection_threshold": "0.6"}
    assert cfg.release_calls == 2  # after each switch: new segments are of the new kind


@pytest.mark.parametrize("cfg_kwargs, words", [
    (dict(initialized=False), "CUDA initialized"),
    (dict(available=False), "CUDA initialized"),
    (dict(backend="cudaMallocAsync"), "cudaMallocAsync"),
    (dict(settings="backend:cudaMallocAsync"), "cudaMallocAsync"),
])
def test_switch_refuses_without_cuda_or_native_allocator_and_touches_nothing(cfg_kwargs, words):
    from workbench.memory.allocator import switch_expandable_segments

    cfg = TorchLikeConfig(**cfg_kwargs)
    with pytest.raises(RuntimeError, match=words):
        switch_expandable_segments(True, runtime=cfg.runtime())
    assert cfg.set_calls == [] and cfg.release_calls == 0


def test_switch_says_so_when_the_setter_did_not_take():
    from workbench.memory.allocator import switch_expandable_segments

    cfg = TorchLikeConfig(None)
    runtime = cfg.runtime()
    ignoring = AllocatorRuntime(**{**runtime.__dict__, "set_settings": lambda text: None})
    with pytest.raises(RuntimeError, match="left the settings"):
        switch_expandable_segments(True, runtime=ignoring)
