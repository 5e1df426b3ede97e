"""Allocator settings strings: parse, merge, format. Pure functions, string in, string out.

PyTorch's caching allocator reads a string like
``"max_split_size_mb:256,roundup_power2_divisions:[256:1,512:2,>:1],expandable_segments:True"`` from
``PYTORCH_ALLOC_CONF`` (newer torch; it wins when both are set) or ``PYTORCH_CUDA_ALLOC_CONF`` (older
name, still read as a fallback), or at run time from the settings setter. Options are ``key:value``
separated by commas; a value may be a bracketed list that itself holds commas and colons.

The runtime setter resets ``max_split_size_mb``, ``garbage_collection_threshold`` and
``roundup_power2_divisions`` to their defaults whenever the string leaves them out, so a change must
always pass the user's current options back: :func:`merge_settings` does that.
"""

from __future__ import annotations

from typing import Mapping

ENV_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch reads the first one set
RESET_BY_SETTER = ("max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")
BOOL_VALUES = {"True": True, "False": False}


def parse_settings(text: str | None) -> dict[str, str]:
    """``"a:1,b:[x:1,y:2]"`` -> ``{"a": "1", "b": "[x:1,y:2]"}``, keys in order; whitespace is ignored.

    Raises ValueError naming the option for an entry without ``:``, an empty key or value, unbalanced
    brackets, or a key given twice.
    """
    text = "".join((text or "").split())
    options: dict[str, str] = {}
    for entry in _split_top_level(text):
        key, sep, value = entry.partition(":")
        if not sep or not key or not value:
            raise ValueError(f"allocator setting {entry!r} is not 'key:value' (in {text!r})")
        if key in options:
            raise ValueError(f"allocator setting {key!r} is given 2 times (in {text!r})")
        options[key] = value
    return options


def _split_top_level(text: str) -> list[str]:
    entries, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"allocator settings have an unmatched ']' at character {i} (in {text!r})")
        elif ch == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"allocator settings have {depth} unclosed '[' (in {text!r})")
    entries.append(text[start:])
    return [e for e in entries if e]


def format_settings(options: Mapping[str, str]) -> str:
    """The inverse of :func:`parse_settings`: ``{"a": "1"}`` -> ``"a:1"`` (order kept)."""
    return ",".join(f"{k}:{v}" for k, v in options.items())


def merge_settings(current: str | None, **updates: str) -> str:
    """``current`` with ``updates`` applied: existing keys are replaced in place, new keys appended,
    every other option passed back unchanged (so the runtime setter resets nothing)."""
    options = parse_settings(current)
    for key, value in updates.items():
        options[key] = value
    return format_settings(options)


def expandable_segments_setting(options: Mapping[str, str]) -> bool | None:
    """True/False when ``expandable_segments`` is set, None when absent. ValueError on another value."""
    value = options.get("expandable_segments")
    if value is None:
        return None
    if value not in BOOL_VALUES:
        raise ValueError(f"allocator setting expandable_segments must be True or False, got {value!r}")
    return BOOL_VALUES[value]


def backend_setting(options: Mapping[str, str]) -> str:
    """The allocator backend the settings ask for: ``"native"`` unless ``backend:`` says otherwise."""
    return options.get("backend", "native")


# What torch uses for an option a settings string leaves out, where it matters to a profile's batch sizes.
TORCH_DEFAULTS = {"expandable_segments": "False", "backend": "native"}


def settings_differences(searched: str | None, current: str | None) -> list[str]:
    """The options that differ between two settings strings, each as ``"key: searched -> current"`` (an
    option left out reads as torch's default for it, or ``(unset)``); [] when they agree. ValueError naming
    the option for a malformed string."""
    before, after = ({**TORCH_DEFAULTS, **parse_settings(text)} for text in (searched, current))
    return [f"{key}: {before.get(key, '(unset)')} -> {after.get(key, '(unset)')}"
            for key in dict.fromkeys([*before, *after]) if before.get(key) != after.get(key)]


def effective_env_settings(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """``(variable name, settings)`` that torch will read from ``environ``, or ``(None, None)``.

    ``PYTORCH_ALLOC_CONF`` wins when both are set, as in torch; an empty value counts as set.
    """
    for name in ENV_VARS:
        if name in environ:
            return name, environ[name]
    return None, None
