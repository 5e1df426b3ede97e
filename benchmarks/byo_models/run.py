"""The OOMptimizer on models nobody here wrote: per adapter, the batch size per bucket, probes per bucket,
search seconds, a soak, and the tightness check (one probe at 1.1x each size, which must OOM), beside a
reference model on the same buckets.

    python -m benchmarks.byo_models [--models NAME ...] [--budget-s 300] [--out DIR]
    python -m benchmarks.byo_models --smoke --out /tmp/x    # CPU: the real steps, a modeled peak
"""

from __future__ import annotations

import math
import tempfile

import torch

from workbench.adapters import ADAPTERS, SMALL_CONFIGS, build_adapter, build_model_from_spec, user_model_spec
from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe
from benchmarks.harness import Run, bench_device, bench_parser, start
from workbench.bucketing import BucketProfile, estimate_2d_bins
from workbench.data import read_cut_arrays, write_synthetic_corpus
from workbench.memory import configure_allocator
from workbench.memory.oom import release_memory
from workbench.models import build_model
from workbench.oomptimizer.probe import TrainingStepProbe
from workbench.oomptimizer.run import soak
from workbench.oomptimizer.search import search_batch_sizes

NAME = "byo_models"
SMOKE_MEMORY_BYTES = 64 * 2**20  # the modeled probe's budget in smoke runs
DEFAULT_MODELS = ["torchaudio-emformer-rnnt", "nemo-fastconformer-rnnt", "hf-whisper", "hf-wav2vec2-ctc",
                  "large-rnnt"]
TIGHTNESS = 1.1  # a probe at this multiple of each returned size must OOM
SOAK_OOM = "soak: OOM"  # how oomptimizer.run.soak begins the error of an OOM


def corpus_buckets(num_buckets: int, num_subbuckets: int, max_duration: float, num_cuts: int) -> list:
    """2D buckets (duration s, tokens) from the synthetic corpus's utterances up to ``max_duration``."""
    with tempfile.TemporaryDirectory() as tmp:
        arrays = read_cut_arrays(write_synthetic_corpus(tmp, num_cuts, progress=False), progress=False)
    keep = arrays.durations <= max_duration
    bins = estimate_2d_bins(arrays.durations[keep], arrays.num_tokens[keep], num_buckets, num_subbuckets)
    return [(float(d), float(u)) for d, u in bins.bins]


def model_spec(name: str) -> str:
    """What a model name builds: an adapter's MODULE:CALLABLE, else the name itself (a reference model)."""
    return user_model_spec(name) or name


def build(name: str, device: torch.device, smoke: bool) -> torch.nn.Module:
    spec = user_model_spec(name)
    if spec is None:
        with device:
            return build_model("tiny-rnnt" if smoke else name)
    if smoke and name in SMALL_CONFIGS:
        return build_adapter(name, device, small=True)
    return build_model_from_spec(spec, device)


def make_probe(model, args, device):
    if device.type == "cuda":
        return TrainingStepProbe(model, dtype=torch.bfloat16, memory_fraction=args.memory_fraction)
    return ModeledMemoryProbe(model, budget_bytes=SMOKE_MEMORY_BYTES, bytes_per_element=64.0)


