"""DistributedDataParallel under torchrun: which rank this process is, and the few collectives training uses.

``torchrun --nproc-per-node N -m workbench train ...`` sets RANK, WORLD_SIZE and LOCAL_RANK; a plain
run is rank 0 of 1 and never touches torch.distributed. CUDA ranks use NCCL and GPU LOCAL_RANK; CPU
ranks use gloo (how the CPU tests run two processes).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Ranks:
    rank: int = 0        # this process among all processes
    world_size: int = 1  # processes in all
    local_rank: int = 0  # this process on its machine: the GPU it uses

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env() -> Ranks:
    """What torchrun says this process is (rank 0 of 1 outside torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        return Ranks()
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def local_world_size() -> int:
    """Processes of this run on this machine (1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def init_process_group(ranks: Ranks, device: torch.device) -> None:
    """Join torchrun's group: NCCL for CUDA devices, gloo for the CPU. No-op for one process."""
    if ranks.distributed and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                             device_id=device if device.type == "cuda" else None)


def destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def gather_objects(obj: Any, ranks: Ranks) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` for one process). Picklable objects only."""
    if not ranks.distributed:
        return [obj]
    out: list[Any] = [None] * ranks.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def sum_over_ranks(values: list[float], ranks: Ranks) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (the same list for one process)."""
    if not ranks.distributed:
        return list(values)
    return [sum(column) for column in zip(*gather_objects(list(values), ranks))]


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks when DDP kept them in sync. (Buffers such as
    batch-norm statistics are not included: DDP copies rank 0's at the start of each forward, so each
    rank's last update differs.)"""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
