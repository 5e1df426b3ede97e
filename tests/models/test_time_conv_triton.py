"""The Triton depthwise convolution over time on [B, T, C] equals torch's ``F.conv1d(..., padding=K // 2,
groups=C)`` on [B, C, T]: values, input, weight and bias gradients; and ConvolutionModule(time_depthwise=
"triton") equals the torch path.

Without CUDA the kernels run on CPU tensors through Triton's interpreter; on a GPU machine the same tests
run the compiled kernels and carry the ``gpu`` mark, and the ``gpu`` tests at the end run them at the
reference models' sizes.
"""

import pytest
import torch
import torch.nn.functional as F

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models import build_model
from workbench.models.encoder import ConvolutionModule

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import time_conv_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []

# (B, T, C, K): T shorter than the kernel, T of 1, C not a power of two and past one channel block,
# more frames than one block, K of 1
SHAPES = [(2, 7, 5, 3), (1, 1, 3, 5), (3, 4, 6, 9), (2, 40, 70, 9), (1, 33, 4, 1), (4, 3, 2, 5)]


def random_inputs(shape, seed, dtype=torch.float32, weight_dtype=torch.float32):
    batch, frames, channels, kernel = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, frames, channels, generator=gen).to(dtype)
    weight = torch.randn(channels, 1, kernel, generator=gen).to(weight_dtype)
    bias = torch.randn(channels, generator=gen).to(weight_dtype)
    upstream = torch.randn(batch, frames, channels, generator=gen).to(dtype)
    return [t.to(DEVICE) for t in (x, weight, bias, upstream)]


def value_and_grads(fn, x, weight, bias, upstream):
    x, weight, bias = (t.detach().clone().requires_grad_() for t in (x, weight, bias))
    out = fn(x, weight, bias)
    out.backward(upstream)
    return out.detach(), x.grad, weight.grad, bias.grad


def torch_conv(x, weight, bias):
    return F.conv1d(x.transpose(1, 2), weight, bias, padding=weight.shape[-1] // 2,
                    groups=x.shape[2]).transpose(1, 2)


def reference(x, weight, bias, upstream):
    """torch's convolution in float64 on the CPU."""
    return value_and_grads(torch_conv, *(t.detach().cpu().double() for t in (x, weight, bias, upstream)))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp32_values_and_gradients_equal_torch(shape):
    x, weight, bias, upstream = random_inputs(shape, seed=sum(shape))
    got = value_and_grads(time_conv_triton.time_depthwise_conv_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        assert g.shape == w.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.double().cpu(), w, rtol=1e-5, atol=1e-5, msg=name)


def test_frames_of_one_utterance_never_see_the_next_one():
    """Rows are flattened (b, t) frames: a tap past an utterance's end reads zero, not the next utterance."""
    x, weight, bias, _ = random_inputs((2, 4, 3, 9), seed=1)
    alone = [time_conv_triton.time_depthwise_conv_triton(x[i:i + 1], weight, bias) for i in range(2)]
    together = time_conv_triton.time_depthwise_conv_triton(x, weight, bias)
    torch.testing.assert_close(together, torch.cat(alone), rtol=0, atol=0)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32_weight", "bf16_weight"])
def test_bf16_values_and_gradients_equal_torch_within_bf16_rounding(weight_dtype):
    x, weight, bias, upstream = random_inputs((2, 11, 6, 9), seed=3, dtype=torch.bfloat16, weight_dtype=weight_dtype)
    out, grad_x, grad_w, grad_b = value_and_grads(time_conv_triton.time_depthwise_conv_triton, x, weight, bias,
                                                  upstream)
    want = reference(x, weight, bias, upstream)
    assert out.dtype == grad_x.dtype == torch.bfloat16 and grad_w.dtype == grad_b.dtype == weight_dtype
    torch.testing.assert_close(out.double().cpu(), want[0], rtol=1e-2, atol=3e-2)  # one rounding of the sum
    torch.testing.assert_close(grad_x.double().cpu(), want[1], rtol=1e-2, atol=3e-2)
    tight = weight_dtype == torch.float32  # fp32 sums of bf16 products, kept in fp32
    for got, w in ((grad_w, want[2]), (grad_b, want[3])):
        torch.testing.assert_close(got.double().cpu(), w, rtol=1e-5 if tight else 1e-2,
                                   atol=1e-4 if tight else 5e-2)


