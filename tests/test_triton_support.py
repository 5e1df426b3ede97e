"""triton_unavailable_reason: one line saying why Triton kernels cannot run on a device (None when they can).
The interpreter is chosen when triton is imported, so the CPU cases run in fresh processes."""

import sys

import pytest
import torch

from workbench import triton_support
from workbench.triton_support import triton_unavailable_reason

CPU_REASON = "on CPU the Triton kernels need its interpreter: set TRITON_INTERPRET=1 before triton is imported"
ASK = "from workbench.triton_support import triton_unavailable_reason as r\nprint(r('cpu'))\n"


@pytest.fixture
def fresh_imports():
    """Forget the remembered import outcomes before and after the test."""
    triton_support._import_error.cache_clear()
    yield
    triton_support._import_error.cache_clear()


def test_cpu_without_the_interpreter_says_how_to_get_it(compile_without_interpreter):
    assert compile_without_interpreter(ASK).strip() == CPU_REASON


def test_cpu_with_the_interpreter_set_before_import_can_run(compile_without_interpreter):
    assert compile_without_interpreter("import os\nos.environ['TRITON_INTERPRET'] = '1'\n" + ASK).strip() == "None"


def test_the_interpreter_set_after_triton_was_imported_does_not_count(compile_without_interpreter):
    script = "import os\nimport triton.language\nos.environ['TRITON_INTERPRET'] = '1'\n" + ASK
    assert compile_without_interpreter(script).strip() == CPU_REASON


def test_a_device_other_than_cuda_or_cpu_is_named():
    pytest.importorskip("triton")
    assert triton_unavailable_reason(torch.device("meta")) == "Triton kernels run on CUDA (or the CPU interpreter), not meta"


def test_triton_that_does_not_import_is_the_reason_with_its_error(monkeypatch, fresh_imports):
    monkeypatch.setitem(sys.modules, "triton.language", None)  # `import triton.language` raises ModuleNotFoundError
    reason = triton_unavailable_reason(torch.device("cuda"))
    assert reason == "triton is not importable (ModuleNotFoundError: import of triton.language halted; None in sys.modules)"
    assert triton_unavailable_reason("cpu") == reason  # before any device check


def test_a_kernels_module_that_does_not_import_is_named_with_its_error(fresh_imports):
    pytest.importorskip("triton")
    reason = triton_unavailable_reason("cuda", kernels_module="workbench.no_such_kernels")
    assert reason == ("workbench.no_such_kernels is not importable "
                      "(ModuleNotFoundError: No module named 'workbench.no_such_kernels')")
    assert triton_unavailable_reason("cuda") is None  # triton itself imports; CUDA needs nothing more


def test_only_the_first_line_of_an_import_error_is_kept(monkeypatch, fresh_imports):
    def fail(name):
        raise RuntimeError("libcuda.so not found\nsearched: /usr/lib")

    monkeypatch.setattr(triton_support.importlib, "import_module", fail)
    assert triton_unavailable_reason("cuda") == "triton is not importable (RuntimeError: libcuda.so not found)"
