"""Memory helpers' CUDA-only paths: release_memory, the recorder's default torch.cuda callables, the real
allocator runtime (newest and older torch APIs) on CPU with torch.cuda faked; the live demo on a GPU."""

import pytest
import torch

from workbench.memory import allocator
from workbench.memory.oom import release_memory
from workbench.memory.telemetry import MemoryRecorder


def _record_calls(monkeypatch, calls, available=True, initialized=True, workspaces=True):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    if workspaces:
        monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("cublas"), raising=False)
    else:
        monkeypatch.delattr(torch._C, "_cuda_clearCublasWorkspaces", raising=False)


def test_release_memory_waits_then_hands_back_cublas_workspaces_and_the_cache(monkeypatch):
    calls = []
    _record_calls(monkeypatch, calls)
    release_memory()
    assert calls == ["synchronize", "cublas", "empty_cache"]  # the workspace first: it lives in the cache


def test_release_memory_without_cublas_workspaces_still_empties_the_cache(monkeypatch):
    calls = []
    _record_calls(monkeypatch, calls, workspaces=False)
    release_memory()
    assert calls == ["synchronize", "empty_cache"]


@pytest.mark.parametrize("available, initialized", [(False, False), (True, False)])
def test_release_memory_leaves_cuda_alone_until_it_is_initialized(monkeypatch, available, initialized):
    calls = []
    _record_calls(monkeypatch, calls, available=available, initialized=initialized)
    release_memory()  # must not initialize CUDA (that would fix the allocator settings too early)
    assert calls == []


def test_recorder_defaults_read_torch_cuda_for_its_device(monkeypatch):
    seen = []
    stats = {"num_device_alloc": 0, "allocated_bytes.all.current": 0}

    def memory_stats(device=None):
        seen.append(("stats", device))
        stats["num_device_alloc"] += 1  # one device allocation between the two reads of a step
        return dict(stats)

    monkeypatch.setattr(torch.cuda, "memory_stats", memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: seen.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(("sync", device)))
    rec = MemoryRecorder(device=1)
    with rec.step(tag="a"):
        pass
    assert seen == [("sync", 1), ("reset", 1), ("stats", 1), ("sync", 1), ("stats", 1)]
    assert rec.rows[0]["device_allocs"] == 1 and rec.rows[0]["tag"] == "a"
    no_reset = MemoryRecorder(device=0, reset_peaks=False)
    seen.clear()
    with no_reset.step():
        pass
    assert ("reset", 0) not in seen


def test_torch_runtime_uses_the_newest_setter_and_getter(monkeypatch):
    got = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", lambda s: got.append(s), raising=False)
    monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: "expandable_segments:True",
                        raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    rt = allocator.torch_runtime()
    assert rt.setter_name == "torch._C._accelerator_setAllocatorSettings" and rt.platform.startswith("linux")
    rt.set_settings("max_split_size_mb:64")
    assert got == ["max_split_size_mb:64"] and rt.get_settings() == "expandable_segments:True"
    assert rt.cuda_available() and rt.cuda_initialized()
    assert allocator.current_allocator_settings() == "expandable_segments:True"  # after init: torch's own


def test_torch_runtime_on_an_older_torch_reads_the_snapshot(monkeypatch):
    got = []
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    monkeypatch.setattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings", lambda s: got.append(s),
                        raising=False)
    snapshot = {"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"}}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snapshot)
    rt = allocator.torch_runtime()
    assert rt.setter_name == "torch.cuda.memory._set_allocator_settings"
    rt.set_settings("expandable_segments:True")
    assert got == ["expandable_segments:True"]
    assert rt.get_settings() == "garbage_collection_threshold:0.6"
    snapshot["allocator_settings"] = {"PYTORCH_ALLOC_CONF": "a:1", "PYTORCH_CUDA_ALLOC_CONF": "b:2"}
    assert rt.get_settings() == "a:1"  # the newer variable's string wins, as in torch
    snapshot["allocator_settings"] = {}
    assert rt.get_settings() is None


def test_torch_runtime_without_any_setter_says_so_when_used(monkeypatch):
    for name in ("_accelerator_setAllocatorSettings", "_cuda_cudaCachingAllocator_set_allocator_settings"):
        monkeypatch.delattr(torch._C, name, raising=False)
    rt = allocator.torch_runtime()
    assert rt.setter_name == "none"
    with pytest.raises(RuntimeError, match="no runtime allocator settings setter"):
        rt.set_settings("expandable_segments:True")


@pytest.mark.parametrize("answer, expected", [("cudaMallocAsync", "cudaMallocAsync"), (AttributeError, "native"),
                                              (RuntimeError, "native")])
def test_torch_runtime_backend(monkeypatch, answer, expected):
    def backend():
        if isinstance(answer, type):
            raise answer("no backend query here")
        return answer

    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", backend)
    assert allocator.torch_runtime().backend() == expected


@pytest.mark.gpu
def test_gpu_release_memory_hands_cached_blocks_back():
    release_memory()
    before = torch.cuda.memory_reserved()
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del x
    assert torch.cuda.memory_reserved() >= before + (64 << 20)  # freed, but cached by the allocator
    release_memory()
    assert torch.cuda.memory_reserved() <= before


@pytest.mark.gpu
def test_gpu_dynamic_shape_demo_records_one_row_per_step():
    from workbench.memory.demo import dynamic_shape_steps

    frame = dynamic_shape_steps(4, width=256, max_rows=2048)
    assert list(frame["step"]) == [0, 1, 2, 3]
    assert frame["rows"].between(256, 2048).all()
    assert (frame["peak_allocated_bytes"] >= frame["rows"] * 256 * 4).all()  # at least each step's input
    assert (frame["time_s"] > 0).all()
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        dynamic_shape_steps(0)