def test_without_a_bias_and_without_a_weight_gradient():
    x, weight, _, upstream = random_inputs((2, 6, 3, 5), seed=7)
    x = x.clone().requires_grad_()
    out = time_conv_triton.time_depthwise_conv_triton(x, weight, None)  # weight needs no gradient
    out.backward(upstream)
    want = reference(x, weight, torch.zeros(3, device=DEVICE), upstream)
    torch.testing.assert_close(out.detach().double().cpu(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double().cpu(), want[1], rtol=1e-5, atol=1e-5)


def test_under_autocast_the_input_is_cast_like_a_convolution_input():
    x, weight, bias, _ = random_inputs((2, 5, 4, 3), seed=4)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = time_conv_triton.time_depthwise_conv_triton(x, weight, bias)
        want = torch_conv(x, weight, bias)
    assert out.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.float(), rtol=1e-2, atol=3e-2)


@pytest.mark.parametrize("bad, message", [
    (dict(x=torch.zeros(2, 3)), r"^x: the time depthwise convolution takes \[B, T, C\], got shape \(2, 3\)$"),
    (dict(x=torch.zeros(2, 3, 4, dtype=torch.float64)), r"^x: the Triton time depthwise convolution takes float32"),
    (dict(weight=torch.zeros(4, 1, 4)), r"^weight: expected \[4, 1, K\] with K odd for 4 channels, got \(4, 1, 4\)$"),
    (dict(weight=torch.zeros(5, 1, 3)), r"^weight: expected \[4, 1, K\] with K odd"),
    (dict(bias=torch.zeros(3)), r"^bias: expected \[4\], got \(3,\)$"),
])
def test_bad_inputs_are_named_in_one_line(bad, message):
    args = dict(x=torch.zeros(2, 3, 4), weight=torch.zeros(4, 1, 3), bias=torch.zeros(4)) | bad
    with pytest.raises(ValueError, match=message):
        time_conv_triton.time_depthwise_conv_triton(**{k: v.to(DEVICE) for k, v in args.items()})


def _module_pass(module, x, valid, upstream):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    out = module(x, valid)
    out.backward(upstream)
    return [out.detach(), x.grad] + [p.grad for p in module.parameters()]


