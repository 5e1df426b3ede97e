"""The allocator record (``benchmarks/results/allocator*.json``): its fields and every reading of them.

``figures["headrooms"][label]`` holds one block per memory headroom: per configuration (``CONFIG_NAMES``)
step times in seconds, device allocations per step, retries, OOMs and peak reserved bytes; the paired
time ratios (numerator over denominator, both summed over the same steps within one round; median and
range over rounds) and the time target's verdict. ``params["series"][label]`` holds per-step columns of
the first block of each configuration, for the plots in ``workbench.memory.plots``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, TypedDict

import pandas as pd

from workbench.units import GiB, MiB

NAME = "allocator"  # allocator.json and allocator_<variant>.json
CONFIG_NAMES = ["static_plain", "dynamic_expandable", "static_expandable", "dynamic_plain"]
TARGET_TIME_RATIO = 1.05  # dynamic shapes with expandable segments vs static shapes, total step time


class TimeTarget(TypedDict, total=False):
    pair: str | None  # the paired ratio checked, "dynamic_expandable/static_plain" or ".../static_expandable"
    limit: float  # TARGET_TIME_RATIO
    median: float  # median of the per-round ratios
    rounds: list[float]  # the ratio in each round
    verdict: str  # "met", "missed", "inconclusive" or "no valid reference"
    conclusive: bool  # >= 2 rounds, all on one side of the limit


class HeadroomBlock(TypedDict, total=False):
    headroom: float  # memory limit = (1 + headroom) x the largest shape's peak
    memory_limit_bytes: int
    memory_fraction: float  # of the device, 0 when no limit was set (smoke runs)
    paired_time_ratios: dict[str, dict]  # "num/den" -> median, min, max, n, rounds
    time_ratio_vs_static_plain: dict[str, float]  # config -> median over rounds of the paired ratio
    time_target: TimeTarget
    # and one dict per name in CONFIG_NAMES: step_time_s, median_step_s, device_allocs_per_step, ...


class AllocatorFigures(TypedDict, total=False):
    headrooms: dict[str, HeadroomBlock]
    rounds_run: int
    targets_met: bool
    failures: list[str]
    warnings: list[str]
    smoke: bool
    complete: bool


def blocks(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Headroom label -> dict with ``figures`` (the block), ``series`` (config -> per-step columns of one
    run), ``warmup_steps``, ``memory_limit_bytes`` and ``rounds``."""
    params, figures = record["params"], record["figures"]
    return {label: dict(figures=block, series=params["series"][label], warmup_steps=params["warmup_steps"],
                        memory_limit_bytes=block["memory_limit_bytes"], rounds=figures["rounds_run"])
            for label, block in figures["headrooms"].items()}


def reference_caveats(figures: Mapping[str, Any]) -> list[str]:
    """Why a headroom's static_plain is no reference for static shapes (OOMs or allocations in repeated
    steps), one line per headroom where it is not: a "targets met" beside such a block needs this."""
    out = []
    for label, block in figures.get("headrooms", {}).items():
        ref = block["static_plain"]
        why = []
        if ref["ooms"]:
            why.append(f"{ref['ooms']} OOM(s)")
        if ref["device_allocs_per_step"]:
            why.append(f"{ref['device_allocs_per_step']:.2f} device allocations per repeated step")
        if why:
            pair = block.get("time_target", {}).get("pair") or "no valid reference"
            out.append(f"headroom {label}: static_plain had {' and '.join(why)}, so the time target uses {pair}")
    return out


def targets_line(figures: Mapping[str, Any]) -> str:
    """'targets met' or 'targets missed', with the reference caveats beside it."""
    caveats = reference_caveats(figures)
    return (f"targets {'met' if figures['targets_met'] else 'missed'}"
            + (f" (caveat: {'; '.join(caveats)})" if caveats else ""))


