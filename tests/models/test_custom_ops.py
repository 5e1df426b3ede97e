"""The Triton kernels as torch custom ops (``workbench::...``): each op passes torch.library.opcheck (schema,
autograd registration, fake implementation, AOT dispatch), torch.compile traces through them with their
backward, the FLOP counter counts them as torch counts the same convolutions, and the OOMptimizer's fake trace
takes them (the path that runs on the GPU).

Without CUDA the kernels run on CPU tensors through Triton's interpreter (tiny shapes: it is slow); on a GPU
machine the same tests run the compiled kernels and carry the ``gpu`` mark, and the last test compiles a
model with inductor.
"""

import pytest
import torch

from triton_interpreter import DEVICE, triton  # noqa: I001 - sets TRITON_INTERPRET before the kernels load

from workbench.models import build_model
from workbench.oomptimizer.plan import (DeviceMemoryTracker, StepTracer, block_bytes, build_fake_reference_model,
                                        new_fake_mode, plan_profile)
from workbench.triton_support import kernel_device_type, kernels_as_on_cuda

if triton is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from workbench.models import depthwise_triton, losses_triton, time_conv_triton  # noqa: E402

pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []
OPS = torch.ops.workbench


def randn(*shape, seed, grad=False, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype).requires_grad_(grad)


def ints(*values):
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def loss_inputs(num_dur=0):
    """Logits [2, 3, 3, 4 + num_dur + 1 padding column] with grad, targets [2, 2], lengths: one full
    utterance, one shorter in both frames and labels."""
    logits = randn(2, 3, 3, 4 + num_dur + 1, seed=num_dur, grad=True)
    return logits, ints([1, 2], [2, 0]), ints(3, 2), ints(2, 1)


@pytest.mark.parametrize("bias, lengths", [(True, True), (False, False)], ids=["bias-lengths", "plain"])
def test_opcheck_depthwise_conv3x3_s2(bias, lengths):
    x, weight = randn(2, 5, 4, 3, seed=1, grad=True), randn(3, 1, 3, 3, seed=2, grad=True)
    b = randn(3, seed=3, grad=True) if bias else None
    lens = ints(5, 3) if lengths else None
    torch.library.opcheck(OPS.depthwise_conv3x3_s2, (x, weight, b, lens))
    grad = randn(2, 3, 2, 3, seed=4)
    torch.library.opcheck(OPS.depthwise_conv3x3_s2_input_grad, (grad, weight.detach(), lens, 5, 4))
    torch.library.opcheck(OPS.depthwise_conv3x3_s2_weight_grad, (x.detach(), grad, lens, 16))


@pytest.mark.parametrize("flip", [False, True])
def test_opcheck_time_depthwise_conv(flip):
    x, weight, bias = randn(2, 5, 3, seed=5, grad=True), randn(3, 1, 3, seed=6, grad=True), randn(3, seed=7, grad=True)
    torch.library.opcheck(OPS.time_depthwise_conv, (x, weight, bias, flip))
    torch.library.opcheck(OPS.time_depthwise_conv_weight_grad, (x.detach(), randn(2, 5, 3, seed=8), 3, 32))


