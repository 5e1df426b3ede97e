"""Whether Triton kernels can run on a device, and if not, why, in one line.

The fused decoding stages (:mod:`workbench.decoding.fused`), the transducer losses
(:mod:`workbench.models.losses`), the subsampling's depthwise convolution
(:func:`workbench.models.encoder.depthwise_conv3x3_s2`) and the convolution module's
(:func:`workbench.models.encoder.time_depthwise_conv`) ask :func:`triton_unavailable_reason` before they run
their kernels.
Triton runs them on CUDA devices, and on the CPU only under its interpreter, which is chosen when
``triton.language`` is first imported: ``TRITON_INTERPRET=1`` must be set before that import (and still be set).

A fake trace on the CPU (the OOMptimizer's plan) takes the kernels' path inside :func:`kernels_as_on_cuda`:
the kernels are torch custom ops whose fake implementations run there instead of the kernels.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib

import torch


_AS_ON_CUDA = contextvars.ContextVar("kernels_as_on_cuda", default=False)


@contextlib.contextmanager
def kernels_as_on_cuda():
    """Inside, CPU tensors pick their kernels as CUDA tensors do (:func:`kernel_device_type` says "cuda"): a
    fake trace on the CPU then takes the Triton kernels' path, through the custom ops' fake implementations,
    as the step would on a GPU. Only fake tensors may reach the kernels inside: a real CPU tensor would launch
    them without the interpreter."""
    token = _AS_ON_CUDA.set(True)
    try:
        yield
    finally:
        _AS_ON_CUDA.reset(token)


def kernel_device_type(device: torch.device | str) -> str:
    """The device type that picks kernels (and layouts) for tensors on ``device``: its own, except "cuda" for
    the CPU inside :func:`kernels_as_on_cuda`."""
    kind = torch.device(device).type
    return "cuda" if kind == "cpu" and _AS_ON_CUDA.get() else kind


def device_guard(device: torch.device):
    """Kernels launch on the current CUDA device: a context that makes it ``device`` (nothing off CUDA)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def reduction_split(items: int, block: int, programs_per_range: int, device: torch.device, *, waves: int,
                    cpu_ranges: int) -> tuple[int, int]:
    """How a two-stage reduction kernel splits ``items`` (pixels, frames) into ranges: (ranges, items per
    range, a multiple of ``block``), about ``waves`` programs per multiprocessor in all on CUDA (each range
    runs ``programs_per_range`` programs), ``cpu_ranges`` ranges on the CPU interpreter. The split depends
    only on the shape and the GPU model, so the sums repeat from run to run."""
    if device.type == "cuda":
        programs = waves * torch.cuda.get_device_properties(device).multi_processor_count
        wanted = max(1, programs // programs_per_range)
    else:
        wanted = cpu_ranges
    blocks = -(-items // block)
    chunk = -(-blocks // min(wanted, blocks)) * block
    return -(-items // chunk), chunk


def triton_unavailable_reason(device: torch.device | str, *, kernels_module: str | None = None) -> str | None:
    """Why Triton kernels cannot run on ``device`` (one line), or None when they can.

    The checks, in order: triton and triton.language import; ``kernels_module`` (the module that defines the
    kernels, e.g. "workbench.models.losses_triton"), when given, imports; on CPU, the interpreter is on; any
    other device than CUDA or CPU is a reason. Import outcomes are remembered for the process. Inside
    :func:`kernels_as_on_cuda` the CPU counts as CUDA (no interpreter needed: no kernel runs on fake tensors).
    """
    error = _import_error("triton.language")
    if error:
        return f"triton is not importable ({error})"
    if kernels_module is not None:
        error = _import_error(kernels_module)
        if error:
            return f"{kernels_module} is not importable ({error})"
    kind = kernel_device_type(device)
    if kind == "cpu" and not _interpreting():
        return "on CPU the Triton kernels need its interpreter: set TRITON_INTERPRET=1 before triton is imported"
    if kind not in ("cuda", "cpu"):
        return f"Triton kernels run on CUDA (or the CPU interpreter), not {kind}"
    return None


@functools.cache
def _import_error(module: str) -> str | None:
    """``module``'s import failure as "ExceptionType: first line of its message", or None when it imports."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        message = str(e).splitlines()[0] if str(e) else ""
        return f"{type(e).__name__}: {message}" if message else type(e).__name__
    return None


def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter: TRITON_INTERPRET is set now, and was set when
    triton.language was imported (its own jitted functions are interpreted ones)."""
    import triton
    import triton.language as tl

    return bool(triton.knobs.runtime.interpret) and type(tl.max).__name__ == "InterpretedFunction"
