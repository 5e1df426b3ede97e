"""The GPU probe: one real training step (forward, loss, backward, optimizer step) at a bucket's worst case.

Runs under ``torch.cuda.set_per_process_memory_fraction`` with expandable segments on (the allocator
settings training uses), returns the peak allocated bytes of the step (near the limit the allocator
frees its cache to fit, so peak reserved bytes saturate while allocated bytes stay linear in the batch), and raises
``torch.OutOfMemoryError`` for an OOM, including the ones in disguise (cuFFT, cuDNN, cuBLAS allocation
failures). Whatever the step held is released before returning, so every probe starts clean and the
process's allocated memory after a search is what it was before.

Data parallel: ``ddp_gradient_buckets=True`` holds an extra gradient-sized buffer through the step, as
DDP's gradient buckets do. Under torchrun (``torch.distributed`` initialized, several ranks) the
gradients are all-reduced through that buffer, and every rank sees the largest peak of all ranks and an
OOM when any rank ran out.
"""

from __future__ import annotations

import contextlib

import torch

from workbench.memory.oom import is_oom_error, release_memory
from workbench.units import GiB


@contextlib.contextmanager
def buffers_kept(model: torch.nn.Module):
    """Put the model's buffers (batch-norm running statistics and the like) back after a probe step, so
    probing with random batches leaves a trained model as it was."""
    saved = [(b, b.clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


class TrainingStepProbe:
    """``probe(bucket, batch_size) -> peak bytes`` for ``search_batch_sizes``; ``.budget_bytes`` is
    the memory fraction of the device in bytes, ``.baseline_bytes`` the allocated bytes before any probe.

    The optimizer step runs for real (its memory is part of the step) with ``lr=0`` by default, and the
    buffers are put back, so probing leaves the model as it was (AdamW's weight decay is scaled by lr too).
    """

    def __init__(self, model: torch.nn.Module, *, dtype: torch.dtype = torch.bfloat16,
                 memory_fraction: float = 0.9, ddp_gradient_buckets: bool = False, lr: float = 0.0,
                 device: int | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("the training-step probe needs a CUDA GPU")
        if not 0 < memory_fraction <= 1:
            raise ValueError(f"memory_fraction: must be in (0, 1], got {memory_fraction}")
        self.model, self.dtype, self.lr = model, dtype, lr
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        self.memory_fraction = memory_fraction
        self.ddp_gradient_buckets = ddp_gradient_buckets
        torch.cuda.set_per_process_memory_fraction(memory_fraction, self.device)
        self.total_bytes = torch.cuda.get_device_properties(self.device).total_memory
        self.budget_bytes = memory_fraction * self.total_bytes
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grad_bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1
        release_memory()
        self.baseline_bytes = torch.cuda.memory_allocated(self.device)
        # Flags for the cross-rank agreement live outside the probe so that they exist even after an OOM.
        self._flags = torch.zeros(2, dtype=torch.float64, device=self.device) if self.distributed else None

    def __call__(self, bucket: tuple[float, float], batch_size: int) -> float:
        duration, tokens = float(bucket[0]), int(round(bucket[1]))
        release_memory()
        torch.cuda.reset_peak_memory_stats(self.device)
        with buffers_kept(self.model):
            ok, peak = self._step(duration, tokens, int(batch_size))
        release_memory()
        if self.distributed:  # any rank OOM -> all OOM; the largest peak decides
            self._flags[0], self._flags[1] = (0.0 if ok else 1.0), float(peak)
            torch.distributed.all_reduce(self._flags, op=torch.distributed.ReduceOp.MAX)
            ok, peak = self._flags[0].item() == 0.0, self._flags[1].item()
        if not ok:
            raise torch.OutOfMemoryError(f"batch size {batch_size} at {duration:g} s / {tokens} tokens "
                                         f"does not fit in {self.budget_bytes / GiB:.1f} GiB")
        return float(peak)

    def warm_up(self, bucket: tuple[float, float], batch_size: int = 2) -> None:
        """One step outside the search (a torch.compile'd model compiles in it), after which the baseline
        is read again: what compiling keeps on the device is not counted as a probe's leftover. An OOM
        here is ignored (the search finds it again)."""
        with buffers_kept(self.model):
            self._step(float(bucket[0]), int(round(bucket[1])), batch_size)
        release_memory()
        self.baseline_bytes = torch.cuda.memory_allocated(self.device)

    def _step(self, duration: float, tokens: int, batch_size: int) -> tuple[bool, float]:
        optimizer = bucket_buffer = batch = None
        ok, peak = True, 0.0
        try:
            try:
                optimizer = torch.optim.AdamW(self.params, lr=self.lr)
                # Optimizer state exists before the forward in steady-state training: create it first.
                for p in self.params:
                    p.grad = torch.zeros_like(p)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if self.ddp_gradient_buckets:
                    bucket_buffer = torch.empty(self.grad_bytes, dtype=torch.uint8, device=self.device)
                batch = self.model.make_batch(batch_size, duration, tokens, self.device)
                self.model.training_step(batch, dtype=self.dtype)
            except Exception as e:  # noqa: BLE001 - anything that is not an OOM is re-raised
                if not is_oom_error(e):
                    raise
                ok = False
            if self.distributed:  # every rank reaches this point once per probe, OOM or not
                ok = self._all_ranks_ok(ok)
            if ok:
                try:
                    if bucket_buffer is not None:
                        self._reduce_gradients(bucket_buffer)
                    optimizer.step()
                    torch.cuda.synchronize(self.device)
                    peak = float(torch.cuda.max_memory_allocated(self.device))
                except Exception as e:  # noqa: BLE001
                    if not is_oom_error(e):
                        raise
                    ok = False
            return ok, peak
        finally:
            del optimizer, bucket_buffer, batch
            self.model.zero_grad(set_to_none=True)

    def _reduce_gradients(self, buffer: torch.Tensor) -> None:
        """Copy gradients into the flat buffer (all-reduced across ranks under torchrun) and back."""
        offset = 0
        views = []
        for p in self.params:
            nbytes = p.numel() * p.element_size()
            view = buffer[offset:offset + nbytes].view(p.dtype).view_as(p)
            if p.grad is not None:
                view.copy_(p.grad)
            views.append((p, view))
            offset += nbytes
        if self.distributed:
            torch.distributed.all_reduce(buffer)  # the bytes travel like DDP's buckets; values unused
        for p, view in views:
            if p.grad is not None:
                p.grad.copy_(view)

    def _all_ranks_ok(self, ok: bool) -> bool:
        self._flags[0] = 1.0 if ok else 0.0
        torch.distributed.all_reduce(self._flags[:1], op=torch.distributed.ReduceOp.MIN)
        return self._flags[0].item() == 1.0
