"""What a finished CUDA step's log record carries, with torch.cuda's counters faked (no GPU needed)."""

import torch

from workbench.training import recipe


class FakeEvent:
    def __init__(self, at_ms: float):
        self.at_ms = at_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other: "FakeEvent") -> float:
        return other.at_ms - self.at_ms


def test_a_cuda_step_record_carries_the_allocators_counters_and_the_pinned_ones(monkeypatch):
    stats = {"num_device_alloc": 7, "num_alloc_retries": 2, "num_ooms": 1, "reserved_bytes.all.current": 4096}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: dict(stats))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 1024)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"num_host_alloc": 5, "host_alloc_time.total": 820.0,
                                                                  "allocations.current": 5})
    step = recipe.LaunchedStep({"step": 3}, torch.tensor(2.5), [FakeEvent(10.0), FakeEvent(30.0), FakeEvent(35.0)],
                               FakeEvent(4.0))
    record = recipe.finish_step(step)
    assert record == {"step": 3, "forward_backward_s": 0.02, "optimizer_s": 0.005, "step_s": 0.025,
                      "data_s": 0.006, "peak_allocated_bytes": 1024, "num_device_alloc": 7, "num_alloc_retries": 2,
                      "num_ooms": 1, "reserved_bytes": 4096, "num_host_alloc": 5, "host_alloc_us": 820.0,
                      "loss": 2.5}