def summary_lines(figures: AllocatorFigures) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md."""
    out = [f"- rounds run: {figures['rounds_run']}; {targets_line(figures)}"]
    for label, block in figures["headrooms"].items():
        out.append(f"- headroom {label}, limit {block['memory_limit_bytes'] / GiB:.1f} GiB:")
        for config in ("static_plain", "static_expandable", "dynamic_plain", "dynamic_expandable"):
            c = block[config]
            out.append(f"  - {config} ({c['settings'] or 'defaults'}): median step {c['median_step_s'] * 1e3:.1f} ms, "
                       f"device allocations/step {c['device_allocs_per_step']:.2f}, retries {c['alloc_retries']}, "
                       f"OOMs {c['ooms']}, peak reserved {c['peak_reserved_bytes'] / GiB:.2f} GiB")
        for pair, r in block["paired_time_ratios"].items():
            out.append(f"  - {pair} (paired time ratio): {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f} over "
                       f"{r['n']} round(s))")
        target = block.get("time_target")
        if target:
            out.append(f"  - time target: {target['pair'] or 'no valid reference'} <= {target['limit']}: "
                       f"{target['verdict']}" + ("" if target.get("conclusive") else " (not conclusive)"))
    out += [f"- failure: {x}" for x in figures["failures"]]
    return out


def table_lines(record: Mapping[str, Any]) -> list[str]:
    """The bench's stdout table: per headroom, one line per configuration and one per paired ratio."""
    figures, params = record["figures"], record["params"]
    out = [f"model: {params['model']}; shapes: {len(params['shapes'])} from {params['shape_source']}; "
           f"{figures['rounds_run']} round(s) x {params['passes']} measured pass(es); {params['wall_s']:.0f} s"]
    for label, block in figures["headrooms"].items():
        limit = f"limit {block['memory_limit_bytes'] / GiB:.2f} GiB" if block["memory_fraction"] else "no limit"
        out += [f"\nheadroom {label}: {limit}",
                f"{'config':<20} {'median ms':>10} {'round range ms':>15} {'paired/static':>13} {'allocs/step':>12} "
                f"{'frees/step':>11} {'retries':>8} {'OOMs':>5} {'peak res GiB':>13}"]
        for name in CONFIG_NAMES:
            f, st = block[name], block[name]["step_time_s"]
            out.append(f"{name:<20} {st['median'] * 1e3:>10.1f} {st['min'] * 1e3:>7.1f}-{st['max'] * 1e3:<7.1f} "
                       f"{block['time_ratio_vs_static_plain'][name]:>13.3f} {f['device_allocs_per_step']:>12.2f} "
                       f"{f['device_frees_per_step']:>11.2f} {f['alloc_retries']:>8d} {f['ooms']:>5d} "
                       f"{f['peak_reserved_bytes'] / GiB:>13.2f}")
        for pair, ratio in block["paired_time_ratios"].items():
            out.append(f"  paired per round {pair:<38} median {ratio['median']:.3f} (range {ratio['min']:.3f}-"
                       f"{ratio['max']:.3f}; rounds {', '.join(f'{v:.3f}' for v in ratio['rounds'])})")
        target = block["time_target"]
        out.append(f"  time target ({target['pair'] or 'no valid reference'} <= {TARGET_TIME_RATIO}): "
                   f"{target['verdict']}" + ("" if target["conclusive"] else " (not conclusive)"))
    out += [f"WARNING: {w}" for w in figures["warnings"]]
    return out


def step_time_table(block: Mapping[str, Any]) -> pd.DataFrame:
    """One row per config of a headroom block: median step ms with spread (over per-round medians), rounds,
    the paired time ratio against static_plain (median over rounds of the ratio of the same steps' total
    time within a round: not the ratio of the medians beside it), device allocs/frees per step, retries,
    OOMs, peak reserved GiB."""
    ratios = block.get("time_ratio_vs_static_plain", {})
    rows = []
    for name, f in block.items():
        if not isinstance(f, dict) or "step_time_s" not in f:
            continue
        st = f["step_time_s"]
        rows.append({"config": name, "median ms": st["median"] * 1e3, "p25 ms": st["p25"] * 1e3,
                     "p75 ms": st["p75"] * 1e3, "rounds": f.get("rounds", 1),
                     "paired time ratio vs static_plain": ratios.get(name),
                     "device allocs/step": f["device_allocs_per_step"],
                     "device frees/step": f["device_frees_per_step"], "retries": f["alloc_retries"],
                     "OOMs": f["ooms"], "peak reserved GiB": f["peak_reserved_bytes"] / GiB})
    return pd.DataFrame(rows).set_index("config").round(3) if rows else pd.DataFrame()


