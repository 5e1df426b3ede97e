"""The model, its memory probe and the OOMptimizer's 1D and 2D profiles of the throughput study's corpus."""

from __future__ import annotations

import argparse
import time

from benchmarks.throughput.settings import SMOKE_BATCH_AUDIO_S, SUBBUCKETS, say, trained_model
from workbench.records.throughput import PROFILES


def build_study_model(args: argparse.Namespace, vocab_size: int):
    """The trained model (:func:`trained_model`) on the GPU, or on the CPU under --smoke."""
    import torch

    from workbench.models import build_model

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    return build_model(trained_model(args), vocab_size=vocab_size).to(device)


def make_probe(args: argparse.Namespace, model):
    """The OOMptimizer's GPU probe, or under --smoke the modelled one (budget: SMOKE_BATCH_AUDIO_S of
    padded audio per batch above the weights and optimizer state)."""
    import torch

    if args.smoke:
        from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe

        base = 4 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        budget = base + 256.0 * model.config.sample_rate * SMOKE_BATCH_AUDIO_S
        return ModeledMemoryProbe(model, dtype=torch.float32, budget_bytes=budget)
    from workbench.oomptimizer.probe import TrainingStepProbe

    return TrainingStepProbe(model, dtype=torch.bfloat16, memory_fraction=args.memory_fraction)


def fill_profile(args: argparse.Namespace, model, probe, bins):
    """``bins`` with batch sizes: ``oomptimize`` on a GPU; the same search over the modelled probe when smoke."""
    from workbench.oomptimizer.run import oomptimize, profile_buckets
    from workbench.oomptimizer.search import search_batch_sizes

    if not args.smoke:
        profile, _ = oomptimize(model, trained_model(args), bins, memory_fraction=args.memory_fraction)
        return profile
    result = search_batch_sizes(profile_buckets(bins), probe, budget_bytes=probe.budget_bytes)
    bins.bucket_batch_size = result.profile_batch_sizes()
    bins.metadata.update(model=trained_model(args), probes=result.num_probes, modelled_memory=True)
    return bins


def profile_bins(args: argparse.Namespace, arrays, kind: str):
    """The bins of one profile: "1d" (``--buckets-1d`` duration buckets), "2d" (the same duration bins x
    SUBBUCKETS token sub-buckets) or "2d_equal" (``--buckets-1d`` // SUBBUCKETS duration buckets x SUBBUCKETS:
    as many buckets as the 1D profile)."""
    from workbench.bucketing import profile_from_arrays

    d, u = arrays.durations, arrays.num_tokens
    if kind == "1d":
        bins = profile_from_arrays(d, u, num_buckets=args.buckets_1d, one_d=True)
        bins.max_tps = float((u / d).max())  # the probe's token bound: no cut above
        return bins
    duration_buckets = args.buckets_2d if kind == "2d" else max(1, args.buckets_1d // SUBBUCKETS)
    return profile_from_arrays(d, u, num_buckets=duration_buckets, num_subbuckets=SUBBUCKETS)


def make_profiles(run, arrays, model, probe) -> dict[str, dict]:
    """The PROFILES' bins from the corpus (:func:`profile_bins`), filled by the OOMptimizer: {kind: profile
    dict with its search's wall seconds (``search_s``) and its duration buckets (``duration_buckets``)}."""
    out = {}
    for kind in PROFILES:
        started = time.perf_counter()
        profile = fill_profile(run.args, model, probe, profile_bins(run.args, arrays, kind))
        durations = {float(b[0] if isinstance(b, (list, tuple)) else b) for b in profile.bucket_duration_bins}
        out[kind] = {**profile.to_dict(), "search_s": time.perf_counter() - started,
                     "duration_buckets": len(durations)}
        say(run, f"{kind} profile: {profile.num_buckets} buckets, batch sizes {profile.bucket_batch_size}")
    return out
