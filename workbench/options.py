"""What the commands and the Python API share about their input: argparse types that name the range of an
option, the integer check of API arguments, and the notice a run prints when it leaves out more than a small
share of its data."""

from __future__ import annotations

import argparse
import math
import numbers
import sys

DROP_NOTICE_SHARE = 0.01  # a run that leaves out more than this share of its data says so (and --strict refuses)
WORKER_NICENESS = 0  # nice levels (0-19) DataLoader workers run below the training process (0: the same priority)
MAX_NICENESS = 19  # the lowest CPU priority a process can take, in nice levels above the default


def number_in(kind, low=None, high=None, *, low_open=False, high_open=False, unit=""):
    """An argparse ``type`` that parses ``kind`` and checks it lies in the range, naming it when not."""
    lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
    what = {int: "an integer", float: "a number"}[kind]
    if low is not None and high is not None:
        span = f"in {lo}{low}, {high}{hi}"
    elif low is not None:
        span = f"{'>' if low_open else '>='} {low}"
    else:
        span = f"{'<' if high_open else '<='} {high}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {span}{unit}, got {text!r}") from None
        if math.isnan(value) or (low is not None and (value < low or low_open and value == low)) \
                or (high is not None and (value > high or high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {span}{unit}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def check_int(value, name: str, minimum: int = 0) -> int:
    """``value`` as an int when it is an integer (not a bool) >= ``minimum``; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return number_in(int, 1)(text)


def count_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return number_in(int, 0)(text)


def seconds(text: str) -> float:
    """argparse type: a duration in seconds, > 0."""
    return number_in(float, 0, low_open=True, unit=" seconds")(text)


def fraction(text: str) -> float:
    """argparse type: a share in [0, 1]."""
    return number_in(float, 0, 1)(text)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return number_in(float, 0, float("inf"), low_open=True, high_open=True)(text)


def dropped_data_line(total: int, reasons: dict[str, int], *, what: str = "utterances") -> str | None:
    """One line saying how much of ``total`` was left out and why (``reasons``: reason -> count), or None when
    the share left out is at most DROP_NOTICE_SHARE."""
    dropped = sum(reasons.values())
    if total <= 0 or dropped <= DROP_NOTICE_SHARE * total:
        return None
    why = ", ".join(f"{n} {reason}" for reason, n in reasons.items() if n)
    return f"{dropped} of {total} {what} ({100 * dropped / total:.1f} %) left out: {why}"


def check_dropped(line: str | None, *, strict: bool) -> None:
    """Print the dropped-data line to stderr, or with ``strict`` raise ValueError with it."""
    if line is None:
        return
    if strict:
        raise ValueError(f"{line} (--strict: refusing; widen the limits or drop --strict)")
    print(f"warning: {line}", file=sys.stderr)
