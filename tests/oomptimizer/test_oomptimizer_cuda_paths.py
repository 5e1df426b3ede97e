"""The OOMptimizer's CUDA-only paths: the probe, the search driver and the CLI's GPU branches on CPU with the
device facts faked (torch.cuda functions replaced by a fake allocator), and the whole command on a GPU."""

import types

import pytest
import torch
from torch import nn

from workbench.bucketing.profile import BucketProfile, load_profile, save_profile
from workbench.oomptimizer import cli, run
from workbench.oomptimizer.probe import TrainingStepProbe


class FakeAllocator:
    """torch.cuda's memory facts, moved by FakeModel's steps: a budget in bytes and a peak per step."""

    def __init__(self, monkeypatch, total_bytes=1_000_000_000, name="Fake GPU 80GB"):
        self.total_bytes, self.name = total_bytes, name
        self.allocated = 1000  # the weights, before any probe
        self.peak = self.allocated
        self.fraction = None
        self.resets = 0
        self.sync_error = None  # raised by the synchronize after the optimizer step, once
        for attr, fn in dict(is_available=lambda: True, is_initialized=lambda: False, current_device=lambda: 0,
                             set_per_process_memory_fraction=self.set_fraction,
                             get_device_properties=lambda device=None: types.SimpleNamespace(
                                 name=self.name, total_memory=self.total_bytes),
                             memory_allocated=lambda device=None: self.allocated,
                             reset_peak_memory_stats=self.reset_peak, synchronize=self.synchronize,
                             max_memory_allocated=lambda device=None: self.peak).items():
            monkeypatch.setattr(torch.cuda, attr, fn)

    def set_fraction(self, fraction, device=None):
        self.fraction = fraction

    def synchronize(self, device=None):
        error, self.sync_error = self.sync_error, None
        if error is not None:
            raise error

    def reset_peak(self, device=None):
        self.resets += 1
        self.peak = self.allocated

    @property
    def limit(self):
        return self.fraction * self.total_bytes


class FakeModel(nn.Module):
    """The probe's model contract on the CPU: a step needs bytes_per_second x duration x batch size on the
    fake allocator, raises ``error`` (default: an OOM) when that is over its limit, and moves a buffer."""

    def __init__(self, alloc: FakeAllocator, bytes_per_second=1_000_000, error=None, leak=0):
        super().__init__()
        self.alloc, self.bytes_per_second, self.error, self.leak = alloc, bytes_per_second, error, leak
        self.weight = nn.Parameter(torch.ones(3))
        self.register_buffer("steps_seen", torch.zeros(()))
        self.batches = []

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        assert device == torch.device("cuda", 0)  # the probe asks for the GPU; the fake stays on the CPU
        self.batches.append((batch_size, duration_s, num_tokens))
        n = max(int(num_tokens), 1)
        return {"audio_lens": torch.full((batch_size,), int(duration_s * 100)),
                "token_lens": torch.full((batch_size,), n), "x": torch.ones(batch_size, 3)}

    def training_step(self, batch, *, dtype=torch.float32):
        need = self.bytes_per_second * float(batch["audio_lens"][0]) / 100 * len(batch["x"])
        self.alloc.allocated += self.leak
        if self.alloc.allocated + need > self.alloc.limit:
            raise self.error or torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        self.alloc.peak = max(self.alloc.peak, self.alloc.allocated + need)
        self.steps_seen += 1
        loss = (batch["x"] @ self.weight).sum()
        loss.backward()
        return loss.detach()


def test_probe_without_cuda_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        TrainingStepProbe(nn.Linear(2, 2))


def test_probe_rejects_a_bad_fraction_before_touching_the_device(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    with pytest.raises(ValueError, match=r"memory_fraction: must be in \(0, 1\], got 1.5"):
        TrainingStepProbe(FakeModel(alloc), memory_fraction=1.5)
    assert alloc.fraction is None


def test_probe_measures_the_peak_under_the_fraction_and_leaves_the_model_as_it_was(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    model = FakeModel(alloc)
    probe = TrainingStepProbe(model, memory_fraction=0.5)
    assert alloc.fraction == 0.5 and probe.budget_bytes == 0.5 * alloc.total_bytes
    assert probe.baseline_bytes == 1000 and probe.device == torch.device("cuda", 0)
    # 4 s at 1 MB/s per utterance: 8 utterances need 32 MB over the weights' 1000 bytes
    assert probe((4.0, 39.6), 8) == 1000 + 8 * 4_000_000
    assert model.batches[-1] == (8, 4.0, 40)  # the token bound is rounded, the batch size an int
    assert probe((4.0, 40), 2) == 1000 + 2 * 4_000_000  # peaks are per probe: reset before each
    assert alloc.resets == 2
    assert float(model.steps_seen) == 0 and model.weight.grad is None  # buffers put back, gradients dropped
    with pytest.raises(torch.OutOfMemoryError, match="batch size 200 at 4 s / 40 tokens does not fit in 0.5 GiB"):
        probe((4.0, 40), 200)  # 800 MB > 500 MB
    assert model.weight.grad is None


@pytest.mark.parametrize("error, oom", [(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                                      "`cublasCreate(handle)`"), True),
                                        (RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), True),
                                        (RuntimeError("shape mismatch: [2, 3] vs [3, 2]"), False)])
