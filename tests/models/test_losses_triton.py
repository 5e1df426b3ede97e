"""The Triton transducer losses equal the pure-PyTorch reference: values and gradients, RNN-T and TDT.

Without CUDA the kernels run on CPU tensors through Triton's interpreter (small shapes, a few seconds);
on a GPU machine the same tests run the compiled kernels and carry the ``gpu`` mark.
"""

import math

import pytest
import torch

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models import losses
from workbench.models.losses import LOG_ZERO, loss_backend, rnnt_loss, rnnt_loss_reference, tdt_loss_reference

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import losses_triton  # noqa: E402
from workbench.models.losses_triton import rnnt_loss_triton, tdt_loss_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []


def assert_padding_has_zero_gradient(grad, frames, labels):
    t = torch.arange(grad.shape[1], device=grad.device)[None, :, None]
    u = torch.arange(grad.shape[2], device=grad.device)[None, None, :]
    padding = (t >= torch.tensor(frames, device=grad.device)[:, None, None]) | (
        u > torch.tensor(labels, device=grad.device)[:, None, None])
    assert bool(padding.any()) and grad[padding].abs().max() == 0


def random_batch(frames, labels, num_classes, *, vocab, seed, scale=2.0):
    """Logits [B, max T, max U + 1, classes] with garbage in the padding, targets in [0, vocab), lengths."""
    gen = torch.Generator().manual_seed(seed)
    batch, max_t, max_u = len(frames), max(frames), max(labels)
    logits = torch.randn(batch, max_t, max_u + 1, num_classes, generator=gen) * scale
    targets = torch.randint(0, vocab, (batch, max_u), generator=gen)
    return (logits.to(DEVICE), targets.to(DEVICE), torch.tensor(frames, device=DEVICE),
            torch.tensor(labels, device=DEVICE))


def loss_and_grad(fn, logits, *args, upstream=None, **kwargs):
    x = logits.detach().clone().requires_grad_()
    values = fn(x, *args, reduction="none", **kwargs)
    weights = torch.ones_like(values) if upstream is None else upstream
    (grad,) = torch.autograd.grad((values * weights).sum(), x)
    return values.detach(), grad


def assert_equal_to_reference(ours, reference, logits, *args, upstream=None, atol=2e-5, **kwargs):
    got, got_grad = loss_and_grad(ours, logits, *args, upstream=upstream, **kwargs)
    want, want_grad = loss_and_grad(reference, logits, *args, upstream=upstream, **kwargs)
    impossible = want > -LOG_ZERO / 2  # no alignment: both say "near -LOG_ZERO", not the same multiple of it
    assert torch.equal(got > -LOG_ZERO / 2, impossible)
    torch.testing.assert_close(got[~impossible], want[~impossible], rtol=1e-5, atol=1e-4)
    assert got_grad.dtype == logits.dtype and got_grad.shape == logits.shape
    torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=1e-4, atol=atol)
    return got, got_grad


@pytest.mark.parametrize("frames, labels, vocab, seed", [
    ([5, 3, 1], [3, 0, 2], 6, 0),       # padded batch; T = 1; U = 0
    ([7, 7], [4, 4], 3, 1),             # no padding
    ([1], [0], 2, 2),                   # the smallest lattice: one blank
    ([2, 6, 4, 3], [5, 1, 5, 2], 9, 3),  # more labels than frames
])
def test_rnnt_equals_the_reference(frames, labels, vocab, seed):
    logits, targets, logit_lengths, target_lengths = random_batch(frames, labels, vocab + 1, vocab=vocab, seed=seed)
    upstream = torch.linspace(0.5, 2.0, len(frames), device=DEVICE)  # each item's scale reaches its gradient
    _, grad = assert_equal_to_reference(rnnt_loss_triton, rnnt_loss_reference, logits, targets, logit_lengths,
                                        target_lengths, upstream=upstream, blank=vocab)
    if grad.shape[1] * grad.shape[2] * len(frames) > sum((t * (u + 1) for t, u in zip(frames, labels))):
        assert_padding_has_zero_gradient(grad, frames, labels)