def measure_model(name: str, buckets: list, args, device) -> dict:
    """Search, soak and tightness for one model; every figure of its entry in the record."""
    model = build(name, device, args.smoke)
    probe = make_probe(model, args, device)
    result = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes, rel_gap=args.rel_gap,
                                max_batch_size=args.max_batch_size)
    sizes = result.batch_sizes
    per_bucket = [sum(1 for p in result.probes if p.bucket_index == i) for i in range(len(buckets))]
    entry = {"spec": model_spec(name), "parameters": sum(p.numel() for p in model.parameters()),
             "batch_sizes": sizes, "probes_per_bucket": per_bucket,
             "mean_probes_per_bucket": result.num_probes / len(buckets), "search_s": result.seconds,
             "peak_bytes": [max((p.peak_bytes for p in result.probes if p.bucket_index == i and not p.oom),
                                default=None) for i in range(len(buckets))],
             "probes": [{"bucket": p.bucket_index, "batch_size": p.batch_size, "predicted_bytes": p.predicted_bytes,
                         "peak_bytes": p.peak_bytes} for p in result.probes]}  # the trace: where predictions missed
    entry["tightness"] = [tightness_probe(probe, b, s) for b, s in zip(buckets, sizes)]  # at the search's limit
    profile = BucketProfile([list(b) for b in buckets], sizes, None)
    try:
        entry["soak"] = soak(model, profile, search_memory_fraction=args.memory_fraction if device.type == "cuda"
                             else None, steps_per_bucket=args.soak_steps, progress=False,
                             dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    except RuntimeError as e:  # an OOM in the soak is a finding, recorded; any other error stops this model
        if not str(e).startswith(SOAK_OOM):
            raise
        entry["soak"] = {"error": str(e).splitlines()[0], "ooms": 1}
    del probe, model
    release_memory()
    return entry


def tightness_probe(probe, bucket, size: int) -> dict:
    """One probe at ceil(TIGHTNESS x size): does it OOM (it must, or the size is not within 10 %)?"""
    larger = max(size + 1, math.ceil(TIGHTNESS * size))
    try:
        peak = probe(bucket, larger)
        return {"batch_size": larger, "oom": False, "peak_bytes": peak}
    except torch.OutOfMemoryError:
        return {"batch_size": larger, "oom": True, "peak_bytes": None}


def checks(name: str, entry: dict) -> list[str]:
    """The targets: <= 3 probes per bucket, a soak without OOM, 1.1x OOMs at every bucket."""
    out = []
    if entry["mean_probes_per_bucket"] > 3:
        out.append(f"{name}: {entry['mean_probes_per_bucket']:.2f} probes per bucket (target <= 3)")
    if entry["soak"].get("ooms"):
        out.append(f"{name}: soak OOM: {entry['soak'].get('error')}")
    loose = [i for i, t in enumerate(entry["tightness"]) if not t["oom"]]
    if loose:
        out.append(f"{name}: {TIGHTNESS}x did not OOM at buckets {loose}")
    return out


def bench_buckets(args) -> list:
    """The benches' buckets: 2D bins of the synthetic corpus (``--buckets`` x ``--sub-buckets`` up to
    ``--max-duration``); two small ones in smoke runs."""
    buckets = corpus_buckets(args.buckets, args.sub_buckets, args.max_duration, 2000 if args.smoke else 20000)
    if args.smoke:
        buckets = [(min(d, 2.0), min(u, 12.0)) for d, u in buckets[:2]]
    return buckets


def add_search_options(parser) -> None:
    """The options the benches that search models share besides the harness's: buckets, the search's settings."""
    parser.add_argument("--buckets", type=int, default=4, help="duration buckets (default 4)")
    parser.add_argument("--sub-buckets", type=int, default=2, help="token sub-buckets each (default 2)")
    parser.add_argument("--max-duration", type=float, default=25.0, help="longest utterance, s (default 25)")
    parser.add_argument("--memory-fraction", type=float, default=0.9, help="the search's share of the GPU")
    parser.add_argument("--rel-gap", type=float, default=0.05, help="the search's stopping gap (default 0.05)")
    parser.add_argument("--max-batch-size", type=int, default=8192, help="the search's upper bound")


SMOKE_NOTE = " (SMOKE: modeled peak, not a measurement)"  # a smoke run's record: its peaks are modeled


def start_run(argv) -> Run:
    """The options parsed and checked; a smoke run without CUDA goes on (a modeled peak), else exit 2."""
    parser = bench_parser(__doc__)
    parser.add_argument("--models", nargs="+", help=f"adapters ({', '.join(ADAPTERS)}), reference names or "
                        f"MODULE:CALLABLE (default: {' '.join(DEFAULT_MODELS)}; --smoke: those with a small config)")
    add_search_options(parser)
    parser.add_argument("--soak-steps", type=int, default=2, help="soak steps per bucket (default 2)")
    parser.add_argument("--name", default=NAME, help=f"record name, {NAME} or {NAME}_<suffix> (default {NAME})")
    run = start(parser, argv, name=NAME, what="OOMptimizer on models nobody here wrote: batch sizes, probes, soak "
                "and the 1.1x check per bucket")
    if run.args.name != NAME and not run.args.name.startswith(NAME + "_"):
        parser.error(f"--name: must be {NAME} or start with {NAME}_ (the summary finds the record by it)")
    run.name, run.smoke_note = run.args.name, SMOKE_NOTE
    return run


def main(argv: list[str] | None = None) -> int:
    run = start_run(argv)
    args = run.args
    configure_allocator()  # expandable segments, as `workbench oomptimize` and training run (before CUDA starts)
    device = bench_device()
    buckets = run.figures["buckets"] = bench_buckets(args)
    names = args.models or ([n for n in DEFAULT_MODELS if n in SMALL_CONFIGS or user_model_spec(n) is None]
                            if args.smoke else DEFAULT_MODELS)

    def measure(name: str) -> tuple[dict, list[str]]:
        print(f"{name}: searching {len(buckets)} buckets", flush=True)
        entry = measure_model(name, buckets, args, device)
        print(f"{name}: sizes {entry['batch_sizes']}, {entry['mean_probes_per_bucket']:.2f} probes per bucket",
              flush=True)
        return entry, checks(name, entry)

    run.each(names, measure, spec_of=model_spec)
    return run.finish()
