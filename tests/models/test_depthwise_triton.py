"""The Triton depthwise 3x3 stride-2 convolution equals torch's ``F.conv2d(..., stride=2, padding=1,
groups=C)``: values, input, weight and bias gradients; and Subsampling(depthwise="triton") equals the
default.

Without CUDA the kernels run on CPU tensors through Triton's interpreter (small shapes, a few seconds); on a
GPU machine the same tests run the compiled kernels and carry the ``gpu`` mark, and the ``gpu`` tests at the
end run them at the subsampling's sizes.
"""

import pytest
import torch
import torch.nn.functional as F

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models import build_model
from workbench.models.config import ModelConfig
from workbench.models.encoder import Subsampling, depthwise_conv3x3_s2

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import depthwise_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []

# (B, C, H, W): odd and even sizes, H or W of 1 and 2, C not a power of two and past one channel block
SHAPES = [(2, 5, 7, 9), (1, 3, 1, 1), (2, 6, 2, 1), (1, 3, 1, 2), (3, 4, 8, 6), (2, 70, 5, 4), (2, 3, 17, 11)]


def random_inputs(shape, *, seed, dtype=torch.float32, weight_dtype=torch.float32, channels_last=False):
    """(x, weight, bias, upstream gradient) on DEVICE, each rounded to its dtype."""
    gen = torch.Generator().manual_seed(seed)
    batch, channels, height, width = shape
    x = torch.randn(shape, generator=gen).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(channels, 1, 3, 3, generator=gen).to(weight_dtype)
    bias = torch.randn(channels, generator=gen).to(weight_dtype)
    upstream = torch.randn(batch, channels, (height + 1) // 2, (width + 1) // 2, generator=gen).to(dtype)
    return x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), upstream.to(DEVICE)


def value_and_grads(conv, x, weight, bias, upstream):
    """conv(x, weight, bias) and the gradients of sum(out * upstream) for x, weight and bias."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = conv(*leaves)
    grads = torch.autograd.grad((out * upstream).sum(), leaves)
    return (out.detach(), *grads)


def torch_conv(x, weight, bias):
    return F.conv2d(x, weight, bias, stride=2, padding=1, groups=x.shape[1])


def reference(x, weight, bias, upstream):
    """torch's results in float64 on the (already rounded) inputs (on CUDA: no TF32, no bf16 sums)."""
    return value_and_grads(torch_conv, x.double(), weight.double(), bias.double(), upstream.double())


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_values_and_gradients_equal_torch(shape, channels_last):
    x, weight, bias, upstream = random_inputs(shape, seed=sum(shape), channels_last=channels_last)
    got = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        assert g.shape == w.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5, msg=name)
    assert got[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32_weight", "bf16_weight"])
def test_bf16_values_and_gradients_equal_torch_in_fp32_within_bf16_rounding(weight_dtype):
    x, weight, bias, upstream = random_inputs((2, 6, 9, 7), seed=3, dtype=torch.bfloat16, weight_dtype=weight_dtype,
                                              channels_last=True)
    out, grad_x, grad_w, grad_b = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias,
                                                  upstream)
    want = reference(x, weight, bias, upstream)
    assert out.dtype == grad_x.dtype == torch.bfloat16 and grad_w.dtype == grad_b.dtype == weight_dtype
    torch.testing.assert_close(out.double(), want[0], rtol=1e-2, atol=2e-2)     # one bf16 rounding of the sum
    torch.testing.assert_close(grad_x.double(), want[1], rtol=1e-2, atol=2e-2)
    tight = weight_dtype == torch.float32  # fp32 sums of bf16 products, kept in fp32
    for got, w in ((grad_w, want[2]), (grad_b, want[3])):
        torch.testing.assert_close(got.double(), w, rtol=1e-5 if tight else 1e-2, atol=1e-4 if tight else 5e-2)


