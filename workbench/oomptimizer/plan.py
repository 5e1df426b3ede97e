"""Planning without a GPU: the peak memory of one training step, predicted from a fake trace.

The step (AdamW state first, then ``make_batch``, ``training_step`` with backward, then the optimizer step, as
:class:`workbench.oomptimizer.probe.TrainingStepProbe` runs it) runs under torch's ``FakeTensorMode``: every
tensor, parameters, gradients and optimizer state included, has a shape, a dtype and a device but no data,
so nothing is computed and no memory is taken. A dispatch mode on top counts the bytes of every storage the
step creates while it lives (a weak reference per storage says when it is freed), rounded as the CUDA
caching allocator rounds a block (512 bytes), and keeps the peak.

What the trace can and cannot see:

- It traces on a fake *CPU* device: a CPU build of torch cannot create fake CUDA tensors (its factory
  functions need CUDA's device guard), so autocast follows the CPU's bf16 op list, except where the two
  devices keep different tensors for the backward (:class:`OpsAsOnCuda`): scaled-dot-product attention
  takes CUDA's kernels (flash attention without a mask, the memory-efficient kernel with one, neither
  materializing the [B, H, Tq, Tk] weights that the CPU's math path would); layer and group norm,
  softmax and log-softmax of half-precision inputs return float32, and cross-entropy keeps its
  log-probabilities in the logits' precision, as CUDA's autocast has them; dropout keeps a one-byte mask.
- Kernels are picked as on CUDA (:func:`workbench.triton_support.kernels_as_on_cuda`): the reference models
  take the path that runs on the GPU, the Triton transducer loss and depthwise convolutions and the
  channels-last subsampling. The kernels are torch custom ops (``workbench::...``) whose fake implementations
  make their outputs and the buffers the kernels get, so the trace counts them. Where triton does not import,
  the models take their torch path here as they would on the GPU. The profile says which path it traced
  (``metadata.plan.traced_path``).
- A value read back to the host (``.item()``, ``.tolist()``, ``if tensor:``) has no data to read: it reads
  as 0 for integers and booleans (the input checks' counts of bad values) and 1.0 for floats (AdamW's step
  count). ``host_reads`` counts them.
- CTC's lengths are taken from the padded shapes (the worst case of a bucket), as its output's shape
  depends on the longest target; ``masked_select``, ``nonzero`` and indexing by a boolean mask select
  every element, for the same reason.
- cuBLAS and cuDNN workspaces, and the allocator's fragmentation, are not traced: the margin covers them.
- A plan traces each run of identical blocks cut to three and grows the timeline back to full depth
  (:mod:`workbench.oomptimizer.repeated_blocks`): the same peaks for a fraction of the trace, checked against
  a whole trace once per plan (:meth:`PlannedProbe.check_block_runs`).

How close the traced peaks come to a GPU's measured ones: benchmarks/results/plan_calibration.json (from
the H200) and plan_replay.json (each recorded probe traced again, ``python -m
benchmarks.plan_calibration.replay``). Where a model's trace and a GPU's peak part, ``python -m
benchmarks.plan_calibration.live_at_peak`` on a GPU lists the tensors live at both peaks by model line.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, is_fake
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workbench.oomptimizer.repeated_blocks import KEEP as KEEP_BLOCKS
from workbench.oomptimizer.repeated_blocks import (NotRepeatable, cut_runs, find_block_runs, grown_allocations,
                                                   grown_timeline)
from workbench.triton_support import kernels_as_on_cuda, triton_unavailable_reason
from workbench.units import GiB, MiB

BLOCK_ROUNDING = 512  # bytes: the caching allocator rounds every block up to a multiple of this
SMALL_BLOCK_LIMIT = 1 * MiB  # bytes: blocks up to this size come from the small pool
PAGE_BYTES = 2 * MiB  # bytes: small-pool segments, and the pages expandable segments grow by
DEFAULT_MARGIN_BYTES = 1 * GiB  # bytes kept free for cuBLAS/cuDNN workspaces and fragmentation
KERNEL_MODULES = ("workbench.models.losses_triton", "workbench.models.depthwise_triton",
                  "workbench.models.time_conv_triton", "workbench.models.fused_joint_triton")  # the Triton kernels a reference model's step may run

# torch.cuda.get_device_properties(...).total_memory of each GPU, in bytes (0.01 GiB as torch's out-of-memory
# messages print it); calibrate against the GPU where one is at hand.
GPU_MEMORY_BYTES = {
    "a100-40gb": round(39.39 * GiB),
    "a100-80gb": round(79.15 * GiB),
    "h100-80gb": round(79.11 * GiB),
    "h200": round(139.81 * GiB),
    "l40s": round(44.39 * GiB),
}

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in "80GiB", "80GB" (10^9), "81920MiB", "1.5 TiB" or a plain number of bytes; a one-line
    ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: expected a number and a unit, e.g. 80GiB, 80GB or 81920MiB")
    size = int(float(match.group(1)) * SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r}: a memory size must be positive")
    return size


def gpu_memory_bytes(name_or_size: str) -> int:
    """Bytes of a named GPU (see GPU_MEMORY_BYTES, any case) or of a size such as 80GiB."""
    known = GPU_MEMORY_BYTES.get(name_or_size.strip().lower())
    if known is not None:
        return known
    if not re.match(r"\s*[\d.]", name_or_size):
        raise ValueError(f"--gpu-memory {name_or_size!r}: not a GPU we know ({', '.join(GPU_MEMORY_BYTES)}) "
                         "nor a size such as 80GiB")
    try:
        return parse_size(name_or_size)
    except ValueError as e:
        raise ValueError(f"--gpu-memory: {e}") from None


def block_bytes(nbytes: int) -> int:
    """Bytes the caching allocator holds for a storage of ``nbytes``: rounded up to 512 (0 stays 0)."""
    return -(-nbytes // BLOCK_ROUNDING) * BLOCK_ROUNDING


def reserved_bytes(small_bytes: int, large_bytes: int) -> int:
    """Reserved memory under expandable segments for live small- and large-pool blocks (bytes): each pool
    grows by 2 MiB pages; fragmentation inside a pool is not modeled."""
    pages = -(-small_bytes // PAGE_BYTES) + -(-large_bytes // PAGE_BYTES)
    return pages * PAGE_BYTES


class PlanError(ValueError):
    """A step that cannot be traced; the message names the operation."""


class DeviceMemoryTracker(TorchDispatchMode):
    """Counts the bytes of the storages that ops create while they live: ``allocated_bytes`` now,
    ``peak_allocated_bytes`` and ``peak_reserved_bytes`` (see :func:`reserved_bytes`) since the last
    :meth:`reset_peak`. ``track`` counts a tensor made outside an op. Also answers host reads (module doc)."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[weakref.ref, int]] = {}  # id(storage) -> (weak reference, block bytes)
        self.small_bytes = self.large_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.host_reads = 0
        self.last_op = None  # the op dispatched last, named when a trace fails
        self.allocations = self.allocated_total = 0  # storages counted so far, and their bytes
        self.events: list[tuple[int, int, int]] | None = None  # while recording: see record_events
        self._born: dict[int, int] = {}  # id(storage) -> the event that made it, while recording

    def record_events(self) -> tuple[int, int]:
        """From now on keep every allocation and free as (small-pool bytes, large-pool bytes, born) in
        ``events``, where born is -1 for an allocation and, for a free, the event that made the storage (-2
        for one made before); returns the pools' bytes now."""
        self.events, self._born = [], {}
        return self.small_bytes, self.large_bytes

    def events_so_far(self) -> int:
        return len(self.events) if self.events is not None else 0

    @property
    def allocated_bytes(self) -> int:
        return self.small_bytes + self.large_bytes

    def reset_peak(self) -> None:
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = reserved_bytes(self.small_bytes, self.large_bytes)

    def track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta":  # shape only, no memory on any device
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live and self._live[key][0]() is storage:
            return
        nbytes = block_bytes(storage.nbytes())
        small = nbytes <= SMALL_BLOCK_LIMIT
        self._live[key] = (weakref.ref(storage, lambda _ref, key=key: self._free(key)), nbytes)
        self.allocations += 1
        self.allocated_total += nbytes
        if self.events is not None:
            self._born[key] = len(self.events)
            self.events.append((nbytes if small else 0, 0 if small else nbytes, -1))
        self._add(nbytes if small else 0, 0 if small else nbytes)

    def _free(self, key: int) -> None:
        _, nbytes = self._live.pop(key)
        small = nbytes <= SMALL_BLOCK_LIMIT
        if self.events is not None:
            self.events.append((-nbytes if small else 0, 0 if small else -nbytes, self._born.pop(key, -2)))
        self._add(-nbytes if small else 0, 0 if small else -nbytes)

    def _add(self, small: int, large: int) -> None:
        self.small_bytes += small
        self.large_bytes += large
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved_bytes(self.small_bytes, self.large_bytes))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default and isinstance(args[0], FakeTensor):
            return args[0].fake_device  # most calls of a trace: answered here, as the fake mode would
        self.last_op = func
        if func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
            return 1.0 if args[0].dtype.is_floating_point else 0
        if func in WORST_CASE_OUTPUTS:
            out = WORST_CASE_OUTPUTS[func](*args)
        else:
            out = func(*args, **(kwargs or {}))
        for value in (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self.track(value)
        return out


def _ctc_loss_outputs(log_probs, targets, *_):
    """CTC's outputs (losses [B], alphas [B, T, 2 S + 1]) for targets as long as their padded width S (or, for
    targets concatenated in one row, their length over B): the shape depends on the longest target, which a
    fake tensor cannot read (a bucket's worst case is that)."""
    frames, batch = log_probs.shape[0], log_probs.shape[1]
    width = targets.shape[-1] if targets.dim() == 2 else -(-targets.shape[0] // batch)
    return log_probs.new_empty(batch), log_probs.new_empty(batch, frames, 2 * width + 1)


def _masked_select_output(values, mask):
    """Every element selected: the worst case of an output whose size depends on the mask's values."""
    return values.new_empty(torch.broadcast_shapes(values.shape, mask.shape).numel())


def _nonzero_output(values):
    """Every element nonzero (the worst case): indices [N, dims]."""
    return values.new_empty((values.numel(), values.dim()), dtype=torch.long)


def _index_output(values, indices):
    """``values[mask]`` with every element of each boolean mask selected (the worst case)."""
    positions = []
    for index in indices:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            positions.extend(_nonzero_output(index).unbind(1))
        else:
            positions.append(index)
    return torch.ops.aten.index.Tensor(values, positions)


# ops whose output shape depends on values a fake tensor does not have: their largest output
WORST_CASE_OUTPUTS = {torch.ops.aten._ctc_loss.Tensor: _ctc_loss_outputs,
                      torch.ops.aten._ctc_loss.default: _ctc_loss_outputs,
                      torch.ops.aten.masked_select.default: _masked_select_output,
                      torch.ops.aten.nonzero.default: _nonzero_output,
                      torch.ops.aten.index.Tensor: _index_output}


@dataclass
class StepMemory:
    """Predicted memory of one training step (bytes)."""
    peak_allocated_bytes: int  # what torch.cuda.max_memory_allocated would report
    peak_reserved_bytes: int  # what the allocator reserves for it under expandable segments
    state_bytes: int  # parameters, gradients' and AdamW's state held before the batch exists
    host_reads: int  # values read back to the host during the trace (answered, not computed)
    step_end_bytes: int = 0  # allocated when the backward has ended, before the optimizer step
    step_allocations: int = 0  # storages the step made (the batch, forward and backward)
    step_allocated_bytes: int = 0  # their bytes, each rounded as a block


class OpsAsOnCuda(TorchFunctionMode):
    """The ops whose saved tensors differ between the CPU and CUDA, run as CUDA runs them, for fake CPU tensors:

    - ``F.scaled_dot_product_attention``: q, k, v (and a float mask) in autocast's dtype when autocast is on
      (SDPA is on both devices' lower-precision lists), then flash attention (half precision, no mask, head
      size a multiple of 8 up to 256) or the memory-efficient kernel. Both save only the output and a float32
      log-sum-exp per query for the backward, where the CPU's math path keeps the [B, H, Tq, Tk] weights (and
      its dropout mask).
    - CUDA autocast's float32 ops that the CPU's autocast leaves in half precision: layer and group norm take
      a float32 copy of a half-precision input (which they save) and return float32; softmax and
      log-softmax compute and return float32; a sum returns float32, and its backward casts the gradient back
      to a half-precision tensor of the input's shape.
    - Cross-entropy of half-precision logits as CUDA's autocast runs it: the log-softmax in the logits' dtype
      (the op passes it), then the NLL of class indices on autocast's float32 copy, or the product with
      probability targets in the dtype the two promote to; its sums over the classes (label smoothing's, the
      product's) of half precision in float32, whose backward casts the gradient back to a half [N, C]. The
      CPU's autocast casts the logits first, which makes every [N, C] tensor of the loss and its backward
      float32.
    - Dropout as CUDA's fused kernel: a one-byte mask per element, where the CPU's path keeps a noise tensor
      of the input's dtype."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            return _attention_as_on_cuda(*args, **kwargs)
        if func not in _CUDA_AUTOCAST_OPS:
            return func(*args, **kwargs)
        tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        if not any(is_fake(t) for t in tensors):  # a real computation: as it is
            return func(*args, **kwargs)
        if func in _FLOAT32_NORMS and any(_autocast_half(t) for t in tensors):  # every floating argument float32
            return func(*_half_to_float(args), **dict(zip(kwargs, _half_to_float(kwargs.values()))))
        if (func in _FLOAT32_SOFTMAX and len(args) <= 2 and kwargs.get("dtype") is None
                and _autocast_half(tensors[0])):
            return func(*args, **{**kwargs, "dtype": torch.float32})
        if func in _FLOAT32_SUMS and kwargs.get("dtype") is None and _autocast_half(tensors[0]):
            return func(*args, **{**kwargs, "dtype": torch.float32})
        if func is torch.nn.functional.dropout:
            return _dropout_as_on_cuda(*args, **kwargs)
        if func is torch.nn.functional.cross_entropy and _autocast_half(tensors[0]):
            return _cross_entropy_as_on_cuda(*args, **kwargs)
        return func(*args, **kwargs)


HALF_DTYPES = (torch.float16, torch.bfloat16)
_FLOAT32_NORMS = (torch.nn.functional.layer_norm, torch.nn.functional.group_norm, torch.layer_norm,
                  torch.group_norm)
_FLOAT32_SOFTMAX = (torch.nn.functional.softmax, torch.nn.functional.log_softmax, torch.softmax,
                    torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax)
_FLOAT32_SUMS = (torch.sum, torch.Tensor.sum)
_CUDA_AUTOCAST_OPS = {*_FLOAT32_NORMS, *_FLOAT32_SOFTMAX, *_FLOAT32_SUMS, torch.nn.functional.dropout,
                      torch.nn.functional.cross_entropy}


def _autocast_half(x) -> bool:
    """x is a half-precision tensor under autocast (where CUDA's autocast would cast it to float32)."""
    return isinstance(x, torch.Tensor) and x.dtype in HALF_DTYPES and torch.is_autocast_enabled(x.device.type)


def _half_to_float(values) -> list:
    return [v.float() if isinstance(v, torch.Tensor) and v.dtype in HALF_DTYPES else v for v in values]


def _cross_entropy_as_on_cuda(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                              reduction="mean", label_smoothing=0.0):
    """``F.cross_entropy`` as ATen composes it, with CUDA's autocast casts (see OpsAsOnCuda): the log-softmax in
    the logits' dtype, then the NLL of class indices (on a float32 copy, nll_loss being on autocast's float32
    list) or the product with probability targets (in the dtype the two promote to); sums of half precision in
    float32. What torch would refuse goes to torch, which says why."""
    class_dim = 0 if input.dim() == 1 else 1
    if (size_average is not None or reduce is not None or not 0 <= label_smoothing <= 1
            or reduction not in ("none", "mean", "sum") or input.dim() == 0
            or (target.is_floating_point()
                and not _probability_targets_fit(input, target, weight, ignore_index, class_dim))):
        return torch.nn.functional.cross_entropy(input, target, weight, size_average, ignore_index, reduce,
                                                 reduction, label_smoothing)
    log_probs = torch.log_softmax(input, class_dim, dtype=input.dtype)
    if target.is_floating_point():
        return _probability_cross_entropy(log_probs, target, weight, reduction, label_smoothing, class_dim)
    loss = torch.nn.functional.nll_loss(log_probs, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing <= 0:
        return loss
    ignored = target == ignore_index
    class_shape = [-1 if d == class_dim else 1 for d in range(input.dim())]
    weighted = log_probs if weight is None else log_probs * weight.view(class_shape)
    smooth = (-_sum_as_on_cuda(weighted, class_dim)).masked_fill(ignored, 0.0)
    if reduction == "mean":
        counted = (~ignored).sum() if weight is None else weight[target.masked_fill(ignored, 0)].masked_fill(ignored, 0).sum()
        smooth = smooth.sum() / counted
    elif reduction == "sum":
        smooth = smooth.sum()
    return (1 - label_smoothing) * loss + smooth * (label_smoothing / input.shape[class_dim])


def _probability_targets_fit(input, target, weight, ignore_index, class_dim) -> bool:
    """Probability targets that torch's cross-entropy takes: the logits' shape, some classes, no ignore_index and
    a weight of one value per class."""
    classes = input.shape[class_dim]
    return (target.shape == input.shape and classes > 0 and ignore_index < 0
            and (weight is None or tuple(weight.shape) == (classes,)))


def _sum_as_on_cuda(x: torch.Tensor, dim=None) -> torch.Tensor:
    """A sum as CUDA's autocast runs it: in float32 for a half-precision input (sum is on its float32 list)."""
    dtype = torch.float32 if _autocast_half(x) else None
    return x.sum(dtype=dtype) if dim is None else x.sum(dim, dtype=dtype)


def _probability_cross_entropy(log_probs, target, weight, reduction, label_smoothing, class_dim):
    """The cross-entropy of probability targets from the log-probabilities, in ATen's order of operations."""
    classes = log_probs.shape[class_dim]
    if label_smoothing > 0:
        target = target * (1 - label_smoothing) + label_smoothing / classes
    product = log_probs * target
    if weight is not None:
        product = product * weight.view([-1 if d == class_dim else 1 for d in range(log_probs.dim())])
    if reduction == "none":
        return -_sum_as_on_cuda(product, class_dim)
    if reduction == "sum":
        return -_sum_as_on_cuda(product)
    return -_sum_as_on_cuda(product) / (log_probs.numel() / classes)


def _dropout_as_on_cuda(input, p=0.5, training=True, inplace=False):
    if training and 0 < p < 1 and not inplace and input.numel() > 0:
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return torch.nn.functional.dropout(input, p, training, inplace)


def _attention_as_on_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                          enable_gqa=False):
    if enable_gqa and key.shape[-3] != query.shape[-3]:  # grouped heads: each key head serves several queries
        repeats = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeats, -3), value.repeat_interleave(repeats, -3)
    if torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    head_size = query.shape[-1]
    if (attn_mask is None and query.dtype in HALF_DTYPES and head_size % 8 == 0
            and head_size <= 256):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # SDPA's conversion: -inf where False
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            attn_mask.logical_not(), float("-inf"))
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, needs_grad, dropout_p, is_causal, scale=scale)[0]


