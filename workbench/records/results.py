"""Reading benchmark records: where they live, their provenance (commit, machine, date) and how figures read.

Every figure reported from a GPU lands in ``benchmarks/results/<name>.json`` with what ran, the command,
the git commit, the device, the date, and each figure with its spread (:func:`workbench.timing.summarize`).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]


RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def model_summary_lines(figures: dict, line_of: Callable[[str, dict], str]) -> list[str]:
    """The lines of a record of models measured one by one ({buckets, models, failures}): ``line_of(name,
    entry)`` per model measured, "not measured" with the error of one that raised, then each failure (a missed
    target) not said above."""
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

