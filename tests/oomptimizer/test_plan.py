"""Planning without a GPU: the fake trace, its memory tracker, the planned search and `oomptimize --plan`."""

import functools
import os
import resource
import time
from pathlib import Path

import pytest
import torch

from workbench.bucketing.profile import BucketProfile, load_profile, save_profile
from workbench.cli import main
from workbench.oomptimizer.plan import (GPU_MEMORY_BYTES, DeviceMemoryTracker, PlanError, PlannedProbe, StepTracer,
                                        build_fake_reference_model, gpu_memory_bytes, new_fake_mode, parse_size,
                                        plan_profile, planned_peaks)
from workbench.oomptimizer.search import search_batch_sizes
from workbench.units import GiB, MiB


@pytest.fixture(scope="module")
def tiny():
    fake_mode = new_fake_mode()
    model = build_fake_reference_model("tiny-rnnt", fake_mode)
    return model, fake_mode, StepTracer(model, fake_mode)


@pytest.mark.parametrize("text, size", [("80GiB", 80 * GiB), ("80GB", 80 * 10**9), ("81920MiB", 80 * GiB),
                                        ("1.5 GiB", 3 * GiB // 2), ("4096", 4096)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["80 parsecs", "GiB", "", "0GiB", "-1GiB"])
def test_a_size_that_is_not_one_is_one_line(text):
    with pytest.raises(ValueError) as e:
        parse_size(text)
    assert "\n" not in str(e.value)


def test_gpu_names_and_sizes():
    assert gpu_memory_bytes("H100-80GB") == GPU_MEMORY_BYTES["h100-80gb"]
    assert gpu_memory_bytes("80GiB") == 80 * GiB
    with pytest.raises(ValueError, match=r"^--gpu-memory 'h300': not a GPU we know \(a100-40gb, "):
        gpu_memory_bytes("h300")
    with pytest.raises(ValueError, match=r"^--gpu-memory: '80Gb/s' is not a size"):
        gpu_memory_bytes("80Gb/s")


def test_tracker_counts_blocks_as_the_caching_allocator_rounds_them():
    tracker = DeviceMemoryTracker()
    with new_fake_mode(), tracker:
        a = torch.empty(1000, dtype=torch.uint8)  # 1000 -> 1024 bytes, small pool
        b = torch.empty(3 * MiB, dtype=torch.uint8)  # large pool
        view = b.view(3, MiB)  # a view holds no new block
        assert tracker.allocated_bytes == 1024 + 3 * MiB
        del a
        c = torch.empty(100, dtype=torch.float32)  # 400 -> 512 bytes
        assert tracker.allocated_bytes == 512 + 3 * MiB
        del b, view
        assert tracker.allocated_bytes == 512
        d = torch.empty(0)  # no block for zero bytes
        shape_only = torch.empty(1 << 30, device="meta")  # no memory on any device
        assert tracker.allocated_bytes == 512
        del c, d, shape_only
    assert tracker.allocated_bytes == 0
    assert tracker.peak_allocated_bytes == 1024 + 3 * MiB
    assert tracker.peak_reserved_bytes == 2 * MiB + 4 * MiB  # one small-pool page, two large-pool pages


def test_predicted_peak_grows_with_batch_size_and_duration(tiny):
    _, _, tracer = tiny
    small = tracer.trace((2.0, 10), 2)
    assert tracer.trace((2.0, 10), 4).peak_allocated_bytes > small.peak_allocated_bytes
    assert tracer.trace((4.0, 10), 2).peak_allocated_bytes > small.peak_allocated_bytes
    assert small.peak_allocated_bytes > small.state_bytes > 0
    assert small.peak_reserved_bytes >= small.peak_allocated_bytes


@pytest.mark.parametrize("name", ["tiny-tdt", "tiny-ctc", "tiny-aed"])
def test_every_head_traces(name):
    fake_mode = new_fake_mode()
    tracer = StepTracer(build_fake_reference_model(name, fake_mode), fake_mode)
    assert tracer.trace((4.0, 20), 4).peak_allocated_bytes < tracer.trace((4.0, 20), 8).peak_allocated_bytes


def test_a_fake_trace_takes_no_real_memory(tiny):
    _, _, tracer = tiny
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    memory = tracer.trace((8.0, 16), 4096)  # gigabytes if it were real
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert memory.peak_allocated_bytes > 4 * GiB and grown < 256 * MiB


def test_planned_search_returns_sizes_that_fit(tiny):
    model, fake_mode, _ = tiny
    probe = PlannedProbe(model, fake_mode, 256 * MiB, memory_fraction=0.9, margin_bytes=16 * MiB)
    result = search_batch_sizes([(4.0, 40)], probe, budget_bytes=probe.budget_bytes, start_batch_size=16)
    assert result.batch_sizes[0] > 16
    with pytest.raises(torch.OutOfMemoryError, match="^planned: batch size"):
        probe((4.0, 40), int(result.batch_sizes[0] * 1.5))


def test_a_plan_in_two_processes_finds_what_one_finds():
    """Two forked searches over interleaved buckets: every bucket planned within the search's gap of the
    one-process plan, every probe indexed into all buckets, one fit over all of them."""
    bins = BucketProfile([[2.0, 10], [2.0, 20], [4.0, 20], [4.0, 40], [6.0, 30], [6.0, 60]])
    plans = {}
    for workers in (1, 2):
        fake_mode = new_fake_mode()
        model = build_fake_reference_model("tiny-rnnt", fake_mode)
        plans[workers] = plan_profile(model, fake_mode, "tiny-rnnt", bins, gpu_memory="2GiB", merge=False,
                                      workers=workers)
    (one, _), (two, two_result) = plans[1], plans[2]
    for a, b in zip(one.bucket_batch_size, two.bucket_batch_size):
        assert abs(a - b) <= 0.05 * max(a, b) + 1, (one.bucket_batch_size, two.bucket_batch_size)
    assert {r.bucket_index for r in two_result.probes} == set(range(6))
    for i, size in enumerate(two_result.batch_sizes):  # each size is a probe of its own bucket that fitted
        assert any(r.bucket_index == i and r.batch_size == size and not r.oom for r in two_result.probes)
    assert sorted(two_result.fit.per_item_bytes) == list(range(6))
    assert two.metadata["plan"]["per_item_bytes"] == [two_result.fit.per_item_bytes[i] for i in range(6)]


class Untraceable(torch.nn.Module):
    """Keeps the model contract, but its step takes a shape from the data (unique values)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"audio": torch.randn(batch_size, 4, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        out = self.layer(batch["audio"])
        loss = out.unique().sum()
        loss.backward()
        return loss.detach()


def test_a_step_that_cannot_be_traced_names_the_operation():
    fake_mode = new_fake_mode()
    with fake_mode:
        model = Untraceable()
    with pytest.raises(PlanError) as e:
        StepTracer(model, fake_mode).trace((1.0, 4), 2)
    message = str(e.value)
    assert message.startswith("cannot trace the training step at 1 s / 4 tokens, batch size 2: aten._unique2")
    assert "\n" not in message


class SelectsByMask(torch.nn.Module):
    """Keeps the model contract; its step selects elements by a mask read from the data (as CTC targets are
    often flattened), three ways."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"audio": torch.randn(batch_size, 256, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        out = self.layer(batch["audio"])
        keep = out > 0
        loss = out.masked_select(keep).sum() + out[keep].sum() + out[keep.nonzero(as_tuple=True)].sum()
        loss.backward()
        return loss.detach()


def test_an_output_shaped_by_values_is_traced_at_its_largest():
    fake_mode = new_fake_mode()
    with fake_mode:
        model = SelectsByMask()
    small, large = (StepTracer(model, fake_mode).trace((1.0, 4), size) for size in (256, 512))
    one_output = 256 * 4  # bytes of one batch item's float32 output: every element selected is as large
    assert large.peak_allocated_bytes - small.peak_allocated_bytes >= 256 * 3 * one_output


class AttentionOnly(torch.nn.Module):
    """Keeps the model contract: one self-attention over [B, T, 64] frames with a key mask and dropout."""

    def __init__(self):
        super().__init__()
        self.project = torch.nn.Linear(64, 3 * 64)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        frames = int(duration_s * 100)
        return {"audio": torch.randn(batch_size, frames, 64, device=device),
                "bias": torch.zeros(batch_size, 1, 1, frames, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            q, k, v = self.project(batch["audio"]).view(*batch["audio"].shape[:2], 3, 4, 16).permute(2, 0, 3, 1, 4)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=batch["bias"].to(q.dtype),
                                                                   dropout_p=0.1)
            loss = out.float().sum()
        loss.backward()
        return loss.detach()


@pytest.mark.parametrize("cuda_kernels", [True, False])
def test_attention_is_traced_as_cuda_runs_it(cuda_kernels):
    """On CUDA the memory-efficient kernel keeps no [B, H, T, T] weights; the CPU's math path (traced when
    cuda_kernels is off) keeps them, and their dropout mask."""
    fake_mode = new_fake_mode()
    with fake_mode:
        model = AttentionOnly()
    peak = StepTracer(model, fake_mode, cuda_kernels=cuda_kernels).trace((10.0, 4), 8).peak_allocated_bytes
    weights = 8 * 4 * 1000 * 1000 * 2  # bytes of the bf16 attention weights of 8 x 4 heads x 1000 frames
    if cuda_kernels:
        assert peak < weights / 2
    else:
        assert peak > weights


class NormDropoutLoss(torch.nn.Module):
    """Keeps the model contract: a bf16 layer's output through a layer norm, a softmax, dropout and a
    cross-entropy of bf16 logits."""

    def __init__(self, dropout: float = 0.1, classes: int = 256):
        super().__init__()
        self.layer, self.norm = torch.nn.Linear(256, classes), torch.nn.LayerNorm(classes)  # classes: the width
        self.dropout = dropout

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"x": torch.randn(batch_size, 256, device=device),
                "y": torch.randint(0, 256, (batch_size,), device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            hidden = self.layer(batch["x"])
            normed, probs = self.norm(hidden), hidden.softmax(-1)
            dropped = torch.nn.functional.dropout(hidden, self.dropout, training=True)
            self.seen = (normed.dtype, probs.dtype)
            loss = (torch.nn.functional.cross_entropy(dropped, batch["y"], label_smoothing=0.1)
                    + normed.float().mean() + probs.float().mean())
        loss.backward()
        return loss.detach()


def test_norms_softmax_and_dropout_are_traced_as_cuda_autocast_runs_them():
    """CUDA's autocast returns a layer norm and a softmax of bf16 in float32 and its dropout keeps a one-byte
    mask; the CPU's keeps bf16 and a bf16 noise tensor. With p = 0 dropout returns its input; else its bf16
    output (two bytes an element) lives at the peak beside the mask (one byte) or the noise (two)."""
    fake_mode = new_fake_mode()
    with fake_mode:
        with_dropout, without = NormDropoutLoss(0.1), NormDropoutLoss(0.0)
    rows = 4096
    peaks = {}
    for cuda_kernels in (True, False):
        for name, model in (("dropout", with_dropout), ("none", without)):
            tracer = StepTracer(model, fake_mode, dtype=torch.bfloat16, cuda_kernels=cuda_kernels)
            peaks[cuda_kernels, name] = tracer.trace((1.0, 1), rows).peak_allocated_bytes
            assert model.seen == ((torch.float32,) * 2 if cuda_kernels else (torch.bfloat16,) * 2)
    mask = peaks[True, "dropout"] - peaks[True, "none"]
    noise = peaks[False, "dropout"] - peaks[False, "none"]
    assert (mask, noise) == (3 * rows * 256, 4 * rows * 256)


class LogitsLoss(NormDropoutLoss):
    """A bf16 output layer of 50,000 classes and its cross-entropy, nothing else."""

    def __init__(self, smoothing: float = 0.0):
        super().__init__(0.0, classes=50_000)
        self.smoothing = smoothing

    def training_step(self, batch, *, dtype=torch.float32):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.layer(batch["x"]), batch["y"],
                                                     label_smoothing=self.smoothing)
        loss.backward()
        return loss.detach()


def bf16_peaks_with_and_without_the_cuda_ops(model_class, rows: int) -> dict[bool, int]:
    """{cuda_kernels: the traced bf16 step's peak in bytes} for ``rows`` items of a fresh ``model_class``."""
    fake_mode = new_fake_mode()
    with fake_mode:
        model = model_class()
    return {cuda_kernels: StepTracer(model, fake_mode, dtype=torch.bfloat16, cuda_kernels=cuda_kernels)
            .trace((1.0, 1), rows).peak_allocated_bytes for cuda_kernels in (True, False)}


def test_cross_entropy_of_bf16_logits_keeps_bf16_log_probabilities_as_on_cuda():
    """CUDA's autocast runs cross-entropy's log-softmax in the logits' bf16 and the NLL on a float32 copy; the
    CPU's casts the logits to float32 first. Logits of 50,000 classes dominate the step: the CUDA trace's peak
    is at least 2 bytes a logit lower. Label smoothing's sum over the classes runs in float32 on CUDA, and its
    backward casts the gradient back: a bf16 [N, C] more."""
    rows = 512
    plain = bf16_peaks_with_and_without_the_cuda_ops(LogitsLoss, rows)
    assert plain[False] - plain[True] >= 2 * rows * 50_000 - MiB  # less the [N] tensors' differences
    smoothed = bf16_peaks_with_and_without_the_cuda_ops(functools.partial(LogitsLoss, 0.1), rows)
    assert smoothed[True] - plain[True] >= 2 * rows * 50_000 - MiB


def test_the_cuda_ops_leave_a_real_computation_as_it_is():
    from workbench.oomptimizer.plan import OpsAsOnCuda

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), OpsAsOnCuda():
        normed = torch.nn.functional.layer_norm(x.bfloat16(), (8,))
        probs = torch.softmax(input=x.bfloat16(), dim=-1)  # the tensor as a keyword
        total = x.bfloat16().sum(-1)
    assert normed.dtype == probs.dtype == total.dtype == torch.bfloat16


def test_a_traced_sum_of_half_precision_is_float32_as_on_cuda():
    """sum is on CUDA autocast's float32 list: a bf16 sum returns float32 (and its backward casts the gradient
    back, a bf16 tensor of the input's shape); a sum given its dtype, or of float32, is left as it is."""
    from workbench.oomptimizer.plan import OpsAsOnCuda

    fake_mode = new_fake_mode()
    with fake_mode:
        x = torch.randn(4, 8).bfloat16()
    with fake_mode, torch.autocast("cpu", dtype=torch.bfloat16), OpsAsOnCuda():
        dtypes = [x.sum(1).dtype, torch.sum(x).dtype, x.sum(dim=0).dtype, x.sum(1, dtype=torch.bfloat16).dtype,
                  x.float().sum(1).dtype]
    assert dtypes == [torch.float32, torch.float32, torch.float32, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1}, {"weight": "w", "label_smoothing": 0.2},
                                     {"reduction": "sum", "label_smoothing": 0.1},
                                     {"reduction": "none", "label_smoothing": 0.1}, {"ignore_index": 3}])
@pytest.mark.parametrize("shape", [(11,), (7, 11), (7, 11, 3)])
def test_cross_entropy_as_cuda_runs_it_has_torchs_value(options, shape):
    from workbench.oomptimizer.plan import _cross_entropy_as_on_cuda

    torch.manual_seed(0)
    logits = torch.randn(*shape, dtype=torch.float64)
    targets = torch.randint(0, 11, shape[:1] + shape[2:] if len(shape) > 1 else ())
    if targets.dim():
        targets.view(-1)[0] = options.get("ignore_index", -100)
    options = {k: torch.rand(11, dtype=torch.float64) if v == "w" else v for k, v in options.items()}
    expected = torch.nn.functional.cross_entropy(logits, targets, **options)
    torch.testing.assert_close(_cross_entropy_as_on_cuda(logits, targets, **options), expected)


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1}, {"weight": "w", "label_smoothing": 0.2},
                                     {"reduction": "sum", "weight": "w"},
                                     {"reduction": "none", "label_smoothing": 0.1}])
