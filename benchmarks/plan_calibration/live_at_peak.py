"""Where a traced peak and a measured one differ: the tensors live at the peak of one training step, grouped
by the line of the model that made them, on the GPU (the caching allocator's history) and in the plan's
trace (the same step on fake tensors), side by side.

    python -m benchmarks.plan_calibration.live_at_peak [--model xl-aed] [--buckets 25:80 25:221]
        [--batch-size 8] [--out DIR]

A line's bytes are those of its allocations live at the step's peak; allocations made by the backward
are grouped as "backward". Reference models only. Writes plan_live_at_peak.json.
"""

from __future__ import annotations

import traceback
from collections import defaultdict

import torch

from benchmarks.harness import bench_parser, start, write_result
from workbench.oomptimizer import plan as plan_module
from workbench.oomptimizer.plan import block_bytes

NAME = "plan_live_at_peak"
MAX_EVENTS = 2_000_000  # the allocator's history kept (a step of the reference models makes far fewer)
MODEL_FILES = ("/workbench/models/", "/workbench/adapters/", "/transformers/")


def model_line(frames) -> str:
    """The innermost frame in the model's code as file:line function (frames innermost first); "state" for the
    weights and AdamW's state counted before the step; "backward" under autograd's engine (the CPU runs it on
    the caller's thread, CUDA on its own, with no Python frames) or with no model line on the stack."""
    if any(name == "_track_state" for _, _, name in frames):
        return "state"
    for filename, _, name in frames:
        if "/torch/autograd/" in filename or name == "_engine_run_backward":
            return "backward"
        if any(part in filename for part in MODEL_FILES):
            break
    for filename, line, name in frames:
        if any(part in filename for part in MODEL_FILES) and not filename.endswith("model.py"):
            return f"{filename.split('/workbench/')[-1]}:{line} {name}"
    for filename, line, name in frames:
        if any(part in filename for part in MODEL_FILES):
            return f"{filename.split('/workbench/')[-1]}:{line} {name}"
    return "backward"


def live_at_peak(events) -> tuple[int, dict[str, int]]:
    """(peak bytes, bytes per line live at the peak) from (key, bytes, line) allocations and (key, None,
    None) frees, in order."""
    live: dict = {}
    total = peak = 0
    peak_at = -1
    for i, (key, nbytes, _line) in enumerate(events):
        if nbytes is None:
            total -= live.pop(key, 0)
        else:
            live[key] = nbytes
            total += nbytes
        if total > peak:
            peak, peak_at = total, i
    lines: dict[str, int] = defaultdict(int)
    alive: dict = {}
    for key, nbytes, line in events[:peak_at + 1]:
        if nbytes is None:
            alive.pop(key, None)
        else:
            alive[key] = (nbytes, line)
    for nbytes, line in alive.values():
        lines[line] += nbytes
    return peak, dict(lines)


def measured(model, bucket, batch_size) -> tuple[int, dict[str, int]]:
    """The step's forward and backward on the GPU, AdamW's state made first (as the probe does), recorded by the
    allocator; sizes rounded to its 512-byte blocks."""
    device = torch.device("cuda", torch.cuda.current_device())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.0)
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=MAX_EVENTS, stacks="python")
    batch = model.make_batch(batch_size, bucket[0], int(bucket[1]), device)
    model.training_step(batch, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del batch, optimizer
    model.zero_grad(set_to_none=True)
    trace = snapshot["device_traces"][device.index]
    if len(trace) >= MAX_EVENTS:
        print(f"note: the allocator's history kept its last {MAX_EVENTS} events only; the peak may be missing")
    events = []
    for e in trace:
        frames = [(f["filename"], f["line"], f["name"]) for f in e.get("frames", [])]  # innermost first
        if e["action"] == "alloc":
            events.append((e["addr"], block_bytes(int(e["size"])), model_line(frames)))
        elif e["action"] == "free_completed":
            events.append((e["addr"], None, None))
    peak, lines = live_at_peak(events)
    return peak + before, {**lines, "state": before}


class RecordingTracker(plan_module.DeviceMemoryTracker):
    """The plan's tracker, also keeping every allocation and free in order (``events``) with its model line."""

    def __init__(self):
        super().__init__()
        self.events: list = []

    def track(self, tensor):
        known = len(self._live)
        super().track(tensor)
        if len(self._live) > known:  # a storage not seen before
            key = id(tensor.untyped_storage())
            frames = [(f.filename, f.lineno, f.name) for f in reversed(traceback.extract_stack())]
            self.events.append((key, self._live[key][1], model_line(frames)))

    def _free(self, key):
        super()._free(key)
        self.events.append((key, None, None))


def traced(name, bucket, batch_size) -> tuple[int, dict[str, int]]:
    """The same step traced as the plan traces it (state counted before the step starts; the optimizer step,
    which the plan adds from one trace, is not in the events)."""
    fake_mode = plan_module.new_fake_mode()
    model = plan_module.build_fake_reference_model(name, fake_mode)
    tracker = RecordingTracker()
    memory = plan_module.StepTracer(model, fake_mode).trace(bucket, batch_size, tracker=tracker)
    _, lines = live_at_peak(tracker.events)
    return memory.peak_allocated_bytes, lines


def main(argv=None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--model", default="xl-aed")
    parser.add_argument("--buckets", nargs="+", default=["25:80", "25:221"], help="DURATION:TOKENS")
    parser.add_argument("--batch-size", type=int, default=8)
    run = start(parser, argv, name=NAME, what="tensors live at a step's peak per model line, GPU against trace",
                needs_cuda=False)
    args = run.args
    from workbench.models import build_model

    model = build_model(args.model).cuda() if torch.cuda.is_available() else None
    rows = []
    for text in args.buckets:
        duration, tokens = (float(v) for v in text.split(":"))
        bucket = (duration, tokens)
        gpu_peak, gpu_lines = measured(model, bucket, args.batch_size) if model is not None else (0, {})
        trace_peak, trace_lines = traced(args.model, bucket, args.batch_size)
        lines = sorted(set(gpu_lines) | set(trace_lines),
                       key=lambda k: -abs(trace_lines.get(k, 0) - gpu_lines.get(k, 0)))
        table = [{"line": k, "gpu_bytes": gpu_lines.get(k, 0), "trace_bytes": trace_lines.get(k, 0)} for k in lines]
        rows.append({"bucket": [duration, tokens], "batch_size": args.batch_size, "gpu_peak_bytes": gpu_peak,
                     "trace_peak_bytes": trace_peak, "lines": table})
        print(f"{args.model} {duration:g} s / {tokens:g} tokens x {args.batch_size}: GPU peak "
              f"{gpu_peak / 2**30:.3f} GiB, trace {trace_peak / 2**30:.3f} GiB; live at the peak by line (MiB):")
        for row in table[:25]:
            print(f"  {row['gpu_bytes'] / 2**20:10.1f} {row['trace_bytes'] / 2**20:10.1f}  {row['line']}")
    write_result(NAME, what=run.what, figures={"rows": rows}, params=vars(args), out_dir=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
