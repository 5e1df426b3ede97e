"""The fused joint + loss equals the materialized one (the joint's logits, then rnnt_loss / tdt_loss) in value
and in every gradient, and never holds a tensor the size of the logits."""

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from workbench.models.fused_joint_loss import ALIGNMENT, fused_joint_loss, fused_projected_joint_loss, tile_shape
from workbench.models.losses import rnnt_loss, tdt_loss
from workbench.models.transducer import Joint


def _inputs(batch, frames, labels, hidden, num_outputs, vocab, dtype=torch.float64, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    enc = torch.randn(batch, frames, hidden, generator=gen, dtype=dtype)
    pred = torch.randn(batch, labels + 1, hidden, generator=gen, dtype=dtype)
    weight = torch.randn(num_outputs, hidden, generator=gen, dtype=dtype) * 0.7
    b = torch.randn(num_outputs, generator=gen, dtype=dtype) if bias else None
    targets = torch.randint(0, vocab, (batch, labels), generator=gen)
    logit_lengths = torch.randint(1, frames + 1, (batch,), generator=gen)
    logit_lengths[0] = frames
    target_lengths = torch.randint(0, labels + 1, (batch,), generator=gen)
    target_lengths[-1] = labels
    return [x.requires_grad_() if x is not None else None for x in (enc, pred, weight, b)], \
        (targets, logit_lengths, target_lengths)


def _materialized(enc, pred, weight, bias, targets, logit_lengths, target_lengths, **kwargs):
    logits = F.linear(torch.relu(enc[:, :, None] + pred[:, None]), weight, bias)
    loss = tdt_loss if "durations" in kwargs else rnnt_loss
    return loss(logits, targets, logit_lengths, target_lengths, **kwargs)


def _value_and_grads(fn, params, lengths, kwargs):
    loss = fn(*params, *lengths, **kwargs)
    wrt = [p for p in params if p is not None]
    return loss, torch.autograd.grad(loss.sum(), wrt)


def _assert_equal(params, lengths, kwargs, tile, rtol=1e-9, atol=1e-9):
    want, want_grads = _value_and_grads(_materialized, params, lengths, kwargs)
    got, got_grads = _value_and_grads(
        lambda *a, **k: fused_projected_joint_loss(*a, max_tile_elements=tile, **k), params, lengths, kwargs)
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("tile", [1, 37, 200, 10_000])  # one node; some frames; whole utterances; everything
@pytest.mark.parametrize("blank", [-1, 0])
def test_rnnt_equals_the_materialized_loss_in_float64(tile, blank):
    vocab = 6
    params, lengths = _inputs(4, 5, 3, 8, vocab + 1, vocab)
    if blank == 0:
        lengths[0].add_(1)  # labels in [1, V]: blank is class 0
    _assert_equal(params, lengths, dict(blank=blank, reduction="none"), tile)


@pytest.mark.parametrize("tile", [1, 50, 10_000])
@pytest.mark.parametrize("durations,sigma", [([0, 1, 2, 3], 0.0), ([2, 0, 1], 0.05)])
def test_tdt_equals_the_materialized_loss_in_float64(tile, durations, sigma):
    vocab = 5
    params, lengths = _inputs(3, 6, 4, 7, vocab + 1 + len(durations), vocab, seed=1)
    _assert_equal(params, lengths, dict(blank=vocab, durations=durations, sigma=sigma, reduction="sum"), tile)


def test_no_labels_at_all_and_no_bias():
    params, lengths = _inputs(2, 4, 0, 5, 4, 3, bias=False)
    _assert_equal(params, lengths, dict(blank=3, reduction="mean"), 7)


def test_a_joint_module_in_fp32_and_bf16_autocast():
    torch.manual_seed(0)
    vocab, durations = 9, [0, 1, 2]
    joint = Joint(6, 5, 8, vocab + 1 + len(durations))
    enc, pred = torch.randn(3, 7, 6), torch.randn(3, 5, 5)
    targets = torch.randint(0, vocab, (3, 4))
    logit_lengths, target_lengths = torch.tensor([7, 3, 5]), torch.tensor([4, 1, 0])
    kwargs = dict(blank=vocab, durations=durations, reduction="sum")
    for autocast, rtol in ((False, 1e-5), (True, 2e-2)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            want = tdt_loss(joint(enc, pred, padded=True), targets, logit_lengths, target_lengths,
                            num_classes=joint.num_outputs, **kwargs)
            want_grads = torch.autograd.grad(want, list(joint.parameters()))
            got = fused_joint_loss(joint, enc, pred, targets, logit_lengths, target_lengths,
                                   max_tile_elements=64, **kwargs)
            got_grads = torch.autograd.grad(got, list(joint.parameters()))
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol)
        for g, w in zip(got_grads, want_grads):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=rtol, atol=rtol * max(1.0, w.abs().max().item()))


