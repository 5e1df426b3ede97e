"""The gpu tests' times that ``scripts/gpu_run.sh``'s tests stage leaves in $OUT/test_times.tsv (a line as each
test starts and one per phase as it ends, so a stage cut at its limit leaves the times of what ran), summed by
test file, and packed into groups that each fit one call beside the README flow.

    python3 -m benchmarks.gpu_test_times test_times.tsv [more.tsv ...]        # seconds per file, slowest first
    python3 -m benchmarks.gpu_test_times test_times.tsv --groups 300          # GPU_TESTS lines of at most 300 s
    python3 -m benchmarks.gpu_test_times --selection                          # pytest's arguments, one a line

A file timed in several runs keeps its longest time. A file whose test was running when its stage was cut (a
start with no teardown, or a crash: xdist's phase "???") is "cut": its time is a lower bound, and it is packed
into no group unless another run timed it whole. ``--unmeasured``
lists the gpu test files that no run timed whole (collected here with ``pytest --collect-only -m gpu``).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("start", "setup", "call", "teardown")  # "start": 0 s, written as the test starts
# Which tests are gpu tests: pytest's arguments, for the tests stage of scripts/gpu_run.sh (``--selection``)
# and for --unmeasured. The README flow's file runs in the flow stage instead.
GPU_TEST_SELECTION = ("-m", "gpu", "--ignore=tests/benchmarks/test_flow.py")


@dataclass
class FileTimes:
    """Seconds per test file, whole (every test that started ended), and the files a cut left unfinished."""
    seconds: dict[str, float] = field(default_factory=dict)
    cut: dict[str, float] = field(default_factory=dict)


def read_times(path: Path) -> tuple[dict[str, float], set[str]]:
    """One run's {test file: seconds} and the files with a test that started but did not end."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    seconds: dict[str, float] = {}
    started: set[str] = set()
    for number, line in enumerate(lines, 1):
        fields = line.split("\t")
        try:
            node, phase, duration = fields[0], fields[1], float(fields[2])
        except (IndexError, ValueError):
            duration, phase = math.nan, ""
        if len(fields) != 4 or not phase or not math.isfinite(duration) or duration < 0:
            raise ValueError(f"{path}:{number}: not a '<node id> TAB <phase> TAB <seconds> TAB <outcome>' line")
        name = node.split("::")[0]
        seconds[name] = seconds.get(name, 0.0) + duration
        if phase == "start" or phase not in PHASES:  # another phase: a crash, which ends no test
            started.add(node)
        elif phase == "teardown":
            started.discard(node)
    return seconds, {node.split("::")[0] for node in started}


def file_times(paths: list[Path]) -> FileTimes:
    """Every run's times: a file keeps its longest whole time; a file cut in every run that timed it is cut."""
    out = FileTimes()
    for path in paths:
        seconds, cut = read_times(path)
        for name, s in seconds.items():
            table = out.cut if name in cut else out.seconds
            table[name] = max(table.get(name, 0.0), s)
    for name in [n for n in out.cut if n in out.seconds]:  # timed whole elsewhere: the longer of the two
        out.seconds[name] = max(out.seconds[name], out.cut.pop(name))
    return out


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
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *GPU_TEST_SELECTION, "tests"], cwd=REPO, capture_output=True, text=True)
    if out.returncode not in (0, 5):  # 5: nothing collected
        last = (out.stdout + out.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ValueError(f"collecting the gpu tests failed (pytest exit {out.returncode}): {last[0]}")
    return sorted({line.split("::")[0] for line in out.stdout.splitlines() if "::" in line})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_test_times", description=__doc__.split("\n\n")[0])
    p.add_argument("times", nargs="*", type=Path, help="test_times.tsv files of gpu_run.sh's tests stage")
    p.add_argument("--groups", type=float, metavar="SECONDS",
                   help="pack the files into GPU_TESTS lines of this many seconds of tests (leave a margin for "
                        "pytest's start and collection, which no line counts)")
    p.add_argument("--unmeasured", action="store_true", help="also list the gpu test files no run timed whole")
    p.add_argument("--selection", action="store_true", help="print pytest's arguments that select the gpu tests, "
                   "one per line")
    args = p.parse_args(argv)
    if args.selection:
        print("\n".join(GPU_TEST_SELECTION))
        return 0
    if not args.times:
        p.error("give at least one test_times.tsv (or --selection)")
    if args.groups is not None and not args.groups > 0:
        p.error(f"--groups {args.groups:g}: needs a number of seconds above 0")
    try:
        times = file_times(args.times)
        missing = [f for f in gpu_test_files() if f not in times.seconds] if args.unmeasured else []
    except ValueError as e:
        print(f"gpu test times: error: {e}", file=sys.stderr)
        return 2
    if args.groups:
        for i, files in enumerate(pack_groups(times.seconds, args.groups), 1):
            total = sum(times.seconds[f] for f in files)
            print(f"# group {i}: {total:.0f} s\nGPU_TESTS=\"{' '.join(files)}\"")
    else:
        for name, s in sorted(times.seconds.items(), key=lambda kv: -kv[1]):
            print(f"{s:8.1f} s  {name}")
        print(f"{sum(times.seconds.values()):8.1f} s  in all, {len(times.seconds)} files")
    for name, s in sorted(times.cut.items()):
        print(f"# cut while running: {name} (at least {s:.1f} s)")
    if args.unmeasured:
        print(f"# not timed whole: {len(missing)} files\nGPU_TESTS=\"{' '.join(missing)}\"" if missing
              else "# every gpu test file timed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
