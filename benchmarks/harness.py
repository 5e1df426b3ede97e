"""What every bench shares: the common options, the CUDA check, parts that fail alone, incremental saves,
the exit code, and writing a record (``benchmarks/results/<name>.json``) with its provenance.

A runner reads::

    parser = bench_parser(__doc__, parts=("compare", "large"), budget_s=300)
    parser.add_argument("--repeat", type=int, default=10)        # the bench's own options
    run = start(parser, argv, name="losses", what="transducer losses ...")
    if run.wants("compare"):                                      # selected (--parts) and in budget
        with run.part("compare"):                                 # an exception becomes a recorded failure
            run.figures["compare"] = measure(...)
    return run.finish()                                           # writes the record; 0, or 1 on a failure

Nothing is typed by hand: every figure comes from a measurement in the same run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from workbench.atomic import write_text_atomically
from workbench.records.results import RESULTS_DIR, device_info, git_commit

def bench_parser(description: str | None, *, parts: tuple[str, ...] = (), budget_s: float = 0.0,
                 out_required: bool = False, default_parts: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """An argument parser with the options every bench shares: ``--out`` (the results folder, default
    benchmarks/results), ``--smoke`` (tiny shapes on any machine; needs an ``--out`` elsewhere), ``--budget-s``
    (wall seconds after which no new part starts; 0: none) and, when the bench has ``parts``, ``--parts``
    (which to run, default ``default_parts`` or all, in the bench's order)."""
    parser = argparse.ArgumentParser(description=(description or "").strip().splitlines()[0] if description else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=out_required, default=None,
                        help="folder for the JSON record" + ("" if out_required else " (default benchmarks/results)"))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes in seconds, on a CPU too; the record goes to --out, never to benchmarks/results")
    parser.add_argument("--budget-s", type=float, default=budget_s,
                        help=f"no new part starts after this many wall seconds; 0: no limit (default {budget_s:g})")
    if parts:
        default = list(parts if default_parts is None else default_parts)
        parser.add_argument("--parts", nargs="+", choices=parts, default=default, metavar="PART",
                            help=f"what to measure, any of {', '.join(parts)} (default "
                                 + ("all" if default == list(parts) else " ".join(default)) + ")")
    return parser


@dataclass
class Run:
    """One bench run: its options, the record's figures and failed checks, saved after every part."""
    name: str  # the record: <out>/<name>.json; empty: the bench writes its records itself
    what: str  # what the record measures, one line
    args: argparse.Namespace
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)  # besides the options, what ran with which settings
    started: float = field(default_factory=time.perf_counter)
    # named checks of the figures, judged at every save into figures["checks"]; a false one is a failure
    checks: Callable[[dict[str, Any]], dict[str, bool]] | None = None
    smoke_note: str = " (SMOKE: tiny shapes, not a measurement)"  # appended to ``what`` in a smoke run

    @property
    def smoke(self) -> bool:
        return bool(getattr(self.args, "smoke", False))

    def seconds(self) -> float:
        """Wall seconds since the run started."""
        return time.perf_counter() - self.started

    def over_budget(self) -> bool:
        budget = getattr(self.args, "budget_s", 0) or 0
        return bool(budget) and self.seconds() > budget

    def wants(self, part: str) -> bool:
        """True when ``part`` is selected (``--parts``) and the budget is not spent; a selected part that the
        budget stops is recorded as a failure (its figures are missing)."""
        selected = getattr(self.args, "parts", None)
        if selected is not None and part not in selected:
            return False
        if self.over_budget():
            self.failures.append(f"{part}: not run (the budget of {self.args.budget_s:g} s was spent)")
            return False
        return True

    @contextmanager
    def part(self, part: str) -> Iterator[None]:
        """Run the block as one part: an exception in it becomes a recorded failure (one line: the part, the
        exception's type and first line), GPU memory is released, and the record is saved either way. Guard
        it with :meth:`wants` to honour ``--parts`` and ``--budget-s``. Ctrl-C still stops the run."""
        try:
            yield
        except Exception as e:  # noqa: BLE001 - one part's failure is recorded; the others still run
            self.failures.append(f"{part}: {one_line(e)}")
            print(f"FAIL in {part}: {one_line(e)}", file=sys.stderr, flush=True)
            _release_memory()
        finally:
            self.save()

    def all_failures(self) -> list[str]:
        """The failed parts, then the names of the false :attr:`checks`."""
        judged = self.checks(self.figures) if self.checks is not None else {}
        return [*self.failures, *(name for name, ok in judged.items() if not ok)]

    def save(self) -> Path | None:
        """Write the record as it stands (atomically), with the failures so far and the wall seconds. A run
        without a ``name`` writes its records itself (:func:`write_result`): nothing is written here."""
        if not self.name:
            return None
        figures = dict(self.figures)
        if self.checks is not None:
            figures["checks"] = self.checks(self.figures)
        figures.update(failures=self.all_failures(), wall_s=round(self.seconds(), 3))
        if self.smoke:
            figures["smoke"] = True
        what = self.what + (self.smoke_note if self.smoke else "")
        params = {**{k: v for k, v in vars(self.args).items() if k != "out"}, **self.params}
        return write_result(self.name, what=what, figures=figures, params=params, out_dir=self.args.out)

    def each(self, names: list[str], measure: Callable[[str], tuple[dict, list[str]]], *, key: str = "models",
             spec_of: Callable[[str], str] = str) -> dict:
        """``measure(name) -> (entry, failed checks)`` for each name in turn, into ``figures[key]``: a name
        whose measure raises gets ``{"spec", "error"}`` (one line) and the others still run; the record is
        saved after each; none starts once ``--budget-s`` is spent. Returns the entries by name."""
        entries = self.figures.setdefault(key, {})
        for name in names:
            if self.over_budget():
                self.failures.append(f"{name}: not run (the budget of {self.args.budget_s:g} s was spent)")
                continue
            try:
                entries[name], failed = measure(name)
                self.failures += failed
            except Exception as e:  # noqa: BLE001 - one model's failure is recorded; the others still run
                entries[name] = {"spec": spec_of(name), "error": one_line(e)}
                self.failures.append(f"{name}: {entries[name]['error']}")
                _release_memory()
            self.save()
        return entries

    def finish(self, *, enforce_smoke: bool = False) -> int:
        """Save the record, print each failure and return the exit code; a smoke run's failures count only
        with ``enforce_smoke`` (checks that hold on any machine)."""
        path = self.save()
        if path is not None:
            print(f"wrote {path}", flush=True)
        return report_failures(self.all_failures(), smoke=self.smoke and not enforce_smoke)


