import pytest
import torch


@pytest.fixture
def cpu_settings_kept():
    """oneDNN and the thread count put back after a bench's smoke main changed them."""
    before = torch.backends.mkldnn.enabled, torch.get_num_threads()
    yield
    torch.backends.mkldnn.enabled, _ = before
    torch.set_num_threads(before[1])
