"""The GPU stages of ``benchmarks/stages.toml`` as shell commands, for ``scripts/gpu_run.sh``.

    python3 -m benchmarks.stages names                                   # every stage of the table
    python3 -m benchmarks.stages writes STAGE                            # the record it writes
    python3 -m benchmarks.stages prelude STAGE                           # what runs first (may be empty)
    python3 -m benchmarks.stages shell STAGE --results DIR --left SECONDS  # the line gpu_run.sh evaluates

``prelude`` prints ``[nemo_site; ][run_before NAME COMMAND]``; gpu_run.sh evaluates it before it asks for
``shell``, so the stage's budget counts from after NeMo's install and the first step. ``shell`` prints
``run_stage NAME LIMIT [NEMO_ENV] python3 -m ...`` with every word quoted, or exits 3 (after saying why)
when the stage's budget does not fit the seconds left.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from workbench.records.stages import Stage, load_table


def stage_budget(stage: Stage, left_s: int) -> int | None:
    """The seconds the bench may spend ({budget}); None when fewer than the stage's least are left."""
    if stage.budget is None:
        return None
    margin_s, least_s, most_s, less_s = stage.budget
    b = left_s - margin_s
    if b < least_s:
        return None
    return min(b - less_s, most_s) if most_s else b - less_s


def expand(stage: Stage, results: str, budget: int | None, environ=os.environ) -> list[str]:
    """The stage's ``python3 -m`` words with the placeholders filled in."""
    words: list[str] = []
    for word in stage.run.split():
        if word == "{results}":
            words.append(results)
        elif word == "{budget}":
            if budget is None:
                raise ValueError(f"stage {stage.name}: {{budget}} needs a budget = [...] entry")
            words.append(str(budget))
        elif word == "{from}":
            earlier = Path(results) / f"{stage.writes}.json"
            words += ["--from", str(earlier)] if earlier.is_file() else []
        elif m := re.fullmatch(r"\{env:(\w+)(?::(\S+))?\}", word):
            value = environ.get(m.group(1), "")
            if m.group(2):
                words += [m.group(2), value] if value else []
            else:
                words += shlex.split(value)
        else:
            words.append(word)
    return words


def prelude_line(stage: Stage, environ=os.environ) -> str:
    """What runs before the stage: NeMo's install for a ``nemo`` stage, then its ``before`` command."""
    steps = ["nemo_site"] if stage.nemo else []
    if stage.before and environ.get("SKIP_BEFORE") != "1":
        steps.append(f"run_before {stage.name.replace('-', '_')} {shlex.quote(stage.before)}")
    return "; ".join(steps)


def shell_line(stage: Stage, results: str, left_s: int, environ=os.environ) -> str | None:
    """The line gpu_run.sh evaluates for ``stage`` after its prelude; None when its budget does not fit
    ``left_s``."""
    budget = stage_budget(stage, left_s)
    if stage.budget is not None and budget is None:
        return None
    nemo_env = '"${NEMO_ENV[@]}" ' if stage.nemo else ""
    command = shlex.join(["python3", "-m", *expand(stage, results, budget, environ)])
    return f"run_stage {stage.name.replace('-', '_')} {stage.limit_s} {nemo_env}{command}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the GPU stages of benchmarks/stages.toml")
    parser.add_argument("what", choices=["names", "writes", "prelude", "shell"])
    parser.add_argument("stage", nargs="?")
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--left", type=int, default=600, help="seconds left in the call")
    args = parser.parse_args(argv)
    stages = load_table()[1]
    if args.what == "names":
        print(" ".join(stages))
        return 0
    if args.stage not in stages:
        print(f"unknown stage '{args.stage}' (stages: {' '.join(stages)})", file=sys.stderr)
        return 2
    stage = stages[args.stage]
    if args.what == "writes":
        print(stage.writes)
        return 0
    if args.what == "prelude":
        print(prelude_line(stage))
        return 0
    line = shell_line(stage, args.results, args.left)
    if line is None:
        print(f"=== {stage.name}: SKIPPED (its budget needs more than the {args.left} s left) ===")
        return 3
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