def paired_ratio_table(block: Mapping[str, Any]) -> pd.DataFrame:
    """One row per ratio of a block's ``paired_time_ratios``: median, min, max over rounds and the
    per-round values."""
    rows = [{"ratio": name, "median": r["median"], "min": r["min"], "max": r["max"], "rounds": r["n"],
             "per round": ", ".join(f"{v:.3f}" for v in r["rounds"])}
            for name, r in block.get("paired_time_ratios", {}).items()]
    return pd.DataFrame(rows).set_index("ratio").round(3) if rows else pd.DataFrame()


def allocation_events_table(block: Mapping[str, Any]) -> pd.DataFrame:
    """The steps after warm-up that touched device memory, every config of a headroom block: round, allocator
    block, pass, step, repeat (a repeated-shape step), shape, the shape before it, allocations, frees,
    retries, MiB allocated and the reason."""
    rows = []
    for name, f in block.items():
        if not isinstance(f, dict):
            continue
        for e in f.get("allocation_events", []):
            rows.append({"config": name, "round": e.get("round"), "block": e.get("block"), "pass": e.get("pass_"),
                         "step": e.get("index"), "repeat": e.get("repeat"),
                         "shape": tuple(e["shape"]), "previous shape": tuple(e["previous_shape"] or ()),
                         "allocs": e["device_allocs"], "frees": e["device_frees"], "retries": e["alloc_retries"],
                         "MiB": round(e["device_alloc_bytes"] / MiB), "reason": e["reason"]})
    return pd.DataFrame(rows)


def dynamic_series(block: Mapping[str, Any]) -> dict[str, dict]:
    """The dynamic-shape configurations' per-step columns of a :func:`blocks` entry."""
    return {k: v for k, v in block["series"].items() if k.startswith("dynamic")}


def config_label(name: str) -> str:
    """'dynamic_expandable' -> 'dynamic shapes, expandable segments'."""
    shapes, segments = name.split("_", 1)
    return f"{shapes} shapes, {segments} segments"


def _pair_label(pair: str) -> str:
    """'dynamic_expandable/static_plain' -> 'dynamic, expandable ÷ static, plain'."""
    return " ÷ ".join(name.replace("_", ", ", 1) for name in pair.split("/"))


def _readable(note: str) -> str:
    """A record's warning with its configuration names and headroom labels in words."""
    note = re.sub(r"\[headroom ([0-9.]+)\] ", lambda m: f"at {float(m.group(1)):.0%} headroom, ", note)
    for name in CONFIG_NAMES:
        note = note.replace(f"{name}/", _on(name) + " ÷ ").replace(name, _on(name))
    return note


def _on(name: str) -> str:
    """'dynamic_expandable' -> 'dynamic shapes on expandable segments'."""
    shapes, segments = name.split("_", 1)
    return f"{shapes} shapes on {segments} segments"


def _headroom_text(label: str, limit_bytes: float) -> str:
    return f"{float(label):.0%} headroom (memory limit {limit_bytes / GiB:.1f} GiB)"


DISPLAY_ORDER = ["static_plain", "static_expandable", "dynamic_plain", "dynamic_expandable"]


