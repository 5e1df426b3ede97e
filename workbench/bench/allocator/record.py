"""The allocator record (``benchmarks/results/allocator*.json``): its fields and every reading of them.

``figures["headrooms"][label]`` holds one block per memory headroom: per configuration (``CONFIG_NAMES``)
step times in seconds, device allocations per step, retries, OOMs and peak reserved bytes; the paired
time ratios (numerator over denominator, both summed over the same steps within one round; median and
range over rounds) and the time target's verdict. ``params["series"][label]`` holds per-step columns of
the first block of each configuration, for the plots in ``workbench.memory.plots``.
"""

from __future__ import annotations

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
    if "headrooms" not in figures:
        raise ValueError("allocator record: no 'headrooms' in figures (a record from before the rounds "
                         "protocol; rerun python3 -m workbench.bench.allocator)")
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


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
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


def describe(name: str, record: Mapping[str, Any]) -> str:
    """What a notebook prints above a record's tables: model, shapes, protocol, targets."""
    params, figures = record["params"], record["figures"]
    lines = [f"{name}: model {params['model']}; shapes: {params['shape_source']}",
             f"{params['steps']} shapes per block, blocks {params['blocks']}: a warm-up pass, then "
             f"{params['passes']} measured pass(es); {figures['rounds_run']} round(s)",
             targets_line(figures) + ("" if figures["targets_met"] else ":\n  " + "\n  ".join(figures["failures"]))]
    for label, block in blocks(record).items():
        target = block["figures"]["time_target"]
        lines.append(f"headroom {label}: memory limit {block['memory_limit_bytes'] / GiB:.1f} GiB; time target "
                     f"{target['pair'] or 'no valid reference'} <= {target['limit']}: {target['verdict']}")
    return "\n".join(lines)


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


def show_tables(name: str, record: Mapping[str, Any], display) -> None:
    """The record's description and, per headroom, its step-time, paired-ratio and allocation-event tables,
    through ``display`` (IPython's in a notebook)."""
    print("\n" + describe(name, record))
    for label, block in blocks(record).items():
        print(f"headroom {label}:")
        display(step_time_table(block["figures"]))
        paired = paired_ratio_table(block["figures"])
        if not paired.empty:
            display(paired)
        events = allocation_events_table(block["figures"])
        if not events.empty:
            print(f"{len(events)} steps after warm-up touched device memory (first 10):")
            display(events.head(10))


def draw_block(label: str, block: Mapping[str, Any]) -> None:
    """Memory curves of the dynamic-shape configurations and device allocations per step, for one
    :func:`blocks` entry."""
    from workbench.memory.plots import plot_device_allocs, plot_memory_curves  # matplotlib: figures only

    plot_memory_curves(dynamic_series(block), warmup_steps=block["warmup_steps"],
                       title=f"Headroom {label}, dynamic shapes only: peak allocated (solid) and reserved "
                             "(dashed) per step")
    plot_device_allocs(block["series"], warmup_steps=block["warmup_steps"],
                       title=f"Headroom {label}: device allocations per step")


def explore_block(label: str, block: Mapping[str, Any]):
    """An ipywidgets panel choosing which configurations' memory curves to draw."""
    from workbench.memory.plots import plot_memory_curves  # matplotlib: figures only
    from workbench.panel import widget_panel  # ipywidgets: the optional panel

    series = block["series"]
    choices = {"dynamic shapes": [k for k in series if k.startswith("dynamic")],
               "static shapes": [k for k in series if k.startswith("static")], "all": list(series)}
    return widget_panel(lambda configs: plot_memory_curves({k: series[k] for k in configs},
                                                           warmup_steps=block["warmup_steps"],
                                                           title=f"Headroom {label}: " + ", ".join(configs)),
                        configs=choices)
