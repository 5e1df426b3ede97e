"""The training recipe's CUDA-only branches: device choice, allocator set-up, the profile's GPU check, pinned
batches, event timing and NCCL set-up on CPU with the device facts faked; the recipe itself on a GPU."""

import json
import math

import pytest
import torch

from workbench.bucketing import BucketProfile, save_profile
from workbench.training import distributed
from workbench.training import recipe
from workbench.training.distributed import Ranks
from workbench.training.recipe import TrainConfig, check_profile_for_run, finish_step, resolve_device


def _gpus(monkeypatch, count):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_resolve_device_defaults_to_cuda_only_where_there_is_one(monkeypatch):
    _gpus(monkeypatch, 0)
    assert resolve_device(None, Ranks()) == torch.device("cpu")
    with pytest.raises(ValueError, match="^--device cuda: this machine has no CUDA GPU that torch can use; "
                                         "train with --device cpu$"):
        resolve_device("cuda", Ranks())
    with pytest.raises(ValueError, match="--device: expected cuda or cpu, got 'mps'"):
        resolve_device("mps", Ranks())
    _gpus(monkeypatch, 2)
    assert resolve_device(None, Ranks()) == torch.device("cuda")
    assert resolve_device("cuda:1", Ranks()) == torch.device("cuda", 1)  # one process: as the user said
    assert resolve_device("cpu", Ranks(1, 2, 1)) == torch.device("cpu")  # gloo ranks on a GPU machine


def test_resolve_device_under_torchrun_takes_the_local_rank_gpu(monkeypatch):
    _gpus(monkeypatch, 2)
    assert resolve_device(None, Ranks(3, 4, 1)) == torch.device("cuda", 1)
    assert resolve_device("cuda", Ranks(0, 4, 0)) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"torchrun started 3\+ processes on a machine with 2 GPU\(s\): use "
                                         "--nproc-per-node 2 or fewer"):
        resolve_device("cuda", Ranks(2, 4, 2))


@pytest.mark.parametrize("device, configures", [("cuda", True), ("cpu", False)])
def test_train_configures_the_allocator_before_cuda_work_only_on_cuda(monkeypatch, tmp_path, device, configures):
    calls = []
    monkeypatch.setattr(recipe, "resolve_device", lambda name, ranks: torch.device(device))
    monkeypatch.setattr(recipe, "configure_allocator", lambda: calls.append("configure_allocator"))
    monkeypatch.setattr(recipe, "init_process_group", lambda ranks, dev: calls.append(("init", dev.type)))
    monkeypatch.setattr(recipe, "_train", lambda config, ranks, dev: calls.append("train") or {"ok": 1})
    monkeypatch.setattr(recipe, "destroy_process_group", lambda: calls.append("destroy"))
    cuts = tmp_path / "cuts.jsonl"
    cuts.write_text("")
    assert recipe.train(TrainConfig(cuts=str(cuts), tokenizer="t.model", out_dir=str(tmp_path))) == {"ok": 1}
    assert calls == ["configure_allocator"] * configures + [("init", device), "train", "destroy"]


def test_profile_for_another_gpu_warns_naming_the_field(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: asked.append(device) or "NVIDIA H200")
    config = TrainConfig(cuts="c.jsonl", tokenizer="t.model", out_dir="out", model="large-rnnt", dtype="bf16")
    gpu = torch.device("cuda", 0)
    other = BucketProfile([2.0, 4.0], [8, 4], metadata={"model": "large-rnnt", "dtype": "bfloat16",
                                                        "gpu": "NVIDIA A100-SXM4-80GB"})
    assert check_profile_for_run(other, "p.yaml", config, Ranks(), gpu) == [
        "--profile p.yaml: metadata.gpu is 'NVIDIA A100-SXM4-80GB' but this run has 'NVIDIA H200'; its batch sizes "
        "may not fit"]
    assert asked == [gpu]
    same = BucketProfile([2.0, 4.0], [8, 4], metadata={"model": "large-rnnt", "gpu": "NVIDIA H200"})
    assert check_profile_for_run(same, "p.yaml", config, Ranks(), gpu) == []
    assert check_profile_for_run(other, "p.yaml", config, Ranks(), torch.device("cpu")) == []  # no GPU to compare
    assert len(asked) == 2


def test_profile_searched_under_other_allocator_settings_warns_naming_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(recipe, "allocator_settings_in_effect", lambda: "expandable_segments:True")
    config = TrainConfig(cuts="c.jsonl", tokenizer="t.model", out_dir="out")
    gpu = torch.device("cuda", 0)
    searched = BucketProfile([2.0, 4.0], [8, 4], allocator_settings="")
    assert check_profile_for_run(searched, "p.yaml", config, Ranks(), gpu) == [
        "--profile p.yaml: searched under CUDA allocator settings '' but this process has 'expandable_segments:True' "
        "(expandable_segments: False -> True); its batch sizes may not fit"]
    same = BucketProfile([2.0, 4.0], [8, 4], allocator_settings="expandable_segments:True")
    assert check_profile_for_run(same, "p.yaml", config, Ranks(), gpu) == []
    assert check_profile_for_run(searched, "p.yaml", config, Ranks(), torch.device("cpu")) == []