def start(parser: argparse.ArgumentParser, argv: list[str] | None, *, name: str, what: str,
          needs_cuda: bool = True) -> Run:
    """Parse the options and check them: a smoke run needs an ``--out`` outside benchmarks/results, and a
    bench that ``needs_cuda`` exits with code 2 without a GPU unless it is a smoke run."""
    args = parser.parse_args(argv)
    if getattr(args, "budget_s", 0) is not None and getattr(args, "budget_s", 0) < 0:
        parser.error(f"--budget-s must be >= 0, got {args.budget_s:g}")
    if getattr(args, "smoke", False):
        check_smoke_out(parser, args.out)
    if needs_cuda and cuda_missing(getattr(args, "smoke", False)):
        raise SystemExit(2)
    return Run(name=name, what=what, args=args)


def bench_env() -> dict[str, str]:
    """This process's environment with the repository root first on PYTHONPATH, for a subprocess that runs
    ``python -m benchmarks...`` from any folder (the benchmarks are not installed)."""
    from workbench.records.results import REPO_ROOT

    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *([path] if path else [])])}


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def _release_memory() -> None:
    from workbench.memory.oom import release_memory  # here: reading records needs no torch

    release_memory()


def check_smoke_out(parser, out: str | None) -> None:
    """A --smoke run's JSON goes to an explicit --out that is not benchmarks/results (a smoke run measures
    nothing); ``parser.error`` otherwise."""
    if out is None:
        parser.error("--smoke needs --out (smoke results never go to benchmarks/results)")
    if Path(out).resolve() == RESULTS_DIR.resolve():
        parser.error(f"--smoke: --out must not be {RESULTS_DIR} (smoke results are not measurements)")


def cuda_missing(smoke: bool) -> bool:
    """True (after saying so on stderr) when a GPU benchmark runs without CUDA and without --smoke: the
    caller exits with code 2."""
    import torch  # here: reading records (reporting, summary) needs no torch

    if torch.cuda.is_available() or smoke:
        return False
    print("FAIL: this benchmark needs a CUDA GPU (or --smoke)", file=sys.stderr)
    return True


def bench_device():
    """The current CUDA device, else the CPU (smoke runs)."""
    import torch  # here: reading records (reporting, summary) needs no torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


@contextmanager
def cpu_smoke_torch(active: bool = True):
    """Torch settings for a smoke run on a CPU, restored on exit: oneDNN off (it builds kernels for every new
    shape, 1-3 s each, and benches change shapes every step) and one thread (tiny steps stall with two on a
    busy 2-core machine). ``active`` False: nothing changes."""
    if not active:
        yield
        return
    import torch  # here: reading records (reporting, summary) needs no torch

    saved = torch.backends.mkldnn.enabled, torch.get_num_threads()
    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = saved[0]
        torch.set_num_threads(saved[1])


def report_failures(failures: list[str], *, smoke: bool = False) -> int:
    """Print each failed check (a smoke run reports them without enforcing); the bench's exit code: 1 when
    a check failed outside a smoke run, else 0."""
    for f in failures:
        print(f"{'SMOKE (not enforced)' if smoke else 'FAIL'}: {f}", flush=True)
    if not failures:
        print("PASS" + (" (smoke)" if smoke else ""), flush=True)
    return 1 if failures and not smoke else 0


def write_result(name: str, *, what: str, figures: dict[str, Any], params: dict[str, Any] | None = None,
                 out_dir: str | os.PathLike | None = None, command: str | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` atomically with provenance; returns the path.

    ``figures`` holds the measurements (use :func:`summarize` for anything repeated, so the spread is
    kept); ``params`` what was run with which settings.
    """
    out = Path(out_dir) if out_dir is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "name": name,
        "what": what,
        "command": command or " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": git_commit(),
        "device": device_info(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "params": params or {},
        "figures": figures,
    }
    return write_text_atomically(out / f"{name}.json",
                                 json.dumps(record, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)