@pytest.mark.parametrize("shape", [(11,), (7, 11), (7, 11, 3)])
def test_cross_entropy_of_probability_targets_as_cuda_runs_it_has_torchs_value(options, shape):
    from workbench.oomptimizer.plan import _cross_entropy_as_on_cuda

    torch.manual_seed(0)
    logits = torch.randn(*shape, dtype=torch.float64)
    targets = torch.softmax(torch.randn(*shape, dtype=torch.float64), 0 if len(shape) == 1 else 1)
    options = {k: torch.rand(11, dtype=torch.float64) if v == "w" else v for k, v in options.items()}
    expected = torch.nn.functional.cross_entropy(logits, targets, **options)
    torch.testing.assert_close(_cross_entropy_as_on_cuda(logits, targets, **options), expected)


class ProbabilityLogitsLoss(LogitsLoss):
    """LogitsLoss against float32 probability targets (soft labels, as in distillation)."""

    def training_step(self, batch, *, dtype=torch.float32):
        soft = torch.nn.functional.one_hot(batch["y"], 50_000).float() * 0.9 + 0.1 / 50_000
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.layer(batch["x"]), soft)
        loss.backward()
        return loss.detach()


def test_cross_entropy_of_probability_targets_keeps_bf16_log_probabilities_as_on_cuda():
    """With probability targets CUDA's autocast casts nothing: the log-softmax stays in the logits' bf16 and only
    its product with the float32 targets is float32; the CPU's makes a float32 copy of the logits first."""
    rows = 512
    peak = bf16_peaks_with_and_without_the_cuda_ops(ProbabilityLogitsLoss, rows)
    assert peak[False] - peak[True] >= 4 * rows * 50_000  # at least the float32 copy


