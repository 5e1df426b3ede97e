"""The worker of the allocator benchmark: one round in a fresh process (``workbench.bench.allocator`` starts
it with ``--worker``).

It builds the model (``workbench.models``) and primes the optimizer state with the cheapest shape, then either
measures each shape's peak (``--mode calibrate``) or runs the blocks of ``--blocks`` (e.g. PEEP): each
block switches the allocator (``workbench.memory.switch_expandable_segments``: P plain, E expandable
segments; cached blocks released), then runs :func:`block_plan` under ``workbench.memory.MemoryRecorder``.
It writes the per-step rows, and per block the settings and segment bytes by kind, as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def worker(args) -> int:
    """One round (or the calibration) in this fresh process; writes its rows as JSON to --rows."""
    from workbench.bench.results import cpu_smoke_torch

    with cpu_smoke_torch(args.device != "cuda"):
        return run_round(args)


def run_round(args) -> int:
    """:func:`worker`'s work.

    ``--device cpu`` (smoke runs without CUDA): the same steps on the CPU, where no allocator is measured:
    memory counters are 0 and a calibration "peak" is the batch's bytes."""
    t_worker = time.perf_counter()
    on_cuda = args.device == "cuda"
    import torch

    from workbench.memory import MemoryRecorder, switch_expandable_segments
    from workbench.memory.oom import is_oom_error
    from workbench.models import build_model

    shapes = [tuple(s) for s in json.loads(Path(args.shapes).read_text())]
    torch.manual_seed(0)
    device = torch.device(args.device)
    with device:  # built on the device: a large model is never initialized on the host
        model = build_model(args.model)
    which = f"workbench.models {args.model}"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total = torch.cuda.get_device_properties(0).total_memory if on_cuda else \
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if args.fraction and on_cuda:
        torch.cuda.set_per_process_memory_fraction(args.fraction)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def train_step(shape):
        b, d, u = shape
        batch = model.make_batch(int(b), float(d), int(u), device)
        model.training_step(batch, dtype=dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return sum(t.numel() * t.element_size() for t in batch.values())

    t_ready = time.perf_counter()
    # Prime: one step of the cheapest shape, not recorded, so the optimizer state exists before the first
    # block (as in training from step 2 on) and lives outside the blocks' segments.
    train_step(min(shapes, key=lambda s: s[0] * s[1] * (s[2] + 1)))
    if args.mode == "calibrate":
        peaks = []  # peak allocated bytes of each step, no limit (on a CPU: the batch's bytes)
        for shape in shapes:
            if on_cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            batch_bytes = train_step(shape)
            if on_cuda:
                torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() if on_cuda else batch_bytes)
        Path(args.rows).write_text(json.dumps(dict(peak_allocated_bytes=max(peaks), peaks=peaks, total_bytes=total,
                                                   model=which, startup_s=t_ready - t_worker)))
        return 0

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
                    train_step(shape)
            except RuntimeError as e:
                if not is_oom_error(e):
                    raise
                opt.zero_grad(set_to_none=True)
                print(f"[allocator] OOM in block {block} ({allocator}) pass {pass_} step {i} shape {shape}", flush=True)
        info["segments_end"] = segment_bytes(on_cuda)
        blocks.append(info)
    frame = rec.to_frame()  # every step in run order
    Path(args.rows).write_text(json.dumps(dict(rows=frame.to_dict(orient="list"), model=which, blocks=blocks,
                                               startup_s=t_ready - t_worker,
                                               steps_s=time.perf_counter() - t_ready)))
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
    import torch

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