def test_bad_inputs_are_named():
    params, (targets, logit_lengths, target_lengths) = _inputs(2, 3, 2, 4, 5, 4)
    with pytest.raises(ValueError, match="targets"):
        fused_projected_joint_loss(*params, targets[:, :1], logit_lengths, target_lengths, blank=-1)
    with pytest.raises(ValueError, match="logit_lengths"):
        fused_projected_joint_loss(*params, targets, logit_lengths + 5, target_lengths, blank=-1)
    with pytest.raises(ValueError, match="max_tile_elements"):
        fused_projected_joint_loss(*params, targets, logit_lengths, target_lengths, blank=-1, max_tile_elements=0)
    with pytest.raises(ValueError, match="backend"):  # refused for fp64 too, which never runs the kernels
        fused_projected_joint_loss(*params, targets, logit_lengths, target_lengths, blank=-1, backend="cuda")
    enc, pred, weight, bias = params
    with pytest.raises(ValueError, match="pred_proj: batch 1"):
        fused_projected_joint_loss(enc, pred[:1], weight, bias, targets, logit_lengths, target_lengths, blank=-1)
    with pytest.raises(ValueError, match="weight: last dim 3"):
        fused_projected_joint_loss(enc, pred, weight[:, :3], bias, targets, logit_lengths, target_lengths, blank=-1)
    with pytest.raises(ValueError, match="bias"):
        fused_projected_joint_loss(enc, pred, weight, bias[:2], targets, logit_lengths, target_lengths, blank=-1)


