"""The GPU's SM clock, power and load sampled by ``nvidia-smi`` while a bench runs: their spread over a run
says whether the card held its clocks (a run whose steps are slow at a steady clock slowed in the work, not
the card)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from workbench.timing import summarize

QUERY = "clocks.sm,clocks.max.sm,power.draw,utilization.gpu,temperature.gpu"
FIELDS = ("sm_mhz", "max_sm_mhz", "power_w", "utilization_pct", "temperature_c")
BUSY_PCT = 50.0  # a sample counts as busy from this GPU utilization (%) up


def visible_card() -> str:
    """The card this process's CUDA device 0 is, as nvidia-smi's ``-i`` takes it: the first entry of
    ``CUDA_VISIBLE_DEVICES`` (an index or a UUID; nvidia-smi ignores that variable), else "0"."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


class GpuClocks:
    """``with GpuClocks(period_ms) as clocks: ...`` samples this process's GPU (:func:`visible_card`) every
    ``period_ms`` milliseconds meanwhile; ``clocks.samples`` then holds one dict per sample (FIELDS) and
    ``clocks.figures()`` their spread (:func:`clock_figures`). Without ``nvidia-smi`` it samples nothing and
    ``figures()`` is None."""

    def __init__(self, period_ms: int = 500):
        self.period_ms = period_ms
        self._proc = None
        self._file = None
        self.samples: list[dict[str, float]] = []

    def __enter__(self) -> "GpuClocks":
        if shutil.which("nvidia-smi"):
            self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv")
            self._proc = subprocess.Popen(["nvidia-smi", "-i", visible_card(), f"--query-gpu={QUERY}",
                                           "--format=csv,noheader,nounits", f"--loop-ms={self.period_ms}"],
                                          stdout=self._file, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)  # its loop ends on Ctrl-C, its output written out
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self.samples = parse_samples(Path(self._file.name).read_text())
        self._file.close()

    def figures(self) -> dict | None:
        """:func:`clock_figures` of the samples taken."""
        return clock_figures(self.samples, self.period_ms)


def clock_figures(samples: list[dict[str, float]], period_ms: int, busy_pct: float = BUSY_PCT) -> dict | None:
    """Each field's spread (:func:`summarize`) over the samples taken while the GPU was busy (utilization at
    least ``busy_pct`` %: a process's start and an idle card's low clocks stay out), with the counts and the
    sampling period (ms); None without samples."""
    if not samples:
        return None
    busy = [s for s in samples if s.get("utilization_pct", 0.0) >= busy_pct]
    out: dict = {"period_ms": period_ms, "samples": len(samples), "busy_samples": len(busy), "busy_pct": busy_pct}
    out.update({name: summarize([s[name] for s in busy if name in s]) for name in FIELDS
                if any(name in s for s in busy)})
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
