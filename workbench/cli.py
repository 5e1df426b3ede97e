"""`python -m workbench <command>`: one sub-command per idea, each defined beside its library code.

Each module in COMMAND_MODULES has ``register(subparsers)`` that adds its sub-command(s) and sets
``func`` on the parser to a function taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMAND_MODULES = [
    "workbench.data.cli",         # corpus synthetic | tts | tokenizer
    "workbench.bucketing.cli",    # bins
    "workbench.oomptimizer.cli",  # oomptimize
    "workbench.models.cli",       # train
    "workbench.reporting",        # report
]


class UserError(Exception):
    """A problem with the user's input: printed as one clear line, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that part of the workbench is not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = args.func(args)
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"workbench {args.command}: error: {e}", file=sys.stderr)
        code = 2
    if argv is None:
        sys.exit(code or 0)
    return code or 0
