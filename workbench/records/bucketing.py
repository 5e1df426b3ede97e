"""The bucketing records (``bucketing_bins_1m*.json``, ``bucketing_first_batch.json``): fields and readings.

``bucketing_bins_1m``: seconds of `workbench bins` end to end (``workbench_bins_end_to_end_s``: median,
min, max, n over fresh processes), per in-process stage, and of the same work through lhotse;
``bucketing_bins_1m_tokenizer``: ``workbench_bins_tokenized_end_to_end_s`` with a sentencepiece model;
``bucketing_first_batch``: seconds to the first batch per buffer size, sequential and concurrent.
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

from workbench.records.results import times_faster

class BinsFigures(TypedDict, total=False):
    utterances: int
    workbench_bins_end_to_end_s: dict[str, float]  # results.summarize() over fresh `workbench bins` processes
    workbench_bins_tokenized_end_to_end_s: dict[str, float]  # the same with --tokenizer (the tokenizer record)
    lhotse_total_s: float  # CutSet iteration + the plain-loop estimate, seconds
    speedup_vs_lhotse: float  # lhotse_total_s over our median
    bins_equal: bool
    target_s: float
    stage_read_manifest_s: float  # in-process stages of ours, seconds
    stage_bins_1d_2d_s: float
    stage_padding_summary_s: float


NAMES = ("bucketing_bins_1m", "bucketing_bins_1m_tokenizer", "bucketing_first_batch")
STAGES = ("stage_read_manifest_s", "stage_bins_1d_2d_s", "stage_padding_summary_s")


def _spread(s: Mapping[str, float]) -> str:
    return f"{s['median']:.4g} s ({s['min']:.4g}-{s['max']:.4g}, n={s.get('n', '?')})"


def summary_lines(figures: BinsFigures) -> list[str]:
    """The lines of any of the three records in benchmarks/SUMMARY.md (told apart by their fields)."""
    if "workbench_bins_tokenized_end_to_end_s" in figures:
        return [f"- with tokenizer: {_spread(figures['workbench_bins_tokenized_end_to_end_s'])} for "
                f"{figures['utterances']:,} utterances (target {figures['target_s']:g} s)"]
    if "workbench_bins_end_to_end_s" in figures:
        return [f"- end to end: {_spread(figures['workbench_bins_end_to_end_s'])} for {figures['utterances']:,} "
                f"utterances; lhotse path {figures['lhotse_total_s']:.3g} s; {times_faster(figures['speedup_vs_lhotse'])}; "
                f"same bins: {figures['bins_equal']}"]
    out = []
    for key in sorted(k for k in figures if k.endswith("_speedup")):
        buffer = key.split("_")[1]
        out.append(f"- buffer {buffer}: sequential {_spread(figures[f'buffer_{buffer}_sequential_s'])}, concurrent "
                   f"{_spread(figures[f'buffer_{buffer}_concurrent_s'])}: concurrent {times_faster(figures[key])}")
    return out


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The bench's stdout table of any of the three records: seconds per measure."""
    if "workbench_bins_tokenized_end_to_end_s" in figures:
        return [f"{'workbench bins --tokenizer, end to end (median)':<48}"
                f"{figures['workbench_bins_tokenized_end_to_end_s']['median']:>10.2f}"]
    if "workbench_bins_end_to_end_s" in figures:
        return ([f"\n{'measure':<48}{'seconds':>10}",
                 f"{'workbench bins, end to end (median)':<48}{figures['workbench_bins_end_to_end_s']['median']:>10.2f}",
                 f"{'lhotse CutSet iteration + loop estimate':<48}{figures['lhotse_total_s']:>10.2f}",
                 f"{'  ratio (lhotse / ours)':<48}{figures['speedup_vs_lhotse']:>10.1f}x"]
                + [f"{'  ours, in process: ' + k:<48}{figures[k]:>10.2f}" for k in STAGES])
    return [f"{k:<48}{(v['median'] if isinstance(v, dict) else v):>10.2f}{'x' if 'speedup' in k else ''}"
            for k, v in figures.items()]


def describe(record: dict) -> str:
    """The record's summary lines as one text (what notebook 01 prints)."""
    return "\n".join(summary_lines(record["figures"]))


def meaning(records: Mapping[str, Mapping[str, Any]]) -> str:
    """What the committed bucketing records mean, in one or two sentences (records by name; missing ones
    are left out)."""
    out = []
    bins = records.get("bucketing_bins_1m")
    if bins is not None:
        f = bins["figures"]
        out.append(f"`workbench bins` reads, bins and summarises {f['utterances']:,} utterances in "
                   f"{f['workbench_bins_end_to_end_s']['median']:.1f} s, {times_faster(f['speedup_vs_lhotse'])} "
                   f"than lhotse's CutSet path{', with the same bins' if f['bins_equal'] else ', with other bins'}.")
    first = records.get("bucketing_first_batch")
    if first is not None:
        f = first["figures"]
        parts = [f"{times_faster(f[k])} at a buffer of {int(k.split('_')[1]):,}"
                 for k in sorted(f, key=lambda k: -int(k.split('_')[1]) if k.endswith('_speedup') else 0)
                 if k.endswith("_speedup")]
        out.append("With concurrent bucketing the first batch arrives " + ", and ".join(parts) + ".")
    return " ".join(out) or "No committed bucketing benchmark yet."
