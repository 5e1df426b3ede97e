"""`workbench oomptimize`: per-bucket batch sizes for a model on this GPU, written into the profile; and\n`workbench check-model`: one contract step of a model (docs/MODEL_CONTRACT.md), with one line per problem."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from workbench.atomic import check_writable
from workbench.bucketing.profile import load_profile, save_profile
from workbench.memory import configure_allocator
from workbench.models.config import DEFAULT_JOINT_LOSS, JOINT_LOSSES, check_joint_loss, config_from_name
from workbench.units import GiB


def register(sub) -> None:
    p = sub.add_parser(
        "oomptimize", help="find the largest batch size per bucket that fits on the GPU",
        description="Find, per bucket of a profile, the largest batch size whose training step fits in GPU\n"
                    "memory (real forward/backward/optimizer steps on this CUDA GPU), and write the batch\n"
                    "sizes into the profile. Needs a CUDA GPU; with --plan and --gpu-memory, none (the peaks are\n"
                    "predicted from a fake trace of the step, on the kernels the GPU runs).",
        epilog="examples:\n"
               "  workbench oomptimize --model large-rnnt --bins work/demo/profile.yaml\n"
               "  workbench oomptimize --model xl-tdt --bins bins.yaml --out profile.yaml --validate --nproc 4\n"
               "  workbench oomptimize --model ./model.py:build --bins bins.yaml --memory-fraction 0.8 "
               "--strategy bisect\n"
               "  workbench oomptimize --model large-rnnt --bins bins.yaml --plan --gpu-memory h100-80gb",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="a reference model (e.g. large-rnnt), an adapter (torchaudio-emformer-rnnt, hf-whisper, "
                        "hf-wav2vec2-ctc, nemo-fastconformer-rnnt) or your own as MODULE:CALLABLE (a module or a .py "
                        "file; the callable returns a model that keeps docs/MODEL_CONTRACT.md)")
    p.add_argument("--bins", required=True, help="profile YAML with bucket_duration_bins (from `workbench bins`)")
    p.add_argument("--out", help="where to write the profile (default: overwrite --bins)")
    p.add_argument("--strategy", choices=["predictive", "bisect"], default="predictive",
                   help="predictive: fit peak memory = base + batch size x cost per utterance and jump to the "
                        "predicted largest size; bisect: double until the first OOM, then bisect "
                        "(default predictive)")
    p.add_argument("--memory-fraction", type=float, default=0.9,
                   help="share of the GPU's memory the probes may use, in (0, 1]; the rest is headroom for "
                        "training (default 0.9)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="the probes' precision: bf16 autocast or fp32; use the one you train with (default bf16)")
    p.add_argument("--rel-gap", type=float, default=0.05,
                   help="stop a bucket's search when (smallest OOM - largest fit) / smallest OOM <= this, in "
                        "(0, 1): 0.05 finds a size within 5%% of the largest that fits (default 0.05)")
    p.add_argument("--start-batch-size", type=int, default=32,
                   help="batch size of the first probe of the largest bucket, >= 1 (default 32)")
    p.add_argument("--no-merge", action="store_true",
                   help="keep neighbouring buckets with equal batch sizes (default: merge them)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--ddp", action="store_true",
                       help="on one GPU, account for the gradient buckets DistributedDataParallel adds")
    group.add_argument("--nproc", type=int,
                       help="probe under torchrun with DDP on this many GPUs of this machine, >= 1")
    p.add_argument("--validate", action="store_true",
                   help="after the search, train 3 steps per bucket at the sizes found and record OOMs and peaks")
    p.add_argument("--joint-chunk-size", type=int, default=0,
                   help="transducers: probe with the joint and loss over chunks of this many utterances, >= 0 "
                        "(0: off); train with the same value (default 0)")
    p.add_argument("--loss", choices=JOINT_LOSSES, default=DEFAULT_JOINT_LOSS,
                   help="transducers: probe with the joint's logits built ('materialized') or with the fused joint "
                        "and loss that never builds them ('fused'); train with the same value; recorded as "
                        f"metadata.joint_loss (default {DEFAULT_JOINT_LOSS})")
    p.add_argument("--compile", action="store_true",
                   help="probe with each encoder block compiled by torch.compile (as `workbench train --compile` "
                        "trains); recorded as metadata.compile")
    p.add_argument("--plan", action="store_true",
                   help="no GPU needed: predict each step's peak memory from a fake trace of the path the GPU runs "
                        "(the Triton kernels by their fakes) and search against --gpu-memory; the profile records "
                        "that it was planned")
    p.add_argument("--gpu-memory", metavar="SIZE|NAME",
                   help="with --plan: the GPU's memory, a size (80GiB, 80GB, 81920MiB) or a GPU's name "
                        "(a100-40gb, a100-80gb, h100-80gb, h200, l40s)")
    p.add_argument("--from-plan", metavar="PLAN", type=Path,
                   help="start the GPU search from a plan of the same --bins (a profile written by --plan, for any "
                        "memory): each bucket's first probe aims at the plan's size, scaled by what the probes "
                        "measure, so a good plan needs about one probe per bucket")
    p.add_argument("--plan-margin", metavar="SIZE", default="1GiB",
                   help="with --plan: memory kept free below the fraction for workspaces and fragmentation "
                        "(default 1GiB)")
    p.set_defaults(func=run_oomptimize)
    register_check_model(sub)


def check_options(args) -> None:
    """One-line ValueErrors naming the option, before any file is read or GPU work starts."""
    if args.joint_chunk_size < 0:
        raise ValueError(f"--joint-chunk-size: must be >= 0 (0: off), got {args.joint_chunk_size}")
    if not 0 < args.memory_fraction <= 1:
        raise ValueError(f"--memory-fraction: must be in (0, 1], got {args.memory_fraction}")
    if not 0 < args.rel_gap < 1:
        raise ValueError(f"--rel-gap: must be in (0, 1), got {args.rel_gap}")
    if args.start_batch_size < 1:
        raise ValueError(f"--start-batch-size: must be >= 1, got {args.start_batch_size}")
    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc: must be >= 1 GPUs, got {args.nproc}")
    check_plan_options(args)
    from workbench.adapters import user_model_spec  # torch loads with it: only when oomptimize runs

    if user_model_spec(args.model) is not None:
        for option, used in (("--joint-chunk-size", args.joint_chunk_size), ("--compile", args.compile)):
            if used:
                raise ValueError(f"{option}: applies to the reference models only, not to --model {args.model}")
    elif args.joint_chunk_size:
        try:
            head = config_from_name(args.model).head
        except ValueError:  # an adapter's name, or a wrong one: check_model_name says which
            head = None
        if head in ("ctc", "aed"):
            raise ValueError(f"--joint-chunk-size: applies to transducers (rnnt, tdt) only, not to --model "
                             f"{args.model}")
    if args.loss != DEFAULT_JOINT_LOSS or args.joint_chunk_size:
        try:
            head = config_from_name(args.model).head
        except ValueError:  # a model we did not write
            head = None
        check_joint_loss(args.loss, head, args.model, args.joint_chunk_size)


def check_plan_options(args) -> None:
    """--plan needs --gpu-memory and no option that runs on a GPU; sets ``args.gpu_memory_bytes`` and
    ``args.plan_margin_bytes``. One-line ValueErrors."""
    if args.from_plan is not None and (args.plan or args.strategy != "predictive"):
        raise ValueError("--from-plan: starts the predictive search on a GPU; it cannot be combined with "
                         + ("--plan" if args.plan else "--strategy bisect"))
    if not args.plan:
        for option, used in (("--gpu-memory", args.gpu_memory is not None), ("--plan-margin", args.plan_margin != "1GiB")):
            if used:
                raise ValueError(f"{option}: applies with --plan only")
        return
    for option, used in (("--validate", args.validate), ("--nproc", args.nproc is not None), ("--compile", args.compile)):
        if used:
            raise ValueError(f"{option}: runs on a GPU, so it cannot be combined with --plan")
    if args.gpu_memory is None:
        raise ValueError("--plan: needs --gpu-memory SIZE|NAME (e.g. 80GiB or h100-80gb)")
    from workbench.oomptimizer.plan import gpu_memory_bytes, parse_size

    args.gpu_memory_bytes = gpu_memory_bytes(args.gpu_memory)
    try:
        args.plan_margin_bytes = parse_size(args.plan_margin)
    except ValueError as e:
        raise ValueError(f"--plan-margin: {e}") from None
    if args.plan_margin_bytes >= args.gpu_memory_bytes * args.memory_fraction:
        raise ValueError(f"--plan-margin {args.plan_margin}: leaves nothing of --memory-fraction "
                         f"{args.memory_fraction} x {args.gpu_memory}")


def check_model_name(name: str) -> None:
    """A reference name, an adapter or an importable MODULE:CALLABLE; else one line, before any GPU work."""
    from workbench.adapters import ADAPTERS, load_model_factory, user_model_spec

    spec = user_model_spec(name)
    if spec is not None:
        load_model_factory(spec)
        return
    try:
        config_from_name(name)
    except ValueError:
        raise ValueError(f"--model {name!r}: neither a reference model (e.g. large-rnnt), an adapter "
                         f"({', '.join(ADAPTERS)}) nor MODULE:CALLABLE") from None


def run_oomptimize(args) -> int:
    check_options(args)
    bins_path = Path(args.bins)
    if not bins_path.exists():
        raise FileNotFoundError(f"{bins_path}: no such profile file")
    check_writable(args.out or bins_path)  # the profile is written after the GPU work: refuse a bad path now
    check_model_name(args.model)  # a wrong model name is a one-line error here, before any GPU work
    bins = load_profile(bins_path)  # so is a malformed profile file
    if args.plan:
        return run_plan(args, bins, bins_path)
    prior = load_prior(args.from_plan, bins) if args.from_plan is not None else None
    configure_allocator()  # before CUDA is initialized
    # torch and the modules that import it load here, so that the CLI's other commands start without them
    import torch

    from workbench.models.model import DTYPES
    from workbench.oomptimizer.run import describe_soak, oomptimize, profile_buckets, soak

    if not torch.cuda.is_available():
        raise ValueError("oomptimize needs a CUDA GPU (the probes run real training steps)")
    if args.nproc and args.nproc > 1 and "LOCAL_RANK" not in os.environ:
        if torch.cuda.device_count() < args.nproc:
            raise ValueError(f"--nproc {args.nproc}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
        return _relaunch_under_torchrun(args.nproc)
    rank = _init_distributed(torch)
    model = _build_for_search(args, bins)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"oomptimize {args.model}: {bins.num_buckets} buckets, {args.strategy}, {args.dtype}, "
        f"memory fraction {args.memory_fraction}{', compiled encoder' if args.compile else ''}")
    t0 = time.perf_counter()
    on_probe, on_bucket = _progress_lines(profile_buckets(bins), say)
    profile, result = oomptimize(model, args.model, bins, strategy=args.strategy, dtype=DTYPES[args.dtype],
                                 memory_fraction=args.memory_fraction, ddp=args.ddp, rel_gap=args.rel_gap,
                                 start_batch_size=args.start_batch_size, merge=not args.no_merge,
                                 on_probe=on_probe, on_bucket=on_bucket, prior=prior)
    say(f"done: {result.num_probes} probes ({result.probes_per_bucket:.2f} per bucket, {result.num_ooms} OOMs) "
        f"in {time.perf_counter() - t0:.1f} s; {profile.num_buckets} buckets after merging")
    if args.validate:
        report = soak(model, profile, dtype=DTYPES[args.dtype], search_memory_fraction=args.memory_fraction,
                      progress=rank == 0)  # under training's limit: the whole device
        profile.metadata["soak"] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in report.items()}
        say(describe_soak(report))
    if rank == 0:
        out = save_profile(args.out or bins_path, profile)
        print(f"wrote {out}")
    return 0


def _build_for_search(args, bins):
    """The model on this CUDA device: a reference model built there, or the user's, checked by one step of the
    smallest bucket first (a broken one fails in one line); compiled when asked."""
    import torch

    from workbench.adapters import build_model_from_spec, check_model, user_model_spec
    from workbench.models import build_model, compile_encoder_layers
    from workbench.models.model import DTYPES
    from workbench.oomptimizer.run import profile_buckets

    device = torch.device("cuda", torch.cuda.current_device())
    spec = user_model_spec(args.model)
    if spec is not None:
        model = build_model_from_spec(spec, device)
        smallest = min(profile_buckets(bins))
        check_model(model, spec=args.model, bucket=(smallest[0], int(smallest[1])), device=device,
                    dtype=DTYPES[args.dtype])
    else:
        with device:  # built on the GPU: an xl model skips host init
            model = build_model(args.model, joint_chunk_size=args.joint_chunk_size, joint_loss=args.loss)
    if args.compile:
        compile_encoder_layers(model)  # the probes measure the compiled step (the first one compiles)
    return model


def _progress_lines(buckets, say):
    """(on_probe, on_bucket) for the search: a line per probe rewritten in place, a line per bucket."""
    def on_probe(rec):
        peak = "OOM" if rec.oom else f"{rec.peak_bytes / GiB:6.1f} GiB"
        say(f"\r  bucket {rec.bucket_index:3d}: probe batch size {rec.batch_size:5d} -> {peak:>10}   ",
            end="", flush=True)

    def on_bucket(i, batch_size, records):
        peak = max((r.peak_bytes for r in records if not r.oom), default=0)
        d, u = buckets[i]
        say(f"\r  bucket {i:3d} ({d:6.2f} s, {u:5.0f} tok): batch size {batch_size:5d}  "
            f"probes {len(records):2d}  peak {peak / GiB:6.1f} GiB")
    return on_probe, on_bucket


def load_prior(path: Path, bins):
    """The planned peaks of the plan at ``path`` for the buckets of ``bins``; one-line errors naming it."""
    from workbench.oomptimizer.plan import planned_peaks
    from workbench.oomptimizer.run import profile_buckets

    if not path.exists():
        raise FileNotFoundError(f"--from-plan {path}: no such profile file")
    return planned_peaks(load_profile(path), profile_buckets(bins), source=f"--from-plan {path}")


def run_plan(args, bins, bins_path: Path) -> int:
    """`oomptimize --plan`: the search against predicted peaks, without a GPU (see oomptimizer/plan.py)."""
    from workbench.adapters import user_model_spec
    from workbench.models.model import DTYPES
    from workbench.oomptimizer.plan import (build_fake_reference_model, build_fake_user_model, new_fake_mode,
                                            plan_profile, plan_workers)

    fake_mode = new_fake_mode()
    spec = user_model_spec(args.model)
    model = (build_fake_user_model(args.model, fake_mode) if spec is not None else
             build_fake_reference_model(args.model, fake_mode, joint_chunk_size=args.joint_chunk_size,
                                        joint_loss=args.loss))
    print(f"oomptimize --plan {args.model}: {bins.num_buckets} buckets, {args.strategy}, {args.dtype}, "
          f"{args.gpu_memory} ({args.gpu_memory_bytes / GiB:.2f} GiB) x {args.memory_fraction} - margin "
          f"{args.plan_margin_bytes / GiB:.2f} GiB; a fake trace of the GPU's path")
    t0 = time.perf_counter()
    profile, result = plan_profile(model, fake_mode, args.model, bins, gpu_memory=args.gpu_memory,
                                   memory_fraction=args.memory_fraction, margin_bytes=args.plan_margin_bytes,
                                   dtype=DTYPES[args.dtype], ddp=args.ddp, strategy=args.strategy,
                                   rel_gap=args.rel_gap, start_batch_size=args.start_batch_size,
                                   merge=not args.no_merge, workers=plan_workers())
    print(f"planned: {result.num_probes} traced steps ({result.probes_per_bucket:.2f} per bucket) in "
          f"{time.perf_counter() - t0:.1f} s; {profile.num_buckets} buckets after merging")
    out = save_profile(args.out or bins_path, profile)
    print(f"wrote {out}")
    return 0


def _init_distributed(torch) -> int:
    """Join the torchrun group when launched by torchrun; returns this process's rank."""
    if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return 0
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl")
    return torch.distributed.get_rank()


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` without ``option VALUE`` and ``option=VALUE``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def _relaunch_under_torchrun(nproc: int) -> int:
    """Run this same command under ``torchrun --nproc_per_node nproc`` (each rank probes).

    ``--nproc`` is left out of the ranks' command: torchrun's parser would reject it as an ambiguous
    prefix of its own --nproc-per-node, and the ranks know they run under torchrun from LOCAL_RANK.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "workbench", *without_option(sys.argv[1:], "--nproc")]
    print("launching:", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def register_check_model(sub) -> None:
    p = sub.add_parser(
        "check-model", help="build your model and run one training step of the smallest bucket",
        description="Build the model that SPEC names and run one training step of the smallest bucket (of\n"
                    "--bins, else 3 s / 24 tokens) at --batch-size, on the GPU when there is one. Prints one\n"
                    "line: ok, or what breaks the model contract (docs/MODEL_CONTRACT.md).",
        epilog="examples:\n  workbench check-model my_models:build\n"
               "  workbench check-model ./model.py:build --bins profile.yaml --device cpu\n"
               "  workbench check-model hf-whisper   (an adapter: torchaudio-emformer-rnnt, hf-whisper, "
               "hf-wav2vec2-ctc, nemo-fastconformer-rnnt)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC", help="MODULE:CALLABLE (a module or a .py file; the callable takes no "
                                                "arguments and returns the model) or an adapter's name")
    p.add_argument("--bins", type=Path,
                   help="profile YAML: its smallest bucket sets the step's duration and tokens "
                        "(default: 3 s, 24 tokens)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the step runs (default auto: cuda when available)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="the step's precision: fp32, or bf16 autocast (default fp32)")
    p.add_argument("--batch-size", type=int, default=2, help="utterances in the step, >= 1 (default 2)")
    p.set_defaults(func=run_check_model)


def run_check_model(args) -> int:
    from workbench.adapters import user_model_spec

    spec = user_model_spec(args.spec)
    if spec is None:
        raise ValueError(f"{args.spec}: expected MODULE:CALLABLE or an adapter's name; reference models "
                         "(e.g. large-rnnt) keep the contract already")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: must be >= 1, got {args.batch_size}")
    bucket = (3.0, 24)
    if args.bins is not None:
        if not args.bins.exists():
            raise FileNotFoundError(f"{args.bins}: no such profile file")
        from workbench.bucketing.profile import load_profile
        from workbench.oomptimizer.run import profile_buckets

        d, u = min(profile_buckets(load_profile(args.bins)))
        bucket = (d, int(u))
    import torch

    from workbench.adapters import build_model_from_spec, check_model
    from workbench.models.model import DTYPES

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU here")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    model = build_model_from_spec(spec, device)
    report = check_model(model, spec=args.spec, bucket=bucket, batch_size=args.batch_size, device=device,
                         dtype=DTYPES[args.dtype])
    print(report.line())
    return 0


if __name__ == "__main__":  # python -m workbench.oomptimizer.cli ARGS == workbench oomptimize ARGS
    import runpy

    sys.argv[1:1] = ["oomptimize"]  # so that a torchrun relaunch (--nproc) repeats the sub-command
    runpy.run_module("workbench", run_name="__main__")
