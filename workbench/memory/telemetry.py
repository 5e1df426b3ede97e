"""Per-step memory telemetry from ``torch.cuda.memory_stats()``, into a pandas frame.

    recorder = MemoryRecorder()
    for batch in loader:
        with recorder.step(batch_size=len(batch)):
            model.training_step(batch)
    frame = recorder.to_frame()

Each row is one step: wall time (seconds, between synchronizes), allocated and reserved bytes at the
end of the step, peak allocated and reserved bytes within the step, and the counts the step added:
device allocations and frees (cudaMalloc/cudaFree of segments), bytes of device memory reserved and
released (this also counts expandable segments mapping and unmapping pages), allocation retries (the
allocator freed its cache and tried again) and out-of-memory errors. Extra keyword tags (batch size,
duration, ...) become columns. A step that raises (an OOM) is still recorded.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from workbench.memory.oom import is_oom_error
from workbench.units import GiB, MiB

# column -> memory_stats() key; "current"/"peak" columns are levels, the others are counters (deltas).
LEVELS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
}
COUNTERS = {
    "device_allocs": "num_device_alloc",
    "device_frees": "num_device_free",
    "device_alloc_bytes": "reserved_bytes.all.allocated",
    "device_free_bytes": "reserved_bytes.all.freed",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}
COLUMNS = ["step", "time_s", *LEVELS, *COUNTERS, "oom_raised"]
_MEASURED = set(COLUMNS)


def step_record(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """One step's row from the stats before and after it: levels from ``after``, counters as deltas.

    A key missing from the stats (an older torch) counts as 0.
    """
    row = {col: int(after.get(key, 0)) for col, key in LEVELS.items()}
    row.update({col: int(after.get(key, 0)) - int(before.get(key, 0)) for col, key in COUNTERS.items()})
    return row


@dataclass
class MemoryRecorder:
    """Records one row per step; see the module docstring. The callables default to torch.cuda's."""

    device: Any = None  # torch device or index; None: the current device
    reset_peaks: bool = True  # reset peak stats at each step start, so peaks are per step
    stats_fn: Callable[[], Mapping[str, Any]] | None = None  # () -> memory_stats dict
    reset_peaks_fn: Callable[[], None] | None = None
    synchronize_fn: Callable[[], None] | None = None
    clock: Callable[[], float] = time.perf_counter
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.stats_fn is None or self.reset_peaks_fn is None or self.synchronize_fn is None:
            import torch

            dev = self.device
            self.stats_fn = self.stats_fn or (lambda: torch.cuda.memory_stats(dev))
            self.reset_peaks_fn = self.reset_peaks_fn or (lambda: torch.cuda.reset_peak_memory_stats(dev))
            self.synchronize_fn = self.synchronize_fn or (lambda: torch.cuda.synchronize(dev))

    @contextmanager
    def step(self, **tags: Any) -> Iterator[None]:
        """Measure the enclosed step; ``tags`` become columns of its row."""
        self.synchronize_fn()
        if self.reset_peaks:
            self.reset_peaks_fn()
        before = dict(self.stats_fn())
        t0 = self.clock()
        oom = False
        try:
            yield
        except Exception as exc:
            oom = is_oom_error(exc)
            raise
        finally:
            self.synchronize_fn()
            elapsed = self.clock() - t0
            row = {"step": len(self.rows), "time_s": elapsed, **step_record(before, self.stats_fn()),
                   "oom_raised": oom, **tags}
            self.rows.append(row)

    def record(self, fn: Callable[[], Any], **tags: Any) -> Any:
        """Run ``fn()`` as one recorded step (a per-step callback form of :meth:`step`); returns its result."""
        with self.step(**tags):
            return fn()

    def to_frame(self):
        """The rows as a pandas DataFrame (columns: :data:`COLUMNS` then the tags)."""
        import pandas as pd

        frame = pd.DataFrame(self.rows)
        if frame.empty:
            return pd.DataFrame(columns=COLUMNS)
        return frame


