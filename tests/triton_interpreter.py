"""Run the Triton kernels on CPU tensors through Triton's interpreter when there is no CUDA.

Every test module that runs Triton kernels (losses, depthwise and time convolutions, padded logits, the fused
decoding stages) imports this first: the interpreter is chosen when ``triton.language`` is first imported, so
``TRITON_INTERPRET`` is set here before triton loads. ``DEVICE`` is "cuda" on a GPU machine (real kernels) and
"cpu" otherwise; ``triton`` is the module, or None where it is not installed (the tests that need it skip).

Two patches of the interpreter (CPU only):

- numpy >= 2.4 refuses ``int()`` of a one-element 1-d array, which the interpreter's scalars are; a loop bound
  taken from a kernel argument (``range(0, n, BLOCK)``) needs ``__index__`` to read it;
- every kernel launch (and device-function call) wraps triton.language's builtins, and finds them by listing
  the members of each language module with ``inspect.getmembers``, a few milliseconds each launch; the list
  is made once here, when nothing is patched, and each launch wraps those of them not wrapped already (as
  the listing finds them: a wrapped builtin is no builtin);
- the numpy dtype of each Triton dtype is looked up once (the interpreter builds a table for each look-up).
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
    import functools
    import inspect

    import numpy as np

    import triton.language as tl
    from triton.runtime import interpreter as _interpreter

    _original_patch = _interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        _original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    _interpreter._patch_lang_tensor = _patch_lang_tensor

    _original_patch_builtin = _interpreter._patch_builtin
    BUILTINS = {pkg: [(name, member) for name, member in inspect.getmembers(pkg) if tl.core.is_builtin(member)]
                for pkg in (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)}

    def _patch_builtin(pkg, builder, scope):
        members = BUILTINS.get(pkg)
        if members is None:  # a module the list does not know: the interpreter's own way
            return _original_patch_builtin(pkg, builder, scope)
        for name, member in members:
            if getattr(pkg, name) is member:  # not wrapped yet (a device function runs inside a wrapped launch)
                _interpreter._patch_attr(pkg, name, member, builder, scope)

    _interpreter._patch_builtin = _patch_builtin

    # the numpy dtype of a Triton dtype: the interpreter builds a dict of every dtype to look up each one (a tenth
    # of a million times a test of the fused decoder); the answer for a dtype never changes
    _POINTER_NP_DTYPE = np.dtype(np.uint64)
    _np_dtype_of_scalar = functools.lru_cache(maxsize=None)(_interpreter._get_np_dtype)

    def _get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):  # a block's is its element type's (block types do not hash)
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):  # pointers are addresses (nor do pointer types hash)
            return _POINTER_NP_DTYPE
        return _np_dtype_of_scalar(tt_dtype)

    _interpreter._get_np_dtype = _get_np_dtype
