"""The ``flow`` record: what the README's commands did on a GPU, and the checks a user makes.

Schema (``figures``): ``commands`` (one ``{"command", "seconds"}`` per README line, in order),
``profile`` (buckets, batch sizes, probes per bucket, soak OOMs), ``train_profile`` and
``train_max_duration`` (see :func:`train_figures`), ``decode`` (utterances decoded, graph mode), and
``checks`` (name -> bool) with ``failures`` (the names of the false ones), and ``wall_s``. When a
command fails, ``commands`` lists those that ran, ``failures`` names the failed one and the other
figures are missing.
"""

from __future__ import annotations

from typing import Any

DATA_WAIT_TARGET = 0.05  # the GPU waits for data less than this share of the step, after warm-up


def train_figures(summary: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one `workbench train` run from its train_summary.json and train_log.jsonl records.

    Steady state is every step after the first (the first waits for the workers' first batches)."""
    from workbench.timing import summarize

    steady = records[1:] or records
    wait = sum(r["data_s"] for r in steady)
    busy = sum(r["step_s"] for r in steady)
    return {"steps": summary["steps"], "num_workers": summary["num_workers"],
            "audio_seconds_per_second": summary["audio_seconds_per_second"],
            "audio_seconds_per_second_per_step": summarize([r["audio_s"] / (r["data_s"] + r["step_s"])
                                                            for r in steady]),
            "data_wait_share": summary["data_wait_share"],
            "data_wait_share_after_warmup": wait / (wait + busy) if wait + busy else 0.0,
            "data_wait_s": summarize([r["data_s"] for r in steady]),
            "step_s": summarize([r["step_s"] for r in steady]),
            "batch_size": summarize([r["batch_size"] for r in records]),
            "first_losses": [r["loss"] for r in records[:3]], "last_losses": [r["loss"] for r in records[-3:]],
            "peak_allocated_bytes": summary.get("peak_allocated_bytes"),
            "warnings": summary.get("warnings", [])}


def summary_lines(figures: dict[str, Any]) -> list[str]:
    """Headline lines for benchmarks/SUMMARY.md (from the record's ``figures``)."""
    f = figures
    lines = []
    total = sum(c["seconds"] for c in f["commands"])
    if "profile" not in f:
        return [f"README flow: FAILED after {len(f['commands'])} commands in {total:.0f} s: {'; '.join(f['failures'])}"]
    lines.append(f"README flow: {len(f['commands'])} commands in {total:.0f} s; checks "
                 + ("all passed" if not f["failures"] else f"FAILED: {', '.join(f['failures'])}"))
    p = f["profile"]
    lines.append(f"- profile: {p['num_buckets']} buckets, batch sizes {min(p['batch_sizes'])}-"
                 f"{max(p['batch_sizes'])}, {p['probes_per_bucket']:.2f} probes per bucket, soak OOMs {p['soak_ooms']}")
    seconds = f["train_max_duration"].get("max_duration")
    baseline = f"train --max-duration {seconds:g}" if seconds else "train --max-duration"
    for name, label in (("train_profile", "train --profile"), ("train_max_duration", baseline)):
        t = f[name]
        lines.append(f"- {label}: {t['audio_seconds_per_second']:.0f} audio s/s, median batch "
                     f"{t['batch_size']['median']:.0f} cuts, data wait {100 * t['data_wait_share_after_warmup']:.1f} % "
                     f"of the step after warm-up ({t['num_workers']} workers), loss "
                     f"{t['first_losses'][0]:.2f} -> {t['last_losses'][-1]:.2f}")
    lines.append("- the --max-duration run is the README's example value, not the largest that fits: its ratio to "
                 "the profile is no throughput result (that is the throughput study's)")
    wait = f["train_profile"]["data_wait_share_after_warmup"]
    lines.append(f"- data wait at the profile's batch sizes: {100 * wait:.1f} % (target < "
                 f"{100 * DATA_WAIT_TARGET:.0f} %: {'met' if wait < DATA_WAIT_TARGET else 'missed'})")
    return lines


def commands_table(record: dict[str, Any]):
    """The README commands with their wall time, as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(record["figures"]["commands"]).assign(seconds=lambda d: d["seconds"].round(1))