def test_tiles_cover_the_lattice_within_the_budget():
    assert tile_shape(8, 10, 5, 4, 10_000) == (8, 10)
    assert tile_shape(8, 10, 5, 4, 450) == (2, 10)
    assert tile_shape(8, 10, 5, 4, 45) == (1, 2)
    assert tile_shape(8, 10, 5, 4, 1) == (1, 1)


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns (meta tensors hold no memory: not counted)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor) and x.device.type != "meta":
                self.largest = max(self.largest, x.numel())
        return out


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]])
def test_no_tensor_the_size_of_the_logits(durations):
    batch, frames, labels, hidden, vocab = 4, 30, 12, 16, 128
    num_outputs = vocab + 1 + len(durations or [])
    params, lengths = _inputs(batch, frames, labels, hidden, num_outputs, vocab, dtype=torch.float32)
    logits_elements = batch * frames * (labels + 1) * padded(num_outputs)
    with _LargestTensor() as mode:
        loss = fused_projected_joint_loss(*params, *lengths, blank=vocab, durations=durations, reduction="sum",
                                          max_tile_elements=logits_elements // 40)
        loss.backward()
    assert mode.largest <= logits_elements // 10, (mode.largest, logits_elements)


def padded(width: int) -> int:
    return -(-width // ALIGNMENT) * ALIGNMENT


def _model_loss_and_grads(model, batch, joint_loss, dtype=torch.float32):
    model.config.joint_loss = joint_loss
    model.zero_grad(set_to_none=True)
    loss = model.training_step(batch, dtype=dtype)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", ["rnnt", "tdt"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_a_training_step_with_the_fused_loss_equals_the_default_one(head, dtype, tolerance):
    from workbench.models import build_model

    torch.manual_seed(0)
    model = build_model(f"tiny-{head}", vocab_size=12, joint_loss="fused")
    batch = model.make_batch(4, 1.0, 6, "cpu", seed=1)
    batch["audio_lens"] = torch.tensor([16000, 12000, 9000, 7000])
    batch["token_lens"] = torch.tensor([6, 3, 0, 2])
    want_loss, want = _model_loss_and_grads(model, batch, "materialized", dtype)
    got_loss, got = _model_loss_and_grads(model, batch, "fused", dtype)
    torch.testing.assert_close(got_loss, want_loss, rtol=tolerance, atol=tolerance)
    assert set(got) == set(want) and any(name.startswith("joint.out") for name in got)
    for name in want:  # encoder, predictor and joint all get the same gradient
        scale = max(1.0, want[name].abs().max().item())
        torch.testing.assert_close(got[name], want[name], rtol=tolerance * 10, atol=tolerance * scale, msg=name)


def test_the_fused_loss_is_a_transducer_option():
    from workbench.models import build_model
    from workbench.models.config import check_joint_loss

    with pytest.raises(ValueError, match="joint_loss"):
        build_model("tiny-rnnt", joint_loss="tiled")
    with pytest.raises(ValueError, match="joint_chunk_size"):
        build_model("tiny-rnnt", joint_loss="fused", joint_chunk_size=2)
    with pytest.raises(ValueError, match="--loss fused: applies to the reference transducers"):
        check_joint_loss("fused", "ctc", "tiny-ctc")
    check_joint_loss("materialized", "ctc", "tiny-ctc")


def _cuda_inputs(batch, frames, labels, hidden, num_outputs, dtype, seed=0, vocab=None, bias=True):
    """vocab: label ids are drawn from [0, vocab) (default: all outputs but the last)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    enc = torch.randn(batch, frames, hidden, device="cuda", generator=gen).to(dtype)
    pred = torch.randn(batch, labels + 1, hidden, device="cuda", generator=gen).to(dtype)
    weight = (torch.randn(num_outputs, hidden, device="cuda", generator=gen) / hidden ** 0.5).to(dtype)
    b = torch.randn(num_outputs, device="cuda", generator=gen).to(dtype) if bias else None
    targets = torch.randint(0, vocab or num_outputs - 1, (batch, labels), device="cuda", generator=gen)
    logit_lengths = torch.randint(frames // 2, frames + 1, (batch,), device="cuda", generator=gen)
    target_lengths = torch.randint(labels // 2, labels + 1, (batch,), device="cuda", generator=gen)
    logit_lengths[0], target_lengths[0] = frames, labels
    return [x.requires_grad_() if x is not None else None for x in (enc, pred, weight, b)], \
        (targets, logit_lengths, target_lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]])
@pytest.mark.parametrize("blank_first,bias", [(False, True), (True, False)])
def test_cuda_equals_the_materialized_triton_loss(dtype, tolerance, durations, blank_first, bias):
    vocab = 1024
    params, lengths = _cuda_inputs(6, 40, 20, 64, vocab + 1 + len(durations or []), dtype, vocab=vocab,
                                   bias=bias)
    blank = 0 if blank_first else vocab
    if blank_first:
        lengths[0].add_(1).clamp_(max=vocab)  # label ids 1..vocab
    kwargs = dict(blank=blank, reduction="none") | ({} if durations is None else dict(durations=durations))
    want, want_grads = _value_and_grads(_materialized, params, lengths, kwargs)
    got, got_grads = _value_and_grads(
        lambda *a, **k: fused_projected_joint_loss(*a, max_tile_elements=1 << 20, **k), params, lengths, kwargs)
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * 10)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.float(), w.float(), rtol=tolerance * 5,
                                   atol=tolerance * max(1.0, w.abs().max().item()))


@pytest.mark.gpu
def test_cuda_past_two_to_the_31_logit_elements():
    """bf16, 2.5e9 logit elements that only the fused path holds: each utterance's loss and its
    projections' gradients equal the materialized loss of that utterance alone."""
    batch, frames, labels, hidden, vocab = 16, 500, 300, 64, 1024
    assert batch * frames * (labels + 1) * (vocab + 1) > 2**31
    params, (targets, logit_lengths, target_lengths) = _cuda_inputs(batch, frames, labels, hidden, vocab + 1,
                                                                   torch.bfloat16)
    got = fused_projected_joint_loss(*params, targets, logit_lengths, target_lengths, blank=vocab, reduction="none")
    grads = torch.autograd.grad(got.sum(), params[:2])
    for b in (0, batch - 1):
        alone = [p[b:b + 1].detach().requires_grad_() for p in params[:2]] + params[2:]
        want = _materialized(*alone, targets[b:b + 1], logit_lengths[b:b + 1], target_lengths[b:b + 1],
                             blank=vocab, reduction="none")
        want_grads = torch.autograd.grad(want.sum(), alone[:2])
        torch.testing.assert_close(got[b:b + 1], want, rtol=1e-3, atol=1e-2)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g[b:b + 1].float(), w.float(), rtol=5e-2,
                                       atol=2e-2 * max(1.0, w.abs().max().item()))


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3], [2, 0, 1]])
def test_the_lattice_kernel_on_node_log_probs_equals_the_diagonal_loop(monkeypatch, durations):
    """On CUDA the fused loss's lattice runs as the Triton lattice kernel (here under Triton's interpreter)."""
    if triton is None:
        pytest.skip("triton is not installed")
    from workbench.models import losses

    vocab = 5
    params, lengths = _inputs(4, 6, 4, 7, vocab + 1 + len(durations or []), vocab, dtype=torch.float32, seed=3)
    kwargs = dict(blank=vocab, reduction="none") | ({} if durations is None else dict(durations=durations))
    want, want_grads = _value_and_grads(fused_projected_joint_loss, params, lengths, kwargs)
    monkeypatch.setattr(losses, "_lattice_kernel_runs", lambda weights: weights.dtype == torch.float32)
    got, got_grads = _value_and_grads(fused_projected_joint_loss, params, lengths, kwargs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _triton_against_torch(params, lengths, kwargs, tile, rtol=1e-5, atol=1e-5):
    if triton is None:
        pytest.skip("triton is not installed")
    params = [p.detach().to(DEVICE).requires_grad_() if p is not None else None for p in params]
    lengths = [x.to(DEVICE) for x in lengths]
    if DEVICE == "cuda":  # compiled GEMMs sum in another order than numpy's
        rtol, atol = max(rtol, 1e-4), max(atol, 1e-4)
    runs = {}
    for backend in ("torch", "triton"):
        runs[backend] = _value_and_grads(
            lambda *a, **k: fused_projected_joint_loss(*a, max_tile_elements=tile, backend=backend, **k),
            params, lengths, kwargs)
    (want, want_grads), (got, got_grads) = runs["torch"], runs["triton"]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol * max(1.0, w.abs().max().item()))