def test_fp16_values_and_gradients_equal_torch_in_fp32_within_fp16_rounding():
    x, weight, bias, upstream = random_inputs((2, 5, 7, 6), seed=5, dtype=torch.float16, channels_last=True)
    got = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    assert got[0].dtype == got[1].dtype == torch.float16 and got[2].dtype == got[3].dtype == torch.float32
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        torch.testing.assert_close(g.double(), w, rtol=2e-3, atol=4e-3, msg=name)


def test_a_checkpoint_saved_with_triton_depthwise_loads_with_torch_convolutions_off_cuda(tmp_path):
    from workbench.training.recipe import load_checkpoint, save_checkpoint

    model = build_model("tiny-rnnt", depthwise="triton")
    save_checkpoint(tmp_path / "model.pt", model)
    loaded = load_checkpoint(tmp_path / "model.pt", device="cpu")
    assert model.encoder.subsampling.depthwise == "triton" and loaded.encoder.subsampling.depthwise == "torch"
    assert loaded.config.depthwise == "torch"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_past_the_lengths_are_read_as_zero_and_get_no_gradient(dtype):
    """With lengths, the kernels compute the convolution of x masked past each item's rows: the same values
    and gradients as torch's on the masked input, and zero input gradient on the masked rows."""
    shape = (4, 5, 11, 6)
    x, weight, bias, upstream = random_inputs(shape, seed=11, dtype=dtype, channels_last=True)
    lengths = torch.tensor([11, 6, 0, 15], device=DEVICE)  # whole, odd cut, empty, past H (whole)
    rows = torch.arange(shape[2], device=DEVICE)[None, :] < lengths[:, None]
    mask = rows[:, None, :, None].to(dtype)
    got = value_and_grads(lambda x, w, b: depthwise_triton.depthwise_conv3x3_s2_triton(x, w, b, lengths),
                          x, weight, bias, upstream)
    want = value_and_grads(lambda x, w, b: torch_conv(x * mask.double(), w, b), x.double(), weight.double(),
                           bias.double(), upstream.double())
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 5e-2}
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        torch.testing.assert_close(g.double(), w, **tolerance, msg=name)
    assert torch.equal(got[1] * (1 - mask), torch.zeros_like(got[1]))  # exactly zero on the masked rows
    assert got[1][:, :, :6][1].abs().sum() > 0                           # and not on the valid ones
    unmasked = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    assert not torch.equal(unmasked[0], got[0])                         # the lengths did change the result


def test_lengths_are_checked_in_one_line():
    x, weight, bias, _ = random_inputs((2, 3, 4, 4), seed=12)
    conv = depthwise_triton.depthwise_conv3x3_s2_triton
    with pytest.raises(ValueError, match=r"^lengths: expected \[2\] integers \(valid rows per batch item\), "
                                         r"got torch.float32 of shape \(2,\)$"):
        conv(x, weight, bias, torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match=r"^lengths: expected \[2\] integers"):
        conv(x, weight, bias, torch.ones(3, dtype=torch.long, device=DEVICE))


def test_under_autocast_the_input_is_cast_like_a_convolution_input():
    x, weight, bias, upstream = random_inputs((2, 4, 6, 5), seed=4)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = depthwise_triton.depthwise_conv3x3_s2_triton(x, weight, bias)
        want = torch_conv(x, weight, bias)
    assert out.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), reference(x.bfloat16(), weight, bias, upstream)[0], rtol=1e-2, atol=2e-2)


class Launches:
    """Records which kernels a call launches (by name) and runs them."""

    def __init__(self, monkeypatch):
        self.names = []
        for name in ("_forward_kernel", "_input_grad_kernel", "_weight_grad_kernel"):
            monkeypatch.setattr(depthwise_triton, name, self._recording(name, getattr(depthwise_triton, name)))

    def _recording(self, name, kernel):
        names = self.names

        class Recording:
            def __getitem__(self, grid):
                return lambda *args, **kw: (names.append(name), kernel[grid](*args, **kw))[1]
        return Recording()


