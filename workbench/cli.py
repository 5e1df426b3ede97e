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
    "workbench.data.cli",         # corpus synthetic | tts | tokenizer | stats
    "workbench.bucketing.cli",    # bins
    "workbench.oomptimizer.cli",  # oomptimize, check-model
    "workbench.training.cli",       # train
    "workbench.reporting",        # report
]


class UserError(Exception):
    """A problem with the user's input: printed as one clear line, no traceback."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``prog: error: ...``) and exit 2, without the usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="workbench", description=__doc__.splitlines()[0])
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


def os_error_line(e: OSError) -> str:
    """One line for an OS error: the path, what went wrong, and what to do about it."""
    import errno

    path = e.filename if e.filename is not None else "?"
    advice = {errno.EROFS: "write somewhere else, e.g. under your home folder or /tmp",
              errno.EACCES: "choose a path you may write to, or fix its permissions",
              errno.EPERM: "choose a path you may write to, or fix its permissions",
              errno.EISDIR: "give a file path, e.g. a name inside that folder",
              errno.ENOTDIR: "a part of the path is a file; choose a path whose parents are folders",
              errno.ENOSPC: "free some space or write elsewhere",
              errno.ENOENT: "check the path",
              errno.EEXIST: "remove it or choose another path"}.get(e.errno)
    reason = e.strerror or str(e)
    return f"{path}: {reason}" + (f"; {advice}" if advice else "")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a bad option (one line printed) or --help: a caller of main(argv) gets the code
        if argv is None:
            raise
        return int(e.code or 0)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    command = " ".join(filter(None, [args.command, getattr(args, "corpus_command", None)]))
    try:
        code = args.func(args)
    except (UserError, ValueError) as e:
        print(f"workbench {command}: error: {e}", file=sys.stderr)
        code = 2
    except OSError as e:  # FileNotFoundError with our own message, or an OS error at a path
        message = os_error_line(e) if e.filename is not None or e.strerror else str(e)
        print(f"workbench {command}: error: {message}", file=sys.stderr)
        code = 2
    if argv is None:
        sys.exit(code or 0)
    return code or 0
