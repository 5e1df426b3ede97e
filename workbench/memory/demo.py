"""A small live demo for the notebook: training steps of an MLP with a batch shape that changes every
step, recorded with MemoryRecorder. Takes a few seconds on any CUDA GPU."""

from __future__ import annotations

from workbench.memory.telemetry import MemoryRecorder


def dynamic_shape_steps(num_steps: int = 20, *, seed: int = 0, width: int = 2048, max_rows: int = 32768):
    """Run ``num_steps`` steps with between max_rows/8 and max_rows rows (drawn with ``seed``) of an MLP of
    ``width``; returns the MemoryRecorder frame (one row per step, with a ``rows`` column)."""
    import numpy as np
    import torch

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    rng = np.random.default_rng(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = MemoryRecorder()
    for rows in rng.integers(max_rows // 8, max_rows + 1, num_steps):
        with rec.step(rows=int(rows)):
            x = torch.randn(int(rows), width, device="cuda")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return rec.to_frame()
