"""The ``throughput_<model>`` record: samplers trained on one GPU, for the same steps and the same wall time.

Schema (``figures``, see the TypedDicts): ``model``; ``prepare`` (:class:`Prepared`: the corpus with its
tokens-per-second percentiles and histogram, the profiles of :data:`PROFILES` with their batch sizes, the
baseline's max_duration with its per-bucket worst cases and the check pass); ``samplers`` (those the train
part was asked for; absent: :data:`FIRST_SAMPLERS`); ``steps`` and ``seconds`` (:class:`Part`: one
:class:`RunFigures` per sampler and the measured matmul rate; ``budget``: the wall seconds each sampler
trained, or the k steps); ``checks`` (name -> bool), ``failures`` (a line per part that raised, then the
names of the false checks) and ``wall_s`` (the run's). A sampler a record lacks is "not measured yet".
Every reading of it is here.
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping, TypedDict
from workbench.palette import SERIES_COLOURS, colour

NAME = "throughput"  # records throughput_large_rnnt, throughput_xl_aed
SAMPLERS = ("baseline", "1d", "2d", "2d_equal", "2d_plain_allocator")
FIRST_SAMPLERS = ("baseline", "1d", "2d")  # what a record without ``samplers`` was asked to train
PROFILES = ("1d", "2d", "2d_equal")  # the profiles the prepare part searches
PROFILE_OF = {"1d": "1d", "2d": "2d", "2d_equal": "2d_equal", "2d_plain_allocator": "2d"}  # sampler -> profile
PLAIN_ALLOCATOR = ("2d_plain_allocator",)  # samplers trained with expandable segments off
HEADLINE = "2d"  # the 2D sampler that the targets judge
LABELS = {"baseline": "lhotse max_duration", "1d": "1D profile", "2d": "2D profile",
          "2d_equal": "2D profile, equal buckets", "2d_plain_allocator": "2D profile, plain allocator"}
# each sampler's method in workbench.palette
PALETTE_NAMES = {"baseline": "max_duration", "1d": "1D", "2d": "2D", "2d_equal": "2D equal buckets",
                 "2d_plain_allocator": "plain segments"}
HEADLINE_WHY = ("The headline 2D profile has the 1D profile's duration bins, each split in two by tokens: it "
                "differs from the 1D profile only by the token split, so its ratio to 1D is what the second "
                "dimension buys. The equal-bucket 2D profile (half the duration bins, each split in two: as many "
                "buckets and searches as 1D) trades duration resolution for token resolution, so its ratio mixes "
                "two effects; it is shown beside the headline, not instead of it.")
STEP_PIECE_COLOURS = {"data wait": SERIES_COLOURS[2], "forward+backward": SERIES_COLOURS[6],
                      "optimizer": SERIES_COLOURS[8], "step (not split on a CPU)": SERIES_COLOURS[6]}
AED_TARGET = 1.8  # 2D profile over the baseline, audio seconds per second, xl-aed
GiB = 1024 ** 3
MAX_CURVE_POINTS = 200
NOT_MEASURED = "not measured yet"


class Spread(TypedDict):
    median: float
    min: float
    max: float
    p25: float
    p75: float
    n: int


class RunFigures(TypedDict, total=False):
    steps: int
    audio_seconds_per_second: float               # after warm-up: audio seconds / wall seconds (data + step)
    audio_seconds_per_second_per_step: Spread     # each step's audio / its wall time, after warm-up
    padded_audio_seconds_per_second: float        # the same with padding counted
    mfu: float                                    # FLOPs per padded audio second x that rate / matmul rate
    flops_per_padded_audio_s: float
    batch_size: Spread
    mean_batch_size: float
    longest_cut_s: Spread                         # a batch's padded length in seconds
    input_padding: float                          # mean share of padded audio samples
    output_padding: float                         # mean share of padded tokens
    peak_allocated_bytes: int | None
    ooms: int
    error: str                                    # with ooms 1: the OOM message
    data_wait_share: float                        # data_s / (data_s + step_s) after warm-up
    time_split_s: dict[str, float | None]         # medians: data_wait, forward_backward, optimizer, step, host
    step_times: dict[str, list[float]]            # per step after warm-up (thinned): see step_times
    slow_steps: dict[str, Any] | None             # slow steps against the others: see slow_steps
    batch_size_by_bucket: list[dict[str, float]]  # {"upper_s", "steps", "mean_batch_size"}
    loss_curve: dict[str, list[float]]            # "wall_s", "audio_s", "loss" (cumulative, every k-th step)
    allocator: dict[str, Any] | None              # see allocator_figures (None: no CUDA counters, e.g. a CPU)
    allocator_settings: dict[str, Any] | None     # "expandable_segments" (bool), "settings" in effect, "env"
    #                                               (PYTORCH_ALLOC_CONF at the end of the training process)
    settings: dict[str, Any]


class Part(TypedDict):
    runs: dict[str, RunFigures]
    matmul: dict[str, Any]                        # n, dtype, seconds (Spread), flops_per_s
    budget: dict[str, float]


class Prepared(TypedDict, total=False):
    corpus: dict[str, Any]                        # paths, percentiles, preset, tokens_per_second (+ _histogram)
    profiles: dict[str, dict[str, Any]]           # PROFILES -> profile dict, search_s, duration_buckets
    baseline: dict[str, Any]
    memory_fraction: float
    device_memory_mib: int | None                 # the GPU the profiles were searched on (nvidia-smi)


def record_name(model: str) -> str:
    """The record's name for a model: throughput_large_rnnt, throughput_xl_aed."""
    return "throughput_" + model.replace("-", "_")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def run_figures(summary: Mapping[str, Any], records: list[dict], uppers: list[float], *,
                warmup: int = 5) -> RunFigures:
    """A training run's figures from train()'s summary and its train_log.jsonl records. The first
    ``warmup`` steps (all but one when the run is shorter) are left out of rates, medians and shares."""
    from workbench.timing import summarize

    steady = records[min(warmup, max(0, len(records) - 1)):]
    wall = [r["data_s"] + r["step_s"] for r in steady]
    padded = [padded_audio_s(r) for r in steady]
    wait, busy = sum(r["data_s"] for r in steady), sum(r["step_s"] for r in steady)

    def median_of(key: str) -> float | None:
        values = [r[key] for r in steady if r.get(key) is not None]
        return summarize(values)["median"] if values else None

    return {"steps": len(records),
            "audio_seconds_per_second": sum(r["audio_s"] for r in steady) / sum(wall),
            "audio_seconds_per_second_per_step": summarize([r["audio_s"] / w for r, w in zip(steady, wall)]),
            "padded_audio_seconds_per_second": sum(padded) / sum(wall),
            "batch_size": summarize([r["batch_size"] for r in steady]),
            "mean_batch_size": _mean([r["batch_size"] for r in steady]),
            "longest_cut_s": summarize([p / r["batch_size"] for p, r in zip(padded, steady)]),
            "input_padding": _mean([r["input_padding"] for r in steady]),
            "output_padding": _mean([r["output_padding"] for r in steady]),
            "peak_allocated_bytes": summary.get("peak_allocated_bytes"),
            "data_wait_share": wait / (wait + busy) if wait + busy else 0.0,
            "time_split_s": {"data_wait": median_of("data_s"), "forward_backward": median_of("forward_backward_s"),
                             "optimizer": median_of("optimizer_s"), "step": median_of("step_s"),
                             "host": median_of("host_s")},
            "step_times": step_times(steady), "slow_steps": slow_steps(steady),
            "batch_size_by_bucket": batch_size_by_bucket(records, padded_lengths(records), uppers),
            "loss_curve": loss_curve(records), "allocator": allocator_figures(records, warmup=warmup)}


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_alloc_retries", "num_ooms")  # cumulative, in each CUDA record


