"""The allocator bench's batch shapes (batch size, padded duration s, padded tokens): from lhotse's sampler
over a synthetic corpus, from a ``--shapes-file``, or drawn directly (tests); the costliest first."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import lhotse
import numpy as np

from workbench.bucketing import close_sampler, cut_num_tokens, estimate_2d_bins, make_sampler
from workbench.bucketing.profile import BucketProfile
from workbench.data.synthetic import synthetic_cut_arrays, write_synthetic_corpus

FRAME_S = 0.08  # encoder frame after subsampling, seconds (for the joint-size cost of a shape)
SMOKE_CORPUS = dict(num_cuts=400, max_duration_s=3.0)  # --smoke: a small corpus of short cuts

Shape = tuple[int, float, int]  # (batch size, padded duration s, padded tokens)


def sampler_shapes(num_steps: int, *, batch_audio_s: float, num_buckets: int, seed: int,
                   work_dir: Path, num_cuts: int | None = None,
                   max_duration_s: float = 40.0) -> tuple[list[Shape], str]:
    """Batch shapes from a real bucketed lhotse sampler over a synthetic corpus of ``num_cuts`` (default
    max(4000, 200 x num_steps)) utterances up to ``max_duration_s`` seconds. Returns (shapes, source)."""
    path = write_synthetic_corpus(work_dir, num_cuts=num_cuts or max(4000, num_steps * 200), seed=seed,
                                  progress=False, max_duration_s=max_duration_s)
    cuts = lhotse.CutSet.from_file(path)
    durations = np.array([c.duration for c in cuts])
    tokens = np.array([cut_num_tokens(c) for c in cuts])
    fit = estimate_2d_bins(durations, tokens, num_buckets, 2)  # with the TPS filter, as in training
    bins = [[float(d), int(t)] for d, t in fit.bins]
    sizes = [max(1, int(batch_audio_s // d)) for d, _ in bins]
    profile = BucketProfile(bucket_duration_bins=bins, bucket_batch_size=sizes, max_tps=list(fit.max_tps))
    sampler = make_sampler(cuts, profile, shuffle=True, seed=seed)
    shapes = []
    try:
        for batch in sampler:
            shapes.append((len(batch), max(c.duration for c in batch), max(cut_num_tokens(c) for c in batch)))
            if len(shapes) == num_steps:
                break
    finally:
        close_sampler(sampler)  # stop the concurrent filling thread
    if len(shapes) < num_steps:
        raise ValueError(f"sampler gave {len(shapes)} batches, need {num_steps}: raise --steps' corpus size")
    return shapes, ("lhotse DynamicBucketingSampler via workbench.bucketing.make_sampler, 2D bins with TPS "
                    "filter, synthetic corpus")


def drawn_shapes(num_steps: int, *, batch_audio_s: float, num_buckets: int, seed: int) -> list[Shape]:
    """What a bucketing sampler yields, drawn directly: pick a bucket (weighted by its share of cuts),
    fill it up to ``batch_audio_s`` of padded audio, pad to the batch's longest cut and transcript. Fast:
    the tests use it in place of :func:`sampler_shapes`."""
    arrays = synthetic_cut_arrays(20_000, seed=seed)
    dur, tok = arrays.durations, arrays.num_tokens
    order = np.argsort(dur, kind="stable")
    dur, tok = dur[order], tok[order]
    cum = np.cumsum(dur)
    edges = np.searchsorted(cum, cum[-1] * np.arange(1, num_buckets) / num_buckets)
    groups = np.split(np.arange(dur.size), edges)
    rng = np.random.default_rng(seed + 1)
    weights = np.array([len(g) for g in groups], dtype=float)
    shapes = []
    for _ in range(num_steps):
        g = groups[rng.choice(len(groups), p=weights / weights.sum())]
        bound = dur[g[-1]]
        batch = rng.choice(g, size=min(len(g), max(1, int(batch_audio_s // bound))), replace=False)
        shapes.append((len(batch), float(dur[batch].max()), int(tok[batch].max())))
    return shapes


def largest_first(shapes: list[Shape], costs: list[float] | None = None) -> list[Shape]:
    """The costliest shape moved to the front: by ``costs`` (e.g. measured peak bytes) when given, else by
    joint-tensor size B*T*(U+1) plus encoder size B*T."""
    cost = costs if costs is not None else [b * (d / FRAME_S) * (u + 1) + b * d / FRAME_S for b, d, u in shapes]
    i = int(np.argmax(cost))
    return [shapes[i]] + shapes[:i] + shapes[i + 1:]


def write_shapes_only(args) -> int:
    """--write-shapes: the sampler's shapes as JSON, for a GPU host without lhotse."""
    with tempfile.TemporaryDirectory() as tmp_name:
        shapes, source = sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s, num_buckets=args.buckets,
                                        seed=args.seed, work_dir=Path(tmp_name))
    Path(args.write_shapes).write_text(json.dumps(dict(shapes=shapes, source=source)))
    print(f"wrote {len(shapes)} shapes ({source}) to {args.write_shapes}")
    return 0


def load_shapes(args, tmp: Path) -> tuple[list[Shape], str]:
    """(shapes, where they come from): the --shapes-file, else lhotse's sampler over a synthetic corpus."""
    if args.shapes_file:
        loaded = json.loads(Path(args.shapes_file).read_text())
        source = f"{loaded['source']} (from {Path(args.shapes_file).name}, written with --write-shapes)"
        return [tuple(x) for x in loaded["shapes"]], source
    return sampler_shapes(args.steps, batch_audio_s=args.batch_audio_s, num_buckets=args.buckets, seed=args.seed,
                          work_dir=tmp / "corpus", **(SMOKE_CORPUS if args.smoke else {}))
