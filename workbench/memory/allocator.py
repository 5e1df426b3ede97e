"""Turn on expandable segments for dynamic batch shapes, without clobbering what the user chose.

With batch shapes that change every step near the memory limit, the caching allocator keeps cutting
and freeing device segments (cudaMalloc/cudaFree, retries) every step; expandable segments grow one
segment per stream in place instead. :func:`configure_allocator` sets it up:

- before CUDA is initialized: through the environment (``PYTORCH_ALLOC_CONF`` and the older
  ``PYTORCH_CUDA_ALLOC_CONF``, both written with the same merged string), read when CUDA initializes;
- after: through the runtime setter the installed torch has, with the current settings read back and
  passed again (the setter resets options it is not given), then cached blocks are released so new
  segments are expandable (blocks still in use stay in their old segments until freed);
- never: without CUDA, on a platform other than Linux, with the ``cudaMallocAsync`` backend or a
  pluggable allocator (e.g. RMM), when the user's own settings say ``expandable_segments:False``
  (respected, with one warning), or when the caller opts out.

It is idempotent: once the settings hold ``expandable_segments:True`` a call changes nothing.
:func:`switch_expandable_segments` is the A/B tool (benchmarks, notebooks): it forces the setting either
way in a running process, overriding the user's choice, so it is not for training code.
The torch side is an :class:`AllocatorRuntime` of plain callables, so tests can pass their own.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, MutableMapping

from workbench.memory.settings import (ENV_VARS, backend_setting, effective_env_settings,
                                       expandable_segments_setting, merge_settings, parse_settings)

_warned_user_disabled: set[str] = set()  # settings strings we already warned about (warn once each)


@dataclass(frozen=True)
class AllocatorStatus:
    """What :func:`configure_allocator` did and why."""

    action: str  # "set_env" | "set_runtime" | "already_active" | "skipped"
    reason: str  # why, in one sentence
    skip_reason: str | None = None  # "opt_out" | "unsupported_platform" | "no_cuda" | "cudaMallocAsync"
    #                                 | "pluggable" | "user_disabled"; None unless skipped
    expandable_segments: bool | None = None  # what the allocator uses after the call (None: not ours/unknown)
    settings_before: str | None = None  # the settings string found (None: nothing set)
    settings_after: str | None = None  # the settings string in effect after the call
    source: str = "defaults"  # where settings_before came from: an env var name, "runtime" or "defaults"
    released_cache: bool = False  # whether cached blocks were released after a runtime change

    @property
    def changed(self) -> bool:
        return self.action in ("set_env", "set_runtime")

    def __str__(self) -> str:
        return f"allocator {self.action}: {self.reason}"


@dataclass
class AllocatorRuntime:
    """The torch side of the allocator as plain callables; :func:`torch_runtime` builds the real one."""

    platform: str  # sys.platform
    cuda_available: Callable[[], bool]
    cuda_initialized: Callable[[], bool]
    backend: Callable[[], str]  # "native" | "cudaMallocAsync" | "pluggable" (the allocator in use)
    get_settings: Callable[[], str | None]  # the settings string in effect (only called after CUDA init)
    set_settings: Callable[[str], None]  # the runtime setter (only called after CUDA init)
    release_cached: Callable[[], None]  # give cached, unused blocks back to the device
    setter_name: str = "?"  # which torch function set_settings calls, for messages


def torch_runtime() -> AllocatorRuntime:
    """The installed torch's allocator functions (newest API first)."""
    import torch

    c = torch._C
    if hasattr(c, "_accelerator_setAllocatorSettings"):  # torch >= 2.9
        setter, setter_name = c._accelerator_setAllocatorSettings, "torch._C._accelerator_setAllocatorSettings"
    elif hasattr(c, "_cuda_cudaCachingAllocator_set_allocator_settings"):  # older torch
        setter = c._cuda_cudaCachingAllocator_set_allocator_settings
        setter_name = "torch.cuda.memory._set_allocator_settings"
    else:
        def setter(_: str) -> None:
            raise RuntimeError("this torch has no runtime allocator settings setter")
        setter_name = "none"

    def get_settings() -> str | None:
        if hasattr(c, "_accelerator_getAllocatorSettings"):
            return c._accelerator_getAllocatorSettings()
        # Older torch: the snapshot carries the last settings string under the env var's name.
        settings = torch.cuda.memory._snapshot().get("allocator_settings", {})
        for key in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
            if key in settings:
                return settings[key]
        return None

    def backend() -> str:
        try:
            return torch.cuda.memory.get_allocator_backend()
        except (AttributeError, RuntimeError):
            return "native"

    return AllocatorRuntime(platform=sys.platform, cuda_available=torch.cuda.is_available,
                            cuda_initialized=torch.cuda.is_initialized, backend=backend,
                            get_settings=get_settings, set_settings=setter,
                            release_cached=torch.cuda.empty_cache, setter_name=setter_name)