def test_rnnt_with_no_labels_at_all_and_blank_first():
    logits, _, logit_lengths, target_lengths = random_batch([4, 2], [0, 0], 5, vocab=4, seed=4)
    targets = torch.zeros(2, 0, dtype=torch.long, device=DEVICE)
    logits = logits[:, :, :1]
    got, grad = assert_equal_to_reference(rnnt_loss_triton, rnnt_loss_reference, logits, targets, logit_lengths,
                                          target_lengths, blank=0)
    # one alignment: blank at every frame
    want = -logits.double().log_softmax(-1)[..., 0].squeeze(-1)
    assert got[0].item() == pytest.approx(want[0].sum().item(), rel=1e-5)
    assert got[1].item() == pytest.approx(want[1, :2].sum().item(), rel=1e-5)


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2), (0, 2), (0, 1), (2, 3)])
def test_tdt_equals_the_reference(durations):
    vocab = 5
    frames, labels = [9, 4, 1, 7], [3, 1, 0, 2]  # T = 1 and U = 0 too
    logits, targets, logit_lengths, target_lengths = random_batch(frames, labels, vocab + 1 + len(durations),
                                                                  vocab=vocab, seed=sum(durations))
    upstream = torch.tensor([1.0, -0.5, 2.0, 0.25], device=DEVICE)
    got, grad = assert_equal_to_reference(tdt_loss_triton, tdt_loss_reference, logits, targets, logit_lengths,
                                          target_lengths, upstream=upstream, blank=vocab, durations=durations)
    assert_padding_has_zero_gradient(grad, frames, labels)
    impossible = got > -LOG_ZERO / 2  # e.g. durations (0, 2) cannot cover an odd number of frames
    assert bool((~impossible).any()) and (not impossible.any() or grad[impossible].abs().max() == 0)


def test_tdt_sigma_and_blank_in_the_middle():
    vocab, durations = 4, (0, 1, 2)
    logits, targets, logit_lengths, target_lengths = random_batch([5, 3], [2, 1], vocab + 1 + 3, vocab=vocab, seed=7)
    targets = torch.where(targets >= 2, targets + 1, targets)  # labels skip blank = 2
    assert_equal_to_reference(tdt_loss_triton, tdt_loss_reference, logits, targets, logit_lengths, target_lengths,
                              blank=2, durations=durations, sigma=0.05)


@pytest.mark.parametrize("durations, dtype", [((0, 1, 7), torch.float32), ((3, 1), torch.float32),
                                             ((1, 3), torch.bfloat16)])
def test_tdt_durations_past_the_utterance_end_and_in_any_order(durations, dtype):
    """Durations longer than some utterances (edges that leave the lattice), listed in any order; bf16
    logits read in fp32: the values and gradients of the reference on the same values."""
    vocab = 4
    frames, labels = [3, 9, 1], [2, 4, 0]
    logits, targets, logit_lengths, target_lengths = random_batch(frames, labels, vocab + 1 + len(durations),
                                                                  vocab=vocab, seed=31)
    logits = logits.to(dtype)
    got, grad = loss_and_grad(tdt_loss_triton, logits, targets, logit_lengths, target_lengths, blank=vocab,
                              durations=durations)
    want, want_grad = loss_and_grad(tdt_loss_reference, logits, targets, logit_lengths, target_lengths,
                                    blank=vocab, durations=durations)
    assert grad.dtype == dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=tolerance, atol=tolerance)
    assert_padding_has_zero_gradient(grad, frames, labels)


