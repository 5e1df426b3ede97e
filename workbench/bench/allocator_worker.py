"""The worker of the allocator benchmark: one configuration in a fresh process (``workbench.bench.allocator``
starts it with ``--worker``; the allocator settings must be in place before CUDA initializes).

It builds the model (``workbench.models``), primes the optimizer state with the cheapest shape, then either
measures each shape's peak (``--mode calibrate``) or runs the warm-up pass and the measured passes of
``worker_plan`` under ``workbench.memory.MemoryRecorder``, and writes its per-step rows as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


def worker(args) -> int:
    """One configuration in this (fresh) process; writes its per-step rows as JSON to --rows.

    ``--device cpu`` (smoke runs without CUDA): the same steps on the CPU, where no allocator is measured:
    memory counters are 0 and a calibration "peak" is the batch's bytes."""
    t_worker = time.perf_counter()
    status = None
    on_cuda = args.device == "cuda"
    if args.expandable:
        from workbench.memory import configure_allocator

        status = configure_allocator()  # before CUDA init: through the environment
        want = "set_env" if on_cuda else "skipped"
        assert status.action == want, f"expected configure_allocator to say {want}, got: {status}"
    import torch

    from workbench.memory import MemoryRecorder, current_allocator_settings, parse_settings
    from workbench.memory.oom import is_oom_error
    from workbench.memory.settings import expandable_segments_setting
    from workbench.models import build_model

    if not on_cuda:
        torch.backends.mkldnn.enabled = False  # oneDNN builds kernels per new shape: seconds each on a CPU
        torch.set_num_threads(1)
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
    # Prime: one step of the cheapest shape, not recorded, so the optimizer state exists before the
    # warm-up (as in training from step 2 on); otherwise the first measured step carries state the
    # warm-up's largest step never had, and allocates.
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

    settings = current_allocator_settings() or ""
    if args.expandable and on_cuda:
        assert expandable_segments_setting(parse_settings(settings)), f"expandable segments not active: {settings!r}"
    # On a CPU there is no allocator: zero counters (step_record reads missing keys as 0), no-op sync.
    rec = MemoryRecorder() if on_cuda else MemoryRecorder(stats_fn=dict, reset_peaks_fn=lambda: None,
                                                          synchronize_fn=lambda: None)
    for pass_, i, timed, repeat in worker_plan(len(shapes), args.mode, args.passes):
        shape = shapes[i]
        try:
            with rec.step(index=i, pass_=pass_, timed=timed, repeat=repeat, batch_size=shape[0], duration_s=shape[1],
                          num_tokens=shape[2]):
                train_step(shape)
        except RuntimeError as e:
            if not is_oom_error(e):
                raise
            opt.zero_grad(set_to_none=True)
            print(f"[allocator] OOM at pass {pass_} step {i} shape {shape}", flush=True)
    frame = rec.to_frame()  # every step in run order: warm-up, then measured (static: untimed first + timed repeat)
    Path(args.rows).write_text(json.dumps(dict(rows=frame.to_dict(orient="list"), model=which, settings=settings,
                                               status=str(status) if status else None,
                                               startup_s=t_ready - t_worker,
                                               steps_s=time.perf_counter() - t_ready)))
    return 0


def worker_plan(num_shapes: int, mode: str, passes: int) -> list[tuple[int, int, bool, bool]]:
    """(pass, shape index, timed, repeat) per step: pass 1 is the warm-up (every shape once,
    timed for the cold-shape figure); passes 2..passes+1 are measured. "static" runs each shape twice in a row
    and times only the repeat (``repeat`` True), which has exactly the shape of the step before it."""
    plan = [(1, i, True, False) for i in range(num_shapes)]
    for pass_ in range(2, passes + 2):
        for i in range(num_shapes):
            if mode == "static":
                plan += [(pass_, i, False, False), (pass_, i, True, True)]
            else:
                plan.append((pass_, i, True, False))
    return plan
