import os
import subprocess
import sys

import pytest
import torch

from workbench.memory.oom import is_oom_error


@pytest.mark.parametrize("message", ["cuFFT error: CUFFT_ALLOC_FAILED", "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
                                     "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                                     "CUDA out of memory. Tried to allocate 2.00 GiB"])
def test_ooms_in_disguise_are_recognized(message):
    assert is_oom_error(RuntimeError(message))


def test_other_errors_are_not_ooms():
    assert is_oom_error(torch.OutOfMemoryError("x"))
    assert not is_oom_error(RuntimeError("shape mismatch: [2, 3] vs [3, 2]"))
    assert not is_oom_error(ValueError("out of memory"))  # only RuntimeError carries library failures


def test_configure_allocator_turns_on_expandable_segments():
    code = ("import os; from workbench.memory import configure_allocator; configure_allocator(); "
            "print(os.environ.get('PYTORCH_ALLOC_CONF', ''))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTORCH_ALLOC_CONF"] = "garbage_collection_threshold:0.8"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    conf = out.stdout.strip()
    # Either workbench.memory did it (env may stay as given) or we appended expandable segments.
    assert "garbage_collection_threshold:0.8" in conf or "expandable_segments" in conf
    if torch.cuda.is_available():  # the user's option is kept and expandable segments are added
        assert conf == "garbage_collection_threshold:0.8,expandable_segments:True"
    else:  # nothing to configure without CUDA: the environment is left as the user set it
        assert conf == "garbage_collection_threshold:0.8"


def test_cli_without_gpu_or_file_fails_cleanly(tmp_path, capsys):
    from workbench.bucketing.profile import BucketProfile, save_profile
    from workbench.cli import main

    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(tmp_path / "missing.yaml")]) == 2
    path = save_profile(tmp_path / "bins.yaml", BucketProfile([[5.0, 40], [10.0, 80]]))
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(path),  # a real file: the fraction fails
                 "--memory-fraction", "1.5"]) == 2
    assert "--memory-fraction: must be in (0, 1], got 1.5" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(path)]) == 2


@pytest.mark.gpu
def test_gpu_probe_finds_sizes_and_releases_memory():
    from oomptimizer_toy_model import ToyTransducerLike

    from workbench.oomptimizer import search_batch_sizes
    from workbench.memory.oom import release_memory
    from workbench.oomptimizer.probe import TrainingStepProbe

    model = ToyTransducerLike().cuda()
    release_memory()  # garbage of earlier tests (decoders' graphs) must not count as this test's baseline
    before = torch.cuda.memory_allocated()
    probe = TrainingStepProbe(model, dtype=torch.bfloat16, memory_fraction=0.5)
    small, large = probe((2.0, 20), 4), probe((2.0, 20), 16)
    assert 0 < small < large <= probe.budget_bytes
    with pytest.raises(torch.OutOfMemoryError):
        probe((30.0, 400), 4096)  # far beyond half an H200
    assert torch.cuda.memory_allocated() == before
    buckets = [(4.0, 40.0), (8.0, 80.0), (16.0, 160.0)]
    result = search_batch_sizes(buckets, probe, budget_bytes=probe.budget_bytes)
    assert result.batch_sizes[0] > result.batch_sizes[1] > result.batch_sizes[2] >= 1
    for i, bs in enumerate(result.batch_sizes):
        assert any(p.bucket_index == i and p.batch_size == bs and not p.oom for p in result.probes)
    assert torch.cuda.memory_allocated() == before


@pytest.mark.gpu
def test_gpu_ddp_buckets_cost_a_gradient_copy():
    from oomptimizer_toy_model import ToyTransducerLike

    from workbench.oomptimizer.probe import TrainingStepProbe

    model = ToyTransducerLike(hidden=1024).cuda()
    plain = TrainingStepProbe(model, memory_fraction=0.5)((2.0, 20), 4)
    ddp = TrainingStepProbe(model, memory_fraction=0.5, ddp_gradient_buckets=True)((2.0, 20), 4)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ddp - plain >= 0.9 * grad_bytes - (2 << 20)


@pytest.mark.gpu
def test_gpu_soak_runs_the_profile():
    from oomptimizer_toy_model import ToyTransducerLike

    from workbench.bucketing.profile import BucketProfile
    from workbench.oomptimizer.run import soak

    model = ToyTransducerLike().cuda()
    report = soak(model, BucketProfile([[4.0, 40], [8.0, 80]], [8, 4]), steps_per_bucket=2, progress=False,
                  search_memory_fraction=0.9)
    assert report["steps"] == 4 and report["ooms"] == 0
    total = torch.cuda.get_device_properties(0).total_memory
    assert report["budget_bytes"] == int(total)  # training's limit: the whole device
    assert 0 < report["peak_allocated_bytes"] <= report["peak_reserved_bytes"] <= total
    assert report["peak_allocated_over_search_budget"] < 1  # a toy model: far below 90 % of an H200
