"""The gpu tests' times that ``scripts/gpu_run.sh``'s tests stage leaves in $OUT/test_times.tsv (one line per
test phase as it ends, so a stage cut at its limit leaves the times of what ran), summed by test file, and packed
into groups that each fit one call beside the README flow.

    python3 -m benchmarks.gpu_test_times test_times.tsv [more.tsv ...]        # seconds per file, slowest first
    python3 -m benchmarks.gpu_test_times test_times.tsv --groups 300          # GPU_TESTS lines of at most 300 s

A file timed in several runs keeps its longest time; ``--unmeasured`` lists the gpu test files that none of
them timed (collected here with ``pytest --collect-only -m gpu``), to run in a group of their own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def file_seconds(paths: list[Path]) -> dict[str, float]:
    """{test file: seconds} over the lines "<node id>\\t<seconds>\\t<outcome>" of ``paths``; a file timed in
    several keeps its longest total."""
    totals: dict[str, float] = {}
    for path in paths:
        per_file: dict[str, float] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise ValueError(f"{path}: cannot be read ({e.strerror})") from None
        for number, line in enumerate(lines, 1):
            fields = line.split("\t")
            try:
                seconds = float(fields[1])
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{number}: not a '<node id> TAB <seconds> TAB <outcome>' line") from None
            name = fields[0].split("::")[0]
            per_file[name] = per_file.get(name, 0.0) + seconds
        for name, seconds in per_file.items():
            totals[name] = max(totals.get(name, 0.0), seconds)
    return totals


def pack_groups(seconds: dict[str, float], limit_s: float) -> list[list[str]]:
    """Files packed into groups of at most ``limit_s`` (a file slower than that gets a group of its own),
    slowest first into the first group with room."""
    groups: list[tuple[float, list[str]]] = []
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        for i, (used, files) in enumerate(groups):
            if used + s <= limit_s:
                groups[i] = (used + s, files + [name])
                break
        else:
            groups.append((s, [name]))
    return [sorted(files) for _, files in groups]


def gpu_test_files() -> list[str]:
    """The test files with gpu tests, as pytest collects them here (the README flow's file left out)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                          "--ignore=tests/benchmarks/test_flow.py", "tests"], cwd=REPO, capture_output=True, text=True)
    return sorted({line.split("::")[0] for line in out.stdout.splitlines() if "::" in line})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_test_times", description=__doc__.split("\n\n")[0])
    p.add_argument("times", nargs="+", type=Path, help="test_times.tsv files of gpu_run.sh's tests stage")
    p.add_argument("--groups", type=float, metavar="SECONDS", help="pack the files into GPU_TESTS lines of this size")
    p.add_argument("--unmeasured", action="store_true", help="also list the gpu test files none of them timed")
    args = p.parse_args(argv)
    try:
        seconds = file_seconds(args.times)
    except ValueError as e:
        print(f"gpu test times: error: {e}")
        return 2
    if args.groups:
        for i, files in enumerate(pack_groups(seconds, args.groups), 1):
            total = sum(seconds[f] for f in files)
            print(f"# group {i}: {total:.0f} s\nGPU_TESTS=\"{' '.join(files)}\"")
    else:
        for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"{s:8.1f} s  {name}")
        print(f"{sum(seconds.values()):8.1f} s  in all, {len(seconds)} files")
    if args.unmeasured:
        missing = [f for f in gpu_test_files() if f not in seconds]
        if missing:
            print(f"# not timed: {len(missing)} files\nGPU_TESTS=\"{' '.join(missing)}\"")
        else:
            print("# every gpu test file timed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
