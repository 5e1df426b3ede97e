import pytest

from workbench.memory.telemetry import COLUMNS, MemoryRecorder, step_record, summarize_steps


class FakeCuda:
    """Memory stats that a test moves by hand, like the allocator would during a step."""

    def __init__(self):
        self.stats = {"allocated_bytes.all.current": 0, "reserved_bytes.all.current": 0,
                      "allocated_bytes.all.peak": 0, "reserved_bytes.all.peak": 0, "num_device_alloc": 0,
                      "num_device_free": 0, "reserved_bytes.all.allocated": 0, "reserved_bytes.all.freed": 0,
                      "num_alloc_retries": 0, "num_ooms": 0}
        self.syncs = self.resets = 0
        self.now = 0.0

    def recorder(self):
        return MemoryRecorder(stats_fn=lambda: dict(self.stats), reset_peaks_fn=self.reset,
                              synchronize_fn=self.sync, clock=lambda: self.now)

    def reset(self):
        self.resets += 1
        self.stats["allocated_bytes.all.peak"] = self.stats["allocated_bytes.all.current"]
        self.stats["reserved_bytes.all.peak"] = self.stats["reserved_bytes.all.current"]

    def sync(self):
        self.syncs += 1

    def run_step(self, *, alloc, peak, new_segments=0, segment_bytes=0, freed_segments=0, retries=0, secs=0.1):
        s = self.stats
        s["num_device_alloc"] += new_segments
        s["num_device_free"] += freed_segments
        s["reserved_bytes.all.allocated"] += new_segments * segment_bytes
        s["reserved_bytes.all.freed"] += freed_segments * segment_bytes
        s["reserved_bytes.all.current"] += (new_segments - freed_segments) * segment_bytes
        s["allocated_bytes.all.peak"] = max(s["allocated_bytes.all.peak"], peak)
        s["reserved_bytes.all.peak"] = max(s["reserved_bytes.all.peak"], s["reserved_bytes.all.current"])
        s["allocated_bytes.all.current"] = alloc
        s["num_alloc_retries"] += retries
        self.now += secs


def test_step_record_levels_and_deltas():
    before = {"num_device_alloc": 5, "num_device_free": 2, "allocated_bytes.all.current": 10}
    after = {"num_device_alloc": 8, "num_device_free": 2, "allocated_bytes.all.current": 30,
             "reserved_bytes.all.current": 64, "num_ooms": 1}
    row = step_record(before, after)
    assert row["device_allocs"] == 3 and row["device_frees"] == 0 and row["ooms"] == 1
    assert row["allocated_bytes"] == 30 and row["reserved_bytes"] == 64 and row["alloc_retries"] == 0


def test_recorder_rows_per_step_with_tags():
    cuda = FakeCuda()
    rec = cuda.recorder()
    with rec.step(batch_size=8):
        cuda.run_step(alloc=100, peak=900, new_segments=2, segment_bytes=512, secs=0.25)
    with rec.step(batch_size=4):
        cuda.run_step(alloc=100, peak=300, secs=0.125)
    rec.record(lambda: cuda.run_step(alloc=50, peak=700, new_segments=1, freed_segments=1,
                                     segment_bytes=512, retries=1), batch_size=6)
    frame = rec.to_frame()
    assert list(frame["step"]) == [0, 1, 2] and list(frame["batch_size"]) == [8, 4, 6]
    assert list(frame["device_allocs"]) == [2, 0, 1] and list(frame["device_frees"]) == [0, 0, 1]
    assert list(frame["device_alloc_bytes"]) == [1024, 0, 512]
    assert list(frame["peak_allocated_bytes"]) == [900, 300, 700]  # peaks reset at each step start
    assert list(frame["reserved_bytes"]) == [1024, 1024, 1024]
    assert list(frame["alloc_retries"]) == [0, 0, 1]
    assert list(frame["time_s"]) == pytest.approx([0.25, 0.125, 0.1])
    assert cuda.resets == 3 and cuda.syncs == 6  # synchronized before and after every step
    assert set(COLUMNS) <= set(frame.columns)


def test_step_that_raises_is_recorded_and_reraised():
    cuda = FakeCuda()
    rec = cuda.recorder()

    class OutOfMemoryError(RuntimeError):
        pass

    def failing():
        cuda.stats["num_ooms"] += 1
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    with pytest.raises(OutOfMemoryError):
        rec.record(failing, batch_size=64)
    frame = rec.to_frame()
    assert len(frame) == 1 and frame["ooms"][0] == 1 and bool(frame["oom_raised"][0])


def test_empty_recorder_frame_has_columns():
    frame = FakeCuda().recorder().to_frame()
    assert frame.empty and list(frame.columns) == COLUMNS