@pytest.mark.parametrize("durations", [None, [0, 1, 2]], ids=["rnnt", "tdt"])
def test_opcheck_transducer_loss(durations):
    """The forward's lattice buffers (alpha, beta, edge weights, duration log-probs) hold unspecified values
    outside the lattice, which backward never reads, so AOT dispatch is checked on the loss and its gradient
    (test_compile_traces_the_ops_and_their_backward), not by comparing those buffers."""
    num_dur = len(durations or [])
    logits, targets, logit_lengths, target_lengths = loss_inputs(num_dur)
    slots = [[1], [0]] if durations is None else [durations, durations]
    args = (logits, targets, logit_lengths, target_lengths, *slots, 4, 4, num_dur, 0.1 * num_dur, True)
    torch.library.opcheck(OPS.transducer_loss_forward, args,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    with torch.no_grad():
        log_likelihood, lse, dur_logp, alpha, beta, _ = OPS.transducer_loss_forward(*args)
    backward_args = (torch.tensor([1.0, 0.5], device=DEVICE), logits.detach(), targets, logit_lengths,
                     target_lengths, lse, dur_logp, alpha, beta, log_likelihood, *slots, 4, 4, num_dur,
                     0.1 * num_dur)
    torch.library.opcheck(OPS.transducer_loss_backward, backward_args)


def kernels_step(x, weight, bias, y, conv_weight, logits, targets, logit_lengths, target_lengths):
    """A scalar through all three kernels' entry points: the subsampling's convolution, the one over time and
    the RNN-T loss."""
    image = depthwise_triton.depthwise_conv3x3_s2_triton(x, weight, bias, ints(6, 4))
    frames = time_conv_triton.time_depthwise_conv_triton(y, conv_weight, None)
    loss = losses_triton.rnnt_loss_triton(logits, targets, logit_lengths, target_lengths, blank=3, num_classes=4,
                                          reduction="sum")
    return image.square().sum() + frames.square().sum() + loss


def kernels_step_inputs():
    return (randn(2, 3, 6, 5, seed=10, grad=True), randn(3, 1, 3, 3, seed=11, grad=True), randn(3, seed=12, grad=True),
            randn(2, 4, 3, seed=13, grad=True), randn(3, 1, 3, seed=14, grad=True), *loss_inputs())


def test_compile_traces_the_ops_and_their_backward():
    """aot_eager: the forward and backward graphs call the custom ops (no graph break around a kernel, no
    torch fallback), and the loss and every gradient equal eager mode's."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs = []

    def record(gm, _):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(kernels_step, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    inputs = kernels_step_inputs()
    eager = kernels_step(*inputs)
    wants = [t for t in inputs if t.requires_grad]
    want_grads = torch.autograd.grad(eager, wants)
    got = compiled(*inputs)
    got_grads = torch.autograd.grad(got, wants)
    torch.testing.assert_close(got, eager)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
    called = set().union(*graphs)
    for op in ("depthwise_conv3x3_s2", "depthwise_conv3x3_s2_input_grad", "depthwise_conv3x3_s2_weight_grad",
               "time_depthwise_conv", "time_depthwise_conv_weight_grad", "transducer_loss_forward",
               "transducer_loss_backward"):
        assert f"workbench.{op}.default" in called, op


def test_flop_counter_counts_the_convolutions():
    """A convolution op's forward counts as torch's convolution of the same shapes, its input and weight
    gradients the same again (torch's counter counts a grouped convolution's weight gradient C times over: it
    ignores the groups); the loss counts nothing (nor does torch's reference loss: the counter counts matmuls,
    convolutions and attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    x, weight, bias, y, conv_weight, *loss = kernels_step_inputs()
    with FlopCounterMode(display=False) as ours:
        kernels_step(x, weight, bias, y, conv_weight, *loss).backward()
    with FlopCounterMode(display=False) as torchs, torch.no_grad():
        torch.nn.functional.conv2d(x, weight, bias, stride=2, padding=1, groups=3)
        torch.nn.functional.conv1d(y.transpose(1, 2), conv_weight, padding=1, groups=3)
    counts = ours.get_flop_counts()["Global"]
    image, frames = 2 * 9 * (2 * 3 * 3 * 3), 2 * 3 * (2 * 4 * 3)  # 2 x taps x outputs [2, 3, 3, 3] and [2, 4, 3]
    assert torchs.get_total_flops() == image + frames
    assert counts[OPS.depthwise_conv3x3_s2] == counts[OPS.depthwise_conv3x3_s2_input_grad] == image
    assert counts[OPS.depthwise_conv3x3_s2_weight_grad] == image
    assert counts[OPS.time_depthwise_conv] == 2 * frames  # forward and input gradient
    assert counts[OPS.time_depthwise_conv_weight_grad] == frames
    assert OPS.transducer_loss_forward not in counts and OPS.transducer_loss_backward not in counts
    assert ours.get_total_flops() == 3 * (image + frames)


def test_a_fake_trace_inside_kernels_as_on_cuda_counts_the_kernels_buffers(monkeypatch):
    """The fake CPU logits take the Triton loss, whose fakes make the forward's lattice buffers (the edge
    weights included, though backward does not keep them): the traced peak holds them all at once."""
    calls = []
    op = losses_triton.transducer_loss_forward
    monkeypatch.setattr(losses_triton, "transducer_loss_forward", lambda *a: calls.append(1) or op(*a))
    fake_mode = new_fake_mode()
    with fake_mode:
        logits = torch.empty(4, 50, 21, 33, requires_grad=True)
        targets = torch.zeros(4, 20, dtype=torch.int64)
        lengths, label_lengths = torch.full((4,), 50), torch.full((4,), 20)
        buffers = losses_triton._forward_buffers(logits, 1, 0)
    tracker = DeviceMemoryTracker()
    with fake_mode, tracker, kernels_as_on_cuda():
        assert kernel_device_type(logits.device) == "cuda"
        losses_triton.rnnt_loss_triton(logits, targets, lengths, label_lengths, num_classes=32).backward()
    assert kernel_device_type("cpu") == "cpu"
    assert calls == [1]  # the Triton loss's op, not torch's reference loss
    lattice = sum(block_bytes(t.untyped_storage().nbytes()) for t in buffers)
    assert tracker.peak_allocated_bytes >= lattice + block_bytes(logits.untyped_storage().nbytes())


def test_the_plan_traces_the_kernels_path(monkeypatch):
    """A planned step of tiny-rnnt runs every kernel's op (by its fake), and predicts less memory than the
    torch path (the loss keeps no fp32 log-softmax of the logits); the profile says which path it traced."""
    from workbench.bucketing.profile import BucketProfile

    calls = []
    for module, name in ((losses_triton, "transducer_loss_forward"), (depthwise_triton, "depthwise_conv3x3_s2_op"),
                         (time_conv_triton, "time_depthwise_conv_op")):
        monkeypatch.setattr(module, name, lambda *a, op=getattr(module, name), name=name: calls.append(name) or op(*a))
    fake_mode = new_fake_mode()
    model = build_fake_reference_model("tiny-rnnt", fake_mode)
    kernels = StepTracer(model, fake_mode).trace((4.0, 40), 8)
    assert sorted(set(calls)) == ["depthwise_conv3x3_s2_op", "time_depthwise_conv_op", "transducer_loss_forward"]
    calls.clear()
    torch_path = StepTracer(model, fake_mode, cuda_kernels=False).trace((4.0, 40), 8)
    assert calls == [] and kernels.peak_allocated_bytes < torch_path.peak_allocated_bytes
    profile, _ = plan_profile(model, fake_mode, "tiny-rnnt", BucketProfile(bucket_duration_bins=[[4.0, 40]]),
                              gpu_memory="256MiB", margin_bytes=16 * 2**20)
    assert "kernels as on CUDA" in profile.metadata["plan"]["traced_path"]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")
def test_gpu_inductor_compiles_through_the_ops_and_matches_eager():
    """torch.compile with inductor of the kernels' entry points and of a whole tiny-rnnt loss on the Triton
    path: the values and gradients equal eager mode's (fp32, TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch._dynamo.reset()
    inputs = kernels_step_inputs()
    wants = [t for t in inputs if t.requires_grad]
    eager = kernels_step(*inputs)
    got = torch.compile(kernels_step)(*inputs)
    torch.testing.assert_close(got, eager)
    for a, b in zip(torch.autograd.grad(got, wants), torch.autograd.grad(eager, wants)):
        torch.testing.assert_close(a, b)

    torch.manual_seed(0)
    model = build_model("tiny-rnnt", depthwise="triton", time_depthwise="triton").cuda()
    batch = model.make_batch(3, 1.0, 8, "cuda")
    model.eval()  # no dropout: the same values twice
    with torch.backends.cudnn.flags(enabled=False):  # cuDNN's LSTM has no backward in eval mode
        eager_loss = model.loss(batch)
        eager_grads = torch.autograd.grad(eager_loss, list(model.parameters()))
        compiled_loss = torch.compile(model.loss)(batch)
        compiled_grads = torch.autograd.grad(compiled_loss, list(model.parameters()))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-4)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