def test_probe_turns_ooms_in_disguise_into_oom_and_reraises_the_rest(monkeypatch, error, oom):
    alloc = FakeAllocator(monkeypatch)
    probe = TrainingStepProbe(FakeModel(alloc, error=error), memory_fraction=0.5)
    with pytest.raises(torch.OutOfMemoryError if oom else RuntimeError) as caught:
        probe((4.0, 40), 200)
    assert isinstance(caught.value, torch.OutOfMemoryError) == oom
    assert probe((4.0, 40), 1) > 0  # the probe is usable after a failure


@pytest.mark.parametrize("error, oom", [(torch.OutOfMemoryError("CUDA out of memory"), True),
                                        (RuntimeError("CUDA error: an illegal memory access was encountered"), False)])
def test_probe_failing_after_the_step_is_an_oom_only_when_it_is_one(monkeypatch, error, oom):
    alloc = FakeAllocator(monkeypatch)
    model = FakeModel(alloc)
    probe = TrainingStepProbe(model, memory_fraction=0.5)
    alloc.sync_error = error  # the optimizer step's kernels fail when the probe waits for them
    with pytest.raises(torch.OutOfMemoryError if oom else RuntimeError, match=str(error) if not oom else "batch"):
        probe((4.0, 40), 2)
    assert model.weight.grad is None and float(model.steps_seen) == 0


def test_ddp_gradient_buffer_round_trips_the_gradients(monkeypatch):
    FakeAllocator(monkeypatch)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2, bias=False)).to(torch.float64)
    model[1].weight.requires_grad_(True)
    probe = TrainingStepProbe(model, ddp_gradient_buckets=True)
    assert probe.grad_bytes == (12 + 4 + 8) * 8  # float64 parameters
    model(torch.randn(5, 3, dtype=torch.float64)).sum().backward()
    grads = [p.grad.clone() for p in probe.params]
    buffer = torch.zeros(probe.grad_bytes, dtype=torch.uint8)
    probe._reduce_gradients(buffer)  # one process: copied in and back, no collective
    assert all(torch.equal(p.grad, g) for p, g in zip(probe.params, grads))
    assert torch.equal(buffer[:12 * 8].view(torch.float64).view(4, 3), grads[0])  # the bucket holds the bytes


