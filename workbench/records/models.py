"""The models record (``benchmarks/results/models.json``): its fields and every reading of them.

``figures["steps"]``: one row per (model, dtype, shape) with ``step_s`` (seconds of one training step:
median, min, max, n), ``peak_bytes`` (None off a GPU), ``audio_s_per_s`` (batch x seconds / median step),
``shape_source`` ("fixed": the bench's own shapes; "profile": a bucket of an OOMptimizer 2D profile, with
``profile_bucket`` {"record", "index"}), ``flops`` (one forward+backward, torch.utils.flop_counter),
``mfu`` (flops / median step / ``figures["matmul"]["flops_per_s"]``), ``kernel_s`` (summed device time of one profiled step's kernels) and ``gpu_busy``
(kernel_s / median step), each None when not measured (``gpu_busy_note`` says why); ``parameters``:
model -> count; ``bf16_vs_fp32``: ratios per model and fixed shape; ``profile_shapes``: {"shapes": model
-> the profile shapes measured, "skipped": model -> why it has none}; ``rnnt_loss_vs_torchaudio``: our
loss and gradient against torchaudio's on the same logits, and their times. ``kernels`` (with --kernels):
model -> one profiled bf16 step at ``params["kernel_shape"]``: ``device``, ``total_s`` (summed self time
of every kernel: device time on a GPU, CPU operator time off one), ``top`` (rows of ``name``, ``self_s``,
``share`` of that total, ``calls``), or ``oom`` / ``error``. A step that did not run has ``oom`` or
``error`` in place of the timed fields.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from workbench.records.results import times_faster
from workbench.units import GiB

NAME = "models"
MFU_TARGETS = {"xl-aed": 0.45, "large-rnnt": 0.25, "large-tdt": 0.25}  # bf16, at the profile's shapes


def _spread(s: Mapping[str, float], scale: float = 1.0, unit: str = "s") -> str:
    return (f"{s['median'] * scale:.4g} {unit} ({s['min'] * scale:.4g}-{s['max'] * scale:.4g}, "
            f"n={s.get('n', '?')})")


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def shape_text(r: Mapping[str, Any]) -> str:
    """"large-rnnt bf16 B=16 15 s U=120", with "(profile oomptimizer.json #0)" for a profile row ("(large-rnnt's
    profile ...)" for another model's shape)."""
    bucket = r.get("profile_bucket") or {}
    of = f"{bucket['model']}'s " if "model" in bucket else ""
    where = f" ({of}profile {bucket['record']} #{bucket['index']})" if r.get("shape_source") == "profile" else ""
    return f"{r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']:g} s U={r['num_tokens']}{where}"


def utilization_text(r: Mapping[str, Any]) -> str:
    """", MFU 4.1 %, GPU busy 41.0 %" ("-" where None); a field the row lacks is left out."""
    out = f", MFU {_percent(r['mfu'])}" if "mfu" in r else ""
    return out + (f", GPU busy {_percent(r['gpu_busy'])}" if "gpu_busy" in r else "")


def row_line(r: Mapping[str, Any]) -> str:
    """One step row in a line: shape, median step time, peak, audio s/s, MFU, GPU busy; or OOM / the error."""
    if "step_s" not in r:
        return f"{shape_text(r)}: {'OOM' if r.get('oom') else 'ERROR ' + r.get('error', '')}"
    peak = "-" if r.get("peak_bytes") is None else f"{_gib(r['peak_bytes'])} GiB"
    return (f"{shape_text(r)}: {r['step_s']['median'] * 1e3:.1f} ms, peak {peak}, "
            f"{audio_per_second(r):.0f} audio s/s{utilization_text(r)}")


def audio_per_second(r: Mapping[str, Any]) -> float:
    """Seconds of (padded) audio trained per second of wall time: batch x seconds / median step."""
    return r["batch_size"] * r["duration_s"] / r["step_s"]["median"]