def summarize_steps(frame, warmup: int = 0) -> dict[str, float]:
    """Figures over the steps after ``warmup``: median step time, device allocs and frees per step,
    retries, OOMs, peak reserved bytes (over all steps, warm-up included)."""
    after = frame.iloc[warmup:]
    if after.empty:
        raise ValueError(f"summarize_steps needs more than warmup={warmup} steps, got {len(frame)}")
    return {
        "steps": int(len(after)),
        "median_step_s": float(after["time_s"].median()),
        "device_allocs_per_step": float(after["device_allocs"].mean()),
        "device_frees_per_step": float(after["device_frees"].mean()),
        "device_alloc_bytes_per_step": float(after["device_alloc_bytes"].mean()),
        "steps_with_device_alloc": int((after["device_allocs"] > 0).sum()),
        "alloc_retries": int(after["alloc_retries"].sum()),
        "ooms": int(after["ooms"].sum()),
        "peak_reserved_bytes": int(frame["peak_reserved_bytes"].max()),
    }


def device_alloc_events(frame, *, shape_columns: tuple[str, ...], start: int = 0,
                        limit: int | None = None) -> list[dict]:
    """Why the steps from row ``start`` on (row order = run order, warm-up rows before ``start``) touched
    device memory: one dict per step with device allocations, allocation retries or OOMs, carrying its
    tags (every column that is not one of :data:`COLUMNS`), its ``shape`` and the shape of the step before
    it (the values of the tag columns ``shape_columns``), reserved bytes before and after, and a one-line
    ``reason``:

    - "OOM": the step failed even after the allocator freed its cache;
    - "OOM-retry": the allocator hit the limit, released cached segments and allocated again;
    - "peak above warm-up": the step needed more than any step before ``start`` (e.g. optimizer state
      created after the warm-up's largest step);
    - "re-allocated after frees": segments were released and mapped again without a retry;
    - "cache miss": no cached block fit after the previous shape, the cache grew.

    At most ``limit`` events (None: all); ``frame`` as from MemoryRecorder.to_frame().
    """
    events = []
    rows = frame.to_dict(orient="records")
    warmup_peak = max((int(r.get("peak_allocated_bytes", 0)) for r in rows[:start]), default=0)
    for i in range(start, len(rows)):
        row = rows[i]
        allocs, retries = int(row.get("device_allocs", 0)), int(row.get("alloc_retries", 0))
        oom = bool(row.get("oom_raised", False)) or int(row.get("ooms", 0)) > 0
        if not (allocs or retries or oom):
            continue
        prev = rows[i - 1] if i > 0 else {}
        frees, peak = int(row.get("device_frees", 0)), int(row.get("peak_allocated_bytes", 0))
        if oom:
            reason = "OOM: the step failed even after the allocator freed its cache"
        elif retries:
            reason = (f"OOM-retry: the allocator hit the limit, released cached memory ({frees} device frees) "
                      f"and allocated again")
        elif warmup_peak and peak > warmup_peak:
            reason = (f"peak above warm-up: needed {peak / GiB:.2f} GiB, more than any warm-up step "
                      f"({warmup_peak / GiB:.2f} GiB)")
        elif frees:
            reason = f"re-allocated after frees: {frees} segment(s) released and {allocs} allocated"
        else:
            reason = (f"cache miss: no cached block fit after the previous shape; reserved grew by "
                      f"{int(row.get('device_alloc_bytes', 0)) / MiB:.0f} MiB")
        events.append({
            "row": i, **{k: v for k, v in row.items() if k not in _MEASURED and k not in shape_columns},
            "shape": [row[c] for c in shape_columns if c in row],
            "previous_shape": [prev[c] for c in shape_columns if c in prev] if prev else None,
            "device_allocs": allocs, "device_frees": frees, "device_alloc_bytes": int(row.get("device_alloc_bytes", 0)),
            "alloc_retries": retries, "oom": oom, "peak_allocated_bytes": peak,
            "reserved_before_bytes": int(prev.get("reserved_bytes", 0)) if prev else 0,
            "reserved_after_bytes": int(row.get("reserved_bytes", 0)), "reason": reason,
        })
        if limit is not None and len(events) >= limit:
            break
    return events
