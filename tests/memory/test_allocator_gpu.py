"""On a real GPU: expandable segments are active after configure_allocator, and the user's options
(max_split_size_mb) are intact; switch_expandable_segments makes new blocks of the chosen kind either way; the
recorder counts device allocations. Each allocator case runs in a fresh interpreter, since the environment
is only read when CUDA initializes."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

PROBE = r"""
import json, torch
from workbench.memory import configure_allocator, current_allocator_settings
if {init_first}:
    keep = torch.ones(1 << 20, device="cuda")  # CUDA and its allocator are initialized before the call
status = configure_allocator()
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # a new 256 MiB block after the call
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
settings = snap.get("allocator_settings", {{}})
segments = snap["segments"]
print(json.dumps(dict(action=status.action, skip=status.skip_reason, current=current_allocator_settings(),
                      expandable=settings.get("expandable_segments"), max_split=settings.get("max_split_size"),
                      seg_expandable=[s.get("is_expandable") for s in segments])))
"""


def run_probe(user_settings: str, *, init_first: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTORCH_ALLOC_CONF"] = user_settings
    out = subprocess.run([sys.executable, "-c", PROBE.format(init_first=init_first)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("init_first, action", [(False, "set_env"), (True, "set_runtime")])
def test_expandable_active_and_user_max_split_intact(init_first, action):
    got = run_probe("max_split_size_mb:256,garbage_collection_threshold:0.6", init_first=init_first)
    assert got["action"] == action, got
    assert "expandable_segments:True" in got["current"] and "max_split_size_mb:256" in got["current"], got
    assert got["expandable"] is True, got
    assert got["max_split"] == 256 * 1024 * 1024, got
    if any(e is not None for e in got["seg_expandable"]):  # torch reports it per segment
        assert any(got["seg_expandable"]), got


def test_user_false_is_kept_on_gpu():
    got = run_probe("expandable_segments:False,max_split_size_mb:128", init_first=False)
    assert got["skip"] == "user_disabled" and got["expandable"] is False, got
    assert got["max_split"] == 128 * 1024 * 1024, got


def test_recorder_counts_device_allocations_on_gpu():
    import torch

    from workbench.memory import MemoryRecorder

    torch.cuda.empty_cache()  # blocks cached by earlier tests would serve the first step without the device
    rec = MemoryRecorder()
    with rec.step(kind="grow"):
        big = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    with rec.step(kind="reuse"):
        del big
        again = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    frame = rec.to_frame()
    assert frame["device_allocs"][0] >= 1 and frame["device_alloc_bytes"][0] >= 512 << 20
    assert frame["device_allocs"][1] == 0  # the cached block is reused
    assert frame["allocated_bytes"][1] >= 512 << 20
    del again


SWITCH_PROBE = r"""
import json, torch
from workbench.memory import current_allocator_settings, switch_expandable_segments
keep = torch.ones(1 << 20, device="cuda")
kinds = {}
for enabled in (True, False, True):
    switch_expandable_segments(enabled)
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # a new block after the switch
    seg = [s for s in torch.cuda.memory._snapshot()["segments"]
           if s["address"] <= x.data_ptr() < s["address"] + s["total_size"]]
    kinds.setdefault(str(enabled), []).append(seg[0].get("is_expandable"))
    del x
print(json.dumps(dict(kinds=kinds, current=current_allocator_settings())))
"""


def test_switch_makes_new_blocks_of_the_chosen_kind_and_keeps_user_options():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:256"
    out = subprocess.run([sys.executable, "-c", SWITCH_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["kinds"] == {"True": [True, True], "False": [False]}, got
    assert "max_split_size_mb:256" in got["current"] and "expandable_segments:True" in got["current"], got
