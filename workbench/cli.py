"""`python -m workbench <command>`: one sub-command per idea, each defined beside its library code.

Each module in COMMAND_MODULES has ``register(subparsers)`` that adds its sub-command(s) and sets
``func`` on the parser to a function taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading

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


INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


@contextlib.contextmanager
def interrupts_spare_cleanup():
    """Ctrl-C (SIGINT) raises KeyboardInterrupt, except while one is already being handled: then the command
    is removing its temp files and the folders it made, and pressing Ctrl-C again must not leave them behind.
    (A KeyboardInterrupt swallowed inside a C extension is not being handled: the next Ctrl-C raises again.)
    The previous handler is back afterwards, unless the block set another. Outside the main thread, nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is interrupt:
            signal.signal(signal.SIGINT, previous)


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv`` (default: the command line). Returns its exit code, or exits with it when
    ``argv`` is None: 0 done, 2 a one-line error, 130 stopped by Ctrl-C."""
    with interrupts_spare_cleanup():
        try:
            code = _main(argv)
        except KeyboardInterrupt:
            if argv is None:  # this process ends now: a Ctrl-C on the way out changes nothing
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            words = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("-")]
            command = " ".join(words[:2] if words[:1] == ["corpus"] else words[:1])
            print(f"workbench {command}: interrupted; stopped, and what it had not finished writing was removed",
                  file=sys.stderr)
            code = INTERRUPTED_EXIT_CODE
    if argv is None:
        sys.exit(code)
    return code


def _main(argv: list[str] | None) -> int:
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
    return code or 0
