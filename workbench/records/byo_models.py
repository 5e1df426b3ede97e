"""The byo_models record (``benchmarks/results/byo_models.json``): the OOMptimizer on models nobody here
wrote, per model: batch size, probes, peak and the 1.1x check per bucket, search seconds and the soak.
One reader for SUMMARY.md and notebook 06."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from workbench.records.results import model_summary_lines
from workbench.units import GiB
from workbench.palette import colour

NAME = "byo_models"


def merged_figures(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One figures dict from byo_models records of the same buckets (a full run and partial reruns): per
    model the measured entry of the newest record that has one, else the newest error; each entry says
    the commit it was measured at (``commit``)."""
    if not records:
        raise ValueError("records: need at least one byo_models record")
    buckets = records[0]["figures"]["buckets"]
    models: dict[str, Any] = {}
    for record in sorted(records, key=lambda r: r["date"]):
        if record["figures"]["buckets"] != buckets:
            raise ValueError(f"{record['name']}: other buckets than {records[0]['name']}: not merged")
        for name, entry in record["figures"]["models"].items():
            if "error" not in entry or "error" in models.get(name, {"error": ""}):
                models[name] = {**entry, "commit": record["git_commit"][:7]}
    return {"buckets": buckets, "models": models}


def model_rows(figures: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (model, bucket): duration, tokens, batch size, probes, peak GiB, whether 1.1x OOMed."""
    rows = []
    for name, entry in figures["models"].items():
        if "error" in entry:
            continue
        for i, (duration, tokens) in enumerate(figures["buckets"]):
            peak = entry["peak_bytes"][i]
            rows.append({"model": name, "bucket": i, "max duration (s)": round(duration, 1),
                         "max tokens": int(tokens), "batch size": entry["batch_sizes"][i],
                         "probes": entry["probes_per_bucket"][i],
                         "peak (GiB)": None if peak is None else round(peak / GiB, 1),
                         "1.1x OOMs": "yes" if entry["tightness"][i]["oom"] else "no"})
    return pd.DataFrame(rows)


def model_summary(figures: Mapping[str, Any]) -> pd.DataFrame:
    """One row per model: parameters, probes per bucket, search and soak seconds, OOMs, buckets tight at 1.1x,
    or the error that stopped it."""
    rows = []
    for name, entry in figures["models"].items():
        if "error" in entry:
            rows.append({"model": name, "error": entry["error"][:120], "commit": entry.get("commit")})
            continue
        soak = entry["soak"]
        rows.append({"model": name, "commit": entry.get("commit"), "parameters (M)": round(entry["parameters"] / 1e6, 1),
                     "probes per bucket": round(entry["mean_probes_per_bucket"], 2),
                     "search (s)": round(entry["search_s"], 1), "soak steps": soak.get("steps"),
                     "soak OOMs": soak.get("ooms"),
                     "buckets OOM at 1.1x": f"{sum(t['oom'] for t in entry['tightness'])}/{len(entry['tightness'])}"})
    return pd.DataFrame(rows)


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md: one per model, then the targets missed."""
    return model_summary_lines(figures, model_line)


def model_line(name: str, entry: Mapping[str, Any]) -> str:
    sizes = entry["batch_sizes"]
    tight = sum(t["oom"] for t in entry["tightness"])
    return (f"- {name} ({entry['parameters'] / 1e6:.0f}M): batch sizes {max(sizes)}-{min(sizes)} over "
            f"{len(sizes)} buckets, {entry['mean_probes_per_bucket']:.2f} probes per bucket in "
            f"{entry['search_s']:.0f} s; soak {entry['soak'].get('steps', 0)} steps, "
            f"{entry['soak'].get('ooms', 0)} OOMs; 1.1x OOMs at {tight}/{len(sizes)} buckets")


def findings(figures: Mapping[str, Any]) -> list[str]:
    """Sentences on what the record means, built from its figures."""
    measured = figures["models"]
    ok = {n: e for n, e in measured.items() if "error" not in e}
    failed = [n for n, e in measured.items() if "error" in e]
    out = []
    if ok:
        worst = max(ok, key=lambda n: ok[n]["mean_probes_per_bucket"])
        tight = all(t["oom"] for e in ok.values() for t in e["tightness"])
        ooms = sum(int(e["soak"].get("ooms") or 0) for e in ok.values())
        out.append(f"{len(ok)} of {len(measured)} models were searched: at most "
                   f"{ok[worst]['mean_probes_per_bucket']:.2f} probes per bucket ({worst}), "
                   f"{ooms} OOMs in their soaks, and 1.1x each size "
                   f"{'ran out of memory at every bucket' if tight else 'fit at some bucket'}, so every size is "
                   f"{'within 10 % of the largest that fits' if tight else 'not yet shown to be tight'}.")
    if failed:
        out.append(f"Not measured: {', '.join(failed)} (the error is in the table above).")
    return out


def plot_batch_sizes(figures: Mapping[str, Any], ax) -> None:
    """Batch size per bucket, one line per model (log scale), legend outside the data."""
    rows = model_rows(figures)
    for name, group in rows.groupby("model", sort=False):
        ax.plot(group["bucket"], group["batch size"], marker="o", label=name, color=colour(name, fallback=len(ax.lines)))
    labels = [f"{d:.0f} s\n{int(u)} tok" for d, u in figures["buckets"]]
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("bucket (max duration, max tokens)")
    ax.set_ylabel("batch size (utterances)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def styled_summary(figures: Mapping[str, Any]):
    """:func:`model_summary` for display: numbers rounded to what they carry, blanks for what does not apply."""
    formats = {"parameters (M)": "{:.0f}", "probes per bucket": "{:.2f}", "search (s)": "{:.0f}",
               "soak steps": "{:.0f}", "soak OOMs": "{:.0f}"}
    table = model_summary(figures)
    return table.style.format({k: v for k, v in formats.items() if k in table}, na_rep="").hide(axis="index")


def styled_rows(figures: Mapping[str, Any]):
    """:func:`model_rows` for display."""
    return model_rows(figures).style.format({"max duration (s)": "{:.1f}", "peak (GiB)": "{:.1f}"},
                                            na_rep="").hide(axis="index")


def committed_figures(results_dir=None) -> dict[str, Any] | None:
    """The merged figures (:func:`merged_figures`) of every committed byo_models record, announcing each
    with its provenance; None when there is none."""
    from workbench.records.results import RESULTS_DIR, load_result, provenance_line

    folder = results_dir or RESULTS_DIR
    records = [load_result(p.stem, folder) for p in sorted(Path(folder).glob(NAME + "*.json"))]
    for record in records:
        print(f"Showing committed result '{record['name']}': {provenance_line(record)}")
    return merged_figures(records) if records else None


def check_meaning(results: Mapping[str, Any]) -> str:
    """What the contract checks of the notebook found: ``results`` maps an adapter to its CheckReport or to
    the one-line reason it was not checked."""
    passed = [name for name, r in results.items() if not isinstance(r, str)]
    skipped = {name: r for name, r in results.items() if isinstance(r, str)}
    text = (f"{' and '.join(passed)} {'keep' if len(passed) > 1 else 'keeps'} the contract: one step gives a finite "
            "scalar loss and a gradient for every trainable tensor, so the OOMptimizer can probe "
            f"{'them' if len(passed) > 1 else 'it'}." if passed else "No adapter was checked here.")
    if skipped:
        text += " Not checked: " + "; ".join(f"{n} ({r})" for n, r in skipped.items()) + "."
    return text


def check_adapters(names, device: str, *, small: bool) -> dict[str, Any]:
    """``check_model`` on each adapter at a small bucket: name -> its CheckReport, or the one-line reason it
    was not checked here (a missing package, a broken contract)."""
    from workbench.adapters import ModelContractError, build_adapter, check_model

    results: dict[str, Any] = {}
    for name in names:
        try:
            results[name] = check_model(build_adapter(name, device, small=small), spec=name, bucket=(2.0, 16),
                                        device=device)
        except (ImportError, ModelContractError) as e:
            results[name] = f"{e}; pip install -e .[adapters]"
    return results


def check_line(name: str, result: Any) -> str:
    """One line of :func:`check_adapters`'s results."""
    return f"{name}: not checked here ({result})" if isinstance(result, str) else result.line()
