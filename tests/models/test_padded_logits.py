"""Transducer losses on logits whose rows end in padding columns (``num_classes``): the loss and the
real columns' gradient of the unpadded logits, a zero gradient on the padding, no copy of the logits.

The Triton kernels run on CPU tensors through Triton's interpreter when there is no CUDA; on a GPU
machine the same tests run the compiled kernels and carry the ``gpu`` mark.
"""

import pytest
import torch

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models.losses import rnnt_loss, rnnt_loss_reference, tdt_loss, tdt_loss_reference

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import losses_triton  # noqa: E402
from workbench.models.losses_triton import rnnt_loss_triton, tdt_loss_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []

RNNT = {"triton": rnnt_loss_triton, "reference": rnnt_loss_reference}
TDT = {"triton": tdt_loss_triton, "reference": tdt_loss_reference}


@pytest.fixture
def poisoned_empty_like(monkeypatch):
    """torch.empty_like returns NaN-filled tensors, so a gradient column the kernel never writes shows."""
    full_like = torch.full_like
    monkeypatch.setattr(torch, "empty_like", lambda x, **kw: full_like(x, float("nan"), **kw))


def lattice_batch(frames, labels, num_classes, *, vocab, seed, dtype=torch.float32):
    """Logits [B, max T, max U + 1, num_classes], targets in [0, vocab), lengths (padding in the batch)."""
    gen = torch.Generator().manual_seed(seed)
    batch, max_t, max_u = len(frames), max(frames), max(labels)
    logits = (torch.randn(batch, max_t, max_u + 1, num_classes, generator=gen) * 2.0).to(dtype)
    targets = torch.randint(0, vocab, (batch, max_u), generator=gen)
    return (logits.to(DEVICE), targets.to(DEVICE), torch.tensor(frames, device=DEVICE),
            torch.tensor(labels, device=DEVICE))


def with_padding(logits, width):
    """The logits in a contiguous [..., width] tensor whose extra columns are NaN (any read of them shows)."""
    padded = torch.full((*logits.shape[:-1], width), float("nan"), dtype=logits.dtype, device=logits.device)
    padded[..., :logits.shape[-1]] = logits
    return padded


def value_and_grad(fn, logits, *args, reduction, **kwargs):
    x = logits.detach().clone().requires_grad_()
    value = fn(x, *args, reduction=reduction, **kwargs)
    weights = torch.linspace(0.5, 2.0, value.numel(), device=value.device).reshape(value.shape)
    (grad,) = torch.autograd.grad((value * weights).sum(), x)
    return value.detach(), grad


def assert_padding_is_invisible(fn, logits, width, *args, reduction="none", **kwargs):
    """fn on the padded logits with num_classes = the real width equals fn on the unpadded ones."""
    num_classes = logits.shape[-1]
    want, want_grad = value_and_grad(fn, logits, *args, reduction=reduction, **kwargs)
    got, got_grad = value_and_grad(fn, with_padding(logits, width), *args, reduction=reduction,
                                   num_classes=num_classes, **kwargs)
    assert got_grad.shape[-1] == width and got_grad.dtype == logits.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad[..., :num_classes], want_grad, rtol=1e-6, atol=1e-6)
    assert torch.equal(got_grad[..., num_classes:], torch.zeros_like(got_grad[..., num_classes:]))
    assert want_grad.abs().max() > 0  # the comparison is not of two zero gradients


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_rnnt_padded_logits_give_the_unpadded_loss_and_gradient(impl, dtype, reduction, poisoned_empty_like):
    vocab = 6  # 7 classes -> rows of 8
    logits, *rest = lattice_batch([5, 3, 1], [3, 0, 2], vocab + 1, vocab=vocab, seed=0, dtype=dtype)  # T = 1, U = 0
    assert_padding_is_invisible(RNNT[impl], logits, 8, *rest, reduction=reduction, blank=vocab)