# 41 outputs padded to 48 x 5 label positions: 240 a frame. One frame a tile; two; two utterances; one tile
@pytest.mark.parametrize("tile", [1, 500, 2400, 1 << 20])
@pytest.mark.parametrize("blank,bias", [(-1, True), (0, False)])
def test_the_triton_kernels_equal_the_torch_ops_for_rnnt(tile, blank, bias):
    """On CUDA where there is one, else under Triton's interpreter: vocabulary blocks that loop (40 tokens,
    32 a block on the CPU), tiles that start mid-utterance."""
    vocab = 40
    params, lengths = _inputs(3, 5, 4, 19, vocab + 1, vocab, dtype=torch.float32, seed=4, bias=bias)
    if blank == 0:
        lengths[0].add_(1).clamp_(max=vocab)
    _triton_against_torch(params, lengths, dict(blank=blank, reduction="none"), tile)


@pytest.mark.parametrize("durations,sigma", [([0, 1, 2, 3], 0.0), ([2, 0, 1], 0.05)])
def test_the_triton_kernels_equal_the_torch_ops_for_tdt(durations, sigma):
    vocab = 35
    params, lengths = _inputs(2, 6, 3, 9, vocab + 1 + len(durations), vocab, dtype=torch.float32, seed=5)
    _triton_against_torch(params, lengths, dict(blank=vocab, durations=durations, sigma=sigma, reduction="sum"),
                          400)  # 40 outputs padded to 48 x 4 label positions: two frames a tile


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_strided_projections_give_what_contiguous_ones_give(backend):
    """Forward and backward make each tile's logits by the same call, so a strided enc_proj (say, a transposed
    tensor) rounds them in bf16 as a contiguous one does, value and gradients alike (on a GPU the Triton
    kernels sum the projections' gradients by atomic adds, in any order: equal up to their rounding)."""
    if backend == "triton" and triton is None:
        pytest.skip("triton is not installed")
    vocab = 30
    device = DEVICE if backend == "triton" else "cpu"
    params, lengths = _inputs(2, 6, 3, 16, vocab + 1, vocab, dtype=torch.float32, seed=7)
    params, lengths = [p.detach().to(device, torch.bfloat16) for p in params], [x.to(device) for x in lengths]
    exact = device == "cpu"
    strided = params[0].transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    kwargs = dict(blank=vocab, reduction="none", backend=backend)
    runs = [_value_and_grads(fused_projected_joint_loss, [enc.requires_grad_(), *(p.requires_grad_() for p in
            params[1:])], lengths, kwargs) for enc in (params[0].clone(), strided)]
    (want, want_grads), (got, got_grads) = runs
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0 if exact else None, atol=0 if exact else None)


