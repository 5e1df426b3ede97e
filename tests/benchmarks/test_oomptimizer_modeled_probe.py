"""The OOMptimizer bench's modeled probe runs the real step and leaves the model as it was."""

import torch

from benchmarks.oomptimizer.modeled_probe import ModeledMemoryProbe


def test_probing_leaves_the_model_weights_as_they_were():
    from workbench.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny-rnnt")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = ModeledMemoryProbe(model, budget_bytes=1 << 40)
    assert probe((1.0, 5), 2) > 0  # a real step with the real optimizer (lr 0) ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    moved = ModeledMemoryProbe(model, budget_bytes=1 << 40, lr=1e-2)
    moved((1.0, 5), 2)
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the check can fail