@pytest.mark.parametrize("which", ["rnnt", "tdt"])
def test_bf16_logits_give_a_bf16_gradient_close_to_the_reference(which):
    extra = 3 if which == "tdt" else 0
    logits, targets, logit_lengths, target_lengths = random_batch([6, 4], [3, 2], 7 + extra, vocab=6, seed=8)
    logits = logits.bfloat16()
    kwargs = {"blank": 6, "durations": (0, 1, 2)} if which == "tdt" else {"blank": 6}
    ours, reference = (tdt_loss_triton, tdt_loss_reference) if which == "tdt" else (rnnt_loss_triton, rnnt_loss_reference)
    got, grad = loss_and_grad(ours, logits, targets, logit_lengths, target_lengths, **kwargs)
    want, want_grad = loss_and_grad(reference, logits, targets, logit_lengths, target_lengths, **kwargs)
    assert got.dtype == torch.float32 and grad.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)  # both read the same bf16 values in fp32
    torch.testing.assert_close(grad.float(), want_grad.float().bfloat16().float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("seed", [20, 21])
def test_random_shapes_equal_the_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 4, (1,), generator=gen))
    frames = torch.randint(1, 7, (batch,), generator=gen).tolist()
    labels = torch.randint(0, 5, (batch,), generator=gen).tolist()
    vocab = int(torch.randint(2, 12, (1,), generator=gen))
    logits, targets, logit_lengths, target_lengths = random_batch(frames, labels, vocab + 1, vocab=vocab, seed=seed)
    blank = int(torch.randint(0, vocab + 1, (1,), generator=gen))
    targets = torch.where(targets >= blank, targets + 1, targets)  # labels skip the blank
    assert_equal_to_reference(rnnt_loss_triton, rnnt_loss_reference, logits, targets, logit_lengths, target_lengths,
                              blank=blank)
    durations = (0, 1, 3) if seed % 2 else (1, 2, 4)
    logits, *_ = random_batch(frames, labels, vocab + 1 + 3, vocab=vocab, seed=seed + 100)
    assert_equal_to_reference(tdt_loss_triton, tdt_loss_reference, logits, targets, logit_lengths, target_lengths,
                              blank=blank, durations=durations)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reductions_match_the_reference(reduction):
    logits, targets, logit_lengths, target_lengths = random_batch([4, 3], [2, 1], 5, vocab=4, seed=9)
    x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = rnnt_loss_triton(x, targets, logit_lengths, target_lengths, reduction=reduction)
    ref = rnnt_loss_reference(y, targets, logit_lengths, target_lengths, reduction=reduction)
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=2e-5)


def test_the_vocabulary_and_label_blocks_loop(monkeypatch):
    """Blocks smaller than the row and the target: the loops over vocabulary and label chunks."""
    monkeypatch.setattr(losses_triton, "_MAX_BLOCK_V", 4)
    monkeypatch.setattr(losses_triton, "_MAX_BLOCK_U", 2)
    logits, targets, logit_lengths, target_lengths = random_batch([4, 3], [4, 2], 11 + 3, vocab=10, seed=10)
    assert_equal_to_reference(tdt_loss_triton, tdt_loss_reference, logits, targets, logit_lengths, target_lengths,
                              blank=10, durations=(0, 1, 2))


def test_bad_inputs_and_second_derivatives_are_refused():
    logits, targets, logit_lengths, target_lengths = random_batch([3], [1], 4, vocab=3, seed=11)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        rnnt_loss_triton(logits.double(), targets, logit_lengths, target_lengths)
    with pytest.raises(ValueError, match="logit_lengths: 1 of 1"):
        rnnt_loss_triton(logits, targets, logit_lengths + 1, target_lengths)
    with pytest.raises(ValueError, match="durations"):
        tdt_loss_triton(logits, targets, logit_lengths, target_lengths, blank=0, durations=(0,))
    x = logits.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="second derivatives"):
        torch.autograd.grad(rnnt_loss_triton(x, targets, logit_lengths, target_lengths), x, create_graph=True)