@pytest.mark.parametrize("device, pinned", [("cuda", True), ("cpu", False)])
def test_loader_pins_host_batches_only_for_cuda(device, pinned):
    config = TrainConfig(cuts="c.jsonl", tokenizer="t.model", out_dir="out", num_workers=2, prefetch_factor=3)
    loader = recipe.make_loader([["cut"]], config, torch.device(device))
    assert loader.pin_memory is pinned
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, True)


class FakeEvent:
    """A torch.cuda.Event at a known device time (milliseconds)."""

    def __init__(self, ms):
        self.ms, self.waited = ms, False

    def elapsed_time(self, later):
        return later.ms - self.ms

    def synchronize(self):
        self.waited = True


def test_finish_step_reads_device_times_from_the_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123456)
    start, backward_done, end = FakeEvent(1000.0), FakeEvent(1250.0), FakeEvent(1400.0)
    previous_end = FakeEvent(990.0)
    record = {"step": 3, "data_s": 0.5, "host_data_s": 0.5, "step_s": 0.001, "host_s": 0.001}
    done = finish_step(recipe.LaunchedStep(dict(record), torch.tensor(2.5), [start, backward_done, end],
                                           previous_end))
    assert end.waited
    assert done["forward_backward_s"] == pytest.approx(0.25) and done["optimizer_s"] == pytest.approx(0.15)
    assert done["step_s"] == pytest.approx(0.4)
    assert done["data_s"] == pytest.approx(0.01)  # the GPU's idle gap, not the host's 0.5 s wait
    assert done["host_data_s"] == 0.5 and done["loss"] == 2.5 and done["peak_allocated_bytes"] == 123456
    assert done["host_s"] == 0.001  # the host's time to queue the step stays beside the device's
    first = finish_step(recipe.LaunchedStep(dict(record), torch.tensor(1.0), [start, backward_done, end], None))
    assert first["data_s"] == 0.5  # the first step has no step before it on the device: the host's wait
    cpu = finish_step(recipe.LaunchedStep(dict(record), torch.tensor(1.0), [], None))
    assert cpu == {**record, "loss": 1.0}  # on the CPU the host times stand


def test_cuda_ranks_join_nccl_on_their_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda backend, device_id=None: calls.append((backend, device_id)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    gpu = torch.device("cuda", 1)
    distributed.init_process_group(Ranks(1, 2, 1), gpu)
    assert calls == [("set_device", gpu), ("nccl", gpu)]
    calls.clear()
    distributed.init_process_group(Ranks(1, 2, 1), torch.device("cpu"))
    assert calls == [("gloo", None)]
    calls.clear()
    distributed.init_process_group(Ranks(), gpu)  # one process: no group
    assert calls == []


def _train_on_gpu(corpus, out, *extra):
    from workbench.cli import main

    cuts, tokenizer = corpus
    return main(["train", "--cuts", str(cuts), "--tokenizer", str(tokenizer), "--out", str(out), "--model", "tiny-ctc",
                 "--device", "cuda", "--dtype", "bf16", "--warmup-steps", "1", "--num-workers", "0",
                 "--log-every", "1", *extra])


@pytest.mark.gpu
def test_gpu_train_times_steps_with_events_saves_cuda_rng_and_resumes(corpus, tmp_path):
    args = ("--max-duration", "3", "--num-buckets", "2", "--save-every", "2")
    assert _train_on_gpu(corpus, tmp_path, "--steps", "4", *args) == 0
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2, 3]
    for r in log:  # device times from the events: the step is its two parts
        assert r["forward_backward_s"] > 0 and r["optimizer_s"] > 0 and r["peak_allocated_bytes"] > 0
        assert r["step_s"] == pytest.approx(r["forward_backward_s"] + r["optimizer_s"], rel=1e-3, abs=1e-5)
        assert r["data_s"] >= 0 and math.isfinite(r["loss"])  # read back from pinned memory
    summary = json.loads((tmp_path / "train_summary.json").read_text())
    assert summary["peak_allocated_bytes"] > 0 and 0 <= summary["data_wait_share"] < 1
    state = torch.load(tmp_path / "train_state.pt", weights_only=True)
    saved_rng = state["ranks"][0]["cuda_rng"]
    assert len(saved_rng) == torch.cuda.device_count() and saved_rng[0].numel() > 0
    assert _train_on_gpu(corpus, tmp_path, "--steps", "6", "--resume", *args) == 0
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(6))


@pytest.mark.gpu
def test_gpu_train_warns_about_a_profile_from_another_gpu(corpus, tmp_path):
    profile = save_profile(tmp_path / "p.yaml", BucketProfile([1.5, 10.0], [3, 2], metadata={"gpu": "Some Other GPU"}))
    assert _train_on_gpu(corpus, tmp_path / "run", "--steps", "2", "--profile", str(profile)) == 0
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    name = torch.cuda.get_device_name()
    assert f"metadata.gpu is 'Some Other GPU' but this run has {name!r}" in " ".join(summary["warnings"])
