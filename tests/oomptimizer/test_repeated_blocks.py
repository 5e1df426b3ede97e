"""A step traced with its runs of identical blocks cut short gives the whole trace's memory, and the plan
checks that before it relies on it."""

import numpy as np
import pytest
import torch

from workbench.bucketing.profile import BucketProfile
from workbench.models.config import ModelConfig
from workbench.models.model import ASRModel
from workbench.oomptimizer.plan import PlannedProbe, StepTracer, new_fake_mode, plan_profile
from workbench.oomptimizer.repeated_blocks import KEEP, NotRepeatable, find_block_runs, grown_timeline
from workbench.units import GiB


def _deep(head: str, fake_mode):
    """A small model with runs long enough to cut: 6 conformer blocks (and 5 decoder layers for aed)."""
    with fake_mode:
        return ASRModel(ModelConfig(head=head, vocab_size=64, name=f"deep-{head}", n_mels=32,
                                    subsampling_channels=16, d_model=64, num_layers=6, num_heads=4, ff_mult=2,
                                    conv_kernel=5, dropout=0.1, pred_hidden=64, joint_hidden=64, dec_layers=5,
                                    dec_heads=4, dec_d_model=64))


@pytest.mark.parametrize("head", ["aed", "rnnt"])
def test_the_cut_trace_gives_the_whole_traces_memory(head):
    fake_mode = new_fake_mode()
    model = _deep(head, fake_mode)
    tracer = StepTracer(model, fake_mode, repeated_blocks=True)
    expected = [("encoder.blocks", 6)] + ([("decoder.layers", 5)] if head == "aed" else [])
    assert [(run.name, run.length) for run in tracer.block_runs] == expected
    for bucket, batch_size in (((2.0, 20), 4), ((12.0, 120), 48), ((1.0, 7), 300)):
        whole = tracer.trace(bucket, batch_size, every_block=True)
        cut = tracer.trace(bucket, batch_size)
        assert (cut.peak_allocated_bytes, cut.peak_reserved_bytes, cut.step_end_bytes, cut.state_bytes) == (
            whole.peak_allocated_bytes, whole.peak_reserved_bytes, whole.step_end_bytes, whole.state_bytes)
    assert [len(run.blocks) for run in tracer.block_runs] == [length for _, length in expected]  # put back whole
    assert not any(block._forward_hooks or block._forward_pre_hooks
                   for run in tracer.block_runs for block in run.blocks)  # and unhooked


def test_only_outer_runs_of_identical_blocks_are_cut():
    fake_mode = new_fake_mode()
    with fake_mode:
        same = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ModuleList(
            torch.nn.Linear(4, 4) for _ in range(5))) for _ in range(4))
        mixed = torch.nn.ModuleList([torch.nn.Linear(4, 4)] * 3 + [torch.nn.Linear(4, 8)])
        short = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(KEEP))
        holder = torch.nn.ModuleDict({"same": same, "mixed": mixed, "short": short})
    assert [(run.name, run.length) for run in find_block_runs(holder)] == [("same", 4)]


class EveryFourthDiffers(torch.nn.Module):
    """Keeps the model contract; 8 identical blocks, but every fourth one keeps a large extra tensor, which a
    trace of three blocks never sees."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(8))

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"x": torch.randn(batch_size, int(duration_s * 100), 64, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        x, kept = batch["x"], []  # the first block's input needs no gradient: its backward ends with the step
        for i, block in enumerate(self.blocks):
            x = torch.relu(block(x))
            if i % 4 == 3:
                kept.append(x.repeat(1, 1, 8))
        loss = x.sum() + sum(k.sum() for k in kept)
        loss.backward()
        return loss.detach()


def test_a_plan_traces_every_block_where_the_cut_trace_differs():
    fake_mode = new_fake_mode()
    with fake_mode:
        model = EveryFourthDiffers()
    probe = PlannedProbe(model, fake_mode, 1 * GiB, margin_bytes=0)
    whole = StepTracer(model, fake_mode).trace((1.0, 4), 16)
    assert probe((1.0, 4), 16) == whole.peak_allocated_bytes
    assert "every block traced, since the cut trace at 1 s / 4 tokens, batch size 16: its peak" in probe.block_check
    assert probe.tracer.block_runs == [] and probe((1.0, 4), 16) == whole.peak_allocated_bytes


def test_a_plan_with_the_cut_trace_finds_the_same_sizes():
    bins = BucketProfile([[2.0, 20], [2.0, 30], [6.0, 60], [6.0, 90]])
    results = {}
    for repeated in (True, False):
        fake_mode = new_fake_mode()
        profile, result = plan_profile(_deep("aed", fake_mode), fake_mode, "deep-aed", bins, gpu_memory="2GiB",
                                       margin_bytes=0, merge=False, repeated_blocks=repeated)
        results[repeated] = (result.batch_sizes, [(r.bucket_index, r.batch_size, r.peak_bytes) for r in result.probes],
                             profile.metadata["plan"]["repeated_blocks"])
    assert results[True][:2] == results[False][:2]
    assert results[True][2].startswith("encoder.blocks (6 blocks), decoder.layers (5 blocks) traced 3 blocks each: "
                                       "the same peak as every block at 6 s / 90 tokens")
    assert results[False][2] == "every block traced"


def test_marks_missing_or_out_of_order_say_so():
    fake_mode = new_fake_mode()
    model = _deep("ctc", fake_mode)
    runs = find_block_runs(model)
    # the template's forward adds 10 small-pool bytes, its backward frees them; 100 large ones come and go between
    events, born = np.array([[10, 0], [0, 100], [-10, 0], [0, -100]]), np.array([-1, -1, 0, 1])
    complete = [(0, b, kind, p) for b in range(KEEP) for kind, p in zip(("fs", "fe", "bs", "be"), (0, 1, 2, 3))]
    small, large = grown_timeline(events, born, (5, 7), runs, complete)  # 6 blocks: 3 cut, each stretch 3 more times
    assert small.tolist() == [5, 15, 25, 35, 45, 45, 35, 25, 15, 5, 5]
    assert large.tolist() == [7, 7, 7, 7, 7, 107, 107, 107, 107, 107, 7]
    with pytest.raises(NotRepeatable, match=r"encoder.blocks\[1\]: its forward and backward marked once each"):
        grown_timeline(events, born, (5, 7), runs, [m for m in complete if m[1:3] != (1, "bs")])
    with pytest.raises(NotRepeatable, match="out of order"):
        grown_timeline(events, born, (5, 7), runs, [(r, b, k, 3 - p if b == 2 else p) for r, b, k, p in complete])


class IndexesTheLastBlock(EveryFourthDiffers):
    """Keeps the model contract; its step reads the eighth block by index, which a cut run does not have."""

    def training_step(self, batch, *, dtype=torch.float32):
        x = batch["x"]
        for block in self.blocks:
            x = torch.relu(block(x))
        loss = self.blocks[7](x).sum()
        loss.backward()
        return loss.detach()


def test_a_model_that_fails_cut_short_is_traced_whole():
    fake_mode = new_fake_mode()
    with fake_mode:
        model = IndexesTheLastBlock()
    probe = PlannedProbe(model, fake_mode, 1 * GiB, margin_bytes=0)
    assert probe((1.0, 4), 16) == StepTracer(model, fake_mode).trace((1.0, 4), 16).peak_allocated_bytes
    assert "every block traced, since the cut trace at 1 s / 4 tokens, batch size 16: cannot trace" in probe.block_check
    assert probe.tracer.block_runs == [] and len(model.blocks) == 8
