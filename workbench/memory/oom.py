"""One test for 'this error means the GPU ran out of memory', and one way to hand memory back after a step;
shared by the probe, telemetry and benches."""

from __future__ import annotations

import gc

# Messages of errors that are OOMs in disguise: libraries that fail to allocate their workspace.
OOM_MESSAGES = ("out of memory", "CUFFT_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                "CUBLAS_STATUS_ALLOC_FAILED", "CUSOLVER_STATUS_ALLOC_FAILED", "cuFFT error: CUFFT_INTERNAL_ERROR",
                "CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input",
                "CUDNN_STATUS_INTERNAL_ERROR", "CUDA error: out of memory")


# Extensions on torch's stable ABI (torchaudio's RNN-T loss) report a failed allocation as a failed call of an
# allocating op, without the allocator's message.
STABLE_ABI_CALL_FAILED = "api call failed"
STABLE_ABI_ALLOCATING_OPS = ('"aten::empty', '"aten::zeros', '"aten::new_empty', '"aten::new_zeros')


def is_oom_error(error: BaseException) -> bool:
    """True for torch.OutOfMemoryError and for library errors whose message says an allocation failed.

    torch.OutOfMemoryError is a RuntimeError; it is recognised by name so this module needs no torch.
    """
    if not isinstance(error, RuntimeError):
        return False
    if type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    if STABLE_ABI_CALL_FAILED in text and "torch_call_dispatcher" in text:
        return any(op in text for op in STABLE_ABI_ALLOCATING_OPS)
    return any(m.lower() in text for m in OOM_MESSAGES)


def release_memory() -> None:
    """Drop unreachable tensors and hand cached blocks back, so the next step starts clean (on a CPU only
    the garbage collection runs)."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:  # cuBLAS keeps its workspace in the caching allocator
            clear_workspaces()
        torch.cuda.empty_cache()
