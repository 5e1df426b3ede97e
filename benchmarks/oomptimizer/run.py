"""The OOMptimizer bench's CLI: predictive vs bisect search, true maxima, soak, xl AED, two-GPU DDP.

    python3 -m benchmarks.oomptimizer --out benchmarks/results            # rnnt and aed, one GPU
    python3 -m benchmarks.oomptimizer --out DIR --parts rnnt              # GPU 0 ...
    python3 -m benchmarks.oomptimizer --out DIR --parts aed               # ... and GPU 1, at once
    python3 -m benchmarks.oomptimizer --out benchmarks/results --nproc 2  # two GPUs (torchrun)
    python3 -m benchmarks.oomptimizer --out DIR --parts rnnt-chunked      # joint whole vs chunked
    python3 -m benchmarks.oomptimizer --out DIR --parts rnnt-chunked --joint-loss fused   # ... vs fused
    python3 -m benchmarks.oomptimizer --smoke --out /tmp/smoke [--nproc 2]   # CPU, seconds

RNN-T part (``single.py``): large RNN-T on 15 x 2 2D buckets up to 40 s: predictive search on all buckets
(the profile), both strategies fresh on every fifth bucket, true maxima on five of them, a soak of the
profile, then the one-GPU DDP gradient-bucket accounting. AED part: xl AED on 8 x 1 buckets, predictive and
bisect; ``--parts aed`` alone writes oomptimizer_aed.json. ``--budget-s``: no new part starts after it (0: no
limit); a skipped part fails the run. ``--nproc 2`` relaunches under torchrun and writes oomptimizer_ddp.json
(``ddp.py``). Exit 1 when a returned size was not probed, predictive needs > 3 probes per bucket, a size is
> 3 % (and > 1) below the true maximum, the soak OOMs, or memory is left allocated. --smoke: tiny models on
a few short buckets; without CUDA the probe is ``ModeledMemoryProbe`` (``modeled_probe.py``). The record's
fields: ``workbench/records/oomptimizer.py``.
``--parts rnnt-chunked [--joint-chunk-size K | --joint-loss fused] [--buckets START:STOP]`` runs alone: the
RNN-T predictive search only, with the joint whole and over chunks of K utterances (``joint_chunks.py``;
oomptimizer_rnnt_chunked.json), or with the joint and loss fused (oomptimizer_rnnt_fused.json).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from workbench.memory import configure_allocator

configure_allocator()  # before CUDA is initialized

import torch  # noqa: E402

from benchmarks.harness import bench_env, bench_parser, cpu_smoke_torch, cuda_missing, start  # noqa: E402
from benchmarks.oomptimizer.ddp import run_ddp  # noqa: E402
from benchmarks.oomptimizer.joint_chunks import run_chunked  # noqa: E402
from benchmarks.oomptimizer.single import run_single  # noqa: E402
from workbench.models.config import (DEFAULT_JOINT_LOSS, JOINT_LOSSES, check_joint_loss,  # noqa: E402
                                     reference_head)
from workbench.oomptimizer.cli import without_option  # noqa: E402
from workbench.options import positive_int  # noqa: E402
from workbench.records import oomptimizer as record  # noqa: E402

PARTS = ("rnnt", "aed", record.CHUNKED_PART)  # the last runs alone
DEFAULT_PARTS = ("rnnt", "aed")
BUDGET_S = 300  # default --budget-s: no new part starts after this (skipped parts are named in the JSON)
DEFAULT_JOINT_CHUNK_SIZE = 16  # --parts rnnt-chunked: utterances per joint + loss chunk
SMOKE_JOINT_CHUNK_SIZE = 2  # --smoke --parts rnnt-chunked: smaller than the smoke batch sizes, so chunks run
SMOKE_MAX_BATCH_SIZE = 16  # --smoke with CUDA: tiny models would fit huge batches


def make_parser() -> argparse.ArgumentParser:
    """The harness's options (--out --smoke --budget-s --parts) and the bench's own."""
    chunked = record.CHUNKED_PART
    parser = bench_parser(__doc__, parts=PARTS, default_parts=DEFAULT_PARTS, budget_s=BUDGET_S)
    parser.add_argument("--rnnt", default="large-rnnt", help="RNN-T model name (or module:Factory)")
    parser.add_argument("--aed", default="xl-aed", help="AED model name (or module:Factory)")
    parser.add_argument("--memory-fraction", type=float, default=0.9)
    parser.add_argument("--joint-chunk-size", type=positive_int, default=None,
                        help=f"--parts {chunked}: utterances per joint + loss chunk in the chunked search "
                             f"(default {DEFAULT_JOINT_CHUNK_SIZE}; {SMOKE_JOINT_CHUNK_SIZE} with --smoke)")
    parser.add_argument("--joint-loss", choices=JOINT_LOSSES, default=DEFAULT_JOINT_LOSS,
                        help=f"--parts {chunked}: 'fused' searches the joint and loss fused (the logits never built) "
                             f"in place of the chunked search ({record.FUSED_NAME}.json)")
    parser.add_argument("--buckets", default=None, metavar="START:STOP",
                        help=f"--parts {chunked}: search only the buckets with these indices (STOP excluded); "
                             f"the record is then named {record.CHUNKED_NAME}_START_STOP.json "
                             f"({record.FUSED_NAME}_START_STOP.json with --joint-loss fused)")
    parser.add_argument("--nproc", type=int, default=1, help="GPUs for the DDP run (torchrun)")
    parser.add_argument("--max-batch-size", type=int, default=1 << 20, help="cap on any batch size probed")
    return parser


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that belong together, and the smoke run's tiny models; ``parser.error`` otherwise."""
    chunked = record.CHUNKED_PART
    if chunked in args.parts and len(args.parts) > 1:
        parser.error(f"--parts {chunked} runs alone")
    if args.joint_chunk_size is not None and chunked not in args.parts:
        parser.error(f"--joint-chunk-size belongs to --parts {chunked}")
    if args.buckets is not None and chunked not in args.parts:
        parser.error(f"--buckets belongs to --parts {chunked}")
    if args.joint_loss == "fused" and chunked not in args.parts:
        parser.error(f"--joint-loss belongs to --parts {chunked}")
    try:
        check_joint_loss(args.joint_loss, reference_head(args.rnnt), args.rnnt, args.joint_chunk_size or 0,
                         option="--joint-loss", model_option="--rnnt")
    except ValueError as e:
        parser.error(str(e))
    if args.nproc > 1 and (list(args.parts) != list(DEFAULT_PARTS) or args.budget_s != BUDGET_S):
        parser.error("--parts and --budget-s belong to the one-GPU run, not to --nproc")
    chunks = chunked in args.parts and args.joint_loss != "fused"
    if chunks and args.joint_chunk_size is None:  # smoke: below the tiny batches
        args.joint_chunk_size = SMOKE_JOINT_CHUNK_SIZE if args.smoke else DEFAULT_JOINT_CHUNK_SIZE
    if args.smoke:
        for option, tiny in (("rnnt", "tiny-rnnt"), ("aed", "tiny-aed")):
            if getattr(args, option) == parser.get_default(option):
                setattr(args, option, tiny)
        if args.max_batch_size == parser.get_default("max_batch_size") and torch.cuda.is_available():
            args.max_batch_size = SMOKE_MAX_BATCH_SIZE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    run = start(parser, argv, name="oomptimizer", what="OOMptimizer", needs_cuda=False)
    run.smoke_note = ""  # a smoke run's "what" says what it stood in for (probes.smoke_what)
    check_options(parser, run.args)
    args = run.args
    if cuda_missing(args.smoke):
        return 2
    if args.nproc > 1 and not ("LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1):
        # Without --nproc: torchrun's own parser would reject it as an ambiguous prefix of --nproc-per-node.
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               "-m", "benchmarks.oomptimizer", *without_option(argv, "--nproc")]
        return subprocess.call(cmd, env=bench_env())
    with cpu_smoke_torch(args.smoke and not torch.cuda.is_available()):
        if "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            run_ddp(run)
        elif record.CHUNKED_PART in args.parts:
            if run_chunked(run) == 2:
                return 2
        else:
            run_single(run)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