def mfu_target_lines(figures: Mapping[str, Any], targets: Mapping[str, float] = MFU_TARGETS) -> list[str]:
    """One line per model with an MFU target in the record: its bf16 MFU at each profile shape against the
    target, met when every profile shape reaches it; "not judged" when it has no profile row with MFU."""
    out = []
    for model, target in targets.items():
        if model not in figures.get("parameters", {}):
            continue
        head = f"{model} MFU target >= {100 * target:.0f} % at profile shapes"
        rows = [r for r in figures["steps"] if r["model"] == model and r.get("shape_source") == "profile"
                and r.get("mfu") is not None]
        if not rows:
            why = (figures.get("profile_shapes", {}).get("skipped", {}).get(model)
                   or "this record has no profile-sized row with MFU")
            out.append(f"{head}: not judged ({why})")
            continue
        values = ", ".join(f"{_percent(r['mfu'])} (B={r['batch_size']} x {r['duration_s']:g} s)" for r in rows)
        stand_ins = sorted({r["profile_bucket"]["model"] for r in rows if "model" in r.get("profile_bucket", {})})
        if stand_ins:
            head += f" (at {', '.join(stand_ins)}'s profile shapes: {model} has no OOMptimizer record)"
        worst, short = min(r["mfu"] for r in rows), sum(r["mfu"] < target for r in rows)
        verdict = ("met" if not short else
                   f"missed at {short} of {len(rows)} ({100 * (target - worst):.1f} points short at worst)")
        out.append(f"{head}: {values}: {verdict}")
    return out


def kernel_lines(top: Sequence[Mapping[str, Any]], rows: int = 5) -> list[str]:
    """The first ``rows`` entries of a top-kernel list (``name``, ``self_s``, ``share``, ``calls``), one line
    each: " 31.2%    12.345 ms    96x  name"."""
    return [f"{k['share']:>6.1%} {k['self_s'] * 1e3:>9.3f} ms {k['calls']:>5}x  {_short(k['name'])}"
            for k in top[:rows]]


def row_kernel_lines(r: Mapping[str, Any], rows: int = 5) -> list[str]:
    """A profile-sized row's top kernels (:func:`kernel_lines`); [] without them."""
    return kernel_lines(r.get("top_kernels", []), rows)


def loss_line(loss: Mapping[str, Any]) -> str:
    """Our rnnt_loss against torchaudio's: differences, and which is faster by how much."""
    ratio = loss["ours_over_torchaudio_time"]
    speed = times_faster(1 / ratio, "torchaudio")
    return (f"rnnt_loss vs torchaudio: max relative loss difference {loss['max_rel_loss_diff']:.2e}, max "
            f"gradient difference {loss['max_abs_grad_diff']:.2e}; ours is {speed} (time ours/torchaudio "
            f"{ratio:.3g})")


def _short(kernel_name: str, width: int = 60) -> str:
    return kernel_name if len(kernel_name) <= width else kernel_name[:width - 3] + "..."


def kernel_line(model: str, profile: Mapping[str, Any]) -> str:
    """One line per model: its top kernel and that kernel's share of the step's kernel time."""
    where = f"{profile['dtype']} B={profile['batch_size']} {profile['duration_s']:g} s on {profile['device']}"
    if profile.get("oom") or profile.get("error"):
        return f"{model} kernels ({where}): {'OOM' if profile.get('oom') else profile['error']}"
    if not profile["top"]:
        return f"{model} kernels ({where}): none recorded"
    first = profile["top"][0]
    return (f"{model} top kernel ({where}): {_short(first['name'])} {first['share']:.1%} of "
            f"{profile['total_s'] * 1e3:.4g} ms")


