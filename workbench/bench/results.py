"""One home for benchmark result files: provenance, timing with spread, reading them back.

Every figure reported from a GPU lands in ``benchmarks/results/<name>.json`` with what ran, the command,
the git commit, the device, the date, and each figure with its spread. Nothing is typed by hand.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from workbench.atomic import write_text_atomically

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


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


def timer_for(device) -> Callable[..., dict[str, float]]:
    """:func:`time_cuda` (events) for a CUDA device, :func:`time_cpu` (wall clock) otherwise."""
    return time_cuda if str(device).startswith("cuda") else time_cpu


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


def model_summary_lines(figures: dict, line_of: Callable[[str, dict], str]) -> list[str]:
    """The lines of a record written through :func:`models_saver`: ``line_of(name, entry)`` per model measured,
    "not measured" with the error of one that raised, then each failure (a missed target) not said above."""
    models = figures["models"]
    lines = [f"- {name}: not measured: {entry['error'][:160]}" if "error" in entry else line_of(name, entry)
             for name, entry in models.items()]
    failed = [name for name, entry in models.items() if "error" in entry]
    return lines + [f"- target missed: {f}" for f in figures.get("failures", [])
                    if not any(f.startswith(f"{name}: ") for name in failed)]


def git_commit() -> str:
    """The current commit (with ``+dirty`` when the tree has changes), or 'unknown' outside git."""
    env_commit = os.environ.get("WORKBENCH_GIT_COMMIT")
    if env_commit:
        return env_commit
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_info() -> dict[str, Any]:
    """The machine the numbers come from: GPU name and memory when CUDA is there, else the CPU."""
    info: dict[str, Any] = {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    import torch  # here: reading records (reporting, summary) needs no torch

    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_bytes=props.total_memory,
                    cuda=torch.version.cuda, driver=_driver_version())
    return info


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def summarize(samples: list[float]) -> dict[str, float]:
    """Median with spread (min, max, IQR, count) of repeated measurements, in their own unit."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("summarize() needs at least one sample")
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0], xs[0], xs[0]]
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "p25": q[0], "p75": q[2],
            "n": len(xs)}


# Hand-timed rather than torch.utils.benchmark.Timer: its blocked_autorange reports means over blocks of
# calls, which hides the spread of single calls. On a function that sleeps 1 or 3 ms at random (this CPU),
# 40 calls here gave min-max 1.07-3.14 ms; blocked_autorange gave blocks of 10 with min-max 1.49-2.51 ms.
# Timer.timeit(1) per call keeps the spread but costs 5.1 us per sample against 0.19 us for perf_counter.
def time_cpu(fn: Callable[[], Any], *, repeat: int = 5, warmup: int = 1) -> dict[str, float]:
    """Wall-clock seconds of ``fn()`` on the host: warm-up runs, then ``repeat`` timed runs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return summarize(samples)


def time_cuda(fn: Callable[[], Any], *, repeat: int = 20, warmup: int = 3) -> dict[str, float]:
    """Seconds of ``fn()`` on the current CUDA device, timed with events after a synchronize."""
    import torch  # here: reading records (reporting, summary) needs no torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0)
    return summarize(samples)


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


def load_result(name: str, results_dir: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The committed result ``name`` (without .json), or None when it has not been measured yet."""
    path = Path(results_dir or RESULTS_DIR) / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def provenance_line(record: dict[str, Any]) -> str:
    """One line saying where a result came from: machine (GPUs, else CPU cores), date, commit."""
    dev = record.get("device", {})
    where = dev.get("gpu") or f"{dev.get('cpu_count', '?')} CPU cores"
    if dev.get("gpu") and dev.get("gpu_count", 1) > 1:
        where = f"{dev['gpu_count']} x {where}"
    return (f"measured on {where}, {str(record.get('date', '?'))[:16]}, "
            f"commit {str(record.get('git_commit', '?'))[:12]}")


def times_faster(ratio: float, than: str = "") -> str:
    """A speed ratio (their time over ours) in words: 4.49 -> '4.49x faster', 0.92 -> '1.09x slower'."""
    suffix = f" than {than}" if than else ""
    return f"{ratio:.2f}x faster{suffix}" if ratio >= 1 else f"{1 / ratio:.2f}x slower{suffix}"
