"""The manifest-reading record (``benchmarks/results/manifest_reading.json``): its fields and readings.

Seconds to read durations and token counts of N cuts from a .jsonl.gz (``workbench_read_cut_arrays_s``:
median, min, max, n over repeats) against iterating lhotse's lazy CutSet (``lhotse_from_jsonl_lazy_s``).
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

from workbench.records.results import times_faster

NAME = "manifest_reading"


class ManifestReadingFigures(TypedDict):
    workbench_read_cut_arrays_s: dict[str, float]  # workbench.timing.summarize() over repeats, seconds
    lhotse_from_jsonl_lazy_s: dict[str, float]
    speedup_vs_lhotse: float  # lhotse's seconds over our median
    file_bytes: int
    cuts_per_s: float
    target_s: float
    meets_target: bool


def _spread(s: Mapping[str, float]) -> str:
    return f"{s['median']:.4g} s ({s['min']:.4g}-{s['max']:.4g}, n={s.get('n', '?')})"


def summary_lines(figures: ManifestReadingFigures) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md."""
    return [f"- read_cut_arrays: {_spread(figures['workbench_read_cut_arrays_s'])}; lhotse from_jsonl_lazy: "
            f"{_spread(figures['lhotse_from_jsonl_lazy_s'])}; {times_faster(figures['speedup_vs_lhotse'])} "
            f"(target {figures['target_s']:g} s met: {figures['meets_target']})"]


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The bench's stdout table."""
    return [f"{'reader':<28}{'seconds':>10}", f"{'workbench':<28}{figures['workbench_read_cut_arrays_s']['median']:>10.2f}",
            f"{'lhotse from_jsonl_lazy':<28}{figures['lhotse_from_jsonl_lazy_s']['median']:>10.2f}",
            f"workbench is {times_faster(figures['speedup_vs_lhotse'], 'lhotse')}"]