def kernel_table_lines(kernels: Mapping[str, Mapping[str, Any]], rows: int = 5) -> list[str]:
    """A short table per model: its top ``rows`` kernels by self time, with their share and calls."""
    out = []
    for model, profile in kernels.items():
        out.append(kernel_line(model, profile))
        out += [f"  {line}" for line in kernel_lines(profile.get("top", []), rows)]
    return out


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md."""
    out = [f"- {name}: {count / 1e6:.1f}M parameters" for name, count in figures["parameters"].items()]
    if figures.get("matmul"):
        m = figures["matmul"]
        out.append(f"- matmul rate (MFU's denominator): {m['flops_per_s'] / 1e12:.4g} TFLOP/s {m['dtype']}, n={m['n']}")
    out += [f"- {kernel_line(name, profile)}" for name, profile in figures.get("kernels", {}).items()]
    for r in figures["steps"]:
        if "step_s" in r:
            peak = "-" if r.get("peak_bytes") is None else f"{_gib(r['peak_bytes'])} GiB"
            out.append(f"  - {shape_text(r)}: {_spread(r['step_s'], 1e3, 'ms')}, peak {peak}"
                       f"{utilization_text(r)}")
    out += [f"- {line}" for line in mfu_target_lines(figures)]
    out += [f"- {model}: no profile-sized rows ({why})"
            for model, why in figures.get("profile_shapes", {}).get("skipped", {}).items()]
    if figures["rnnt_loss_vs_torchaudio"].get("ran"):
        out.append(f"- {loss_line(figures['rnnt_loss_vs_torchaudio'])}")
    out.append(f"- failures: {figures['failures'] or 'none'}")
    return out


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The bench's stdout table: bf16 against fp32 per model and fixed shape (with bf16 MFU and GPU busy),
    the profile-sized rows, the OOMs, the MFU targets, the loss check."""
    rows, params = figures["steps"], figures["parameters"]
    out = [f"{'model':<11} {'params':>8} {'B':>3} {'sec':>5} {'U':>4} {'bf16 ms':>9} {'fp32 ms':>9} "
           f"{'fp32/bf16':>9} {'bf16 GiB':>9} {'fp32 GiB':>9} {'bf16 MFU':>9} {'bf16 busy':>9}"]
    for r in figures["bf16_vs_fp32"]:
        b, f = (next(x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                     and x["duration_s"] == r["duration_s"] and x["dtype"] == dtype
                     and x["shape_source"] == "fixed") for dtype in ("bf16", "fp32"))
        out.append(f"{r['model']:<11} {params[r['model']] / 1e6:>7.1f}M {r['batch_size']:>3} {r['duration_s']:>5g} "
                   f"{b['num_tokens']:>4} {b['step_s']['median'] * 1e3:>9.1f} {f['step_s']['median'] * 1e3:>9.1f} "
                   f"{r['fp32_over_bf16_time']:>9.2f} {_gib(b['peak_bytes']):>9} {_gib(f['peak_bytes']):>9} "
                   f"{_percent(b.get('mfu')):>9} {_percent(b.get('gpu_busy')):>9}")
    profile_rows = [r for r in rows if r.get("shape_source") == "profile"]
    if profile_rows:
        out.append("profile shapes (OOMptimizer batch sizes):")
        out += [f"  {row_line(r)}" for r in profile_rows]
    out += [f"OOM: {r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']}s" for r in rows if r.get("oom")]
    out += [f"{model}: no profile-sized rows ({why})"
            for model, why in figures.get("profile_shapes", {}).get("skipped", {}).items()]
    out += mfu_target_lines(figures)
    if figures["rnnt_loss_vs_torchaudio"].get("ran"):
        out.append(loss_line(figures["rnnt_loss_vs_torchaudio"]))
    return out


def _row_key(r: Mapping[str, Any]) -> tuple:
    return (r["model"], r["dtype"], r["shape_source"], r["batch_size"], r["duration_s"], r["num_tokens"])


