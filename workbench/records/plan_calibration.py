"""The plan_calibration record (``benchmarks/results/plan_calibration.json``): per model, planned against
searched batch sizes, the plan's predicted peaks against the measured ones, and the search from the plan."""

from __future__ import annotations

from typing import Any, Mapping

from workbench.records.results import model_summary_lines

NAME = "plan_calibration"


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md: one per model, then the targets missed."""
    return model_summary_lines(figures, model_line)


def model_line(name: str, entry: Mapping[str, Any]) -> str:
    ratios = entry["planned_over_searched"]
    error = entry["largest_peak_error"]
    return (f"- {name}: planned / searched batch size {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} "
            f"buckets, {sum(entry['planned_fits'])}/{len(ratios)} planned sizes fit; predicted peaks within "
            f"{'n/a' if error is None else f'{error:.1%}'} of the measured ones "
            f"({len(entry['probes'])} probes); search {entry['search']['mean_probes_per_bucket']:.2f} "
            f"probes per bucket, from the plan {entry['from_plan']['mean_probes_per_bucket']:.2f}; "
            f"plan {entry['plan']['seconds']:.0f} s on the CPU")


REPLAY_NAME = "plan_replay"


def replay_summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The plan_replay record's lines: per model, traced against measured peaks and the replayed searches."""
    lines = []
    for name, entry in figures["models"].items():
        low, high = entry["error_range"]
        line = (f"- {name}: traced peaks {low:+.1%} to {high:+.1%} of the measured ones "
                f"({len(entry['traced'])} probes)")
        if "replayed" in entry:
            search, from_plan = entry["replayed"]["search"], entry["replayed"]["from_plan"]
            line += (f"; replayed against them, {search['probes_per_bucket']:.2f} probes per bucket without the "
                     f"plan (recorded {search['recorded_probes_per_bucket']:.2f}), "
                     f"{from_plan['probes_per_bucket']:.2f} from the record's plan (recorded "
                     f"{from_plan['recorded_probes_per_bucket']:.2f}, with the search of the record's commit)")
            checkout = entry["replayed"].get("from_checkout_plan")
            if checkout:
                ratios = [r for r in checkout["planned_over_searched"] if r is not None]
                line += (f", {checkout['probes_per_bucket']:.2f} from this checkout's plan" + (
                    f" (planned / searched {min(ratios):.3f}-{max(ratios):.3f})" if ratios else ""))
        lines.append(line)
    return lines


JOINT_LOSS_NAME = "plan_joint_loss"


def joint_loss_summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The plan_joint_loss record's lines: per transducer, planned sizes fused / materialized and the step peaks."""
    lines = []
    for name, entry in figures["models"].items():
        ratios = entry["size_ratio"]
        peaks = [entry[joint_loss]["step_peak_bytes"] / 2**30 for joint_loss in ("materialized", "fused")]
        lines.append(f"- {name}: planned batch sizes fused / materialized {min(ratios):.2f}-{max(ratios):.2f}x over "
                     f"{len(ratios)} buckets; one step's planned peak {peaks[0]:.2f} -> {peaks[1]:.2f} GiB "
                     f"({entry['step_peak_ratio']:.2f}x; planned on the CPU, not measured)")
    return lines


def speed_summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The plan_speed record's lines: per model, the plan's wall seconds on the CPU (the median and spread of
    several plans where timed so) and its traced steps; the target is judged on the slowest plan."""
    lines = []
    for name, entry in figures["models"].items():
        spread = entry["seconds_spread"]
        line = (f"- {name}: {entry['traced_steps']} traced steps ({entry['traced_steps_per_bucket']:.2f} per bucket) "
                f"in {entry['seconds']:.0f} s")
        if spread["n"] > 1:
            line += f" (median of {spread['n']} plans, {spread['min']:.0f}-{spread['max']:.0f} s)"
        if spread["max"] > entry["target_s"]:
            line += f" (target missed: at most {entry['target_s']:.0f} s)"
        lines.append(line)
    return lines


def live_at_peak_summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The plan_live_at_peak record's lines: per bucket, the GPU's and the trace's peak and the three model lines
    whose live bytes differ most."""
    lines = []
    for row in figures["rows"]:
        gpu, trace = row["gpu_peak_bytes"] / 2**30, row["trace_peak_bytes"] / 2**30
        apart = ", ".join(f"{line['line']} {line['gpu_bytes'] / 2**20:.0f} -> {line['trace_bytes'] / 2**20:.0f} MiB"
                          for line in row["lines"][:3])
        duration, tokens = row["bucket"]
        lines.append(f"- {duration:g} s / {tokens:g} tokens x {row['batch_size']}: peak on the GPU {gpu:.2f} GiB, "
                     f"traced {trace:.2f} GiB; lines most apart (GPU -> trace): {apart}")
    return lines