def step_time_summary(block: Mapping[str, Any]) -> pd.DataFrame:
    """:func:`step_time_table` as a reader scans it: one row per configuration (static before dynamic, plain
    before expandable), human column names with units, the spread as the range of the per-round medians."""
    ratios = block.get("time_ratio_vs_static_plain", {})
    rows = []
    for name in [n for n in DISPLAY_ORDER if n in block]:
        f, st = block[name], block[name]["step_time_s"]
        shapes, segments = name.split("_", 1)
        rows.append({"Shapes": shapes, "Segments": segments, "Median step (ms)": st["median"] * 1e3,
                     "Range over rounds (ms)": f"{st['min'] * 1e3:.0f}–{st['max'] * 1e3:.0f}",
                     "Time vs static, plain (paired)": ratios.get(name),
                     "Device allocations per step": f["device_allocs_per_step"],
                     "Device frees per step": f["device_frees_per_step"], "Allocator retries": f["alloc_retries"],
                     "OOMs": f["ooms"], "Peak reserved (GiB)": f["peak_reserved_bytes"] / GiB})
    return pd.DataFrame(rows)


def styled_step_times(label: str, block: Mapping[str, Any]):
    """:func:`step_time_summary` for display, captioned with its headroom and rounds."""
    rounds = max((block[n].get("rounds", 1) for n in DISPLAY_ORDER if n in block), default=1)
    return (step_time_summary(block).style
            .format({"Median step (ms)": "{:.0f}", "Time vs static, plain (paired)": "{:.2f}",
                     "Device allocations per step": "{:.2f}", "Device frees per step": "{:.2f}",
                     "Peak reserved (GiB)": "{:.2f}"}, na_rep="")
            .hide(axis="index")
            .set_properties(subset=["Shapes", "Segments"], **{"text-align": "left"})
            .set_caption(f"With {_headroom_text(label, block['memory_limit_bytes'])}: step times as the median of "
                         f"{rounds} rounds' medians, allocator counts over the measured steps"))


def styled_paired_ratios(block: Mapping[str, Any]):
    """:func:`paired_ratio_table` for display: each ratio of the same steps' total time within a round, its
    median and per-round values at 2 decimals (the rounds differ in the second), and the time target's pair."""
    target = block.get("time_target", {})
    rows = [{"Paired time ratio": _pair_label(name), "Median": r["median"],
             "Per round": ", ".join(f"{v:.2f}" for v in r["rounds"]),
             "Time target": (f"≤ {target['limit']}: {target['verdict']}" if name == target.get("pair") else "")}
            for name, r in block.get("paired_time_ratios", {}).items()]
    return (pd.DataFrame(rows).style.format({"Median": "{:.2f}"}).hide(axis="index")
            .set_properties(subset=["Paired time ratio", "Time target"], **{"text-align": "left"}))


_CAUSES = {"OOM": "OOM: the step failed even after the allocator freed its cache",
           "OOM-retry": "retry: the allocator hit the limit, freed cached memory and allocated again",
           "peak above warm-up": "peak above every warm-up step's",
           "re-allocated after frees": "segments freed and allocated again",
           "cache miss": "cache miss: no cached block fit after the previous shape"}


def allocation_event_summary(block: Mapping[str, Any]) -> pd.DataFrame:
    """The steps after warm-up that touched device memory (:func:`allocation_events_table`), counted per
    configuration and cause: steps, how many of them repeated the shape before, device allocations, retries
    and MiB allocated. Empty when no step did."""
    events = allocation_events_table(block)
    if events.empty:
        return events
    events = events.assign(cause=events["reason"].map(lambda r: _CAUSES.get(r.split(":")[0], r.split(":")[0])),
                           order=events["config"].map(DISPLAY_ORDER.index))
    grouped = events.groupby(["order", "config", "cause"], sort=True).agg(
        steps=("step", "size"), repeats=("repeat", "sum"), allocs=("allocs", "sum"), retries=("retries", "sum"),
        mib=("MiB", "sum")).reset_index()
    return pd.DataFrame({"Configuration": grouped["config"].map(config_label), "Cause": grouped["cause"],
                         "Steps": grouped["steps"], "Of them a repeated shape": grouped["repeats"].astype(int),
                         "Device allocations": grouped["allocs"], "Allocator retries": grouped["retries"],
                         "MiB allocated": grouped["mib"]})


