"""Whether Triton kernels can run on a device, and if not, why, in one line.

The fused decoding stages (:mod:`workbench.decoding.fused`), the transducer losses
(:mod:`workbench.models.losses`), the subsampling's depthwise convolution
(:func:`workbench.models.encoder.depthwise_conv3x3_s2`) and the convolution module's
(:func:`workbench.models.encoder.time_depthwise_conv`) ask :func:`triton_unavailable_reason` before they run
their kernels.
Triton runs them on CUDA devices, and on the CPU only under its interpreter, which is chosen when
``triton.language`` is first imported: ``TRITON_INTERPRET=1`` must be set before that import (and still be set).
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import torch


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
    other device than CUDA or CPU is a reason. Import outcomes are remembered for the process.
    """
    error = _import_error("triton.language")
    if error:
        return f"triton is not importable ({error})"
    if kernels_module is not None:
        error = _import_error(kernels_module)
        if error:
            return f"{kernels_module} is not importable ({error})"
    kind = torch.device(device).type
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