def test_backward_computes_only_the_gradients_asked_for(monkeypatch):
    x, weight, bias, upstream = random_inputs((2, 3, 5, 4), seed=5)
    launches = Launches(monkeypatch)
    w = weight.clone().requires_grad_()
    out = depthwise_triton.depthwise_conv3x3_s2_triton(x, w, None)  # no bias; x needs no gradient
    (grad_w,) = torch.autograd.grad((out * upstream).sum(), [w])
    assert launches.names == ["_forward_kernel", "_weight_grad_kernel"]
    torch.testing.assert_close(grad_w.double(), reference(x, weight, bias, upstream)[2], rtol=1e-5, atol=1e-5)
    launches.names.clear()
    xg = x.clone().requires_grad_()
    out = depthwise_triton.depthwise_conv3x3_s2_triton(xg, weight, bias)  # only x needs a gradient
    (grad_x,) = torch.autograd.grad((out * upstream).sum(), [xg])
    assert launches.names == ["_forward_kernel", "_input_grad_kernel"]
    torch.testing.assert_close(grad_x.double(), reference(x, weight, bias, upstream)[1], rtol=1e-5, atol=1e-5)


def test_weight_gradient_is_split_over_pixel_ranges_and_deterministic(monkeypatch):
    ranges, chunk = depthwise_triton._weight_grad_ranges(90, 1, torch.device("cpu"))
    assert (ranges, chunk) == (3, 32)  # 90 pixels: 6 steps of 16 over at most CPU_RANGES = 4 ranges -> 2 steps each
    assert depthwise_triton._weight_grad_ranges(5, 1, torch.device("cpu")) == (1, 16)
    x, weight, bias, upstream = random_inputs((2, 3, 17, 9), seed=6)  # 9 x 5 outputs per utterance: 90 pixels
    first = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    again = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), first, reference(x, weight, bias, upstream)):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5, msg=name)  # the 3 ranges' sums add up