def describe_run(name: str, record: Mapping[str, Any]) -> str:
    """What a notebook prints above a record's tables, in sentences: model, shapes, protocol, limits and the
    record's warnings."""
    params, figures = record["params"], record["figures"]
    order = ", ".join({"P": "plain", "E": "expandable"}.get(c, c) for c in params["blocks"])
    limits = "; ".join(_headroom_text(label, b["memory_limit_bytes"]) for label, b in figures["headrooms"].items())
    text = (f"{name}.json: {params['model']} in {params['dtype']}, {params['steps']} batch shapes "
            f"({params['shape_source']}). Each of {figures['rounds_run']} rounds is one process running the "
            f"allocator blocks {order}, each a warm-up pass and {params['passes']} measured pass(es) of every shape "
            f"twice in a row; {limits}.")
    notes = [_readable(w) for w in figures.get("warnings", [])] + [f"failed: {_readable(x)}"
                                                                    for x in figures.get("failures", [])]
    return text + "".join(f"\n  - {note}" for note in notes)


def show_block(name: str, record: Mapping[str, Any], display) -> None:
    """A record's description and, per headroom, its step-time, paired-ratio and allocation-cause tables and
    its plots (:func:`draw_block`), through ``display`` (IPython's in a notebook)."""
    import matplotlib.pyplot as plt

    print(describe_run(name, record))
    for label, block in blocks(record).items():
        display(styled_step_times(label, block["figures"]))
        if block["figures"].get("paired_time_ratios"):
            display(styled_paired_ratios(block["figures"]))
        events = allocation_event_summary(block["figures"])
        if events.empty:
            print("No step after warm-up touched device memory.")
        else:
            print(f"The {events['Steps'].sum()} steps after warm-up that touched device memory, by cause:")
            display(events.style.hide(axis="index").set_properties(subset=["Configuration", "Cause"],
                                                                   **{"text-align": "left"}))
        draw_block(label, block)
        plt.show()


def draw_block(label: str, block: Mapping[str, Any]) -> None:
    """Memory curves of the dynamic-shape configurations and device allocations per step, for one
    :func:`blocks` entry."""
    from workbench.memory.plots import plot_device_allocs, plot_memory_curves  # matplotlib: figures only

    headroom = _headroom_text(label, block["memory_limit_bytes"])
    plot_memory_curves({config_label(k): v for k, v in dynamic_series(block).items()},
                       warmup_steps=block["warmup_steps"],
                       title=f"Dynamic shapes, {headroom}: memory per step")
    plot_device_allocs({config_label(k): v for k, v in block["series"].items()}, warmup_steps=block["warmup_steps"],
                       title=f"Device allocations per step in one round, {headroom}")


def explore_block(label: str, block: Mapping[str, Any]):
    """An ipywidgets panel choosing which configurations' memory curves to draw."""
    from workbench.memory.plots import plot_memory_curves  # matplotlib: figures only
    from workbench.panel import widget_panel  # ipywidgets: the optional panel

    series = block["series"]
    choices = {"dynamic shapes": [k for k in series if k.startswith("dynamic")],
               "static shapes": [k for k in series if k.startswith("static")], "all": list(series)}
    return widget_panel(lambda configs: plot_memory_curves({config_label(k): series[k] for k in configs},
                                                           warmup_steps=block["warmup_steps"],
                                                           title=f"Headroom {label}: " + ", ".join(configs)),
                        configs=choices)


# What each section of notebooks/03_allocator.ipynb means, in sentences from the figures.

def meaning_of_settings(preview, here) -> str:
    """What the settings logic does, from two :class:`workbench.memory.AllocatorStatus`: ``preview`` (a user's
    settings on a GPU machine before CUDA starts) and ``here`` (this machine, now)."""
    if preview.changed:
        kept = [o for o in (preview.settings_before or "").split(",") if o]
        what = (f"On a GPU machine configure_allocator keeps the user's {len(kept)} option(s) "
                f"({', '.join(kept) or 'none'}) and adds expandable_segments:True, so the allocator starts with "
                f"'{preview.settings_after}'.")
    else:
        what = f"On a GPU machine configure_allocator would leave these settings as they are: {preview.reason}."
    if here.changed:
        return what + f" On this machine it set '{here.settings_after}'."
    return what + f" On this machine it changes nothing ({here.reason})."


