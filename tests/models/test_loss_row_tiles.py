"""The per-node Triton loss kernels over tiles of ROWS lattice nodes per program: the reference's values and
gradients at any ROWS, and ROWS = 1 (one node per program) against ROWS > 1 within fp32 rounding.

Without CUDA the kernels run on CPU tensors through Triton's interpreter; on a GPU machine the same tests
run the compiled kernels and carry the ``gpu`` mark.
"""

import pytest
import torch

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models.losses import LOG_ZERO, rnnt_loss_reference, tdt_loss_reference

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import losses_triton  # noqa: E402
from workbench.models.losses_triton import rnnt_loss_triton, rows_per_program, tdt_loss_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []

FRAMES, LABELS = [5, 3, 1], [3, 0, 2]  # padded batch, U = 0, T = 1: 3 * 5 * 4 = 60 nodes, not a multiple of 8
VOCAB = 6


def batch(num_classes, *, seed, dtype=torch.float32, width=None):
    """Logits [3, 5, 4, width or num_classes] (NaN in the padding columns past num_classes), targets, lengths."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(FRAMES), max(FRAMES), max(LABELS) + 1, num_classes, generator=gen) * 2.0
    if width is not None:
        logits = torch.cat([logits, torch.full((*logits.shape[:-1], width - num_classes), float("nan"))], -1)
    targets = torch.randint(0, VOCAB, (len(FRAMES), max(LABELS)), generator=gen)
    return (logits.to(dtype).to(DEVICE), targets.to(DEVICE), torch.tensor(FRAMES, device=DEVICE),
            torch.tensor(LABELS, device=DEVICE))


def value_and_grad(fn, logits, *args, **kwargs):
    x = logits.detach().clone().requires_grad_()
    values = fn(x, *args, reduction="none", **kwargs)
    upstream = torch.linspace(0.5, 2.0, values.numel(), device=values.device)
    (grad,) = torch.autograd.grad((values * upstream).sum(), x)
    return values.detach(), grad


class LaunchRecorder:
    """Stands in for a kernel: records each launch's grid and ROWS, then launches the kernel."""

    def __init__(self, kernel, launches):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.kernel.fn.__name__, grid[0], kwargs["ROWS"]))
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture
def launches(monkeypatch):
    recorded = []
    for name in ("_normalize_kernel", "_grad_kernel"):
        monkeypatch.setattr(losses_triton, name, LaunchRecorder(getattr(losses_triton, name), recorded))
    return recorded


CASES = {  # name: (loss, reference, durations or None)
    "rnnt": (rnnt_loss_triton, rnnt_loss_reference, None),
    "tdt-with-0": (tdt_loss_triton, tdt_loss_reference, (0, 1, 2)),
    "tdt-without-0": (tdt_loss_triton, tdt_loss_reference, (1, 3)),
}


@pytest.mark.parametrize("case, dtype, padded_rows", [
    ("rnnt", torch.float32, False), ("rnnt", torch.bfloat16, True), ("tdt-with-0", torch.float32, True),
    ("tdt-with-0", torch.bfloat16, False), ("tdt-without-0", torch.float32, False),
    ("tdt-without-0", torch.bfloat16, True)])
