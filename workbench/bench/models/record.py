"""The models record (``benchmarks/results/models.json``): its fields and every reading of them.

``figures["steps"]``: one row per (model, dtype, shape) with ``step_s`` (seconds of one training step:
median, min, max, n) and ``peak_bytes`` (None off a GPU); ``parameters``: model -> count;
``bf16_vs_fp32``: ratios per model and shape; ``rnnt_loss_vs_torchaudio``: our loss and gradient against
torchaudio's on the same logits, and their times. ``kernels`` (with --kernels): model -> one profiled bf16
step at ``params["kernel_shape"]``: ``device``, ``total_s`` (summed self time of every kernel: device time
on a GPU, CPU operator time off one), ``top`` (rows of ``name``, ``self_s``, ``share`` of that total,
``calls``), or ``oom`` / ``error``.
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

from workbench.bench.results import times_faster
from workbench.units import GiB

NAME = "models"


class StepRow(TypedDict, total=False):
    model: str
    dtype: str  # "bf16" (autocast) or "fp32"
    batch_size: int
    duration_s: float
    num_tokens: int
    step_s: dict[str, float]  # results.summarize() of one step's seconds
    peak_bytes: int | None
    oom: bool


def _spread(s: Mapping[str, float], scale: float = 1.0, unit: str = "s") -> str:
    return (f"{s['median'] * scale:.4g} {unit} ({s['min'] * scale:.4g}-{s['max'] * scale:.4g}, "
            f"n={s.get('n', '?')})")


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f}"


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
        for k in profile.get("top", [])[:rows]:
            out.append(f"  {k['share']:>6.1%} {k['self_s'] * 1e3:>9.3f} ms {k['calls']:>5}x  {_short(k['name'])}")
    return out


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """The record's lines in benchmarks/SUMMARY.md."""
    out = [f"- {name}: {count / 1e6:.1f}M parameters" for name, count in figures["parameters"].items()]
    out += [f"- {kernel_line(name, profile)}" for name, profile in figures.get("kernels", {}).items()]
    for r in figures["steps"]:
        if "step_s" in r:
            peak = "-" if r.get("peak_bytes") is None else f"{_gib(r['peak_bytes'])} GiB"
            out.append(f"  - {r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']:g} s "
                       f"U={r['num_tokens']}: {_spread(r['step_s'], 1e3, 'ms')}, peak {peak}")
    if figures["rnnt_loss_vs_torchaudio"].get("ran"):
        out.append(f"- {loss_line(figures['rnnt_loss_vs_torchaudio'])}")
    out.append(f"- failures: {figures['failures'] or 'none'}")
    return out


def table_lines(figures: Mapping[str, Any]) -> list[str]:
    """The bench's stdout table: bf16 against fp32 per model and shape, the OOMs, the loss check."""
    rows, params = figures["steps"], figures["parameters"]
    out = [f"{'model':<11} {'params':>8} {'B':>3} {'sec':>5} {'U':>4} {'bf16 ms':>9} {'fp32 ms':>9} "
           f"{'fp32/bf16':>9} {'bf16 GiB':>9} {'fp32 GiB':>9}"]
    for r in figures["bf16_vs_fp32"]:
        b, f = (next(x for x in rows if x["model"] == r["model"] and x["batch_size"] == r["batch_size"]
                     and x["duration_s"] == r["duration_s"] and x["dtype"] == dtype) for dtype in ("bf16", "fp32"))
        out.append(f"{r['model']:<11} {params[r['model']] / 1e6:>7.1f}M {r['batch_size']:>3} {r['duration_s']:>5g} "
                   f"{b['num_tokens']:>4} {b['step_s']['median'] * 1e3:>9.1f} {f['step_s']['median'] * 1e3:>9.1f} "
                   f"{r['fp32_over_bf16_time']:>9.2f} {_gib(b['peak_bytes']):>9} {_gib(f['peak_bytes']):>9}")
    out += [f"OOM: {r['model']} {r['dtype']} B={r['batch_size']} {r['duration_s']}s" for r in rows if r.get("oom")]
    if figures["rnnt_loss_vs_torchaudio"].get("ran"):
        out.append(loss_line(figures["rnnt_loss_vs_torchaudio"]))
    return out


def compile_speedups(eager: Mapping[str, Any], compiled: Mapping[str, Any]) -> list[dict]:
    """Per model, dtype and shape timed in both figures: eager step time / compiled step time."""
    def key(r):
        return r["model"], r["dtype"], r["batch_size"], r["duration_s"], r["num_tokens"]

    timed = {key(r): r["step_s"]["median"] for r in compiled["steps"] if "step_s" in r}
    return [{"model": r["model"], "dtype": r["dtype"], "batch_size": r["batch_size"], "duration_s": r["duration_s"],
             "eager_over_compiled_time": r["step_s"]["median"] / timed[key(r)]}
            for r in eager["steps"] if "step_s" in r and key(r) in timed]


def lean_step_lines(eager: Mapping[str, Any] | None, compiled: Mapping[str, Any] | None) -> list[str]:
    """Notebook 02's view of the step (figures of ``models`` and ``models_compile``, either may be None):
    the kernel table of each, then the compiled step's speed against the eager one."""
    out = []
    for label, figures in (("eager", eager), ("compiled encoder", compiled)):
        if figures is None:
            continue
        if figures.get("kernels"):
            out += [f"top kernels, {label}:", *kernel_table_lines(figures["kernels"])]
        else:
            out.append(f"{label}: no kernel table in this record (the bench ran without --kernels)")
    if eager is not None and compiled is not None:
        out += [f"{s['model']} {s['dtype']} B={s['batch_size']} {s['duration_s']:g} s: compiled encoder "
                f"{times_faster(s['eager_over_compiled_time'], 'eager')}" for s in compile_speedups(eager, compiled)]
    return out
