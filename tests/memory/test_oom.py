"""is_oom_error: OOMs, OOMs in disguise (library allocation failures), and nothing else."""

import pytest

from workbench.memory.oom import is_oom_error

STABLE_ABI = ('torch_call_dispatcher( "{op}", "", stack.data(), TORCH_ABI_VERSION) API call failed at '
              '/site-packages/torch/include/torch/csrc/stable/ops.h, line 45')


@pytest.mark.parametrize("error, oom", [
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError(STABLE_ABI.format(op="aten::empty_like")), True),  # torchaudio's RNN-T loss, out of memory
    (RuntimeError(STABLE_ABI.format(op="aten::zeros")), True),
    (RuntimeError(STABLE_ABI.format(op="aten::add")), False),  # a failed call that allocates nothing
    (RuntimeError("compute.cpp:78, input length mismatch"), False),
    (ValueError("out of memory"), False),
])
def test_ooms_and_only_ooms_are_recognised(error, oom):
    assert is_oom_error(error) is oom