def before_after_rows(before: Mapping[str, Any], after: Mapping[str, Any], *, paired_only: bool = False) -> list[dict]:
    """Per model, dtype and shape timed in either record (``after``'s order, then rows only ``before``
    has; ``paired_only``: only those timed in both): median step seconds, audio s/s, MFU and peak allocated
    bytes of each (None where that record has no such timed row or field), and before / after step time."""
    timed = [{_row_key(r): r for r in figures["steps"] if "step_s" in r} for figures in (before, after)]
    keys = list(timed[1]) + [k for k in timed[0] if k not in timed[1]]
    if paired_only:
        keys = [k for k in keys if k in timed[0] and k in timed[1]]
    out = []
    for key in keys:
        b, a = timed[0].get(key), timed[1].get(key)
        model, dtype, source, batch_size, seconds, tokens = key
        row = {"model": model, "dtype": dtype, "shape_source": source, "batch_size": batch_size,
               "duration_s": seconds, "num_tokens": tokens}
        for label, r in (("before", b), ("after", a)):
            row[f"{label}_step_s"] = None if r is None else r["step_s"]["median"]
            row[f"{label}_audio_s_per_s"] = None if r is None else audio_per_second(r)
            row[f"{label}_mfu"] = None if r is None else r.get("mfu")
            row[f"{label}_peak_bytes"] = None if r is None else r.get("peak_bytes")
        row["before_over_after_time"] = None if a is None or b is None else b["step_s"]["median"] / a["step_s"]["median"]
        out.append(row)
    return out


# Notebook 02's reading of the step records: tables with human columns, sentences built from the figures.

MATMUL_MARKERS = ("nvjet", "gemm", "cutlass", "sm90_xmma", "ampere_", "cublas")


def kernel_label(kernel_name: str, width: int = 48) -> str:
    """A profiler kernel name a reader can scan: the kernel's own name without "void" and namespaces, and
    the functor or kernel it wraps ("unrolled_elementwise_kernel: direct_copy"); nvjet/Triton names as
    they are; cut to ``width``."""
    import re

    name = re.sub(r"^void\s+", "", kernel_name).replace("(anonymous namespace)::", "")
    full_head = re.split(r"[<(]", name, maxsplit=1)[0]
    head = full_head.split("::")[-1]
    inner = re.search(r"(\w+?)_(?:functor|kernel_cuda|kernel_impl)\b|CUDAFunctor_(\w+)", name[len(full_head):])
    what = inner and (inner.group(1) or inner.group(2))
    label = head + (f": {what}" if what and what != head else "")
    return label if len(label) <= width else label[:width - 1] + "…"


def kernel_table(figures: Mapping[str, Any], rows: int = 5):
    """Each model's top ``rows`` kernels of one profiled bf16 step (a stated top-N): model, kernel, share of
    the step's kernel time (%), self time (ms), calls; for display."""
    import pandas as pd

    out = []
    for model, profile in figures.get("kernels", {}).items():
        for k in profile.get("top", [])[:rows]:
            out.append({"model": model, "kernel": kernel_label(k["name"]), "share of kernel time (%)": 100 * k["share"],
                        "self time (ms)": k["self_s"] * 1e3, "calls": k["calls"]})
    return (pd.DataFrame(out).style.format({"share of kernel time (%)": "{:.1f}", "self time (ms)": "{:.2f}"})
            .set_properties(subset=["model", "kernel"], **{"text-align": "left"}).hide(axis="index"))


def meaning_of_kernels(figures: Mapping[str, Any] | None, rows: int = 5) -> str:
    """What the kernel profile means, in a sentence: the largest single kernel's share, the top ``rows``'
    share, and how many of those are matmuls."""
    profiles = {m: p for m, p in ((figures or {}).get("kernels") or {}).items() if p.get("top")}
    if not profiles:
        return "The committed models record has no kernel profile (the bench ran without --kernels)."
    top1 = {m: p["top"][0]["share"] for m, p in profiles.items()}
    tops = {m: sum(k["share"] for k in p["top"][:rows]) for m, p in profiles.items()}
    entries = [k for p in profiles.values() for k in p["top"][:rows]]
    matmuls = sum(any(mark in k["name"].lower() for mark in MATMUL_MARKERS) for k in entries)
    biggest = max(top1, key=top1.get)
    lead = "No kernel dominates a step" if top1[biggest] < 0.25 else "One kernel dominates a step"
    return (f"{lead}: the largest takes at most {100 * top1[biggest]:.0f} % of a model's "
            f"kernel time ({biggest}), and each model's top {rows} together "
            f"{100 * min(tops.values()):.0f}-{100 * max(tops.values()):.0f} %; {matmuls} of those "
            f"{len(entries)} are matmuls.")


