"""The GPU's SM clock, power and load sampled by ``nvidia-smi`` while a bench runs: a slow stretch of steps
read against them says whether the card slowed (clock or power) or the work did."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from workbench.timing import summarize

QUERY = "clocks.sm,clocks.max.sm,power.draw,utilization.gpu,temperature.gpu"
FIELDS = ("sm_mhz", "max_sm_mhz", "power_w", "utilization_pct", "temperature_c")
BUSY_PCT = 50.0  # a sample counts as busy from this GPU utilization (%) up


class GpuClocks:
    """``with GpuClocks(period_ms) as clocks: ...`` samples GPU 0 every ``period_ms`` (ms) meanwhile;
    ``clocks.figures()`` then gives each field's spread (:func:`summarize`), the samples, and the share of
    samples whose SM clock was below 90 % of the card's maximum. Without ``nvidia-smi`` it samples nothing and
    ``figures()`` is None."""

    def __init__(self, period_ms: int = 500):
        self.period_ms = period_ms
        self._proc = None
        self._file = None
        self.samples: list[dict[str, float]] = []

    def __enter__(self) -> "GpuClocks":
        if shutil.which("nvidia-smi"):
            self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv")
            self._proc = subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={QUERY}",
                                           "--format=csv,noheader,nounits", f"-lms={self.period_ms}"],
                                          stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self.samples = parse_samples(Path(self._file.name).read_text())
        self._file.close()

    def figures(self) -> dict | None:
        return clock_figures(self.samples, self.period_ms)


def clock_figures(samples: list[dict[str, float]], period_ms: int, busy_pct: float = BUSY_PCT) -> dict | None:
    """Each field's spread over the samples taken while the GPU was busy (utilization at least ``busy_pct``:
    a process's start and an idle card's low clocks stay out), the share of busy samples whose SM clock was
    below 90 % of the card's maximum, and the counts; None without samples."""
    if not samples:
        return None
    busy = [s for s in samples if s.get("utilization_pct", 0.0) >= busy_pct]
    out: dict = {"period_ms": period_ms, "samples": len(samples), "busy_samples": len(busy), "busy_pct": busy_pct}
    if not busy:
        return out
    out.update({name: summarize([s[name] for s in busy if name in s]) for name in FIELDS
                if any(name in s for s in busy)})
    top = max((s.get("max_sm_mhz", 0.0) for s in busy), default=0.0)
    if top:
        out["below_90pct_clock_share"] = sum(s.get("sm_mhz", top) < 0.9 * top for s in busy) / len(busy)
    return out


def parse_samples(text: str) -> list[dict[str, float]]:
    """nvidia-smi's CSV lines (``QUERY``'s fields, no header or units) -> one dict per line; a field that reads
    "[N/A]" or is not a number is left out."""
    samples = []
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(FIELDS):
            continue
        sample = {}
        for name, value in zip(FIELDS, values):
            try:
                sample[name] = float(value)
            except ValueError:
                pass
        if sample:
            samples.append(sample)
    return samples
