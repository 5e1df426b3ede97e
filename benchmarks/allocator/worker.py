"""The allocator bench's worker: one round (or the calibration) in a fresh process, started by ``run.py``.

    python3 -m benchmarks.allocator.worker --mode interleaved --shapes S.json --rows OUT.json ...

It builds the model and primes the optimizer state with the cheapest shape, then either measures each
shape's peak allocated bytes (``--mode calibrate``) or runs the blocks of ``--blocks`` (e.g. PEEP): each
block switches the allocator (P plain, E expandable segments; cached blocks released) and runs
:func:`block_plan` under ``MemoryRecorder``. It writes the per-step rows, and per block the settings and
segment bytes by kind, as JSON to ``--rows``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.harness import cpu_smoke_torch
from workbench.memory import MemoryRecorder, switch_expandable_segments
from workbench.memory.oom import is_oom_error
from workbench.models import build_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one round of the allocator bench (started by its run.py)")
    p.add_argument("--mode", default="interleaved", choices=["interleaved", "calibrate"])
    p.add_argument("--shapes", required=True, help="JSON list of [batch_size, duration_s, num_tokens]")
    p.add_argument("--rows", required=True, help="write the result JSON here")
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--fraction", type=float, default=0.0, help="per-process memory fraction of the GPU (0: none)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--passes", type=int, default=1, help="measured passes per block")
    p.add_argument("--blocks", default="PEEP", help="allocator per block: P plain, E expandable segments")
    return p.parse_args(argv)


@dataclass
class Trainer:
    """A model, its optimizer and one training step per batch shape on ``device``."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    dtype: torch.dtype

    def step(self, shape) -> int:
        """One training step of ``shape`` (batch size, duration s, tokens); returns the batch's bytes."""
        b, d, u = shape
        batch = self.model.make_batch(int(b), float(d), int(u), self.device)
        self.model.training_step(batch, dtype=self.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sum(t.numel() * t.element_size() for t in batch.values())


def build_trainer(args) -> Trainer:
    torch.manual_seed(0)
    device = torch.device(args.device)
    with device:  # built on the device: a large model is never initialized on the host
        model = build_model(args.model)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    return Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-4), device, dtype)


def calibrate(trainer: Trainer, shapes, on_cuda: bool) -> list[int]:
    """Peak allocated bytes of each shape's step, no limit (on a CPU: the batch's bytes)."""
    peaks = []
    for shape in shapes:
        if on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        batch_bytes = trainer.step(shape)
        if on_cuda:
            torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() if on_cuda else batch_bytes)
    return peaks


def run_blocks(trainer: Trainer, shapes, args, on_cuda: bool) -> tuple[dict, list[dict]]:
    """The blocks of ``args.blocks``, each under its allocator: (rows as columns, one info dict per block)."""
    rec = MemoryRecorder() if on_cuda else MemoryRecorder(stats_fn=dict, reset_peaks_fn=lambda: None,
                                                          synchronize_fn=lambda: None)
    blocks = []  # per block: the allocator, its settings, and segment bytes by kind after the switch and at the end
    for block, expandable in enumerate(parse_blocks(args.blocks)):
        allocator = "expandable" if expandable else "plain"
        if on_cuda:
            settings = switch_expandable_segments(expandable)  # releases cached blocks: new segments of this kind
        else:  # on a CPU there is no allocator: counters are 0 (step_record reads missing keys as 0)
            settings = f"(cpu) expandable_segments:{expandable}"
        info = dict(block=block, allocator=allocator, settings=settings, segments_after_switch=segment_bytes(on_cuda))
        for pass_, i, repeat in block_plan(len(shapes), args.passes):
            shape = shapes[i]
            try:
                with rec.step(block=block, allocator=allocator, index=i, pass_=pass_, repeat=repeat,
                              batch_size=shape[0], duration_s=shape[1], num_tokens=shape[2]):
                    trainer.step(shape)
            except RuntimeError as e:
                if not is_oom_error(e):
                    raise
                trainer.optimizer.zero_grad(set_to_none=True)
                print(f"[allocator] OOM in block {block} ({allocator}) pass {pass_} step {i} shape {shape}", flush=True)
        info["segments_end"] = segment_bytes(on_cuda)
        blocks.append(info)
    return rec.to_frame().to_dict(orient="list"), blocks  # every step in run order


def run_round(args) -> dict:
    """The worker's result: the calibration's peaks, or the rows and blocks of one round.

    ``--device cpu`` (smoke runs without CUDA): the same steps on the CPU, where no allocator is measured:
    memory counters are 0 and a calibration "peak" is the batch's bytes."""
    t_worker = time.perf_counter()
    on_cuda = args.device == "cuda"
    shapes = [tuple(s) for s in json.loads(Path(args.shapes).read_text())]
    trainer = build_trainer(args)
    if args.fraction and on_cuda:
        torch.cuda.set_per_process_memory_fraction(args.fraction)
    which = f"workbench.models {args.model}"
    t_ready = time.perf_counter()
    # Prime: one step of the cheapest shape, not recorded, so the optimizer state exists before the first
    # block (as in training from step 2 on) and lives outside the blocks' segments.
    trainer.step(min(shapes, key=lambda s: s[0] * s[1] * (s[2] + 1)))
    if args.mode == "calibrate":
        total = torch.cuda.get_device_properties(0).total_memory if on_cuda else \
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        peaks = calibrate(trainer, shapes, on_cuda)
        return dict(peak_allocated_bytes=max(peaks), peaks=peaks, total_bytes=total, model=which,
                    startup_s=t_ready - t_worker)
    rows, blocks = run_blocks(trainer, shapes, args, on_cuda)
    return dict(rows=rows, model=which, blocks=blocks, startup_s=t_ready - t_worker,
                steps_s=time.perf_counter() - t_ready)


def main(argv=None) -> int:
    args = parse_args(argv)
    with cpu_smoke_torch(args.device != "cuda"):
        result = run_round(args)
    Path(args.rows).write_text(json.dumps(result))
    return 0


def parse_blocks(text: str) -> list[bool]:
    """"PEEP" -> [False, True, True, False]: one block per letter, P the plain allocator, E expandable segments."""
    if not text or set(text) - {"P", "E"}:
        raise ValueError(f"--blocks: want letters P (plain) and E (expandable segments), e.g. PEEP; got {text!r}")
    return [c == "E" for c in text]


def segment_bytes(on_cuda: bool) -> dict[str, int]:
    """Bytes of the allocator's segments by kind, from torch's memory snapshot (zeros on a CPU)."""
    if not on_cuda:
        return dict(expandable=0, plain=0)
    segments = torch.cuda.memory._snapshot()["segments"]
    return dict(expandable=sum(int(s["total_size"]) for s in segments if s.get("is_expandable")),
                plain=sum(int(s["total_size"]) for s in segments if not s.get("is_expandable")))


def block_plan(num_shapes: int, passes: int) -> list[tuple[int, int, bool]]:
    """(pass, shape index, repeat) per step of one block: pass 1 is the warm-up (every shape once, in order);
    passes 2..passes+1 are measured and run every shape twice in a row. The first occurrence follows a
    different shape, as with dynamic shapes; the repeat (``repeat`` True) has exactly the shape of the step
    before it, as with static shapes."""
    plan = [(1, i, False) for i in range(num_shapes)]
    for pass_ in range(2, passes + 2):
        for i in range(num_shapes):
            plan += [(pass_, i, False), (pass_, i, True)]
    return plan


if __name__ == "__main__":
    sys.exit(main())