def test_cross_entropy_as_cuda_runs_it_refuses_what_torch_refuses():
    from workbench.oomptimizer.plan import _cross_entropy_as_on_cuda

    with pytest.raises(RuntimeError, match="label_smoothing"):
        _cross_entropy_as_on_cuda(torch.randn(3, 5), torch.tensor([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        _cross_entropy_as_on_cuda(torch.randn(3, 5), torch.rand(3, 5), reduction="avg")
    soft = torch.rand(3, 5)
    for wrong in ({"target": torch.rand(3, 4)}, {"ignore_index": 0}, {"weight": torch.rand(1, 5)}):
        options = {"target": soft, **wrong}
        with pytest.raises(RuntimeError):
            torch.nn.functional.cross_entropy(torch.randn(3, 5), **options)
        with pytest.raises(RuntimeError):
            _cross_entropy_as_on_cuda(torch.randn(3, 5), **options)


def test_cross_entropy_of_no_classes_is_torchs_nan():
    from workbench.oomptimizer.plan import _cross_entropy_as_on_cuda

    for reduction in ("mean", "sum", "none"):
        expected = torch.nn.functional.cross_entropy(torch.randn(4, 0), torch.rand(4, 0), reduction=reduction)
        got = _cross_entropy_as_on_cuda(torch.randn(4, 0), torch.rand(4, 0), reduction=reduction)
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_cross_entropy_sums_half_precision_in_float32_as_cuda_autocast_does():
    from workbench.oomptimizer.plan import _cross_entropy_as_on_cuda, _sum_as_on_cuda

    logits, soft = torch.randn(3, 5).bfloat16(), torch.softmax(torch.randn(3, 5), 1).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        per_row = _cross_entropy_as_on_cuda(logits, soft, reduction="none")
        sums = (_sum_as_on_cuda(logits, 1), _sum_as_on_cuda(logits), _sum_as_on_cuda(logits.double(), 1))
    assert per_row.dtype == sums[0].dtype == sums[1].dtype == torch.float32 and sums[2].dtype == torch.float64
    assert _sum_as_on_cuda(logits, 1).dtype == torch.bfloat16  # no autocast, no cast


class ShapeFromTheHost(torch.nn.Module):
    """Keeps the model contract; its step takes a width from a value read back to the host."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"audio": torch.randn(batch_size, 4, device=device),
                "lens": torch.full((batch_size,), 4, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        out = self.layer(batch["audio"])
        width = int(batch["lens"].max())
        loss = (out[:, :width] * torch.ones_like(out)).sum()
        loss.backward()
        return loss.detach()


def test_a_failure_after_a_host_read_says_what_the_read_was_answered():
    fake_mode = new_fake_mode()
    with fake_mode:
        model = ShapeFromTheHost()
    with pytest.raises(PlanError, match="read 1 value.s. back to the host, answered as 0 .integers.") as e:
        StepTracer(model, fake_mode).trace((1.0, 4), 2)
    assert "\n" not in str(e.value)


def _bins(tmp_path, bins=((2.0, 20), (4.0, 40))):
    return save_profile(tmp_path / "bins.yaml", BucketProfile([list(b) for b in bins]))


def test_cli_writes_a_planned_profile(tmp_path, capsys):
    bins = _bins(tmp_path, [(4.0, 40)])
    out = tmp_path / "plan.yaml"
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), "--out", str(out), "--plan",
                 "--gpu-memory", "256MiB", "--plan-margin", "16MiB", "--start-batch-size", "16"]) == 0
    profile = load_profile(out)
    meta = profile.metadata
    assert profile.bucket_batch_size[0] > 16 and meta["planned"] is True
    assert meta["gpu_memory_bytes"] == 256 * MiB and meta["memory_fraction"] == 0.9
    assert meta["plan"]["margin_bytes"] == 16 * MiB and "fake CPU device" in meta["plan"]["traced_path"]
    assert meta["budget_bytes"] == int(0.9 * 256 * MiB - 16 * MiB)
    assert profile.allocator_settings == "expandable_segments:True"
    assert "planned:" in capsys.readouterr().out


def test_cli_plans_a_model_that_keeps_the_contract(tmp_path):
    bins = _bins(tmp_path, [(2.0, 20)])
    spec = f"{Path(__file__).with_name('oomptimizer_toy_model.py')}:ToyTransducerLike"
    assert main(["oomptimize", "--model", spec, "--bins", str(bins), "--plan", "--gpu-memory", "1GiB",
                 "--plan-margin", "64MiB"]) == 0
    profile = load_profile(bins)
    assert profile.metadata["planned"] is True and profile.bucket_batch_size[0] > 1


def test_cli_a_model_that_cannot_be_traced_is_one_line_naming_the_operation(tmp_path, capsys):
    bins = _bins(tmp_path, [(2.0, 20)])
    out = tmp_path / "plan.yaml"
    assert main(["oomptimize", "--model", f"{__file__}:Untraceable", "--bins", str(bins), "--out", str(out),
                 "--plan", "--gpu-memory", "1GiB", "--plan-margin", "64MiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("workbench oomptimize: error: cannot trace the training step at 2 s / 20 tokens")
    assert "aten._unique2" in err and "\n" not in err and not out.exists()


@pytest.mark.parametrize("options, error", [
    (["--plan", "--gpu-memory", "h300"], "--gpu-memory 'h300': not a GPU we know"),
    (["--plan", "--gpu-memory", "80 parsecs"], "--gpu-memory: '80 parsecs' is not a size"),
    (["--plan", "--gpu-memory", "h200", "--plan-margin", "lots"], "--plan-margin: 'lots' is not a size"),
    (["--plan"], "--plan: needs --gpu-memory"),
    (["--gpu-memory", "h200"], "--gpu-memory: applies with --plan only"),
    (["--plan", "--gpu-memory", "h200", "--validate"], "--validate: runs on a GPU"),
    (["--plan", "--gpu-memory", "h200", "--nproc", "2"], "--nproc: runs on a GPU"),
    (["--plan", "--gpu-memory", "h200", "--compile"], "--compile: runs on a GPU"),
])
def test_cli_bad_plan_input_is_one_line_and_writes_nothing(tmp_path, capsys, options, error):
    bins = _bins(tmp_path)
    written = bins.read_bytes()
    out = tmp_path / "plan.yaml"
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), "--out", str(out), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"workbench oomptimize: error: {error}") and "\n" not in err
    assert not out.exists() and bins.read_bytes() == written


def test_a_plan_keeps_the_lines_a_gpu_search_starts_from(tmp_path, tiny):
    bins = _bins(tmp_path)
    out = tmp_path / "plan.yaml"
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), "--out", str(out), "--plan",
                 "--gpu-memory", "256MiB", "--plan-margin", "16MiB", "--no-merge"]) == 0
    plan = load_profile(out)
    prior = planned_peaks(plan, [(2.0, 20), (4.0, 40)])
    assert 0 < prior.per_item_bytes[0] < prior.per_item_bytes[1] and prior.base_bytes > 0
    model, _, tracer = tiny
    for bucket, size, cost in zip([(2.0, 20), (4.0, 40)], plan.bucket_batch_size, prior.per_item_bytes):
        traced = tracer.trace(bucket, size).peak_allocated_bytes  # the line passes through the traced peaks
        assert abs(prior.base_bytes + size * cost - traced) <= 0.01 * traced
    with pytest.raises(ValueError, match="plan.yaml: planned for 2 other buckets than these 1"):
        planned_peaks(plan, [(4.0, 40)], source=str(out))
    with pytest.raises(ValueError, match="not a plan with per-bucket peaks"):
        planned_peaks(BucketProfile([[4.0, 40]], [3]), [(4.0, 40)])


@pytest.mark.parametrize("case, error", [
    ("missing", "--from-plan {dir}/nothing.yaml: no such profile file"),
    ("not a plan", "--from-plan {dir}/bins.yaml: not a plan with per-bucket peaks"),
    ("other buckets", "--from-plan {dir}/plan.yaml: planned for 1 other buckets than these 2"),
    ("with --plan", "--from-plan: starts the predictive search on a GPU; it cannot be combined with --plan"),
    ("bisect", "--from-plan: starts the predictive search on a GPU; it cannot be combined with --strategy bisect"),
    ("good", "oomptimize needs a CUDA GPU"),
])
def test_cli_from_plan_bad_input_is_one_line(tmp_path, capsys, case, error):
    if torch.cuda.is_available() and case == "good":
        pytest.skip("a GPU is here: the search would run")
    bins = _bins(tmp_path)
    plan_bins = _bins(tmp_path / "one", [(4.0, 40)]) if case == "other buckets" else bins
    plan = tmp_path / "plan.yaml"
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(plan_bins), "--out", str(plan), "--plan",
                 "--gpu-memory", "256MiB", "--plan-margin", "16MiB", "--no-merge"]) == 0
    capsys.readouterr()
    source = {"missing": tmp_path / "nothing.yaml", "not a plan": bins}.get(case, plan)
    extra = {"with --plan": ["--plan", "--gpu-memory", "h200"], "bisect": ["--strategy", "bisect"]}.get(case, [])
    written = bins.read_bytes()
    assert main(["oomptimize", "--model", "tiny-rnnt", "--bins", str(bins), "--from-plan", str(source),
                 *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"workbench oomptimize: error: {error.format(dir=tmp_path)}") and "\n" not in err
    assert bins.read_bytes() == written


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("WORKBENCH_SLOW") != "1", reason="minutes on the CPU: WORKBENCH_SLOW=1")
def test_thirty_bucket_plan_of_large_rnnt(capsys):
    bins = BucketProfile([[round(1.0 + i, 1), int(8 * (1.0 + i))] for i in range(30)])
    fake_mode = new_fake_mode()
    model = build_fake_reference_model("large-rnnt", fake_mode)
    start = time.perf_counter()
    profile, result = plan_profile(model, fake_mode, "large-rnnt", bins, gpu_memory="h200", merge=False)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n30-bucket large-rnnt plan: {result.num_probes} traced steps in {seconds:.1f} s; "
              f"batch sizes {profile.bucket_batch_size}")
    sizes = profile.bucket_batch_size
    assert len(sizes) == 30 and all(s >= 1 for s in sizes) and sizes[0] >= sizes[-1]


def test_plans_for_two_gpus_scale_with_memory_and_say_so():
    from workbench.oomptimizer.plan import plan_for_gpus
    from workbench.oomptimizer.plots import meaning_of_plans, plan_table

    bins = BucketProfile(bucket_duration_bins=[[4.0, 40]])
    plans = plan_for_gpus("tiny-rnnt", bins, ["256MiB", "512MiB"], margin_bytes=16 * MiB, progress=False)
    small, large = plans["256MiB"].bucket_batch_size[0], plans["512MiB"].bucket_batch_size[0]
    assert 1.5 * small < large  # the weights' share is fixed, so twice the memory more than doubles the room
    table = plan_table(plans)
    assert list(table.columns) == ["256MiB", "512MiB"] and table.index.tolist() == ["4.0 s / 40 tok"]
    assert table.loc["4.0 s / 40 tok"].tolist() == [small, large]
    line = meaning_of_plans(plans)
    assert f"plans {small} utterances per step on 256MiB and {large} on 512MiB" in line
    assert f"{large / small:.1f}x the batch for 2.0x the memory" in line


def test_an_adapter_is_planned_by_its_name():
    pytest.importorskip("transformers")
    from workbench.oomptimizer.plan import build_fake_user_model

    fake_mode = new_fake_mode()
    model = build_fake_user_model("hf-whisper", fake_mode)
    memory = StepTracer(model, fake_mode, dtype=torch.float32).trace((1.0, 8), 2)
    assert memory.peak_allocated_bytes > memory.state_bytes > 0