def test_oomptimize_fills_the_profile_from_probes_and_writes_plain_metadata(monkeypatch, tmp_path):
    alloc = FakeAllocator(monkeypatch)
    model = FakeModel(alloc)
    bins = BucketProfile([[4.0, 40], [8.0, 80], [8.0, 90]], metadata={"corpus": "x"})
    profile, result = run.oomptimize(model, "fake-rnnt", bins, memory_fraction=0.5, rel_gap=0.02)
    budget = 0.5 * alloc.total_bytes
    true_max = [int((budget - 1000) // (d * 1_000_000)) for d, _ in run.profile_buckets(bins)]  # 124, 62, 62
    assert len(result.batch_sizes) == 3
    for bs, best in zip(result.batch_sizes, true_max):
        assert 0.98 * best <= bs <= best
    # the two 8 s buckets got the same size and were merged
    assert profile.num_buckets == 2 and profile.bucket_duration_bins == [[4.0, 40], [8.0, 90]]
    assert profile.bucket_batch_size == [result.batch_sizes[0], result.batch_sizes[2]]
    meta = profile.metadata
    assert meta["corpus"] == "x" and meta["model"] == "fake-rnnt" and meta["dtype"] == "bfloat16"
    assert meta["gpu"] == "Fake GPU 80GB" and meta["gpu_memory_bytes"] == alloc.total_bytes
    assert meta["budget_bytes"] == int(budget) and meta["probes"] == result.num_probes
    assert meta["world_size"] == 1 and meta["ddp"] is False and meta["unmerged_buckets"] == 3
    assert meta["torch"] == torch.__version__
    loaded = load_profile(save_profile(tmp_path / "p.yaml", profile))
    assert loaded.bucket_batch_size == profile.bucket_batch_size and loaded.metadata["gpu"] == "Fake GPU 80GB"
    assert type(loaded.metadata["torch"]) is str


def test_oomptimize_refuses_probes_that_leave_memory_behind(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    with pytest.raises(RuntimeError, match="probes left [0-9]+ bytes allocated"):
        run.oomptimize(FakeModel(alloc, leak=512), "fake", BucketProfile([[4.0, 40]]), memory_fraction=0.5)


def test_gpu_metadata_reads_the_current_device(monkeypatch):
    FakeAllocator(monkeypatch, total_bytes=150_000_000_000, name="NVIDIA H200")
    meta = run.gpu_metadata("large-rnnt", torch.float32, 0.9, strategy="bisect")
    assert (meta["gpu"], meta["gpu_memory_bytes"], meta["dtype"], meta["memory_fraction"], meta["strategy"]) == \
        ("NVIDIA H200", 150_000_000_000, "float32", 0.9, "bisect")
    assert type(meta["gpu_memory_bytes"]) is int


def test_soak_turns_an_oom_into_one_line_naming_the_step_and_bucket():
    class CpuOomModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(1))

        def make_batch(self, batch_size, duration_s, num_tokens, device):
            return {"audio_lens": torch.full((batch_size,), int(duration_s * 16000)),
                    "token_lens": torch.full((batch_size,), int(num_tokens))}

        def training_step(self, batch, *, dtype=torch.float32):
            if len(batch["audio_lens"]) > 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            (self.weight * batch["audio_lens"].float().mean()).backward()

    profile = BucketProfile([[4.0, 40], [8.0, 80]], [2, 8])
    with pytest.raises(RuntimeError, match=r"soak: OOM at step \d+, bucket 1 \(8 s, 80 tokens\), batch size 8: "
                                           "CUDA out of memory"):
        run.soak(CpuOomModel(), profile, steps_per_bucket=2, progress=False)
    report = run.soak(CpuOomModel(), BucketProfile([[4.0, 40]], [4]), steps_per_bucket=2, progress=False)
    assert report["steps"] == 2 and report["peak_allocated_bytes"] is None  # no CUDA: nothing measured


def _bins(tmp_path):
    return save_profile(tmp_path / "bins.yaml", BucketProfile([[2.0, 20], [4.0, 40]]))


def test_cli_nproc_beyond_the_gpus_is_one_line_and_relaunches_otherwise(monkeypatch, tmp_path, capsys):
    from workbench.cli import main

    configured, relaunched = [], []
    monkeypatch.setattr(cli, "configure_allocator", lambda: configured.append(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cli, "_relaunch_under_torchrun", lambda n: relaunched.append(n) or 0)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    args = ["oomptimize", "--model", "tiny-rnnt", "--bins", str(_bins(tmp_path)), "--nproc", "2"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == "workbench oomptimize: error: --nproc 2: this machine has 1 CUDA GPU(s)"
    assert configured == [1] and relaunched == []  # the allocator is configured before CUDA starts
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert main(args) == 0 and relaunched == [2]


def test_init_distributed_joins_nccl_only_under_torchrun(monkeypatch):
    calls = []
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(set_device=lambda i: calls.append(("set_device", i))),
        distributed=types.SimpleNamespace(is_initialized=lambda: False, get_rank=lambda: 3,
                                          init_process_group=lambda backend: calls.append(("init", backend))))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert cli._init_distributed(fake_torch) == 0 and calls == []
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli._init_distributed(fake_torch) == 0 and calls == []  # torchrun with one process: no group
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert cli._init_distributed(fake_torch) == 3
    assert calls == [("set_device", 1), ("init", "nccl")]


@pytest.mark.gpu
def test_gpu_oomptimize_command_writes_a_loadable_profile(tmp_path, capsys):
    """The command as a user types it, on a small share of the GPU (a few GiB): search, soak, save."""
    from workbench.cli import main

    out = tmp_path / "profile.yaml"
    try:
        code = main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(_bins(tmp_path)), "--out", str(out),
                     "--memory-fraction", "0.05", "--validate"])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)  # the rest of the session gets the whole GPU back
    assert code == 0, capsys.readouterr().err
    profile = load_profile(out)
    assert len(profile.bucket_batch_size) == profile.num_buckets >= 1 and min(profile.bucket_batch_size) >= 1
    meta = profile.metadata
    assert meta["gpu"] == torch.cuda.get_device_name() and meta["model"] == "tiny-rnnt"
    assert meta["budget_bytes"] == int(0.05 * torch.cuda.get_device_properties(0).total_memory)
    assert meta["soak"]["ooms"] == 0 and meta["soak"]["peak_allocated_bytes"] > 0
    assert "expandable_segments:True" in profile.allocator_settings  # the command turned them on first
    assert f"wrote {out}" in capsys.readouterr().out


