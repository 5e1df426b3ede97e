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


class Blocks(torch.nn.Module):
    """Keeps the model contract: an input layer, then 8 identical blocks (linear + ReLU) and a sum."""

    def __init__(self):
        super().__init__()
        self.inputs = torch.nn.Linear(64, 64)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
                                          for _ in range(8))

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        return {"x": torch.randn(batch_size, int(duration_s * 100), 64, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        x = self.inputs(batch["x"])
        for i, block in enumerate(self.blocks):
            x = self.after_block(i, block(x))
        loss = x.sum()
        loss.backward()
        return loss.detach()

    def after_block(self, i, x):
        return x


class EveryFourthKeeps(Blocks):
    """Every fourth block's output is kept four times over, which a trace of three blocks never sees."""

    def after_block(self, i, x):
        return x + 0 * x.repeat(1, 1, 4)[..., :64] if i % 4 == 3 else x


class EveryFourthScratch(Blocks):
    """Every fourth block makes a [B, 256, 256] scratch tensor and drops it: it sets the peak of short, wide
    batches only, so a check at a long bucket sees the same peak, but not the same bytes made."""

    def after_block(self, i, x):
        if i % 4 == 3:
            (torch.ones(x.shape[0], 256, 256) * 2).sum()
        return x


class GlueBetweenBlocks(Blocks):
    """Each block's output goes through a ReLU outside the blocks."""

    def after_block(self, i, x):
        return torch.relu(x)


def _probe(model_class):
    fake_mode = new_fake_mode()
    with fake_mode:
        model = model_class()
    return model, fake_mode, PlannedProbe(model, fake_mode, 1 * GiB, margin_bytes=0)


def test_identical_blocks_are_traced_cut_short_after_the_check():
    model, fake_mode, probe = _probe(Blocks)
    for bucket, size in (((1.0, 4), 16), ((0.05, 4), 64)):
        assert probe(bucket, size) == StepTracer(model, fake_mode).trace(bucket, size).peak_allocated_bytes
    assert probe.block_check.startswith("blocks (8 blocks) traced 3 blocks each: the same peaks and storages as "
                                        "every block")
    assert probe.tracer.block_runs  # still cut


@pytest.mark.parametrize("model_class, found", [
    (EveryFourthKeeps, "its peak"), (EveryFourthScratch, "its count of storages made"),
    (GlueBetweenBlocks, "the step makes tensors between blocks 0 and 1, outside both")])
def test_a_plan_traces_every_block_where_the_cut_trace_is_not_the_whole_one(model_class, found):
    model, fake_mode, probe = _probe(model_class)
    whole = StepTracer(model, fake_mode)
    assert probe((30.0, 4), 16) == whole.trace((30.0, 4), 16).peak_allocated_bytes  # long: activations set the peak
    assert "every block traced, since the cut trace at 30 s / 4 tokens, batch size 16: " in probe.block_check
    assert found in probe.block_check
    assert probe.tracer.block_runs == []
    assert probe((0.05, 4), 64) == whole.trace((0.05, 4), 64).peak_allocated_bytes  # where the scratch is the peak


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
                                       "the same peaks and storages as every block at 6 s / 90 tokens")
    assert results[False][2] == "every block traced"


def test_marks_missing_or_out_of_order_say_so():
    fake_mode = new_fake_mode()
    model = _deep("ctc", fake_mode)
    runs = find_block_runs(model)
    # the template's forward adds 10 small-pool bytes, its backward frees them; 100 large ones come and go between
    events, born = np.array([[10, 0], [0, 100], [-10, 0], [0, -100]]), np.array([-1, -1, 0, 1])
    positions = {0: (0, 0, 3, 3), 1: (0, 1, 2, 3), 2: (1, 1, 2, 2)}  # block 1's forward holds event 0, its backward 2
    complete = [(0, b, kind, p) for b in range(KEEP) for kind, p in zip(("fs", "fe", "bs", "be"), positions[b])]
    small, large = grown_timeline(events, born, (5, 7), runs, complete)  # 6 blocks: 3 cut, each stretch 3 more times
    assert small.tolist() == [5, 15, 25, 35, 45, 45, 35, 25, 15, 5, 5]
    assert large.tolist() == [7, 7, 7, 7, 7, 107, 107, 107, 107, 107, 7]
    with pytest.raises(NotRepeatable, match=r"encoder.blocks\[1\]: its forward and backward marked once each"):
        grown_timeline(events, born, (5, 7), runs, [m for m in complete if m[1:3] != (1, "bs")])
    with pytest.raises(NotRepeatable, match=r"encoder.blocks\[2\]: its marks are out of order"):
        grown_timeline(events, born, (5, 7), runs, [(r, b, k, 3 if (b, k) == (2, "fs") else p)
                                                    for r, b, k, p in complete])
    with pytest.raises(NotRepeatable, match="makes tensors between blocks 1 and 2"):
        grown_timeline(events, born, (5, 7), runs, [(r, b, k, 2 if (b, k) in ((2, "fs"), (2, "fe")) else p)
                                                    for r, b, k, p in complete])  # event 1 between them


class IndexesTheLastBlock(Blocks):
    """Its step reads the eighth block by index, which a cut run does not have."""

    def after_block(self, i, x):
        return self.blocks[7](x) - self.blocks[7](x) + x if i == 0 else x


def test_a_model_that_fails_cut_short_is_traced_whole():
    model, fake_mode, probe = _probe(IndexesTheLastBlock)
    assert probe((1.0, 4), 16) == StepTracer(model, fake_mode).trace((1.0, 4), 16).peak_allocated_bytes
    assert "every block traced, since the cut trace at 1 s / 4 tokens, batch size 16: cannot trace" in probe.block_check
    assert probe.tracer.block_runs == [] and len(model.blocks) == 8