@pytest.mark.parametrize("impl", ["triton", "reference"])
@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tdt_padded_logits_give_the_unpadded_loss_and_gradient(impl, durations, dtype, poisoned_empty_like):
    vocab = 5  # 6 tokens + durations -> rows of 16
    logits, *rest = lattice_batch([7, 4, 1], [3, 0, 2], vocab + 1 + len(durations), vocab=vocab, seed=len(durations),
                                  dtype=dtype)
    assert_padding_is_invisible(TDT[impl], logits, 16, *rest, blank=vocab, durations=durations, sigma=0.05)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_tdt_padded_reductions(reduction, poisoned_empty_like):
    logits, *rest = lattice_batch([4, 3], [2, 1], 5 + 3, vocab=4, seed=3)
    assert_padding_is_invisible(tdt_loss_triton, logits, 13, *rest, reduction=reduction, blank=4,
                                durations=(0, 1, 2))


def test_wide_padding_takes_several_vocabulary_blocks(monkeypatch, poisoned_empty_like):
    """Padding wider than the vocabulary block: every padding block of the row gets its zeros."""
    monkeypatch.setattr(losses_triton, "_MAX_BLOCK_V", 4)
    logits, *rest = lattice_batch([4, 2], [2, 1], 7, vocab=6, seed=4)
    assert_padding_is_invisible(rnnt_loss_triton, logits, 19, *rest, blank=6)


def test_the_kernels_get_the_padded_tensor_itself(monkeypatch):
    """No slice, no copy: the custom op's input is the caller's padded tensor."""
    logits, *rest = lattice_batch([3, 2], [1, 2], 5, vocab=4, seed=5)
    padded = with_padding(logits, 8).requires_grad_()
    seen = []
    forward = losses_triton.transducer_loss_forward
    monkeypatch.setattr(losses_triton, "transducer_loss_forward", lambda x, *a: seen.append(x) or forward(x, *a))
    rnnt_loss_triton(padded, *rest, num_classes=5).backward()
    assert seen[0] is padded and padded.grad.shape == padded.shape


def test_blank_counts_from_num_classes_and_the_public_losses_pass_it_on():
    logits, *rest = lattice_batch([4, 3], [2, 1], 5, vocab=4, seed=6)
    want = rnnt_loss_reference(logits, *rest, blank=4)
    padded = with_padding(logits, 8)
    for backend in ("torch", "triton"):
        torch.testing.assert_close(rnnt_loss(padded, *rest, blank=-1, num_classes=5, backend=backend), want)
    logits, *rest = lattice_batch([4, 3], [2, 1], 5 + 2, vocab=4, seed=7)
    want = tdt_loss_reference(logits, *rest, blank=4, durations=(0, 2))
    for backend in ("torch", "triton"):
        got = tdt_loss(with_padding(logits, 8), *rest, blank=-1, durations=(0, 2), num_classes=7, backend=backend)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_bad_num_classes_are_refused_naming_the_option(impl):
    logits, targets, logit_lengths, target_lengths = lattice_batch([3], [1], 8, vocab=4, seed=8)
    args = (logits, targets, logit_lengths, target_lengths)
    rnnt, tdt = RNNT[impl], TDT[impl]
    with pytest.raises(ValueError, match=r"^num_classes: 9 is outside \[2, 8\] \(the logits' last dim\)$"):
        rnnt(*args, num_classes=9)
    with pytest.raises(ValueError, match=r"^num_classes: 1 is outside \[2, 8\]"):
        rnnt(*args, num_classes=1)
    for bad in (5.0, True, "5"):
        with pytest.raises(ValueError, match="^num_classes: expected an int or None, got"):
            rnnt(*args, num_classes=bad)
    with pytest.raises(ValueError, match=r"^blank: 5 is not one of the 5 token classes$"):
        rnnt(*args, blank=5, num_classes=5)  # a padding column is no class
    with pytest.raises(ValueError, match=r"^targets: 1 labels are blank \(2\) or outside \[0, 3\)$"):
        rnnt(logits, torch.full_like(targets, 3), logit_lengths, target_lengths, num_classes=3)
    with pytest.raises(ValueError, match=r"^logits: num_classes 4 leaves 1 token classes after 3 durations"):
        tdt(*args, blank=0, durations=(0, 1, 2), num_classes=4)
    with pytest.raises(ValueError, match=r"^num_classes: 10 is outside \[2, 8\]"):
        tdt(*args, blank=0, durations=(0, 1, 2), num_classes=10)