def test_oomptimize_metadata_says_whether_the_probed_encoder_was_compiled(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    bins = BucketProfile([[4.0, 40]])
    eager = FakeModel(alloc)
    assert run.oomptimize(eager, "fake-rnnt", bins, memory_fraction=0.5)[0].metadata["compile"] is False
    compiled = FakeModel(alloc)
    compiled.encoder = nn.Module()
    compiled.encoder.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    for block in compiled.encoder.blocks:
        block.compile(dynamic=True)  # what workbench.models.compile_encoder_layers does (never called here)
    assert run.oomptimize(compiled, "fake-rnnt", bins, memory_fraction=0.5)[0].metadata["compile"] is True
    assert compiled.batches[0] == (2, 4.0, 40) and eager.batches[0] != (2, 4.0, 40)  # the warm-up step first


def test_probe_warm_up_reads_the_baseline_again(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    probe = TrainingStepProbe(FakeModel(alloc, leak=500), memory_fraction=0.5)
    assert probe.baseline_bytes == 1000
    probe.warm_up((4.0, 40))
    assert probe.baseline_bytes == 1500 and probe.model.batches == [(2, 4.0, 40)]


@pytest.mark.parametrize("settings, warns", [("expandable_segments:True,max_split_size_mb:512", False),
                                             ("expandable_segments:False", True), (None, True)])
def test_oomptimize_records_the_allocator_settings_and_warns_without_expandable_segments(monkeypatch, caplog, tmp_path,
                                                                                        settings, warns):
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    if settings is not None:
        monkeypatch.setenv("PYTORCH_ALLOC_CONF", settings)
    alloc = FakeAllocator(monkeypatch)  # CUDA not initialized: the settings torch will read are the env's
    caplog.set_level("WARNING", logger="workbench.oomptimizer.run")
    profile, _ = run.oomptimize(FakeModel(alloc), "fake-rnnt", BucketProfile([[4.0, 40]]), memory_fraction=0.5)
    assert profile.allocator_settings == (settings or "")
    assert load_profile(save_profile(tmp_path / "p.yaml", profile)).allocator_settings == (settings or "")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == warns
    if warns:
        assert lines[0].startswith(f"oomptimize: the CUDA allocator runs without expandable segments (settings "
                                   f"{settings or ''!r})") and "\n" not in lines[0]


@pytest.mark.gpu
def test_gpu_search_from_a_plan_takes_no_more_probes(tmp_path, capsys):
    """`--plan` for this GPU's memory, then `--from-plan` on it: the same command as a user types it, at 5 % of
    the GPU; the search from the plan probes no more than the search without it, and says it started there."""
    from workbench.cli import main

    bins = _bins(tmp_path)
    total = torch.cuda.get_device_properties(0).total_memory
    plan, searched, started = tmp_path / "plan.yaml", tmp_path / "searched.yaml", tmp_path / "started.yaml"
    common = ["--model", "tiny-rnnt", "--bins", str(bins), "--memory-fraction", "0.05", "--no-merge"]
    try:
        assert main(["oomptimize", *common, "--out", str(plan), "--plan", "--gpu-memory", str(total),
                     "--plan-margin", "64MiB"]) == 0
        assert main(["oomptimize", *common, "--out", str(searched)]) == 0
        assert main(["oomptimize", *common, "--out", str(started), "--from-plan", str(plan)]) == 0
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    capsys.readouterr()
    without, with_plan = load_profile(searched).metadata, load_profile(started).metadata
    assert with_plan["started_from_plan"] is True and without["started_from_plan"] is False
    assert with_plan["probes"] <= without["probes"]
    for a, b in zip(load_profile(searched).bucket_batch_size, load_profile(started).bucket_batch_size):
        assert abs(a - b) <= 0.06 * max(a, b)  # both within the search's 5 % of the same maximum