def _block_sentence(label: str, block: Mapping[str, Any]) -> str:
    plain, expandable = block["dynamic_plain"], block["dynamic_expandable"]
    target = block.get("time_target") or {}
    pair = target.get("pair")
    time = (f" and took {target['median']:.2f}x the time of the same steps run as {_on(pair.split('/')[1])} "
            f"(paired over {len(target['rounds'])} rounds; target ≤ {target['limit']}: {target['verdict']})"
            if pair else "")
    return (f"With {_headroom_text(label, block['memory_limit_bytes'])}, dynamic shapes on plain segments had "
            f"{plain['alloc_retries']} allocator retries, {plain['ooms']} OOMs and "
            f"{plain['device_allocs_per_step']:.2f} device allocations per step; on expandable segments they had "
            f"{expandable['alloc_retries']}, {expandable['ooms']} and {expandable['device_allocs_per_step']:.2f}{time}.")


def meaning_of_runs(records: Mapping[str, Mapping[str, Any]]) -> str:
    """What the committed runs mean: one sentence per headroom, nearest the limit first."""
    found = sorted(((float(label), label, block) for r in records.values()
                    for label, block in r["figures"]["headrooms"].items()), key=lambda x: x[0])
    if not found:
        return "No allocator run is committed yet, so nothing is measured here."
    return " ".join(_block_sentence(label, block) for _, label, block in found)


def meaning_of_live(frame, steps: int) -> str:
    """What the live telemetry shows: from its MemoryRecorder ``frame``, or, None when it did not run, what it
    would show."""
    if frame is None:
        return (f"On a CUDA GPU this section runs {steps} training steps of a small MLP with a new batch size "
                "every step and shows, per step, whether the allocator went to the device (allocations, retries) "
                "and how allocated and reserved memory move; this machine has none.")
    later = frame.iloc[1:]
    return (f"Over {len(frame)} steps with a new batch size each, the allocator made {int(later['device_allocs'].sum())} "
            f"device allocations after the first step and {int(frame['alloc_retries'].sum())} retries; reserved "
            f"memory ended at {frame['reserved_bytes'].iloc[-1] / GiB:.2f} GiB.")


def finding(figures: Mapping[str, Any]) -> str:
    """The notebook's one line for the report's index: dynamic shapes with and without expandable segments
    nearest the memory limit (the record's first headroom)."""
    label, block = next(iter(figures["headrooms"].items()))
    plain, expandable = block["dynamic_plain"], block["dynamic_expandable"]
    p, e = plain["step_time_s"], expandable["step_time_s"]
    same = p["min"] <= e["max"] and e["min"] <= p["max"]  # the per-round medians overlap
    time = (f"at the same median step ({e['median'] * 1e3:.0f} ms)" if same else
            f"at a median step of {e['median'] * 1e3:.0f} ms against {p['median'] * 1e3:.0f} ms")
    return (f"With expandable segments, dynamic shapes ran with {expandable['alloc_retries']} allocator retries and "
            f"{expandable['ooms']} OOMs against {plain['alloc_retries']} and {plain['ooms']} without, {time}, "
            f"{float(label):.0%} above the largest step's peak memory")


def styled_live(frame):
    """A live MemoryRecorder frame (``workbench.memory.demo.dynamic_shape_steps``) for display: one row per
    step with its batch rows, time, memory and allocator counts."""
    table = pd.DataFrame({"Step": frame["step"], "Batch rows": frame["rows"], "Step time (ms)": frame["time_s"] * 1e3,
                          "Allocated (GiB)": frame["allocated_bytes"] / GiB,
                          "Reserved (GiB)": frame["reserved_bytes"] / GiB,
                          "Device allocations": frame["device_allocs"], "Allocator retries": frame["alloc_retries"]})
    return table.style.format({"Step time (ms)": "{:.1f}", "Allocated (GiB)": "{:.2f}",
                               "Reserved (GiB)": "{:.2f}"}).hide(axis="index")