def test_dispatch_says_why():
    cpu_logits = torch.zeros(1, 1, 1, 2)
    assert loss_backend(cpu_logits) == ("torch", "torch: logits on cpu (the Triton kernels run on CUDA)")
    assert loss_backend(cpu_logits, "torch")[0] == "torch"
    with pytest.raises(ValueError, match="backend: expected one of"):
        loss_backend(cpu_logits, "numba")
    if DEVICE == "cuda":
        assert loss_backend(cpu_logits.cuda()) == ("triton", "triton: CUDA logits and triton importable")
        assert loss_backend(cpu_logits.cuda().double())[1].startswith("torch: logits are torch.float64")
    else:
        assert loss_backend(cpu_logits, "triton")[0] == "triton"  # the interpreter runs CPU tensors


def test_dispatch_without_triton_names_the_import_error(monkeypatch):
    asked = []

    def unavailable(device, *, kernels_module=None):
        asked.append((torch.device(device).type, kernels_module))
        return "triton is not importable (ModuleNotFoundError: x)"

    monkeypatch.setattr(losses, "triton_unavailable_reason", unavailable)
    backend, reason = loss_backend(torch.zeros(1, 1, 1, 2, device=DEVICE))
    assert backend == "torch" and reason == ("torch: triton is not importable (ModuleNotFoundError: x)"
                                             if DEVICE == "cuda" else "torch: logits on cpu (the Triton kernels run on CUDA)")
    with pytest.raises(ValueError, match=r"^backend='triton': triton is not importable \(ModuleNotFoundError: x\)$"):
        loss_backend(torch.zeros(1, 1, 1, 2), "triton")
    assert asked[-1] == ("cpu", "workbench.models.losses_triton")  # the loss kernels' module is checked too


def test_backend_triton_on_cpu_without_the_interpreter_says_how_to_get_it(compile_without_interpreter):
    out = compile_without_interpreter(
        "import torch\nfrom workbench.models.losses import loss_backend\n"
        "try:\n    loss_backend(torch.zeros(1, 1, 1, 2), 'triton')\nexcept ValueError as e:\n    print(e)\n")
    assert out.strip() == ("backend='triton': on CPU the Triton kernels need its interpreter: "
                           "set TRITON_INTERPRET=1 before triton is imported")


def test_public_loss_with_backend_triton_runs_the_kernels(monkeypatch):
    logits, targets, logit_lengths, target_lengths = random_batch([3, 2], [1, 2], 4, vocab=3, seed=12)
    calls = []
    monkeypatch.setattr(losses_triton, "_transducer_loss", lambda *a: calls.append(1) or torch.zeros(2, device=DEVICE))
    rnnt_loss(logits, targets, logit_lengths, target_lengths, backend="triton")
    assert calls == [1]


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU with about 12 GB free")
def test_past_two_to_the_31_logit_elements():
    """bf16 logits of 2.4e9 elements: the item whose rows straddle 2**31 has the loss and gradient of
    the same item run alone (32-bit offsets would read and write elsewhere)."""
    batch, frames, labels, vocab = 3, 200, 100, 40000
    assert batch * frames * (labels + 1) * (vocab + 1) > 2**31
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(batch, frames, labels + 1, vocab + 1, device="cuda", dtype=torch.bfloat16, generator=gen)
    targets = torch.randint(0, vocab, (batch, labels), device="cuda", generator=gen)
    lengths = torch.full((batch,), frames, device="cuda"), torch.full((batch,), labels, device="cuda")
    x = logits.requires_grad_()
    whole = rnnt_loss_triton(x, targets, *lengths, blank=vocab, reduction="none")
    whole.sum().backward()
    last = logits[2:].detach().clone().requires_grad_()
    alone = rnnt_loss_triton(last, targets[2:], lengths[0][2:], lengths[1][2:], blank=vocab, reduction="none")
    alone.sum().backward()
    assert math.isfinite(whole[2].item())
    torch.testing.assert_close(whole[2:], alone)
    assert torch.equal(x.grad[2], last.grad[0])