def test_convolution_module_with_triton_equals_the_torch_path():
    """The same parameters (and state_dict); the same output and gradients on a padded batch; the batch
    norm's running statistics move the same way."""
    torch.manual_seed(0)
    ours = ConvolutionModule(16, 5, dropout=0.0, time_depthwise="triton").to(DEVICE).train()
    theirs = ConvolutionModule(16, 5, dropout=0.0, time_depthwise="torch").to(DEVICE).train()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 9, 16, device=DEVICE)
    valid = torch.arange(9, device=DEVICE)[None] < torch.tensor([9, 6, 2], device=DEVICE)[:, None]
    upstream = torch.randn(3, 9, 16, device=DEVICE)
    # the depthwise bias's gradient is zero in exact arithmetic (the batch norm removes a constant): both
    # paths give rounding noise of ~1e-5 there, hence the absolute bound
    for got, want in zip(_module_pass(ours, x, valid, upstream), _module_pass(theirs, x, valid, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_build_model_threads_the_option_and_checks_it():
    model = build_model("tiny-rnnt", time_depthwise="triton")
    assert model.config.time_depthwise == "triton"
    assert {block.conv.time_depthwise for block in model.encoder.blocks} == {"triton"}
    assert build_model("tiny-rnnt").encoder.blocks[0].conv.time_depthwise == "auto"  # the default
    with pytest.raises(ValueError, match=r"^time_depthwise: expected one of \('auto', 'torch', 'triton'\), got 'x'$"):
        build_model("tiny-rnnt", time_depthwise="x")


def test_a_training_step_with_triton_time_depthwise_equals_the_torch_one():
    torch.manual_seed(0)
    ours = build_model("tiny-rnnt", vocab_size=12, time_depthwise="triton", depthwise="torch").to(DEVICE)
    theirs = build_model("tiny-rnnt", vocab_size=12, depthwise="torch", time_depthwise="torch").to(DEVICE)
    theirs.load_state_dict(ours.state_dict())
    batch = ours.make_batch(3, 0.5, 4, torch.device(DEVICE))
    loss_ours = ours.training_step(batch, dtype=torch.float32)
    loss_theirs = theirs.training_step(batch, dtype=torch.float32)
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        # the depthwise bias's gradient is rounding noise of ~1e-5 (zero in exact arithmetic, see above)
        atol = 5e-5 if name.endswith("conv.depthwise.bias") else 1e-5
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=atol, msg=name)


@pytest.mark.skipif(DEVICE == "cuda", reason="needs a CPU without the interpreter")
def test_time_depthwise_conv_off_cuda_without_the_interpreter_says_how_to_get_it(compile_without_interpreter):
    out = compile_without_interpreter(
        "import torch\nfrom workbench.models.encoder import time_depthwise_conv\n"
        "try:\n    time_depthwise_conv(torch.zeros(1, 2, 3), torch.zeros(3, 1, 3), None)\n"
        "except ValueError as e:\n    print(e)\n")
    assert out.startswith("time_depthwise='triton': on CPU the Triton kernels need its interpreter")


COMPILE_FOR_H200 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from workbench.models import time_conv_triton as T

for dtype in ("fp32", "bf16"):
    for kernel, block_t in ((T._time_conv_kernel, T.BLOCK_T), (T._time_weight_grad_kernel, T.WEIGHT_GRAD_BLOCK_T)):
        values = {"K": 9, "FLIP": True, "HAS_BIAS": True, "BLOCK_T": block_t, "BLOCK_C": T.MAX_BLOCK_C}
        constexprs = {n: values[n] for n, p in zip(kernel.arg_names, kernel.params) if p.is_constexpr}
        weights = {"w_ptr": "fp32", "bias_ptr": "fp32", "partial_ptr": "fp32"}  # the rest: activations
        signature = {n: "constexpr" if n in constexprs else "*" + weights.get(n, dtype) if n.endswith("_ptr")
                     else "i32" for n in kernel.arg_names}
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        print(kernel.__name__, dtype, "compiled" if compiled.asm["cubin"] else "no cubin")
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU run compiles them for real")
def test_the_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: compile both kernels to a cubin for sm_90 (fp32 and
    bf16 activations) in a process without TRITON_INTERPRET."""
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_kernels_equal_torch_at_the_conformer_size(dtype):
    """B=64, T=500, C=512, K=9 (a 40 s utterance's encoder frames at large's width), fp32 weights as in
    bf16 autocast."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 500, 512, device="cuda", generator=gen).to(dtype)
    weight = torch.randn(512, 1, 9, device="cuda", generator=gen)
    bias = torch.randn(512, device="cuda", generator=gen)
    upstream = torch.randn(64, 500, 512, device="cuda", generator=gen).to(dtype)
    got = value_and_grads(time_conv_triton.time_depthwise_conv_triton, x, weight, bias, upstream)
    want = reference(x, weight, bias, upstream)
    for name, g, w in zip(("output", "grad x", "grad weight", "grad bias"), got, want):
        rtol, atol = (1e-5, 1e-4) if dtype == torch.float32 else (1e-2, 5e-2)
        if name in ("grad weight", "grad bias"):  # fp32 sums over 32000 frames
            rtol, atol = 1e-5, 1e-5 * float(w.abs().max())
        torch.testing.assert_close(g.double().cpu(), w, rtol=rtol, atol=atol, msg=name)


def test_importing_the_models_loads_neither_triton_nor_dynamo(compile_without_interpreter):
    """Triton's interpreter is chosen when triton.language is first imported (torch._dynamo imports it):
    importing the models must not, or the tests' TRITON_INTERPRET comes too late."""
    out = compile_without_interpreter("import sys\nimport workbench.models\n"
                                      "print('triton.language' in sys.modules, 'torch._dynamo' in sys.modules)")
    assert out.split() == ["False", "False"]