def compared_table(before: Mapping[str, Any], after: Mapping[str, Any], labels: tuple[str, str], *,
                   paired_only: bool = False):
    """:func:`before_after_rows` of two records of one GPU call that differ in one setting, named by
    ``labels`` (e.g. ("cuDNN", "Triton")): per model and shape the median step time (ms), MFU (%) of each,
    and the first's time over the second's; for display."""
    import pandas as pd

    a, b = labels
    out = [{"model": r["model"], "batch size": r["batch_size"], "max duration (s)": r["duration_s"],
            "tokens": r["num_tokens"], f"{a} step (ms)": _ms(r["before_step_s"]), f"{b} step (ms)": _ms(r["after_step_s"]),
            f"{a} MFU (%)": _pct(r["before_mfu"]), f"{b} MFU (%)": _pct(r["after_mfu"]),
            f"{a} / {b} time (x)": r["before_over_after_time"]}
           for r in before_after_rows(before, after, paired_only=paired_only)]
    formats = {f"{a} step (ms)": "{:.0f}", f"{b} step (ms)": "{:.0f}", f"{a} MFU (%)": "{:.1f}",
               f"{b} MFU (%)": "{:.1f}", f"{a} / {b} time (x)": "{:.2f}", "max duration (s)": "{:.1f}"}
    return (pd.DataFrame(out).style.format(formats, na_rep="").set_properties(subset=["model"], **{"text-align": "left"})
            .hide(axis="index"))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _pct(share: float | None) -> float | None:
    return None if share is None else 100 * share


def meaning_of_comparison(before: Mapping[str, Any], after: Mapping[str, Any], labels: tuple[str, str],
                          targets: Mapping[str, float] = MFU_TARGETS) -> str:
    """What two records of one GPU call mean, in two sentences: at how many shapes the second setting is
    faster and the range of first / second time; then each model's MFU at the profile shapes under the
    second setting against its target."""
    a, b = labels
    rows = [r for r in before_after_rows(before, after, paired_only=True) if r["before_over_after_time"]]
    if not rows:
        return f"The two records share no timed shape, so {a} and {b} are not compared."
    ratios = [r["before_over_after_time"] for r in rows]
    faster = sum(x > 1 for x in ratios)
    slowest = min(rows, key=lambda r: r["before_over_after_time"])
    line = (f"{b} is faster at {faster} of {len(rows)} shapes ({a} / {b} step time {min(ratios):.2f}x to "
            f"{max(ratios):.2f}x)")
    where = f"{slowest['model']} B={slowest['batch_size']} x {slowest['duration_s']:.0f} s"
    if slowest["before_over_after_time"] < 0.98:
        line += f"; at {where} {a} is the faster ({slowest['before_over_after_time']:.2f}x)"
    elif slowest["before_over_after_time"] < 1:
        line += f"; at {where} the two are level (within 2 %)"
    mfu = []
    for model, target in targets.items():
        values = [r["after_mfu"] for r in rows if r["model"] == model and r["after_mfu"] is not None]
        if values:
            mfu.append(f"{model} {100 * min(values):.0f}-{100 * max(values):.0f} % (target {100 * target:.0f} %)")
    return line + "." + (f" MFU at the profile shapes with {b}: {', '.join(mfu)}." if mfu else "")