def new_fake_mode() -> FakeTensorMode:
    """A fake-tensor mode for building and tracing a model (real tensors may enter: they are faked)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def traced_path(cuda_kernels: bool = True) -> str:
    """What a trace runs, in words (``metadata.plan.traced_path``): with ``cuda_kernels``, the kernels CUDA
    would run (:class:`StepTracer`)."""
    problem = next(filter(None, (triton_unavailable_reason("cuda", kernels_module=m) for m in KERNEL_MODULES)),
                   None) if cuda_kernels else "the CPU's choice"
    if problem is None:
        return ("torch ops on a fake CPU device, kernels as on CUDA (Triton losses, fused joint + loss and "
                "depthwise convolutions by their custom ops' fakes, flash and memory-efficient attention, CUDA autocast's "
                "float32 norms, softmax and cross-entropy, dropout's one-byte mask)")
    return f"torch ops on a fake CPU device (CPU autocast list, torch kernels, no Triton: {problem})"


def build_fake_reference_model(name: str, fake_mode: FakeTensorMode, *, joint_chunk_size: int = 0,
                               joint_loss: str = "materialized"):
    """A reference model (e.g. large-rnnt) whose weights are fake (no memory); its kernels are picked per
    step ("auto"), so a :class:`StepTracer` traces those CUDA would run."""
    from workbench.models import build_model

    with fake_mode:
        return build_model(name, joint_chunk_size=joint_chunk_size, joint_loss=joint_loss)


def build_fake_user_model(spec: str, fake_mode: FakeTensorMode):
    """A model that keeps the model contract (MODULE:CALLABLE or an adapter's name), built with fake weights."""
    from workbench.adapters import build_model_from_spec, user_model_spec

    with fake_mode:
        return build_model_from_spec(user_model_spec(spec) or spec, None)  # a failing factory: one line


class StepTracer:
    """Traces training steps of ``model`` (built under ``fake_mode``): ``trace(bucket, batch_size)`` ->
    :class:`StepMemory`. AdamW's state is made once, as in steady-state training; the optimizer step's own
    temporaries (bytes above what is live when it starts) are traced once here and added to each step.
    ``cuda_kernels``: the step picks its kernels as on CUDA (:func:`kernels_as_on_cuda`: the Triton kernels by
    their fakes); False: as on the CPU (torch's)."""

    def __init__(self, model: torch.nn.Module, fake_mode: FakeTensorMode, *, dtype: torch.dtype = torch.bfloat16,
                 ddp_gradient_buckets: bool = False, cuda_kernels: bool = True, repeated_blocks: bool = False):
        self.model, self.fake_mode, self.dtype, self.cuda_kernels = model, fake_mode, dtype, cuda_kernels
        # runs of identical blocks traced cut short and grown back (repeated_blocks.py); [] traces every block
        self.block_runs = find_block_runs(model) if repeated_blocks else []
        self.params = [p for p in model.parameters() if p.requires_grad]
        tracker = DeviceMemoryTracker()
        with fake_mode, tracker, _naming_the_operation(tracker, "creating AdamW's state"):
            self._track_state(tracker)
            self.optimizer = torch.optim.AdamW(self.params, lr=0.0, foreach=True)  # foreach: CUDA's default
            for p in self.params:
                p.grad = torch.zeros_like(p)
            self.optimizer.step()  # creates the state
            tracker.reset_peak()
            before = tracker.allocated_bytes
            self.optimizer.step()
            self.optimizer_step_bytes = tracker.peak_allocated_bytes - before
            self.optimizer.zero_grad(set_to_none=True)
            self.gradient_buffer = (torch.empty(sum(p.numel() * p.element_size() for p in self.params),
                                                dtype=torch.uint8) if ddp_gradient_buckets else None)

    def _track_state(self, tracker: DeviceMemoryTracker) -> None:
        """Count the tensors that live across steps: weights, buffers, AdamW's state, DDP's buffer."""
        state = getattr(self, "optimizer", None)
        tensors = [*self.model.parameters(), *self.model.buffers()]
        if state is not None:
            tensors += [t for s in state.state.values() for key, t in s.items()
                        if key != "step" and isinstance(t, torch.Tensor)]  # AdamW's step count is on the host
        if getattr(self, "gradient_buffer", None) is not None:
            tensors.append(self.gradient_buffer)
        for tensor in tensors:
            tracker.track(tensor)

    def trace(self, bucket: tuple[float, float], batch_size: int,
              tracker: DeviceMemoryTracker | None = None, *, every_block: bool = False) -> StepMemory:
        """Memory of one step on the worst-case batch of ``bucket`` (duration s, tokens); a
        :class:`PlanError` names the operation that cannot be traced. ``tracker``: a fresh one that counts
        it (default a new :class:`DeviceMemoryTracker`). With ``block_runs``, the runs are traced cut short and
        the timeline grown back (:mod:`workbench.oomptimizer.repeated_blocks`), unless ``every_block``."""
        duration, tokens = float(bucket[0]), int(round(bucket[1]))
        tracker = DeviceMemoryTracker() if tracker is None else tracker
        runs = [] if every_block else self.block_runs
        batch, marks = None, []
        where = f"at {duration:g} s / {tokens} tokens, batch size {batch_size}"
        try:
            kernels = kernels_as_on_cuda() if self.cuda_kernels else contextlib.nullcontext()
            cuda_ops = OpsAsOnCuda() if self.cuda_kernels else contextlib.nullcontext()
            with self.fake_mode, tracker, _naming_the_operation(tracker, where), kernels, cuda_ops:
                self._track_state(tracker)  # every block's weights and AdamW state, cut or not
                state_bytes = tracker.allocated_bytes
                tracker.reset_peak()
                made_before = (tracker.allocations, tracker.allocated_total)
                with contextlib.ExitStack() as cut:
                    if runs:
                        start = tracker.record_events()
                        cut.enter_context(cut_runs(runs, marks, tracker.events_so_far))
                    batch = self.model.make_batch(int(batch_size), duration, tokens, "cpu")
                    self.model.training_step(batch, dtype=self.dtype)
                peak_allocated, peak_reserved = tracker.peak_allocated_bytes, tracker.peak_reserved_bytes
                end_allocated, step_events = tracker.allocated_bytes, tracker.events_so_far()
                made = (tracker.allocations - made_before[0], tracker.allocated_total - made_before[1])
        finally:
            del batch
            self.model.zero_grad(set_to_none=True)
        if runs:  # the cut trace's timeline to the step's end, grown to every block (NotRepeatable where it cannot be)
            events, tracker.events = tracker.events[:step_events], None
            deltas = np.array([e[:2] for e in events], dtype=np.int64).reshape(-1, 2)
            born = np.array([e[2] for e in events], dtype=np.int64)
            small, large = grown_timeline(deltas, born, start, runs, marks)
            made = grown_allocations(deltas, born, runs, marks)
            pages = -(-small // PAGE_BYTES) + -(-large // PAGE_BYTES)
            peak_allocated, peak_reserved = int((small + large).max()), int(pages.max()) * PAGE_BYTES
            end_allocated = int(small[-1] + large[-1])
        step_peak = end_allocated + self.optimizer_step_bytes
        peak = max(peak_allocated, step_peak)
        reserved = max(peak_reserved, -(-step_peak // PAGE_BYTES) * PAGE_BYTES)
        return StepMemory(peak, reserved, state_bytes, tracker.host_reads, end_allocated, *made)


@contextlib.contextmanager
def _naming_the_operation(tracker: DeviceMemoryTracker, where: str):
    """Turn a failure inside a trace into a one-line :class:`PlanError` that names the operation."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - whatever the traced code raises is named in one line
        op = getattr(e, "func", None) or tracker.last_op or "the first operation"
        reads = (f"; the step read {tracker.host_reads} value(s) back to the host, answered as 0 (integers) or "
                 f"1.0 (floats): a shape taken from one is wrong" if tracker.host_reads else "")
        raise PlanError(f"cannot trace the training step {where}: {op} ({type(e).__name__}: "
                        f"{_first_line(e)}){reads}") from None


@dataclass
class PlannedProbe:
    """``probe(bucket, batch_size) -> predicted peak allocated bytes`` for ``search_batch_sizes``, raising
    ``torch.OutOfMemoryError`` when the predicted reserved peak exceeds ``budget_bytes`` = gpu memory x
    memory fraction - margin (bytes). ``model`` is built under ``fake_mode``."""
    model: torch.nn.Module
    fake_mode: FakeTensorMode
    gpu_memory_bytes: int
    memory_fraction: float = 0.9
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    dtype: torch.dtype = torch.bfloat16
    ddp_gradient_buckets: bool = False
    cuda_kernels: bool = True  # the kernels CUDA would run (see StepTracer)
    repeated_blocks: bool = True  # runs of identical blocks traced cut short, once checked (see __call__)
    traces: list[StepMemory] = field(default_factory=list)
    baseline_bytes: int = 0  # nothing is allocated on a device
    block_check: str | None = None  # what the check of the cut trace found (None: not made)

    def __post_init__(self):
        self.tracer = StepTracer(self.model, self.fake_mode, dtype=self.dtype,
                                 ddp_gradient_buckets=self.ddp_gradient_buckets, cuda_kernels=self.cuda_kernels,
                                 repeated_blocks=self.repeated_blocks)
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction: must be in (0, 1], got {self.memory_fraction}")
        if self.budget_bytes <= 0:
            raise ValueError(f"margin {self.margin_bytes / GiB:.2f} GiB leaves no memory of "
                             f"{self.memory_fraction} x {self.gpu_memory_bytes / GiB:.2f} GiB")

    @property
    def budget_bytes(self) -> float:
        return self.gpu_memory_bytes * self.memory_fraction - self.margin_bytes

    def __call__(self, bucket: tuple[float, float], batch_size: int) -> float:
        if self.tracer.block_runs and self.block_check is None:
            memory = self.check_block_runs(bucket, batch_size)
        else:
            try:
                memory = self.tracer.trace(bucket, batch_size)
            except (PlanError, NotRepeatable) as e:  # the cut model fails where the whole one may not
                if not self.tracer.block_runs:
                    raise
                self._trace_every_block(bucket, batch_size, _first_line(e))
                memory = self.tracer.trace(bucket, batch_size)
        self.traces.append(memory)
        if memory.peak_reserved_bytes > self.budget_bytes:
            raise torch.OutOfMemoryError(
                f"planned: batch size {batch_size} at {bucket[0]:g} s / {int(round(bucket[1]))} tokens needs "
                f"{memory.peak_reserved_bytes / GiB:.2f} GiB > {self.budget_bytes / GiB:.2f} GiB")
        return float(memory.peak_allocated_bytes)


    def check_block_runs(self, bucket: tuple[float, float], batch_size: int) -> StepMemory:
        """One probe traced whole and cut short (the first, or one before the searches fork): where the two
        differ, every later probe is traced whole. Returns the whole trace's memory; ``block_check`` says what
        was found."""
        whole = self.tracer.trace(bucket, batch_size, every_block=True)
        try:
            cut = self.tracer.trace(bucket, batch_size)
            found = next((f"its {name} {a} B differed from the whole trace's {b} B" for name, a, b in (
                ("peak", cut.peak_allocated_bytes, whole.peak_allocated_bytes),
                ("reserved peak", cut.peak_reserved_bytes, whole.peak_reserved_bytes),
                ("bytes at the backward's end", cut.step_end_bytes, whole.step_end_bytes),
                ("count of storages made", cut.step_allocations, whole.step_allocations),
                ("bytes made", cut.step_allocated_bytes, whole.step_allocated_bytes)) if a != b), None)
        except (PlanError, NotRepeatable) as e:  # e.g. a model that indexes a block past the cut
            found = _first_line(e)
        if found is None:
            self.block_check = (f"{self._runs_text()} traced {KEEP_BLOCKS} blocks each: the same peaks and storages "
                                f"as every block {_where(bucket, batch_size)}")
        else:
            self._trace_every_block(bucket, batch_size, found)
        return whole

    def _runs_text(self) -> str:
        return ", ".join(f"{r.name} ({r.length} blocks)" for r in self.tracer.block_runs)

    def _trace_every_block(self, bucket: tuple[float, float], batch_size: int, why: str) -> None:
        self.block_check = (f"{self._runs_text()}: every block traced, since the cut trace "
                            f"{_where(bucket, batch_size)}: {why}")
        self.tracer.block_runs = []


def _where(bucket: tuple[float, float], batch_size: int) -> str:
    return f"at {bucket[0]:g} s / {int(round(bucket[1]))} tokens, batch size {batch_size}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def plan_profile(model: torch.nn.Module, fake_mode: FakeTensorMode, model_name: str, bins, *, gpu_memory: str,
                 memory_fraction: float = 0.9, margin_bytes: int = DEFAULT_MARGIN_BYTES,
                 dtype: torch.dtype = torch.bfloat16, ddp: bool = False, strategy: str = "predictive",
                 rel_gap: float = 0.05, start_batch_size: int = 32, merge: bool = True, on_probe=None,
                 on_bucket=None, cuda_kernels: bool = True, workers: int = 1, repeated_blocks: bool = True):
    """Batch sizes for the buckets of ``bins`` on a GPU of ``gpu_memory`` (a name or a size), found by
    the same search as on a GPU against predicted peaks. Returns (profile, search result); the profile's
    metadata says it was planned, for which memory, with which fraction and margin, on which path
    (``cuda_kernels``: see :class:`StepTracer`). ``workers`` > 1 (:func:`plan_workers`), with no callbacks
    and at least two buckets each: the buckets are searched in that many forked processes, each taking every
    ``workers``-th bucket from the largest, so that each sees every shape; a trace is single-threaded Python,
    so the plan takes about 1 / workers of the time, for somewhat more traced steps. ``repeated_blocks``: runs
    of identical blocks traced cut short (:mod:`workbench.oomptimizer.repeated_blocks`), checked against a
    whole trace once (:meth:`PlannedProbe.check_block_runs`); ``metadata.plan.repeated_blocks`` says what the
    check found."""
    import datetime as _dt

    from workbench.oomptimizer.run import profile_buckets, profile_with_batch_sizes
    from workbench.oomptimizer.search import search_batch_sizes

    total = gpu_memory_bytes(gpu_memory)
    probe = PlannedProbe(model, fake_mode, total, memory_fraction=memory_fraction, margin_bytes=margin_bytes,
                         dtype=dtype, ddp_gradient_buckets=ddp, cuda_kernels=cuda_kernels,
                         repeated_blocks=repeated_blocks)
    options = dict(budget_bytes=probe.budget_bytes, rel_gap=rel_gap, start_batch_size=start_batch_size,
                   strategy=strategy)
    buckets = profile_buckets(bins)
    if workers > 1 and len(buckets) >= 2 * workers and on_probe is None and on_bucket is None \
            and "fork" in multiprocessing.get_all_start_methods():
        if probe.tracer.block_runs:  # settled once here, so every forked search traces the same way
            from workbench.oomptimizer.search import largest_first
            probe.check_block_runs(tuple(buckets[largest_first(buckets)[0]]), start_batch_size)
        result = _search_in_forks(probe, buckets, workers, options)
    else:
        result = search_batch_sizes(buckets, probe, on_probe=on_probe, on_bucket=on_bucket, **options)
    named = gpu_memory.strip().lower() in GPU_MEMORY_BYTES
    meta = {"model": model_name, "dtype": str(dtype).replace("torch.", ""),
            "gpu": gpu_memory.strip().lower() if named else None, "gpu_memory_bytes": int(total),
            "memory_fraction": float(memory_fraction), "torch": str(torch.__version__),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "strategy": strategy,
            "ddp": bool(ddp), "joint_chunk_size": int(getattr(getattr(model, "config", None), "joint_chunk_size", 0)),
            "joint_loss": str(getattr(getattr(model, "config", None), "joint_loss", "materialized")),
            "compile": False, "world_size": 1, "probes": result.num_probes,
            "search_seconds": round(result.seconds, 2), "budget_bytes": int(probe.budget_bytes),
            "unmerged_buckets": len(profile_buckets(bins)), "planned": True,
            "plan": {"margin_bytes": int(margin_bytes), "traced_path": traced_path(probe.cuda_kernels),
                     "repeated_blocks": probe.block_check or ("every block traced" + (
                         " (no run of identical blocks)" if repeated_blocks else "")),
                     "allocator": "expandable segments, 512-byte blocks, 2 MiB pages",
                     "host_reads_per_step": max((t.host_reads for t in probe.traces), default=0),
                     **planned_lines(result)}}
    profile = profile_with_batch_sizes(bins, result, meta, "expandable_segments:True", merge=merge)
    return profile, result


def plan_workers() -> int:
    """Processes for a plan on this machine (``plan_profile(workers=)``): its cores, at most 4."""
    return max(1, min(os.cpu_count() or 1, 4))


_FORKED: tuple | None = None  # (probe, buckets, groups, search options): what the forked searches read


def _search_in_forks(probe: "PlannedProbe", buckets: list, workers: int, options: dict):
    """``search_batch_sizes`` over ``workers`` interleaved groups of buckets in forked processes (they inherit
    the fake model: nothing is pickled but the results), merged into one SearchResult over all buckets: each
    bucket's size and stop reason, every probe (indices into ``buckets``), one fit over all of them."""
    import time

    from workbench.oomptimizer.memory_model import fit_base_and_costs
    from workbench.oomptimizer.search import SearchResult, largest_first

    global _FORKED
    order = largest_first(buckets)
    groups = [order[w::workers] for w in range(workers)]
    t0 = time.perf_counter()
    _FORKED = (probe, buckets, groups, options)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_search_group, range(workers))
    finally:
        _FORKED = None
    sizes, reasons, records = [None] * len(buckets), [""] * len(buckets), []
    for group, (group_sizes, group_reasons, group_records, traces) in zip(groups, parts):
        for j, i in enumerate(group):
            sizes[i], reasons[i] = group_sizes[j], group_reasons[j]
        records += group_records
        probe.traces += traces
    fit = fit_base_and_costs([(r.bucket_index, r.batch_size, r.peak_bytes) for r in records if not r.oom])
    return SearchResult(buckets=buckets, batch_sizes=sizes, probes=records, strategy=options["strategy"],
                        rel_gap=options["rel_gap"], budget_bytes=options["budget_bytes"],
                        seconds=time.perf_counter() - t0, fit=fit if options["strategy"] == "predictive" else None,
                        stop_reasons=reasons)


def _search_group(w: int):
    """In a forked process: the search over group ``w`` of :data:`_FORKED` -> (sizes, stop reasons, probes with
    indices into all buckets, traces)."""
    import dataclasses

    from workbench.oomptimizer.search import search_batch_sizes

    probe, buckets, groups, options = _FORKED
    group = groups[w]
    result = search_batch_sizes([buckets[i] for i in group], probe, **options)
    records = [dataclasses.replace(r, bucket_index=group[r.bucket_index]) for r in result.probes]
    return result.batch_sizes, result.stop_reasons, records, probe.traces


def planned_lines(result) -> dict:
    """What a GPU search started from this plan needs (``metadata.plan``): the buckets (duration s, tokens),
    unmerged, and the planned peak per bucket as base_bytes + n x per_item_bytes[i] (bytes)."""
    fit = result.fit
    return {"buckets": [[float(d), float(u)] for d, u in result.buckets],
            "base_bytes": float(fit.base_bytes) if fit is not None else 0.0,
            "per_item_bytes": [float(fit.per_item_bytes[i]) if fit is not None and fit.per_item_bytes.get(i)
                               else None for i in range(len(result.buckets))]}


def planned_peaks(plan, buckets, *, source: str = "plan"):
    """The :class:`~workbench.oomptimizer.search.PlannedPeaks` of a planned profile (``plan``, from
    ``oomptimize --plan``) for ``buckets`` (duration s, tokens), which must be the plan's own; a one-line
    ValueError naming ``source`` otherwise."""
    from workbench.oomptimizer.search import PlannedPeaks

    metadata = plan.metadata or {}
    lines = metadata.get("plan") if metadata.get("planned") else None
    if not isinstance(lines, dict) or "per_item_bytes" not in lines:
        raise ValueError(f"{source}: not a plan with per-bucket peaks (make one with oomptimize --plan)")
    planned = [tuple(float(x) for x in b) for b in lines.get("buckets") or []]
    wanted = [(float(d), float(u)) for d, u in buckets]
    if len(planned) != len(wanted) or any(abs(a - b) > 1e-6 * max(abs(a), 1.0)
                                          for p, w in zip(planned, wanted) for a, b in zip(p, w)):
        raise ValueError(f"{source}: planned for {len(planned)} other buckets than these {len(wanted)} "
                         "(plan with the same --bins)")
    return PlannedPeaks(float(lines["base_bytes"]),
                        [None if c is None else float(c) for c in lines["per_item_bytes"]])


def plan_for_gpus(model_name: str, bins, gpus, *, memory_fraction: float = 0.9,
                  margin_bytes: int = DEFAULT_MARGIN_BYTES, dtype: torch.dtype = torch.bfloat16,
                  progress: bool = True) -> dict:
    """One plan of the buckets of ``bins`` per GPU in ``gpus`` (names or sizes) for the reference model
    ``model_name``, built once with fake weights: {gpu: profile}, buckets unmerged in the order of ``bins``."""
    from tqdm.auto import tqdm

    fake_mode = new_fake_mode()
    model = build_fake_reference_model(model_name, fake_mode)
    return {gpu: plan_profile(model, fake_mode, model_name, bins, gpu_memory=gpu, memory_fraction=memory_fraction,
                              margin_bytes=margin_bytes, dtype=dtype, merge=False)[0]
            for gpu in tqdm(list(gpus), desc="plan", unit="GPU", disable=not progress)}