def configure_allocator(expandable_segments: bool = True, *, environ: MutableMapping[str, str] | None = None,
                        runtime: AllocatorRuntime | None = None, release_cached: bool = True,
                        warn: bool = True) -> AllocatorStatus:
    """Turn expandable segments on for the CUDA caching allocator, keeping every option the user set.

    ``expandable_segments=False`` is the opt-out: nothing is touched. ``environ`` defaults to
    ``os.environ`` and ``runtime`` to :func:`torch_runtime` (tests pass their own). ``release_cached``
    releases cached blocks after a runtime change so new segments are expandable. ``warn`` False keeps the
    once-per-settings warning about a user's ``expandable_segments:False`` for a later call (a preview).
    Safe to call again.
    """
    if not expandable_segments:
        return AllocatorStatus("skipped", "opt-out: configure_allocator(expandable_segments=False) leaves "
                               "the allocator as it is", skip_reason="opt_out")
    rt = runtime if runtime is not None else torch_runtime()
    env = os.environ if environ is None else environ
    if not rt.platform.startswith("linux"):
        return AllocatorStatus("skipped", f"expandable segments are not supported on platform "
                               f"{rt.platform!r} (Linux only)", skip_reason="unsupported_platform")
    if not rt.cuda_available():
        return AllocatorStatus("skipped", "no CUDA device: nothing to configure", skip_reason="no_cuda")

    initialized = rt.cuda_initialized()
    if initialized:
        source, current = "runtime", rt.get_settings()
    else:
        source, current = effective_env_settings(env)
        source = source or "defaults"
    options = parse_settings(current)
    seen = dict(settings_before=current, settings_after=current, source=source)

    backend = backend_setting(options)
    if backend == "native":
        backend = rt.backend()
    if backend != "native":
        kind = "cudaMallocAsync" if backend == "cudaMallocAsync" else "pluggable"
        return AllocatorStatus("skipped", f"the {backend!r} allocator backend is in use: expandable segments "
                               "belong to the native caching allocator", skip_reason=kind, **seen)

    user_choice = expandable_segments_setting(options)
    if user_choice is False:
        key = current or ""
        if warn and key not in _warned_user_disabled:
            _warned_user_disabled.add(key)
            warnings.warn(f"allocator settings from {source} say expandable_segments:False; respecting it "
                          "(dynamic batch shapes may re-allocate device memory every step)", stacklevel=2)
        return AllocatorStatus("skipped", f"the user's settings ({source}) say expandable_segments:False; "
                               "respected", skip_reason="user_disabled", expandable_segments=False, **seen)
    if user_choice is True:
        return AllocatorStatus("already_active", f"expandable_segments:True already set ({source}); nothing "
                               "to do", expandable_segments=True, **seen)

    return _turn_expandable_segments_on(rt, env, current, source, len(options), initialized=initialized,
                                        release_cached=release_cached)


def _turn_expandable_segments_on(rt: AllocatorRuntime, env: MutableMapping[str, str], current: str | None,
                                 source: str, num_user_options: int, *, initialized: bool,
                                 release_cached: bool) -> AllocatorStatus:
    """Add ``expandable_segments:True`` to the user's settings: in the environment before CUDA starts, else
    through the runtime setter (releasing cached blocks when asked, so new segments are expandable)."""
    merged = merge_settings(current, expandable_segments="True")
    if not initialized:
        for name in ENV_VARS:
            env[name] = merged
        return AllocatorStatus("set_env", f"CUDA not initialized yet: wrote {merged!r} to "
                               f"{' and '.join(ENV_VARS)} (kept {num_user_options} user option(s) from {source})",
                               expandable_segments=True, settings_before=current, settings_after=merged,
                               source=source)
    rt.set_settings(merged)
    if release_cached:
        rt.release_cached()
    return AllocatorStatus("set_runtime", f"CUDA already initialized: set {merged!r} through "
                           f"{rt.setter_name} (kept {num_user_options} user option(s))"
                           + ("; released cached blocks" if release_cached else ""),
                           expandable_segments=True, settings_before=current, settings_after=merged,
                           source=source, released_cache=release_cached)


def preview_configure_allocator(user_settings: str | None) -> AllocatorStatus:
    """What :func:`configure_allocator` would do with these user settings (a ``PYTORCH_ALLOC_CONF``
    string) on a Linux GPU machine before CUDA starts; nothing on this machine is touched."""
    runtime = AllocatorRuntime(platform="linux", cuda_available=lambda: True, cuda_initialized=lambda: False,
                               backend=lambda: "native", get_settings=lambda: None,
                               set_settings=lambda settings: None, release_cached=lambda: None,
                               setter_name="(preview)")
    environ = {} if user_settings is None else {ENV_VARS[0]: user_settings}
    return configure_allocator(environ=environ, runtime=runtime, warn=False)  # the status says it


def switch_expandable_segments(enabled: bool, *, runtime: AllocatorRuntime | None = None) -> str:
    """Force expandable segments on or off in a running process and release cached blocks, so segments
    made from now on are of the new kind (blocks in use stay where they are). Every other option in effect
    is passed back to the setter. For A/B measurements: it overrides a user's choice. Needs CUDA initialized
    and the native caching allocator (RuntimeError otherwise). Returns the settings string in effect."""
    rt = runtime if runtime is not None else torch_runtime()
    if not (rt.cuda_available() and rt.cuda_initialized()):
        raise RuntimeError("switch_expandable_segments needs CUDA initialized (before that, set the environment "
                           "or call configure_allocator)")
    current = rt.get_settings()
    backend = backend_setting(parse_settings(current))
    if backend == "native":
        backend = rt.backend()
    if backend != "native":
        raise RuntimeError(f"switch_expandable_segments: the {backend!r} allocator backend has no expandable segments")
    rt.set_settings(merge_settings(current, expandable_segments=str(bool(enabled))))
    rt.release_cached()
    now = rt.get_settings()
    if expandable_segments_setting(parse_settings(now)) is not bool(enabled):
        raise RuntimeError(f"switch_expandable_segments({enabled}): {rt.setter_name} left the settings at {now!r}")
    return now


def current_allocator_settings() -> str | None:
    """The settings string in effect: torch's (after CUDA init) or the one torch will read from the env."""
    rt = torch_runtime()
    if rt.cuda_available() and rt.cuda_initialized():
        return rt.get_settings()
    return effective_env_settings(os.environ)[1]
