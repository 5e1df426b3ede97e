"""The benches' shared profiler helpers: a real CPU call profiled, and the ranking on hand-made averages."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks.profiling import TOP_KERNELS, profile_call, top_kernels

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def _average(key, device_type, self_device_us=0.0, self_cpu_us=0.0, count=1):
    """The fields of one ``prof.key_averages()`` entry that :func:`top_kernels` reads, times in us."""
    return SimpleNamespace(key=key, device_type=device_type, self_device_time_total=self_device_us,
                           self_cpu_time_total=self_cpu_us, count=count)


def test_top_kernels_ranks_by_self_time_and_keeps_all_with_none():
    events = [_average("small", CUDA, 50.0, count=2), _average("big", CUDA, 150.0, count=3),
              _average("aten::mm", CPU, self_cpu_us=400.0, count=5), _average("mid", CUDA, 50.0, count=1)]
    assert top_kernels(events, "cuda", top=None) == {"total_s": 250e-6, "top": [
        {"name": "big", "self_s": 150e-6, "share": 0.6, "calls": 3},
        {"name": "small", "self_s": 50e-6, "share": 0.2, "calls": 2},  # equal times keep the profiler's order
        {"name": "mid", "self_s": 50e-6, "share": 0.2, "calls": 1}]}
    assert top_kernels(events, "cuda", top=1)["top"] == [{"name": "big", "self_s": 150e-6, "share": 0.6, "calls": 3}]
    assert top_kernels(events, "cuda", top=1)["total_s"] == 250e-6  # shares stay of the whole
    assert top_kernels([], "cuda") == {"total_s": 0.0, "top": []}


def test_top_kernels_keeps_top_kernels_by_default():
    events = [_average(f"k{i}", CUDA, float(i + 1)) for i in range(TOP_KERNELS + 8)]
    names = [k["name"] for k in top_kernels(events, "cuda")["top"]]
    assert names == [f"k{i}" for i in range(TOP_KERNELS + 7, 7, -1)]  # the slowest first, the 8 fastest left out


def test_profile_call_on_cpu_returns_the_result_and_its_operators():
    a, b = torch.randn(64, 32), torch.randn(32, 16)

    def three_products():
        return [a @ b for _ in range(3)]

    result, events, wall_s = profile_call(three_products, torch.device("cpu"))
    assert len(result) == 3 and all(torch.equal(r, a @ b) for r in result)
    assert wall_s > 0
    ranked = top_kernels(events, "cpu", top=None)
    calls = {k["name"]: k["calls"] for k in ranked["top"]}
    assert calls["aten::mm"] == 3
    assert sum(k["share"] for k in ranked["top"]) == pytest.approx(1.0)
    assert ranked["total_s"] == pytest.approx(sum(k["self_s"] for k in ranked["top"]))
    assert top_kernels(events, "cuda")["top"] == []  # no CUDA activity was recorded
