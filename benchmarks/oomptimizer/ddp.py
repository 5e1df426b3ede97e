"""The OOMptimizer bench under torchrun (``--nproc N``): the RNN-T predictive search with DDP's gradient
all-reduce on every rank; rank 0 writes oomptimizer_ddp.json."""

from __future__ import annotations

import os

import torch

from benchmarks.harness import Run
from benchmarks.oomptimizer import probes
from benchmarks.oomptimizer.buckets import rnnt_buckets


def run_ddp(run: Run) -> None:
    """One process of the torchrun group (NCCL on GPUs, gloo in a smoke run on a CPU)."""
    args = run.args
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    buckets, bins_source = rnnt_buckets(args)
    model = probes.build(args.rnnt)
    probe = probes.make_probe(model, args, ddp_gradient_buckets=True)
    res = probes.run_search(probe, buckets, "predictive", args.max_batch_size)
    if not res["all_returned_probed"]:
        run.failures.append("ddp: a returned batch size was not probed")
    run.failures += probes.too_many_probes("ddp", res)
    torch.distributed.barrier()
    run.name = "oomptimizer_ddp" if rank == 0 else ""  # one record, from rank 0
    run.what = probes.smoke_what(args, f"OOMptimizer under torchrun with DDP gradient all-reduce on {world} GPUs "
                                       "(largest peak across ranks decides)")
    run.params.update({"dtype": "bf16", "memory_fraction": args.memory_fraction, "smoke": bool(args.smoke)})
    run.figures.update({"smoke": bool(args.smoke), "probe": type(probe).__name__, "model": args.rnnt,
                        "world_size": world, "buckets": buckets, "bins_source": bins_source, "predictive": res,
                        "wall_seconds": run.seconds()})
    if rank == 0:
        print(f"{args.rnnt} DDP x{world}: {res['probes']} probes ({res['probes_per_bucket']:.2f}/bucket), "
              f"{res['seconds']:.1f} s, batch sizes {res['batch_sizes']}")
    torch.distributed.destroy_process_group()