@pytest.mark.skipif(DEVICE != "cuda", reason="device memory accounting needs a GPU")
def test_a_loss_step_leaves_nothing_allocated_on_the_device():
    # the OOMptimizer refuses probes that leave memory behind, so the loss keeps no device caches
    logits = torch.randn(2, 6, 4, 9, device="cuda", requires_grad=True)
    targets = torch.randint(0, 8, (2, 3), device="cuda")
    lengths = torch.tensor([6, 4], device="cuda"), torch.tensor([3, 2], device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for fn, kw in ((rnnt_loss_triton, {}), (tdt_loss_triton, {"durations": [0, 1, 2]})):
        x = torch.randn(2, 6, 4, 9 + len(kw.get("durations", [])), device="cuda", requires_grad=True)
        fn(x, targets, *lengths, blank=8, reduction="sum", **kw).backward()
        del x
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    del logits


def test_beta_runs_alongside_alpha_only_when_a_gradient_is_wanted(monkeypatch):
    grids = []
    kernel = losses_triton._lattice_kernel

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(losses_triton, "_lattice_kernel", Recording())
    logits, targets, logit_lengths, target_lengths = random_batch([3, 2], [1, 2], 4, vocab=3, seed=13)
    with torch.no_grad():
        rnnt_loss_triton(logits.requires_grad_(), targets, logit_lengths, target_lengths)
    rnnt_loss_triton(logits.detach(), targets, logit_lengths, target_lengths)
    rnnt_loss_triton(logits.requires_grad_(), targets, logit_lengths, target_lengths).backward()
    assert grids == [(2, 1), (2, 1), (2, 2)]


def test_the_lattice_kernel_takes_8_warps_only_for_wide_tiles(monkeypatch):
    """4 warps for RNN-T's one slot and for short targets; 8 once a diagonal's tile passes 512 edges (TDT's 5
    slots, padded to 8, at 128 labels), as launched."""
    assert [losses_triton._lattice_warps(u, s) for u, s in ((128, 1), (256, 1), (64, 8), (128, 8), (256, 8))] == \
        [4, 4, 4, 8, 8]
    warps = []
    kernel = losses_triton._lattice_kernel

    class Recording:
        def __getitem__(self, grid):
            return lambda *args, **kw: (warps.append(kw["num_warps"]), kernel[grid](*args, **kw))[1]

    monkeypatch.setattr(losses_triton, "_lattice_kernel", Recording())
    logits, targets, logit_lengths, target_lengths = random_batch([3, 2], [1, 2], 4, vocab=3, seed=13)
    rnnt_loss_triton(logits, targets, logit_lengths, target_lengths)
    assert warps == [4]


COMPILE_FOR_H200 = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from workbench.models import losses_triton as L

INT64_POINTERS = {"targets_ptr", "logit_lengths_ptr", "target_lengths_ptr", "edges_ptr"}
for dtype, nd, ns in (("fp32", 0, 1), ("bf16", 5, 5)):
    constants = {"ND": nd, "NS": ns, "BLOCK_V": 2048, "BLOCK_S": triton.next_power_of_2(ns), "BLOCK_U": 128,
                 "ROWS": 4 if nd == 0 else 1, "ONE_BLOCK": nd == 0}  # tiles of rows in one block; one row, looped
    for kernel in (L._normalize_kernel, L._lattice_kernel, L._grad_kernel):
        signature, constexprs = {}, {}
        for name, param in zip(kernel.arg_names, kernel.params):
            if param.is_constexpr:
                signature[name], constexprs[name] = "constexpr", constants[name]
            elif name in ("logits_ptr", "grad_ptr"):
                signature[name] = "*" + dtype
            elif name.endswith("_ptr"):
                signature[name] = "*i64" if name in INT64_POINTERS else "*fp32"
            else:
                signature[name] = "fp32" if name == "sigma" else "i32"
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], kernel.__name__
        print(kernel.__name__, dtype, "compiled")
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU run compiles them for real")
def test_the_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: compile every kernel to a cubin for sm_90 (fp32
    RNN-T and bf16 TDT variants) in a process without TRITON_INTERPRET."""
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 6