def test_bad_inputs_are_refused_in_one_line():
    x, weight, bias, _ = random_inputs((1, 3, 4, 4), seed=7)
    conv = depthwise_triton.depthwise_conv3x3_s2_triton
    with pytest.raises(ValueError, match=r"^x: the Triton depthwise convolution takes float32, bfloat16 or float16, "
                                         r"got torch.float64$"):
        conv(x.double(), weight, bias)
    with pytest.raises(ValueError, match=r"^weight: expected \[3, 1, 3, 3\] for 3 channels, got \(3, 1, 5, 5\)$"):
        conv(x, torch.zeros(3, 1, 5, 5, device=DEVICE), bias)
    with pytest.raises(ValueError, match=r"^bias: expected \[3\], got \(4,\)$"):
        conv(x, weight, torch.zeros(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"^x: the depthwise convolution takes \[B, C, H, W\], got shape \(3, 4, 4\)$"):
        conv(x[0], weight, bias)


def test_the_dispatch_runs_the_kernels():
    x, weight, bias, upstream = random_inputs((1, 3, 5, 5), seed=8)
    got = depthwise_conv3x3_s2(x, weight, bias).double()
    torch.testing.assert_close(got, reference(x, weight, bias, upstream)[0], rtol=1e-5, atol=1e-5)


def test_the_dispatch_on_cpu_without_the_interpreter_says_how_to_get_it(compile_without_interpreter):
    out = compile_without_interpreter(
        "import torch\nfrom workbench.models.encoder import depthwise_conv3x3_s2\n"
        "try:\n    depthwise_conv3x3_s2(torch.zeros(1, 2, 3, 3), torch.zeros(2, 1, 3, 3), None)\n"
        "except ValueError as e:\n    print(e)\n")
    assert out.strip() == ("depthwise='triton': on CPU the Triton kernels need its interpreter: "
                           "set TRITON_INTERPRET=1 before triton is imported")


def test_depthwise_option_is_checked_where_it_is_given():
    with pytest.raises(ValueError, match=r"^depthwise: expected one of \('auto', 'torch', 'triton'\), got 'cudnn'$"):
        Subsampling(16, 8, 12, depthwise="cudnn")
    with pytest.raises(ValueError, match=r"^depthwise: expected one of \('auto', 'torch', 'triton'\), got 'cudnn'$"):
        ModelConfig(head="ctc", vocab_size=4, depthwise="cudnn")
    assert ModelConfig(head="ctc", vocab_size=4).depthwise == "auto"


def _subsampling_pass(sub, features, lengths):
    sub.zero_grad(set_to_none=True)
    features = features.clone().requires_grad_()
    out, out_lengths = sub(features, lengths)
    (out * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out.detach(), out_lengths, features.grad, {k: p.grad.clone() for k, p in sub.named_parameters()}


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_subsampling_with_triton_depthwise_equals_torchs_convolutions(channels_last, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # on a GPU: fp32 convolutions in fp32
    torch.manual_seed(0)
    default = Subsampling(n_mels=16, channels=8, d_model=12, channels_last=channels_last,
                          depthwise="torch").to(DEVICE)
    triton_sub = Subsampling(n_mels=16, channels=8, d_model=12, channels_last=channels_last,
                             depthwise="triton").to(DEVICE)
    assert list(triton_sub.state_dict()) == list(default.state_dict())
    triton_sub.load_state_dict(default.state_dict())
    features = torch.randn(3, 37, 16, device=DEVICE)
    lengths = torch.tensor([37, 20, 9], device=DEVICE)
    a, la, ga, pa = _subsampling_pass(default, features, lengths)
    b, lb, gb, pb = _subsampling_pass(triton_sub, features, lengths)
    assert torch.equal(la, lb) and b.shape == a.shape == (3, 5, 12)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-5)
    assert pb.keys() == pa.keys()
    for key in pa:
        torch.testing.assert_close(pb[key], pa[key], rtol=1e-4, atol=1e-5, msg=key)


def _mask_multiplies(sub, features, lengths) -> int:
    """aten.mul calls of one forward of ``sub`` (the frame masks; the Triton kernels are no aten ops)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += func is torch.ops.aten.mul.Tensor
            return func(*args, **(kwargs or {}))

    with Count():
        sub(features, lengths)
    return Count.calls


def test_on_the_triton_path_only_the_last_stage_is_masked():
    """The stages whose output feeds the Triton kernels skip their mask multiply (the kernels read the frames
    past the lengths as zero): one mask in all, against one per stage with torch's convolutions."""
    features, lengths = torch.randn(2, 21, 16, device=DEVICE), torch.tensor([21, 9], device=DEVICE)
    masks = {depthwise: _mask_multiplies(Subsampling(16, 8, 12, depthwise=depthwise).to(DEVICE), features, lengths)
             for depthwise in ("torch", "triton")}
    assert masks == {"torch": 3, "triton": 1}


def test_build_model_threads_the_option_to_the_subsampling():
    default, with_triton = build_model("tiny-ctc"), build_model("tiny-ctc", depthwise="triton")
    assert default.config.depthwise == default.encoder.subsampling.depthwise == "auto"
    assert with_triton.config.depthwise == with_triton.encoder.subsampling.depthwise == "triton"
    assert list(with_triton.state_dict()) == list(default.state_dict())


COMPILE_FOR_H200 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from workbench.models import depthwise_triton as D

for dtype in ("fp32", "bf16"):
    activations = {"x_ptr": dtype, "y_ptr": dtype, "g_ptr": dtype, "gx_ptr": dtype}
    for kernel, block_p in ((D._forward_kernel, D.BLOCK_P), (D._input_grad_kernel, D.BLOCK_P),
                            (D._weight_grad_kernel, D.WEIGHT_GRAD_BLOCK_P)):
        values = {"HAS_BIAS": True, "HAS_LENGTHS": True, "BLOCK_P": block_p, "BLOCK_C": D.MAX_BLOCK_C}
        constexprs = {n: values[n] for n, p in zip(kernel.arg_names, kernel.params) if p.is_constexpr}
        pointers = {**activations, "len_ptr": "i64"}
        signature = {n: "constexpr" if n in constexprs else "*" + pointers.get(n, "fp32") if n.endswith("_ptr")
                     else "i32" for n in kernel.arg_names}
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        print(kernel.__name__, dtype, "compiled" if compiled.asm["cubin"] else "no cubin")
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU run compiles them for real")
def test_the_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: compile every kernel to a cubin for sm_90 (fp32 and
    bf16) in a process without TRITON_INTERPRET."""
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_kernels_equal_torch_at_the_subsampling_size(dtype):
    """B=64, C=256, 167 x 40 channels-last (a stage's input), fp32 weights as in bf16 autocast."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 256, 167, 40, device="cuda", generator=gen).to(dtype).contiguous(
        memory_format=torch.channels_last)
    weight = torch.randn(256, 1, 3, 3, device="cuda", generator=gen)
    bias = torch.randn(256, device="cuda", generator=gen)
    upstream = torch.randn(64, 256, 84, 20, device="cuda", generator=gen).to(dtype)
    got = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    fp32 = dtype == torch.float32
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        rtol, atol = (1e-5, 1e-4) if fp32 or name in ("grad weight", "grad bias") else (1e-2, 3e-2)
        if name in ("grad weight", "grad bias"):  # sums over 64 x 84 x 20 pixels
            atol = 1e-5 * float(w.abs().max())
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=atol, msg=name)


@pytest.mark.gpu
def test_gpu_offsets_past_2_31_elements():
    """An input of 2.2e9 bf16 elements: the last utterances' outputs and input gradients (the input's and its
    gradient's offsets are past 2^31 there) equal torch's, the weight gradient (whose kernel reads the whole
    input) equals torch's summed over batch chunks, and the bias gradient is the upstream gradient's sum."""
    batch, channels, height, width = 1300, 256, 165, 40
    x = torch.empty(batch, channels, height, width, device="cuda", dtype=torch.bfloat16,
                    memory_format=torch.channels_last).normal_()
    weight = torch.randn(channels, 1, 3, 3, device="cuda", requires_grad=True)
    bias = torch.randn(channels, device="cuda", requires_grad=True)
    xg = x.requires_grad_()
    out = depthwise_triton.depthwise_conv3x3_s2_triton(xg, weight, bias)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    tail = slice(batch - 2, batch)
    want, want_x, _, _ = reference(x[tail].detach(), weight.detach(), bias.detach(), upstream[tail])
    torch.testing.assert_close(out[tail].double(), want, rtol=1e-2, atol=3e-2)
    torch.testing.assert_close(xg.grad[tail].double(), want_x, rtol=1e-2, atol=3e-2)
    torch.testing.assert_close(bias.grad.double(), upstream.double().sum((0, 2, 3)), rtol=1e-4, atol=1e-2)
    want_w = sum(torch.nn.grad.conv2d_weight(x[i:i + 100].detach().float(), tuple(weight.shape),
                                             upstream[i:i + 100].float(), stride=2, padding=1, groups=channels)
                 for i in range(0, batch, 100))
    torch.testing.assert_close(weight.grad, want_w, rtol=1e-3, atol=1e-3 * float(want_w.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("upstream_channels_last", [False, True], ids=["upstream_contiguous", "upstream_channels_last"])
def test_gpu_kernels_equal_torch_at_the_first_depthwise_stage_size(upstream_channels_last):
    """B=16, C=256, 350 x 40 (the first depthwise stage's input for 700 frames of 80 mel bins, even sizes),
    bf16 channels-last with fp32 weights, the upstream gradient in either layout."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(16, 256, 350, 40, device="cuda", generator=gen).to(torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    weight = torch.randn(256, 1, 3, 3, device="cuda", generator=gen)
    bias = torch.randn(256, device="cuda", generator=gen)
    upstream = torch.randn(16, 256, 175, 20, device="cuda", generator=gen).to(torch.bfloat16)
    if upstream_channels_last:
        upstream = upstream.contiguous(memory_format=torch.channels_last)
    got = value_and_grads(depthwise_triton.depthwise_conv3x3_s2_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        rtol, atol = (1e-2, 3e-2) if name in ("output", "grad x") else (1e-5, 1e-5 * float(w.abs().max()))
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


def relative_errors(results, want):
    """max |result - want| / max |want| of each pair, and where the largest error of each is."""
    out = []
    for got, ref in zip(results, want):
        diff = (got.double() - ref).abs()
        out.append((float(diff.max() / ref.abs().max()), tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))))
    return out


@pytest.mark.gpu
def test_gpu_subsampling_with_triton_depthwise_is_as_close_to_float64_as_cudnn_under_bf16_autocast():
    """Both bf16-autocast subsamplings (cuDNN's depthwise convolutions, the Triton ones) against the same
    module in float64: the Triton path's error in the output and each gradient is at most 2x cuDNN's
    (or under 1e-2 of the largest value); the message names both errors and where the largest is."""
    torch.manual_seed(0)
    default = Subsampling(n_mels=80, channels=256, d_model=512, depthwise="torch").cuda()
    triton_sub = Subsampling(n_mels=80, channels=256, d_model=512, depthwise="triton").cuda()
    triton_sub.load_state_dict(default.state_dict())
    exact = Subsampling(n_mels=80, channels=256, d_model=512, depthwise="torch").cuda().double()
    exact.load_state_dict(default.state_dict())
    features = torch.randn(16, 700, 80, device="cuda")
    lengths = torch.tensor([700 - 40 * i for i in range(16)], device="cuda")
    names = ("output", "grad features", "grad weight 1", "grad bias 2")

    def run(sub, inputs, autocast):
        sub.zero_grad(set_to_none=True)
        f = inputs.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out, _ = sub(f, lengths)
        weights = torch.linspace(-1, 1, out.shape[-1], device="cuda", dtype=out.dtype)
        (out * weights).sum().backward()
        return (out.detach(), f.grad, sub.stages[1][0].weight.grad, sub.stages[2][0].bias.grad)

    want = [t.double() for t in run(exact, features.double(), autocast=False)]
    cudnn = relative_errors(run(default, features, autocast=True), want)
    ours = relative_errors(run(triton_sub, features, autocast=True), want)
    report = "; ".join(f"{n}: triton {o[0]:.2e} at {o[1]}, cuDNN {c[0]:.2e} at {c[1]}"
                       for n, o, c in zip(names, ours, cudnn))
    print(report)
    assert all(o[0] <= max(2 * c[0], 1e-2) for o, c in zip(ours, cudnn)), report


def test_auto_takes_torch_off_cuda_even_where_the_interpreter_could_run_the_kernels(monkeypatch):
    from workbench.models.encoder import depthwise_backend

    assert depthwise_backend("auto", "cpu") == "torch"
    assert depthwise_backend("torch", "cuda") == "torch" and depthwise_backend("triton", "cpu") == "triton"
    calls = []
    op = depthwise_triton.depthwise_conv3x3_s2_op
    monkeypatch.setattr(depthwise_triton, "depthwise_conv3x3_s2_op", lambda *a: calls.append(1) or op(*a))
    sub = Subsampling(n_mels=16, channels=8, d_model=12)
    sub(torch.randn(2, 20, 16), torch.tensor([20, 11]))
    assert sub.depthwise == "auto" and calls == []


@pytest.mark.gpu
def test_gpu_the_default_model_runs_the_triton_depthwise_kernels_on_cuda(monkeypatch):
    calls = []
    op = depthwise_triton.depthwise_conv3x3_s2_op
    monkeypatch.setattr(depthwise_triton, "depthwise_conv3x3_s2_op", lambda *a: calls.append(1) or op(*a))
    sub = Subsampling(n_mels=80, channels=64, d_model=128).cuda()
    sub(torch.randn(2, 100, 80, device="cuda"), torch.tensor([100, 60], device="cuda"))
    assert len(calls) == 2  # the two depthwise stages
