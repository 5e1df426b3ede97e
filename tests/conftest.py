import pytest

from workbench.reporting import has_cuda as _has_cuda


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leaked_sync_debug_mode(request):
    """A GPU test that fails while torch.cuda.set_sync_debug_mode("error") is on must not fail every test
    after it: reset the mode after each GPU test."""
    yield
    if "gpu" in request.keywords and _has_cuda():
        import torch

        torch.cuda.set_sync_debug_mode(0)
