"""Run the Triton loss kernels on CPU tensors through Triton's interpreter when there is no CUDA.

Import this before anything imports ``workbench.models.losses_triton``: the interpreter is chosen when a
kernel is decorated. ``DEVICE`` is "cuda" on a GPU machine (real kernels) and "cpu" otherwise.
"""

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton  # noqa: F401
except ImportError:  # the tests that need it skip
    triton = None

if triton is not None and DEVICE == "cpu":
    from triton.runtime import interpreter as _interpreter

    _original_patch = _interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        """numpy >= 2.4 refuses int() of a one-element 1-d array, which the interpreter's scalars are; a loop
        bound taken from a kernel argument (``range(0, n, BLOCK)``) needs it."""
        _original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interpreter._patch_lang_tensor = _patch_lang_tensor