def test_summarize_steps_after_warmup():
    cuda = FakeCuda()
    rec = cuda.recorder()
    for i in range(6):
        with rec.step():
            cuda.run_step(alloc=10, peak=20, new_segments=3 if i < 2 else (1 if i == 4 else 0),
                          segment_bytes=100, secs=0.1 * (i + 1))
    summary = summarize_steps(rec.to_frame(), warmup=2)
    assert summary["steps"] == 4 and summary["steps_with_device_alloc"] == 1
    assert summary["device_allocs_per_step"] == pytest.approx(0.25)
    assert summary["median_step_s"] == pytest.approx(0.45)
    assert summary["peak_reserved_bytes"] == 700
    with pytest.raises(ValueError, match="warmup=6"):
        summarize_steps(rec.to_frame(), warmup=6)


def test_device_alloc_events_say_which_step_allocated_after_what_and_why():
    from workbench.memory.telemetry import device_alloc_events

    cuda, gib = FakeCuda(), 2**30
    rec = cuda.recorder()
    shapes = [(2, 20.0, 90), (8, 4.0, 20), (4, 8.0, 40), (8, 4.0, 20), (2, 20.0, 90), (4, 8.0, 40), (8, 4.0, 20)]
    plan = [  # warm-up: two steps; then quiet, cache miss, retry, peak above warm-up, frees without retry
        dict(alloc=gib, peak=10 * gib, new_segments=3, segment_bytes=4 * gib),
        dict(alloc=gib, peak=6 * gib),
        dict(alloc=gib, peak=7 * gib),
        dict(alloc=gib, peak=6 * gib, new_segments=1, segment_bytes=gib // 2),
        dict(alloc=gib, peak=10 * gib, new_segments=2, segment_bytes=gib, freed_segments=2, retries=1),
        dict(alloc=gib, peak=11 * gib, new_segments=1, segment_bytes=gib),
        dict(alloc=gib, peak=5 * gib, new_segments=1, segment_bytes=gib, freed_segments=1),
    ]
    for i, (shape, step) in enumerate(zip(shapes, plan)):
        with rec.step(index=i, pass_=1 if i < 2 else 2, timed=True, batch_size=shape[0], duration_s=shape[1],
                      num_tokens=shape[2]):
            cuda.run_step(**step)
    frame = rec.to_frame()
    shape = ("batch_size", "duration_s", "num_tokens")
    events = device_alloc_events(frame, start=2, shape_columns=shape)
    assert [e["row"] for e in events] == [3, 4, 5, 6]  # row 2 touched nothing; warm-up rows are not listed
    miss, retry, above, frees = events
    assert miss["reason"].startswith("cache miss") and "512 MiB" in miss["reason"]
    assert miss["shape"] == [8, 4.0, 20] and miss["previous_shape"] == [4, 8.0, 40]
    assert miss["reserved_before_bytes"] == 12 * gib and miss["reserved_after_bytes"] == 12 * gib + gib // 2
    assert retry["reason"].startswith("OOM-retry") and "2 device frees" in retry["reason"]
    assert retry["alloc_retries"] == 1 and retry["previous_shape"] == [8, 4.0, 20]
    assert above["reason"].startswith("peak above warm-up") and "11.00 GiB" in above["reason"]
    assert frees["reason"].startswith("re-allocated after frees")
    assert {k: miss[k] for k in ("index", "pass_", "timed")} == {"index": 3, "pass_": 2, "timed": True}  # its tags
    assert "batch_size" not in miss and "time_s" not in miss  # shape tags go to shape, measurements stay out
    assert device_alloc_events(frame, start=2, limit=2, shape_columns=shape) == events[:2]
    assert device_alloc_events(frame, start=len(frame), shape_columns=shape) == []


def test_device_alloc_events_report_an_oom():
    from workbench.memory.telemetry import device_alloc_events

    class OutOfMemoryError(RuntimeError):
        pass

    cuda = FakeCuda()
    rec = cuda.recorder()
    with rec.step(batch_size=1):
        cuda.run_step(alloc=0, peak=1)
    with pytest.raises(OutOfMemoryError):
        with rec.step(batch_size=9):
            raise OutOfMemoryError("CUDA out of memory")
    (event,) = device_alloc_events(rec.to_frame(), start=1, shape_columns=("batch_size",))
    assert event["oom"] and event["reason"].startswith("OOM:") and event["previous_shape"] == [1]


def test_step_marks_ooms_in_disguise_and_only_those():
    import pytest

    from workbench.memory import MemoryRecorder

    rec = MemoryRecorder(stats_fn=dict, reset_peaks_fn=lambda: None, synchronize_fn=lambda: None)
    for error in (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), RuntimeError("shape mismatch"),
                  ValueError("out of memory")):
        with pytest.raises(type(error)):
            with rec.step():
                raise error
    assert [row["oom_raised"] for row in rec.rows] == [True, False, False]
