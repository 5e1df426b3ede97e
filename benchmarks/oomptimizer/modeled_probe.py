"""The OOMptimizer bench's stand-in probe for smoke runs without CUDA: the real step, a modeled peak."""

from __future__ import annotations

import torch

from workbench.oomptimizer.probe import buffers_kept
from workbench.units import MiB


class ModeledMemoryProbe:
    """Smoke-run stand-in for :class:`TrainingStepProbe` where CUDA is absent: same interface, same real
    step, modeled peak.

    Each call runs the real ``model.make_batch`` + ``model.training_step`` + AdamW step on the model's
    device (so the code path is the GPU one), but a CPU has no allocator statistics to measure, so the
    peak is *modeled*: ``base_bytes`` (weights, gradients and two AdamW moments: 4 x parameter bytes, one
    more gradient copy with ``ddp_gradient_buckets``) + ``bytes_per_element`` x the number of elements in
    the batch dict. Above ``budget_bytes`` it raises ``torch.OutOfMemoryError`` without running the step.
    Under ``torch.distributed`` (gloo) every rank sees the largest peak and an OOM when any rank has one.
    """

    def __init__(self, model: torch.nn.Module, *, dtype: torch.dtype = torch.float32, budget_bytes: float,
                 bytes_per_element: float = 256.0, ddp_gradient_buckets: bool = False, lr: float = 0.0):
        if not budget_bytes > 0:
            raise ValueError(f"budget_bytes: must be positive, got {budget_bytes}")
        self.model, self.dtype, self.lr = model, dtype, lr
        self.device = next(model.parameters()).device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grad_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.ddp_gradient_buckets = ddp_gradient_buckets
        self.base_bytes = 4 * self.grad_bytes + (self.grad_bytes if ddp_gradient_buckets else 0)
        self.bytes_per_element = float(bytes_per_element)
        self.budget_bytes = float(budget_bytes)
        self.baseline_bytes = 0  # nothing is measured on a CPU
        self.distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1

    def modeled_peak(self, batch: dict[str, torch.Tensor]) -> float:
        """base_bytes + bytes_per_element x elements of every tensor in the batch."""
        return self.base_bytes + self.bytes_per_element * sum(t.numel() for t in batch.values())

    def __call__(self, bucket: tuple[float, float], batch_size: int) -> float:
        duration, tokens = float(bucket[0]), int(round(bucket[1]))
        batch = self.model.make_batch(int(batch_size), duration, tokens, self.device)
        peak = self.modeled_peak(batch)
        ok = peak <= self.budget_bytes
        if ok:
            optimizer = torch.optim.AdamW(self.params, lr=self.lr)
            try:
                with buffers_kept(self.model):
                    loss = self.model.training_step(batch, dtype=self.dtype)
                    if not torch.isfinite(loss):
                        raise RuntimeError(f"loss is not finite ({float(loss)}) at batch size {batch_size}, "
                                           f"{duration:g} s / {tokens} tokens")
                    optimizer.step()
            finally:
                del optimizer
                self.model.zero_grad(set_to_none=True)
        del batch
        if self.distributed:  # any rank OOM -> all OOM; the largest peak decides
            flags = torch.tensor([0.0 if ok else 1.0, peak], dtype=torch.float64)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            ok, peak = flags[0].item() == 0.0, flags[1].item()
        if not ok:
            raise torch.OutOfMemoryError(f"modeled: batch size {batch_size} at {duration:g} s / {tokens} "
                                         f"tokens needs {peak / MiB:.1f} MiB > {self.budget_bytes / MiB:.1f} MiB")
        return float(peak)
