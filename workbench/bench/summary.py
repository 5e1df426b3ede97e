"""Headline figures of every committed benchmark result, as Markdown, read from benchmarks/results/*.json.

    python3 -m workbench.bench.summary > benchmarks/SUMMARY.md      # `make summary` does this

Nothing here is measured or typed by hand: each line quotes a JSON field (seconds as medians with their
min-max over repeats), so notes and the README can point at one generated page. A test checks that the
committed SUMMARY.md matches the committed results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from workbench.bench.flow.record import summary_lines as flow_summary_lines
from workbench.bench.losses.record import summary_lines as losses_summary_lines
from workbench.bench.results import RESULTS_DIR, provenance_line


def _spread(s: dict[str, float], scale: float = 1.0, unit: str = "s") -> str:
    """'6.24 s (6.23-6.46, n=3)' from a summarize() dict."""
    return (f"{s['median'] * scale:.4g} {unit} ({s['min'] * scale:.4g}-{s['max'] * scale:.4g}, "
            f"n={s.get('n', '?')})")


def _manifest(f: dict) -> list[str]:
    return [f"- read_cut_arrays: {_spread(f['workbench_read_cut_arrays_s'])}; lhotse from_jsonl_lazy: "
            f"{_spread(f['lhotse_from_jsonl_lazy_s'])}; {f['speedup_vs_lhotse']:.2f}x "
            f"(target {f['target_s']:g} s met: {f['meets_target']})"]


def _bins(f: dict) -> list[str]:
    if "workbench_bins_tokenized_end_to_end_s" in f:
        return [f"- with tokenizer: {_spread(f['workbench_bins_tokenized_end_to_end_s'])} for {f['utterances']:,} "
                f"utterances (target {f['target_s']:g} s)"]
    return [f"- end to end: {_spread(f['workbench_bins_end_to_end_s'])} for {f['utterances']:,} utterances; "
            f"lhotse path {f['lhotse_total_s']:.3g} s; {f['speedup_vs_lhotse']:.2f}x; same bins: {f['bins_equal']}"]


def _first_batch(f: dict) -> list[str]:
    out = []
    for key in sorted(k for k in f if k.endswith("_speedup")):
        buffer = key.split("_")[1]
        out.append(f"- buffer {buffer}: sequential {_spread(f[f'buffer_{buffer}_sequential_s'])}, concurrent "
                   f"{_spread(f[f'buffer_{buffer}_concurrent_s'])}: {f[key]:.2f}x")
    return out


def _decoding(f: dict) -> list[str]:
    t = f["targets"]
    out = []
    if None not in (t.get("rnnt_full_s"), t.get("tdt_full_s"), t.get("full_speedup_vs_frame_looping_off_rnnt")):
        out.append(f"- B=16, 12 s, fp32: RNN-T full graph {t['rnnt_full_s'] * 1e3:.2f} ms "
                   f"({t['speedup_vs_nemo_full_rnnt']:.2f}x NeMo's full graph), TDT full graph "
                   f"{t['tdt_full_s'] * 1e3:.2f} ms ({t['speedup_vs_nemo_full_tdt']:.2f}x NeMo's); RNN-T full "
                   f"graph {t['full_speedup_vs_frame_looping_off_rnnt']:.1f}x frame-looping off")
    rows = [r for r in f["rows"] if r.get("batch") == 16 and r.get("frames") == 150 and "time_s" in r]
    for r in rows:
        extra = f", token disagreement {r['token_disagreement']:.3f}" if "token_disagreement" in r else ""
        out.append(f"  - {r['model']} {r['dtype']} {r['method']}: {_spread(r['time_s'], 1e3, 'ms')}, "
                   f"{r['labels_per_frame']:.3f} labels/frame{extra}")
    for r in f["rows"]:
        if r.get("method", "").startswith("torchaudio") and "time_s" in r:
            out.append(f"  - torchaudio RNNTBeamSearch beam 1, B=1, {r['frames']} frames: "
                       f"{_spread(r['time_s'], 1e3, 'ms')}")
    out.append(f"- empty conditional-while iteration: {f['empty_while_iteration']['seconds_per_iteration'] * 1e6:.2f} us;"
               f" failures: {f['failures'] or 'none'}; skipped: {f['skipped_for_time'] or 'none'}")
    return out


def _models(f: dict) -> list[str]:
    out = [f"- {name}: {count / 1e6:.1f}M parameters" for name, count in f["parameters"].items()]
    for r in f["steps"]:
        if "step_s" in r:
            peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**30:.1f} GiB"
            out.append(f"  - {r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']:g} s "
                       f"U={r['num_tokens']}: {_spread(r['step_s'], 1e3, 'ms')}, peak {peak}")
    loss = f["rnnt_loss_vs_torchaudio"]
    if loss.get("ran"):
        out.append(f"- rnnt_loss vs torchaudio: max relative loss difference {loss['max_rel_loss_diff']:.2e}, max "
                   f"gradient difference {loss['max_abs_grad_diff']:.2e}; time ours/torchaudio "
                   f"{loss['ours_over_torchaudio_time']:.1f}x")
    out.append(f"- failures: {f['failures'] or 'none'}")
    return out


def _search_line(label: str, r: dict) -> str:
    return (f"- {label}: {len(r['batch_sizes'])} buckets, {r['probes']} probes ({r['probes_per_bucket']:.2f} per "
            f"bucket), {r['ooms']} OOMs, {r['seconds']:.0f} s")


def _oomptimizer(f: dict) -> list[str]:
    out = []
    for part in ("rnnt", "aed"):
        p = f.get(part, {})
        if "skipped" in p and "predictive" not in p:
            continue
        comparison = p.get("comparison", {})
        runs = [("predictive, all buckets", p.get("predictive"))]
        if comparison:  # both strategies fresh on a subset of the buckets
            runs += [("predictive, compared buckets", comparison.get("predictive")),
                     ("bisect, compared buckets", comparison.get("bisect"))]
        else:
            runs.append(("bisect, all buckets", p.get("bisect")))
        runs.append(("predictive with DDP gradient buckets", p.get("ddp_accounting")))
        for label, r in runs:
            if r and "probes" in r:
                out.append(_search_line(f"{p['model']} {label}", r))
        for i, t in p.get("true_max", {}).items():
            out.append(f"  - bucket {i} {t['bucket']}: true maximum {t['true_max']}, predictive {t['predictive']} "
                       f"({t['predictive_below_true']:.1%} below), bisect {t['bisect']}")
        if "soak" in p:
            from workbench.oomptimizer.run import describe_soak

            out.append(f"- {describe_soak(p['soak'])}")
    if "world_size" in f:
        out.append(_search_line(f"{f['model']} DDP on {f['world_size']} GPUs", f["predictive"]))
    out.append(f"- failures: {f.get('failures') or 'none'}")
    return out


def _allocator(f: dict) -> list[str]:
    out = [f"- rounds run: {f['rounds_run']}; targets met: {f['targets_met']}"]
    for label, block in f["headrooms"].items():
        out.append(f"- headroom {label}, limit {block['memory_limit_bytes'] / 2**30:.1f} GiB:")
        for config in ("static_plain", "static_expandable", "dynamic_plain", "dynamic_expandable"):
            c = block[config]
            out.append(f"  - {config} ({c['settings'] or 'defaults'}): median step {c['median_step_s'] * 1e3:.1f} ms, "
                       f"device allocations/step {c['device_allocs_per_step']:.2f}, retries {c['alloc_retries']}, "
                       f"OOMs {c['ooms']}, peak reserved {c['peak_reserved_bytes'] / 2**30:.2f} GiB")
        for pair, r in block["paired_time_ratios"].items():
            out.append(f"  - {pair}: {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f} over {r['n']} round(s))")
        target = block.get("time_target")
        if target:
            out.append(f"  - time target: {target['pair'] or 'no valid reference'} <= {target['limit']}: "
                       f"{target['verdict']}"
                       + ("" if target.get("conclusive") else " (not conclusive)"))
    out += [f"- failure: {x}" for x in f["failures"]]
    out += [f"- warning: {x}" for x in f.get("warnings", []) if "not a reference" in x]
    return out


SECTIONS: dict[str, Callable[[dict], list[str]]] = {
    "manifest_reading": _manifest, "bucketing_bins_1m": _bins, "bucketing_bins_1m_tokenizer": _bins,
    "bucketing_first_batch": _first_batch, "models": _models, "oomptimizer": _oomptimizer,
    "oomptimizer_aed": _oomptimizer, "oomptimizer_ddp": _oomptimizer, "allocator": _allocator,
    "decoding": _decoding, "decoding_quick": _decoding,
    "flow": lambda figures: flow_summary_lines({"figures": figures}), "losses": losses_summary_lines,
}


def section_for(stem: str) -> Callable[[dict], list[str]] | None:
    """The summary of a result file by its name (``allocator_headroom15`` is an allocator result)."""
    return SECTIONS.get(stem) or next((f for name, f in SECTIONS.items() if stem.startswith(name + "_")), None)


def render(results_dir: Path = RESULTS_DIR) -> str:
    lines = ["# Benchmark summary", "",
             "Generated by `python3 -m workbench.bench.summary` from `benchmarks/results/*.json`; do not edit.",
             "Times: median (min-max, n repeats).", ""]
    for path in sorted(p for p in results_dir.glob("*.json") if not p.name.startswith(".")):  # not temp files
        try:
            record = json.loads(path.read_text())
            section = section_for(path.stem)
            lines += [f"## {path.name}", f"{record['what']}  ", f"*{provenance_line(record)}*", ""]
            lines += section(record["figures"]) if section else ["- (no summary for this file)"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: cannot summarize ({type(e).__name__}: {e})") from e
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from workbench.atomic import write_text_atomically

    parser = argparse.ArgumentParser(description="benchmarks/SUMMARY.md from benchmarks/results/*.json")
    parser.add_argument("--out", help="write here (atomically: a failure leaves the old file) instead of stdout")
    args = parser.parse_args(argv)
    text = render()
    if args.out:
        write_text_atomically(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