def test_rows_1_and_8_equal_each_other_and_the_reference(case, dtype, padded_rows, launches):
    ours, reference, durations = CASES[case]
    num_classes = VOCAB + 1 + (len(durations) if durations else 0)
    width = num_classes + 5 if padded_rows else None  # row stride past the classes
    logits, *rest = batch(num_classes, seed=len(case), dtype=dtype, width=width)
    kwargs = {"blank": VOCAB} | ({"durations": durations, "sigma": 0.05} if durations else {})
    if padded_rows:
        kwargs["num_classes"] = num_classes
    results = {}
    for rows in (1, 8):
        with rows_per_program(rows):
            results[rows] = value_and_grad(ours, logits, *rest, **kwargs)
    assert launches == [(name, -(-60 // rows), rows) for rows in (1, 8)
                        for name in ("_normalize_kernel", "_grad_kernel")]  # 60 nodes: a partial last tile
    (one, one_grad), (eight, eight_grad) = results[1], results[8]
    torch.testing.assert_close(eight, one, rtol=1e-6, atol=0)
    grad_rtol = 2**-7 if dtype == torch.bfloat16 else 1e-6  # a fp32 rounding may move a bf16 value by one step
    torch.testing.assert_close(eight_grad.float(), one_grad.float(), rtol=grad_rtol, atol=1e-7)
    assert eight_grad.dtype == dtype and eight_grad.shape == logits.shape
    if padded_rows:
        assert torch.equal(eight_grad[..., num_classes:], torch.zeros_like(eight_grad[..., num_classes:]))
    real = logits[..., :num_classes].contiguous()
    kwargs.pop("num_classes", None)
    want, want_grad = value_and_grad(reference, real, *rest, **kwargs)
    possible = want < -LOG_ZERO / 2  # without duration 0, item 3 (T = 1, U = 2) has no alignment
    assert bool(possible.any()) and torch.equal(eight < -LOG_ZERO / 2, possible)
    assert bool(possible.all()) == (case != "tdt-without-0")
    torch.testing.assert_close(eight[possible], want[possible], rtol=1e-5, atol=1e-4)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(eight_grad[..., :num_classes].float(), want_grad.float(), rtol=tolerance,
                               atol=tolerance)
    t = torch.arange(max(FRAMES), device=DEVICE)[None, :, None]
    u = torch.arange(max(LABELS) + 1, device=DEVICE)[None, None, :]
    outside = (t >= rest[1][:, None, None]) | (u > rest[2][:, None, None])
    assert eight_grad[outside].abs().max() == 0 and eight_grad[~outside].abs().max() > 0


def test_rows_past_the_row_blocks_loop_too(monkeypatch, launches):
    """Vocabulary blocks smaller than the row (the online log-sum-exp) with tiles of 16 rows: equal to
    one row per program and to the reference."""
    monkeypatch.setattr(losses_triton, "_MAX_BLOCK_V", 4)
    logits, *rest = batch(VOCAB + 1 + 3, seed=3)
    kwargs = {"blank": VOCAB, "durations": (0, 1, 2)}
    with rows_per_program(1):
        one, one_grad = value_and_grad(tdt_loss_triton, logits, *rest, **kwargs)
    with rows_per_program(16):
        many, many_grad = value_and_grad(tdt_loss_triton, logits, *rest, **kwargs)
    assert [rows for _, _, rows in launches] == [1, 1, 16, 16]
    torch.testing.assert_close(many, one, rtol=1e-6, atol=0)
    torch.testing.assert_close(many_grad, one_grad, rtol=1e-6, atol=1e-7)
    want, want_grad = value_and_grad(tdt_loss_reference, logits, *rest, **kwargs)
    torch.testing.assert_close(many, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(many_grad, want_grad, rtol=1e-4, atol=2e-5)


def test_the_default_tile_and_its_warps_follow_the_vocabulary_block(launches):
    assert [losses_triton._node_rows(v) for v in (8192, 4096, 2048, 1024, 8)] == [1, 2, 2, 2, 2]
    assert [losses_triton._node_warps(r, v) for r, v in ((4, 2048), (2, 4096), (1, 2048), (1, 4096), (4, 1024))] == \
        [8, 8, 4, 4, 4]
    logits, *rest = batch(VOCAB + 1, seed=4)
    rnnt_loss_triton(logits.requires_grad_(), *rest, blank=VOCAB).backward()
    rows = losses_triton._node_rows(8)  # 7 classes: a block of 8
    assert launches == [("_normalize_kernel", 60 // rows, rows), ("_grad_kernel", 60 // rows, rows)]


def test_rows_per_program_refuses_what_is_no_power_of_two_and_restores_the_default():
    for bad in (0, 3, -2, 2.0, True, "8"):
        with pytest.raises(ValueError, match=r"^rows_per_program: expected a power of two >= 1, got "):
            with rows_per_program(bad):
                pass
    with rows_per_program(1):
        with rows_per_program(32):
            assert losses_triton._node_rows(1024) == 32
        assert losses_triton._node_rows(1024) == 1
    assert losses_triton._node_rows(1024) == 2
