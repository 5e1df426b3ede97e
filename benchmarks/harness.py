"""What every bench shares: smoke-run checks, the device, incremental saves, failures and exit codes, and
writing a record (``benchmarks/results/<name>.json``) with its provenance. Nothing is typed by hand."""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from workbench.atomic import write_text_atomically
from workbench.records.results import RESULTS_DIR, device_info, git_commit

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


def measure_each(names: list[str], measure: Callable[[str], tuple[dict, list[str]]], *, budget_s: float = 0,
                 save: Callable[[dict, list[str]], None], spec_of: Callable[[str], str] = str,
                 ) -> tuple[dict, list[str]]:
    """``measure(name) -> (entry, failed checks)`` for each of ``names`` in turn, ``save(entries, failures)``
    after each; a model that raises gets ``{"spec", "error"}`` (one line) and the others still run; none
    starts after ``budget_s`` seconds (0: no limit). Returns (entries by name, failures)."""
    entries: dict[str, dict] = {}
    failures: list[str] = []
    t0 = time.perf_counter()
    for name in names:
        if budget_s and time.perf_counter() - t0 > budget_s:
            failures.append(f"{name}: not run (budget of {budget_s:g} s spent)")
            continue
        try:
            entries[name], failed = measure(name)
            failures += failed
        except Exception as e:  # noqa: BLE001 - one model's failure is recorded; the others still run
            entries[name] = {"spec": spec_of(name),
                             "error": f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"}
            failures.append(f"{name}: {entries[name]['error']}")
            from workbench.memory.oom import release_memory  # here: reading records needs no torch

            release_memory()
        save(entries, failures)
    return entries, failures


def models_saver(name: str, what: str, buckets: list, args) -> Callable[[dict, list[str]], None]:
    """``save(models, failures)`` for :func:`measure_each`: writes the record ``name`` ({buckets, models,
    failures}, ``vars(args)`` as its params) to ``args.out``; a smoke run's ``what`` says its peaks are modeled."""
    what += " (SMOKE: modeled peak, not a measurement)" if args.smoke else ""

    def save(models: dict, failures: list[str]) -> None:
        write_result(name, what=what, figures={"buckets": buckets, "models": models, "failures": failures},
                     params=dict(vars(args)), out_dir=args.out)
    return save


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