def test_the_triton_kernels_in_bf16_round_the_logits_as_the_torch_ops_do():
    vocab = 33
    params, lengths = _inputs(2, 4, 3, 16, vocab + 1, vocab, dtype=torch.float32, seed=6)
    params = [p.detach().to(torch.bfloat16).requires_grad_() for p in params]
    _triton_against_torch(params, lengths, dict(blank=vocab, reduction="none"), 1 << 20, rtol=2e-2, atol=2e-2)


def test_a_fake_trace_takes_the_kernels_custom_ops(monkeypatch):
    """The OOMptimizer's plan traces the step with fake CPU tensors as on CUDA: the fused loss goes through
    the kernels' custom ops (their fake implementations), forward and backward, and the plan predicts less
    memory for it than for the materialized joint (large-rnnt, B=64 x 15 s, 120 tokens)."""
    from workbench.models import fused_joint_triton
    from workbench.oomptimizer.plan import StepTracer, build_fake_reference_model, new_fake_mode

    if triton is None:
        pytest.skip("triton is not installed")
    calls = []
    names = ("fused_joint_logits_stats", "fused_joint_logits_grad", "fused_joint_hidden", "fused_joint_hidden_grad")
    for name in names:
        op = getattr(fused_joint_triton, name)
        monkeypatch.setattr(fused_joint_triton, name, lambda *a, _op=op, _name=name: calls.append(_name) or _op(*a))
    peaks = {}
    for joint_loss in ("materialized", "fused"):
        fake_mode = new_fake_mode()
        tracer = StepTracer(build_fake_reference_model("large-rnnt", fake_mode, joint_loss=joint_loss), fake_mode)
        peaks[joint_loss] = tracer.trace((15.0, 120), 64).peak_allocated_bytes
    assert set(names) <= set(calls)
    assert peaks["fused"] < 0.7 * peaks["materialized"], peaks  # the logits, their gradient and the hidden units


COMPILE_FOR_H200 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
import torch
from workbench.models import fused_joint_triton as F

block_m, block_n, _ = F._BLOCKS["cuda"]
hidden_m, hidden_n, _ = F._HIDDEN_BLOCKS["cuda"]
block_u, block_t, block_j, _ = F._HIDDEN_GRAD_BLOCKS["cuda"]
kernels = [(F._logits_stats_kernel, dict(BLOCK_M=block_m, BLOCK_N=block_n)),
           (F._logits_grad_kernel, dict(BLOCK_M=block_m, BLOCK_N=block_n)),
           (F._hidden_kernel, dict(HAS_BIAS=True, BLOCK_M=hidden_m, BLOCK_N=hidden_n)),
           (F._hidden_grad_kernel, dict(BLOCK_U=block_u, BLOCK_T=block_t, BLOCK_J=block_j))]
for dtype in ("fp32", "bf16"):
    for kernel, constants in kernels:
        signature, constexprs = {}, {}
        for name, param in zip(kernel.arg_names, kernel.params):
            if param.is_constexpr:
                signature[name], constexprs[name] = "constexpr", constants[name]
            elif name in ("z_ptr", "enc_ptr", "pred_ptr", "h_ptr", "dh_ptr"):
                signature[name] = "*" + dtype
            elif name.endswith("_ptr"):
                signature[name] = "*i64" if name == "targets_ptr" else "*fp32"
            else:
                signature[name] = "i64" if name in ("START", "NODES") else "i32"
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], kernel.__name__
        print(kernel.__name__, dtype, "compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles them for real")
def test_the_fused_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: the four kernels to a cubin for sm_90, fp32 and bf16."""
    if triton is None:
        pytest.skip("triton is not installed")
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 8