def allocator_figures(records: list[dict], *, warmup: int = 5) -> dict[str, Any] | None:
    """The CUDA caching allocator per step, from the counters each record carries (cumulative in the
    training process): each step's increase over the record before, over the steps after ``warmup``
    (at least the first): cudaMalloc calls (``device_allocs``: total, ``per_step`` mean, ``steps_with``
    any), allocation retries (``alloc_retries``, ``steps_with_retry``), allocator OOMs (``cuda_ooms``), the
    step's device seconds (``step_s``: Spread), the most reserved bytes, and ``curve``: the counts since
    the first record, per step (at most MAX_CURVE_POINTS points). None when the records lack the counters."""
    from workbench.timing import summarize

    if len(records) < 2 or any(k not in records[0] for k in ALLOCATOR_COUNTERS):
        return None
    first = max(1, min(warmup, len(records) - 1))
    steady = list(range(first, len(records)))

    def deltas(key: str) -> list[int]:
        return [records[i][key] - records[i - 1][key] for i in steady]

    allocs, retries, ooms = (deltas(k) for k in ALLOCATOR_COUNTERS)
    every = max(1, -(-len(records) // MAX_CURVE_POINTS))
    kept = [i for i in range(len(records)) if i % every == 0 or i == len(records) - 1]
    return {"steps": len(steady), "device_allocs": sum(allocs), "device_allocs_per_step": _mean(allocs),
            "steps_with_device_alloc": sum(a > 0 for a in allocs), "alloc_retries": sum(retries),
            "steps_with_retry": sum(r > 0 for r in retries), "cuda_ooms": sum(ooms),
            "step_s": summarize([records[i]["step_s"] for i in steady]),
            "max_reserved_bytes": max(r.get("reserved_bytes", 0) for r in records),
            "curve": {"step": [records[i]["step"] for i in kept],
                      **{key: [records[i][key] - records[0][key] for i in kept]
                         for key in ("num_device_alloc", "num_alloc_retries")}}}


def padded_audio_s(record: Mapping[str, Any]) -> float:
    """A step's padded audio seconds (batch x longest cut): audio / (1 - input padding)."""
    return record["audio_s"] / max(1e-9, 1.0 - record["input_padding"])


def padded_lengths(records: list[dict]) -> list[float]:
    """Each step's padded length in seconds (its longest cut): audio / (1 - input padding) / batch size."""
    return [padded_audio_s(r) / r["batch_size"] for r in records]


def batch_size_by_bucket(records: list[dict], lengths: list[float], uppers: list[float]) -> list[dict]:
    """Mean batch size of the steps whose padded length falls in each bucket (upper bounds ``uppers``, s)."""
    groups: dict[int, list[int]] = {}
    for r, length in zip(records, lengths):
        i = min(bisect.bisect_left(uppers, length - 1e-6), len(uppers) - 1)
        groups.setdefault(i, []).append(r["batch_size"])
    return [{"upper_s": uppers[i], "steps": len(g), "mean_batch_size": _mean(g)} for i, g in sorted(groups.items())]


SLOW_STEP = 1.3  # a step is slow above this times the run's p25 of seconds per padded audio second
HOST_KEYS = ("host_s", "host_cpu_s", "host_preemptions")


def step_times(records: list[dict]) -> dict[str, list[float]]:
    """Per step (thinned evenly to at most MAX_CURVE_POINTS): ``step_s`` (device seconds; on a CPU the
    host's), ``host_s`` (seconds to queue it), ``padded_audio_s``; empty lists for steps without host times."""
    logged = [r for r in records if r.get("host_s") is not None]
    every = max(1, -(-len(logged) // MAX_CURVE_POINTS))
    kept = logged[::every]
    return {"step_s": [round(r["step_s"], 4) for r in kept], "host_s": [round(r["host_s"], 4) for r in kept],
            "padded_audio_s": [round(padded_audio_s(r), 1) for r in kept]}


def slow_steps(records: list[dict]) -> dict[str, Any] | None:
    """The steps slower than SLOW_STEP x the run's p25 of seconds per padded audio second, against the
    others: for each, the count and the means of device seconds, of HOST_KEYS (those logged) and of the
    pinned-memory blocks made and their milliseconds since the record before (None where not logged). None
    when no step logged host times."""
    from workbench.timing import summarize

    pinned = {}  # step -> (pinned blocks made, their ms) since the record before (the counters are cumulative)
    for before, r in zip(records, records[1:]):
        if r.get("num_host_alloc") is not None and before.get("num_host_alloc") is not None:
            pinned[r["step"]] = (r["num_host_alloc"] - before["num_host_alloc"],
                                 (r["host_alloc_us"] - before["host_alloc_us"]) / 1e3)
    logged = [r for r in records if r.get("host_s") is not None]
    if not logged:
        return None
    pace = [r["step_s"] / max(1e-9, padded_audio_s(r)) for r in logged]
    threshold = SLOW_STEP * summarize(pace)["p25"]

    def means(group: list[dict]) -> dict[str, Any]:
        out = {"steps": len(group), "step_s": _mean([r["step_s"] for r in group])}
        for key in HOST_KEYS:
            values = [r[key] for r in group if r.get(key) is not None]
            out[key] = _mean(values) if values else None
        counted = [pinned[r["step"]] for r in group if r["step"] in pinned]
        out["pinned_allocs"] = _mean([n for n, _ in counted]) if counted else None
        out["pinned_alloc_ms"] = _mean([ms for _, ms in counted]) if counted else None
        return out

    return {"threshold_s_per_padded_audio_s": threshold,
            "slow": means([r for r, p in zip(logged, pace) if p > threshold]),
            "others": means([r for r, p in zip(logged, pace) if p <= threshold])}


def slow_steps_line(run: Mapping[str, Any]) -> str | None:
    """The run's slow steps against the others in words (see :func:`slow_steps`); None without them."""
    split = run.get("slow_steps")
    if not split:
        return None
    text = (f"{split['slow']['steps']} of {split['slow']['steps'] + split['others']['steps']} steps over "
            f"{SLOW_STEP}x the run's p25 pace")
    for name, group in (("those", split["slow"]), ("the others", split["others"])):
        if not group["steps"]:
            continue
        text += f"; {name}: device {group['step_s']:.3f} s, host queueing {group['host_s']:.3f} s"
        if group.get("host_cpu_s") is not None:
            text += f" (CPU {group['host_cpu_s']:.3f} s, {group['host_preemptions']:.1f} preemptions)"
        if group.get("pinned_allocs") is not None:
            text += f", {group['pinned_allocs']:.1f} pinned-memory blocks made ({group['pinned_alloc_ms']:.1f} ms)"
    return text


def gpu_clocks_line(run: Mapping[str, Any]) -> str | None:
    """The GPU's SM clock and power over the run's busy samples in words; None where none were taken."""
    clocks = run.get("gpu_clocks") or {}
    sm = clocks.get("sm_mhz")
    if not sm:
        return None
    text = (f"SM clock median {sm['median']:.0f} MHz (p25-p75 {sm['p25']:.0f}-{sm['p75']:.0f}, min {sm['min']:.0f}"
            + (f", the card's maximum {clocks['max_sm_mhz']['max']:.0f}" if clocks.get("max_sm_mhz") else "") + ")")
    if clocks.get("power_w"):
        text += f", power median {clocks['power_w']['median']:.0f} W (max {clocks['power_w']['max']:.0f})"
    return text + f", over {clocks['busy_samples']} busy samples of {clocks['samples']} (whole run)"


def loss_curve(records: list[dict]) -> dict[str, list[float]]:
    """Loss against cumulative wall seconds and audio seconds seen, at most MAX_CURVE_POINTS points."""
    wall = audio = 0.0
    out: dict[str, list[float]] = {"step": [], "wall_s": [], "audio_s": [], "loss": []}
    every = max(1, -(-len(records) // MAX_CURVE_POINTS))
    for i, r in enumerate(records):
        wall, audio = wall + r["data_s"] + r["step_s"], audio + r["audio_s"]
        if i % every == 0 or i == len(records) - 1:
            for key, value in (("step", r["step"]), ("wall_s", wall), ("audio_s", audio), ("loss", r["loss"])):
                out[key].append(value)
    return out


def parts(figures: Mapping[str, Any]) -> list[str]:
    """The training parts the record holds, in order."""
    return [p for p in ("steps", "seconds") if p in figures]


def ratio(figures: Mapping[str, Any], part: str, over: str, under: str) -> float | None:
    """audio s/s of sampler ``over`` / that of ``under`` in ``part`` (None when either OOMed or is absent)."""
    runs = figures.get(part, {}).get("runs", {})
    a, b = runs.get(over, {}), runs.get(under, {})
    if "audio_seconds_per_second" not in a or "audio_seconds_per_second" not in b:
        return None
    return a["audio_seconds_per_second"] / b["audio_seconds_per_second"]


def asked(figures: Mapping[str, Any]) -> tuple[str, ...]:
    """The samplers the record's train part was asked for (:data:`FIRST_SAMPLERS` when it does not say)."""
    return tuple(figures.get("samplers") or FIRST_SAMPLERS)


def trained(run: Mapping[str, Any] | None) -> bool:
    """Whether a sampler's run has figures (it did not end in an out-of-memory error)."""
    return bool(run) and "audio_seconds_per_second" in run


def checks(figures: Mapping[str, Any]) -> dict[str, bool]:
    """What must hold: the baseline pass has no batch beyond its probed worst case, no run OOMs (the
    plain-allocator run's OOMs are what it measures, not a failure), every sampler asked for trained."""
    out: dict[str, bool] = {}
    prep = figures.get("prepare")
    if prep:
        out["baseline_pass_within_probed_worst_case"] = prep["baseline"]["pass"]["exceeding"] == 0
    for part in parts(figures):
        for sampler, run in figures[part]["runs"].items():
            if sampler not in PLAIN_ALLOCATOR:
                out[f"{part}_{sampler}_no_oom"] = run.get("ooms", 1) == 0
    if parts(figures):  # a call stopped at its limit leaves samplers untrained
        out["every_sampler_trained"] = bool(figures.get("complete")) and all(
            set(asked(figures)) <= set(figures[part]["runs"]) for part in parts(figures))
    return out


def targets(figures: Mapping[str, Any]) -> list[str]:
    """The targets, met or missed, with the numbers: judged on the same-wall-time part when there is
    one (else the only part), for the headline 2D sampler; the other part's ratios, and the equal-bucket
    2D profile's, are listed beside them."""
    lines = []
    judged = "seconds" if "seconds" in parts(figures) else next(iter(parts(figures)), None)
    for part in parts(figures):
        over_base, over_1d = ratio(figures, part, "2d", "baseline"), ratio(figures, part, "2d", "1d")
        if part != judged:  # the same-steps view's first steps include each shape's first, slow, step
            if over_base is not None:
                lines.append(f"{part}: 2D / baseline = {over_base:.2f}x (the target is judged at the same wall time)")
            if over_1d is not None:
                lines.append(f"{part}: 2D / 1D = {over_1d:.2f}x")
        else:
            model = figures.get("model", "")
            if over_base is not None:
                target = BASELINE_TARGETS.get(model)
                lines.append(f"{part}: 2D / baseline = {over_base:.2f}x{_judged(over_base, target)}")
            if over_1d is not None:
                lines.append(f"{part}: 2D / 1D = {over_1d:.2f}x{_judged(over_1d, OVER_1D_TARGETS.get(model))}")
        equal = [f"{ratio(figures, part, '2d_equal', under):.2f}x {name}" for under, name in
                 (("baseline", "baseline"), ("1d", "1D")) if ratio(figures, part, "2d_equal", under) is not None]
        if equal:
            lines.append(f"{part}: 2D at equal buckets = {' and '.join(equal)} (beside the headline, no target)")
    return lines


def sampler_state(figures: Mapping[str, Any], part: str, sampler: str) -> str:
    """One sampler's line in a part: its figures, "not run" (asked for, not trained) or "not measured yet"."""
    run = figures[part]["runs"].get(sampler)
    if run:
        return describe_run(run)
    return "not run" if sampler in asked(figures) else NOT_MEASURED


def summary_lines(figures: Mapping[str, Any]) -> list[str]:
    """Headline lines for benchmarks/SUMMARY.md."""
    f, lines = figures, []
    prep = f.get("prepare")
    if prep:
        c, b = prep["corpus"], prep["baseline"]
        lines.append(f"{f['model']}: corpus {c['kind']}, {c['num_cuts']} cuts ({c['unique_utterances']} unique), "
                     f"{c['hours']:.0f} h, {c['duration_s'][0]:.1f}-{c['duration_s'][-1]:.1f} s")
        if "tokens_per_second" in c:
            t = c["tokens_per_second"]
            lines.append(f"- tokens per second p10/p50/p90 {t['p10']:.1f}/{t['p50']:.1f}/{t['p90']:.1f} "
                         f"(max {t['max']:.1f})")
        lines.append(f"- baseline max_duration {b['max_duration']:g} s ({len(b['buckets'])} lhotse buckets, "
                     f"{b['probes']} probes); check pass: {b['pass']['batches']} batches, "
                     f"{b['pass']['exceeding']} beyond the probed worst case")
        for kind in (k for k in PROFILES if k in prep["profiles"]):
            sizes = prep["profiles"][kind]["bucket_batch_size"]
            lines.append(f"- {LABELS[kind]}: {len(sizes)} buckets, batch sizes {min(sizes)}-{max(sizes)}")
    for part in parts(f):
        p = f[part]
        budget = f"{p['budget']['steps']} steps" if "steps" in p["budget"] else f"{p['budget']['seconds']:g} s"
        rate = ("matmul not measured" if not p.get("matmul") else
                f"matmul {p['matmul']['flops_per_s'] / 1e12:.3g} TFLOP/s {p['matmul']['dtype']}")
        lines.append(f"- same {'steps' if part == 'steps' else 'wall time'} ({budget} each; {rate}):")
        lines += [f"  - {LABELS[sampler]}: {sampler_state(f, part, sampler)}" for sampler in SAMPLERS]
    lines += [f"- {line}" for line in calls_lines(f)]
    lines += [f"- allocator, {line}" for line in allocator_lines(f)]
    runs = f.get("seconds", {}).get("runs", {})
    lines += [f"- slow steps, {LABELS[s]}: {line}" for s, run in runs.items() if (line := slow_steps_line(run))]
    lines += [f"- the GPU, {LABELS[s]}: {line}" for s, run in runs.items() if (line := gpu_clocks_line(run))]
    lines += [f"- {line}" for line in targets(f)]
    failures = f.get("failures", [])
    lines.append("- checks " + ("all passed" if not failures else f"FAILED: {', '.join(failures)}"))
    return lines


def calls_lines(figures: Mapping[str, Any]) -> list[str]:
    """One line naming the calls that trained the runs when there were several (ratios then cross calls of
    the same seconds and steps); none when one call trained them all or the runs do not say."""
    by_call: dict[str, list[str]] = {}
    for sampler, run in figures.get("seconds", {}).get("runs", {}).items():
        call = run.get("call") or {}
        if call.get("git_commit"):
            by_call.setdefault(f"commit {call['git_commit'][:12]} ({call.get('date', '?')})", []).append(LABELS[sampler])
    if len(by_call) < 2:
        return []
    return ["trained over several calls: " + "; ".join(f"{', '.join(s)} at {c}" for c, s in by_call.items())]


def allocator_lines(figures: Mapping[str, Any], part: str = "seconds") -> list[str]:
    """Per run with the allocator's counters (same wall time): cudaMalloc calls and retries per step after
    warm-up, allocator OOMs, the median step; none for a record without them."""
    lines = []
    for sampler, run in figures.get(part, {}).get("runs", {}).items():
        a = run.get("allocator")
        if not a:
            continue
        lines.append(f"{LABELS[sampler]} (expandable segments {'off' if sampler in PLAIN_ALLOCATOR else 'on'}): "
                     f"{a['device_allocs_per_step']:.2f} cudaMalloc per step ({a['steps_with_device_alloc']} of "
                     f"{a['steps']} steps after warm-up), {a['alloc_retries']} retries, {a['cuda_ooms']} OOMs, "
                     f"step {a['step_s']['median']:.3f} s (p25-p75 {a['step_s']['p25']:.3f}-{a['step_s']['p75']:.3f})")
    return lines


def describe_run(run: Mapping[str, Any]) -> str:
    """One run in a line: audio s/s median (p25-p75), MFU, batch, padding, peak, OOMs (steps trained in
    parts), data wait; or the out-of-memory error that ended it."""
    if not trained(run):
        return f"OOM ({run.get('error', '')})"
    s = run["audio_seconds_per_second_per_step"]
    peak = run.get("peak_allocated_bytes")
    mfu = run.get("mfu")
    return (f"{run['audio_seconds_per_second']:.0f} audio s/s (per step median {s['median']:.0f}, "
            f"p25-p75 {s['p25']:.0f}-{s['p75']:.0f}), MFU {'-' if mfu is None else f'{100 * mfu:.1f} %'}, "
            f"{run['steps']} steps, mean batch {run['mean_batch_size']:.0f}, padding in/out "
            f"{100 * run['input_padding']:.0f}/{100 * run['output_padding']:.0f} %, peak "
            f"{'-' if peak is None else f'{peak / GiB:.1f} GiB'}, OOMs {run['ooms']}, "
            f"data wait {100 * run['data_wait_share']:.1f} %")


def runs_table(record: Mapping[str, Any]):
    """One row per (comparison, sampler): the run's figures with units in the headers, as a DataFrame."""
    import pandas as pd

    rows = []
    for part in parts(record["figures"]):
        compared = "same steps" if part == "steps" else "same wall time"
        for sampler, run in record["figures"][part]["runs"].items():
            if not trained(run):
                rows.append({"compared at": compared, "sampler": LABELS[sampler], "OOMs": run.get("ooms", 1)})
                continue
            s = run["audio_seconds_per_second_per_step"]
            peak = run.get("peak_allocated_bytes")
            rows.append({"compared at": compared, "sampler": LABELS[sampler], "steps": run["steps"],
                         "audio s/s": round(run["audio_seconds_per_second"]),
                         "per step: median (audio s/s)": round(s["median"]),
                         "p25-p75 (audio s/s)": f"{s['p25']:.0f}-{s['p75']:.0f}",
                         "MFU (%)": None if run.get("mfu") is None else round(100 * run["mfu"], 1),
                         "mean batch (cuts)": round(run["mean_batch_size"]),
                         "padding in/out (%)": f"{100 * run['input_padding']:.0f}/{100 * run['output_padding']:.0f}",
                         "peak (GiB)": None if peak is None else round(peak / GiB, 1), "OOMs": run["ooms"],
                         "data wait (%)": round(100 * run["data_wait_share"], 1)})
    return pd.DataFrame(rows)


def _ok_runs(record: Mapping[str, Any], part: str) -> dict[str, Mapping[str, Any]]:
    runs = record["figures"].get(part, {}).get("runs", {})
    return {s: runs[s] for s in SAMPLERS if trained(runs.get(s))}


def throughput_bars(record: Mapping[str, Any], part: str = "steps"):
    """Audio seconds per second per sampler: bars at the per-step median, whiskers p25-p75 and min-max."""
    import matplotlib.pyplot as plt

    runs = _ok_runs(record, part)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for x, (sampler, run) in enumerate(runs.items()):
        s = run["audio_seconds_per_second_per_step"]
        ax.bar(x, s["median"], color=sampler_colour(sampler))
        ax.errorbar(x, s["median"], yerr=[[s["median"] - s["p25"]], [s["p75"] - s["median"]]], color="k", capsize=8)
        ax.errorbar(x, s["median"], yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]], color="grey",
                    capsize=3, alpha=0.6)
    ax.set_xticks(range(len(runs)), [LABELS[s].replace(" ", "\n", 1) for s in runs])
    ax.set_ylabel("audio seconds per second")
    ax.set_title(f"{record['figures']['model']}, same {'steps' if part == 'steps' else 'wall time'}: per-step "
                 "median, p25-p75 (black), min-max (grey)")
    fig.tight_layout()
    return fig


def loss_curves(record: Mapping[str, Any], part: str = "seconds"):
    """Loss against wall seconds (left) and against audio seconds seen (right), one line per sampler."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
    for sampler, run in _ok_runs(record, part).items():
        curve = run["loss_curve"]
        axes[0].plot(curve["wall_s"], curve["loss"], color=sampler_colour(sampler), label=LABELS[sampler])
        axes[1].plot([a / 3600 for a in curve["audio_s"]], curve["loss"], color=sampler_colour(sampler),
                     label=LABELS[sampler])
    axes[0].set_xlabel("wall seconds")
    axes[1].set_xlabel("audio hours seen")
    axes[0].set_ylabel("training loss")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{record['figures']['model']}: loss ({part} part)")
    fig.tight_layout()
    return fig


def batch_size_by_bucket_plot(record: Mapping[str, Any], part: str = "steps"):
    """Mean batch size against the bucket's upper duration bound (log scale), one line per sampler."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for sampler, run in _ok_runs(record, part).items():
        rows = run["batch_size_by_bucket"]
        ax.plot([r["upper_s"] for r in rows], [r["mean_batch_size"] for r in rows], "o-", color=sampler_colour(sampler),
                label=LABELS[sampler])
    ax.set_yscale("log")
    ax.set_xlabel("bucket's longest cut (s)")
    ax.set_ylabel("mean batch size (cuts)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def step_time_split(record: Mapping[str, Any], part: str = "steps"):
    """Per-step median seconds split into data wait, forward+backward and optimizer, stacked per sampler
    (on a CPU the split is not measured: the step is one bar)."""
    import matplotlib.pyplot as plt

    runs = _ok_runs(record, part)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for x, run in enumerate(runs.values()):
        t = run["time_split_s"]
        pieces = [("data wait", t["data_wait"])]
        if t["forward_backward"] is not None:
            pieces += [("forward+backward", t["forward_backward"]), ("optimizer", t["optimizer"])]
        else:
            pieces += [("step (not split on a CPU)", t["step"])]
        bottom = 0.0
        for label, value in pieces:
            ax.bar(x, value or 0.0, bottom=bottom, color=STEP_PIECE_COLOURS[label], label=label if x == 0 else None)
            bottom += value or 0.0
    ax.set_xticks(range(len(runs)), [LABELS[s].replace(" ", "\n", 1) for s in runs])
    ax.set_ylabel("seconds per step (medians)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def allocator_table(record: Mapping[str, Any], part: str = "seconds"):
    """One row per run with the CUDA allocator's counters: expandable segments on or off, cudaMalloc calls
    and allocation retries per step after warm-up, OOMs, step time and audio seconds per second."""
    import pandas as pd

    rows = []
    for sampler, run in _ok_runs(record, part).items():
        a = run.get("allocator")
        if not a:
            continue
        rows.append({"sampler": LABELS[sampler], "expandable segments": "off" if sampler in PLAIN_ALLOCATOR else "on",
                     "steps after warm-up": a["steps"], "cudaMalloc per step": round(a["device_allocs_per_step"], 2),
                     "steps with cudaMalloc": a["steps_with_device_alloc"], "allocation retries": a["alloc_retries"],
                     "allocator OOMs": a["cuda_ooms"], "steps trained in parts": run["ooms"],
                     "step median (s)": round(a["step_s"]["median"], 3),
                     "step p25-p75 (s)": f"{a['step_s']['p25']:.3f}-{a['step_s']['p75']:.3f}",
                     "most reserved (GiB)": round(a["max_reserved_bytes"] / GiB, 1),
                     "audio s/s": round(run["audio_seconds_per_second"])})
    return pd.DataFrame(rows)


def allocator_curves(record: Mapping[str, Any], part: str = "seconds"):
    """cudaMalloc calls (left) and allocation retries (right) since the first step, against the step, one
    line per run with the allocator's counters; None when no run has them."""
    import matplotlib.pyplot as plt

    runs = {s: r for s, r in _ok_runs(record, part).items() if r.get("allocator")}
    if not runs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for sampler, run in runs.items():
        curve = run["allocator"]["curve"]
        for ax, key in zip(axes, ("num_device_alloc", "num_alloc_retries")):
            ax.plot(curve["step"], curve[key], color=sampler_colour(sampler), label=LABELS[sampler])
    axes[0].set_ylabel("cudaMalloc calls since step 0")
    axes[1].set_ylabel("allocation retries since step 0")
    for ax in axes:
        ax.set_xlabel("step")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.suptitle(f"{record['figures']['model']}: the CUDA caching allocator in training ({part} part)")
    fig.tight_layout()
    return fig


def corpus_rates(figures: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The prepared corpus's tokens-per-second percentiles and histogram, or None when not measured."""
    corpus = (figures.get("prepare") or {}).get("corpus", {})
    return corpus if "tokens_per_second_histogram" in corpus else None


def tokens_per_second_histogram(record: Mapping[str, Any]):
    """Utterances per tokens-per-second bin of the study's corpus, p10/p50/p90 marked; None when the
    record has no histogram."""
    import matplotlib.pyplot as plt

    from workbench.palette import BOUNDARY_COLOUR, FIT_COLOUR

    corpus = corpus_rates(record["figures"])
    if corpus is None:
        return None
    h, t = corpus["tokens_per_second_histogram"], corpus["tokens_per_second"]
    edges = h["edges"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(edges[:-1], h["utterances"], width=[b - a for a, b in zip(edges, edges[1:])], align="edge",
           color=FIT_COLOUR)
    for q, style in (("p10", ":"), ("p50", "--"), ("p90", ":")):
        ax.axvline(t[q], color=BOUNDARY_COLOUR, linestyle=style, label=f"{q} {t[q]:.1f}")
    ax.set_xlabel("tokens per second")
    ax.set_ylabel("utterances")
    ax.set_title(f"{corpus['kind']}: {corpus['unique_utterances']} utterances")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def sampler_colour(sampler: str) -> str:
    """The palette's colour of a sampler's method (max_duration, 1D, 2D)."""
    return colour(PALETTE_NAMES[sampler])


def setup_line(figures: Mapping[str, Any]) -> str:
    """What was compared, in one sentence: the model, the corpus and the samplers' settings."""
    prep = figures.get("prepare")
    if not prep:
        return f"{figures.get('model', 'the model')}: the record holds no preparation part."
    c, b = prep["corpus"], prep["baseline"]
    sizes = {kind: prep["profiles"][kind]["bucket_batch_size"] for kind in PROFILES if kind in prep["profiles"]}
    profiles = ", ".join(f"the {LABELS[k]} {len(v)} buckets with batch sizes {min(v)}-{max(v)}" for k, v in sizes.items())
    return (f"{figures['model']} on {c['num_cuts']:,} utterances ({c['kind']}, {c['hours']:.0f} h, "
            f"{c['duration_s'][0]:.1f}-{c['duration_s'][-1]:.1f} s). lhotse's sampler runs at max_duration "
            f"{b['max_duration']:.0f} s, the largest that survived a full pass over the corpus; {profiles}.")


def corpus_meaning(figures: Mapping[str, Any]) -> str:
    """The corpus's spread of tokens per second, and what it means for the token sub-buckets."""
    corpus = corpus_rates(figures)
    if corpus is None:
        return f"The record's corpus has no tokens-per-second statistics: {NOT_MEASURED}."
    t = corpus["tokens_per_second"]
    spread = (t["p90"] - t["p10"]) / t["p50"]
    return (f"Tokens per second: p10 {t['p10']:.1f}, p50 {t['p50']:.1f}, p90 {t['p90']:.1f} (max {t['max']:.1f}); "
            f"the middle 80 % of utterances spans {100 * spread:.0f} % of the median. Within one duration bucket, "
            "utterances with fewer tokens than the bucket's most fit larger batches: the wider this spread, the "
            "more the 2D profile's token sub-buckets can gain.")


def headline_note() -> str:
    """Which 2D sampler the headline uses, and why."""
    return HEADLINE_WHY


# The design's targets for the same-wall-time part: 2D over lhotse's max_duration per model, 2D over 1D
BASELINE_TARGETS = {"xl-aed": AED_TARGET, "large-rnnt": 1.5}
OVER_1D_TARGETS = {"xl-aed": 1.1}


def _judged(ratio_: float, target: float | None) -> str:
    """' (target >= 1.8x: met)', ' (target >= 1.8x: missed by 0.21x)', or '' without a target."""
    if target is None:
        return ""
    return f" (target >= {target}x: {'met' if ratio_ >= target else f'missed by {target - ratio_:.2f}x'})"


def throughput_meaning(figures: Mapping[str, Any]) -> str:
    """What the runs mean: the judged ratios against the design's targets, in words."""
    part = "seconds" if "seconds" in parts(figures) else next(iter(parts(figures)), None)
    if part is None:
        return "No training part was recorded."
    over_base, over_1d = ratio(figures, part, "2d", "baseline"), ratio(figures, part, "2d", "1d")
    if over_base is None:
        return "A sampler ran out of memory or was not run, so no ratio is judged; see the table."
    model = figures.get("model", "")
    judged = part == "seconds"
    when = "in the same wall time" if judged else "over the same steps"
    text = (f"{when.capitalize()}, the 2D profile trains {over_base:.2f}x the audio of lhotse's best max_duration"
            + _judged(over_base, BASELINE_TARGETS.get(model) if judged else None))
    if over_1d is not None:
        text += f", and {over_1d:.2f}x the 1D profile's" + _judged(over_1d, OVER_1D_TARGETS.get(model) if judged
                                                                    else None)
    text += "."
    equal_base, equal_1d = ratio(figures, part, "2d_equal", "baseline"), ratio(figures, part, "2d_equal", "1d")
    if equal_base is not None and equal_1d is not None:
        text += (f" At the 1D profile's number of buckets, the 2D profile trains {equal_base:.2f}x lhotse's audio and "
                 f"{equal_1d:.2f}x the 1D profile's.")
    return text


def _trained_runs(figures: Mapping[str, Any], part: str) -> dict[str, Mapping[str, Any]]:
    runs = figures.get(part, {}).get("runs", {})
    return {s: runs[s] for s in SAMPLERS if trained(runs.get(s))}


def batch_size_meaning(figures: Mapping[str, Any], part: str = "steps") -> str:
    """How much larger the profiles' batches are than the fixed budget's, per the record's means."""
    runs = _trained_runs(figures, part)
    if "baseline" not in runs:
        return "No baseline run to compare batch sizes with."
    base = runs["baseline"]["mean_batch_size"]
    larger = [f"the {LABELS[s]}'s is {runs[s]['mean_batch_size'] / base:.1f}x as large" for s in runs
              if s != "baseline" and s not in PLAIN_ALLOCATOR]
    return (f"lhotse's max_duration averages {base:.0f} utterances per batch; " + " and ".join(larger) + ". The "
            "profiles fill each bucket to what fits, where one duration budget must leave room for the worst bucket.")


def loss_at_audio(curve: Mapping[str, list[float]], audio_s: float, window: float = 0.1) -> float:
    """Mean loss of a curve's points whose audio seen lies in the last ``window`` share of ``audio_s`` seconds
    (the point nearest to it when none does): a loss compared at equal audio, less noisy than one step's."""
    points = [loss for a, loss in zip(curve["audio_s"], curve["loss"]) if (1 - window) * audio_s <= a <= audio_s]
    if not points:
        nearest = min(range(len(curve["audio_s"])), key=lambda i: abs(curve["audio_s"][i] - audio_s))
        points = [curve["loss"][nearest]]
    return sum(points) / len(points)


def loss_meaning(figures: Mapping[str, Any], part: str | None = None) -> str:
    """The loss each sampler reached at the end of ``part`` (default: the same-wall-time part, else steps),
    and at the same audio seen (the least that any run saw)."""
    part = part or ("seconds" if "seconds" in parts(figures) else next(iter(parts(figures)), None))
    runs = {s: r for s, r in _trained_runs(figures, part).items() if "loss_curve" in r}
    if not runs:
        return "No loss curve was recorded."
    ends = ", ".join(f"{LABELS[s]} {r['loss_curve']['loss'][-1]:.2f} after {r['loss_curve']['audio_s'][-1] / 3600:.1f} h"
                     f" of audio" for s, r in runs.items())
    least = min(r["loss_curve"]["audio_s"][-1] for r in runs.values())
    equal = ", ".join(f"{LABELS[s]} {loss_at_audio(r['loss_curve'], least):.2f}" for s, r in runs.items())
    most_audio = max(runs, key=lambda s: runs[s]["loss_curve"]["audio_s"][-1])
    lowest = min(runs, key=lambda s: runs[s]["loss_curve"]["loss"][-1])
    return (f"At the end of the {'same wall time' if part == 'seconds' else 'same steps'}: {ends}. At the same "
            f"audio seen ({least / 3600:.1f} h, the least of any run; mean over its last tenth): {equal}. The "
            f"{LABELS[most_audio]} saw the most audio and the {LABELS[lowest]} reached the lowest loss; the "
            "right-hand plot shows the loss per hour of audio seen.")


def step_time_meaning(figures: Mapping[str, Any], part: str = "steps") -> str:
    """Where a step's time goes: the largest data-wait share across samplers."""
    runs = _trained_runs(figures, part)
    if not runs:
        return "No run to split."
    worst = max(runs, key=lambda s: runs[s]["data_wait_share"])
    return (f"Data wait is at most {100 * runs[worst]['data_wait_share']:.1f} % of a step ({LABELS[worst]}): the "
            f"GPU computes for the rest, so throughput differences come from the batches, not the input pipeline.")


def spread_meaning(figures: Mapping[str, Any], part: str = "steps") -> str:
    """Whether the profiles' per-step throughput stands clear of the baseline's spread (p25-p75)."""
    runs = _trained_runs(figures, part)
    if "baseline" not in runs or len(runs) < 2:
        return "Fewer than two samplers ran, so there is no spread to compare."
    base = runs["baseline"]["audio_seconds_per_second_per_step"]
    clear = [LABELS[s] for s in runs if s != "baseline"
             and runs[s]["audio_seconds_per_second_per_step"]["p25"] > base["p75"]]
    ranges = ", ".join(f"{LABELS[s]} {r['audio_seconds_per_second_per_step']['p25']:.0f}-"
                       f"{r['audio_seconds_per_second_per_step']['p75']:.0f}" for s, r in runs.items())
    verdict = (f"the {' and '.join(clear)} {'stand' if len(clear) > 1 else 'stands'} clear of lhotse's, so the gain is "
               "beyond step-to-step variation" if clear else "they overlap lhotse's, so the gain is within step-to-step "
               "variation")
    return f"Middle half of the steps (audio s/s): {ranges}; {verdict}."


def allocator_meaning(figures: Mapping[str, Any], part: str = "seconds") -> str:
    """The 2D profile's training with expandable segments against without, from the allocator's counters."""
    runs = figures.get(part, {}).get("runs", {})
    on, off = runs.get("2d"), runs.get("2d_plain_allocator")
    if off is None:
        return f"The 2D profile without expandable segments: {NOT_MEASURED}."
    if not trained(off):
        return f"Without expandable segments the 2D profile's run ended out of memory ({off.get('error', '')})."
    if not (trained(on) and on.get("allocator") and off.get("allocator")):
        return "The allocator's counters were not recorded (no CUDA), so the allocator is not compared."
    a, b = on["allocator"], off["allocator"]
    return (f"After warm-up, with expandable segments the 2D profile's training called cudaMalloc "
            f"{a['device_allocs_per_step']:.2f} times per step ({a['steps_with_device_alloc']} of {a['steps']} steps), "
            f"retried {a['alloc_retries']} allocations and trained {on['ooms']} steps in parts; without them "
            f"{b['device_allocs_per_step']:.2f} times per step ({b['steps_with_device_alloc']} of {b['steps']}), "
            f"{b['alloc_retries']} retries and {off['ooms']} steps in parts. The median step took "
            f"{b['step_s']['median'] / a['step_s']['median']:.2f}x as long without them, and the run trained "
            f"{off['audio_seconds_per_second'] / on['audio_seconds_per_second']:.2f}x the audio per second.")
