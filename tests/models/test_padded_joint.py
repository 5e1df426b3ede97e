"""The joint's output layer padded to an aligned width in training: the same logits, loss and gradients as
the unpadded layer, the parameters and state dict of the true width, and (on a GPU) aligned GEMM kernels."""

import pytest
import torch

from workbench.models import build_model, model as model_module
from workbench.models.transducer import Joint, padded_width


def test_padded_width_rounds_up_to_the_multiple():
    assert [padded_width(n) for n in (1, 7, 8, 9, 13, 1024, 1025, 1030)] == [8, 8, 8, 16, 16, 1024, 1032, 1032]
    assert padded_width(5, multiple=4) == 8 and padded_width(12, multiple=4) == 12


def joint_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(3, 5, 6, generator=gen), torch.randn(3, 4, 7, generator=gen)


@pytest.mark.parametrize("num_outputs", [13, 16])
def test_padded_joint_has_the_true_logits_zero_padding_and_the_same_gradients(num_outputs):
    torch.manual_seed(0)
    joint = Joint(6, 7, 10, num_outputs)
    state = {k: v.clone() for k, v in joint.state_dict().items()}
    enc, pred = joint_inputs()
    weights = torch.randn(3, 5, 4, num_outputs)
    want = joint(enc, pred)
    (want * weights).sum().backward()
    want_grads = [p.grad.clone() for p in joint.parameters()]
    joint.zero_grad()
    got = joint(enc, pred, padded=True)
    assert got.shape == (3, 5, 4, padded_width(num_outputs)) and got.is_contiguous()
    torch.testing.assert_close(got[..., :num_outputs], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[..., num_outputs:], torch.zeros_like(got[..., num_outputs:]))
    (got[..., :num_outputs] * weights + got[..., num_outputs:].sum()).sum().backward()
    for p, g in zip(joint.parameters(), want_grads):  # padding columns feed no parameter
        assert p.grad.shape == g.shape
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-6)
    assert joint.state_dict().keys() == state.keys()
    assert all(torch.equal(joint.state_dict()[k], v) for k, v in state.items())
    assert joint.out.weight.shape == (num_outputs, 10) and joint.num_outputs == num_outputs


@pytest.mark.parametrize("chunk_size, calls", [(0, 1), (2, 2)])
def test_the_model_keeps_the_true_width_and_gives_the_loss_padded_logits(chunk_size, calls, monkeypatch):
    model = build_model("tiny-tdt", vocab_size=12, joint_chunk_size=chunk_size)  # 13 tokens + 5 durations -> 24
    assert model.joint.out.weight.shape[0] == 18 and model.state_dict()["joint.out.weight"].shape[0] == 18
    seen = []
    tdt_loss = model_module.tdt_loss
    monkeypatch.setattr(model_module, "tdt_loss", lambda x, *a, **kw: seen.append((x.shape[-1], kw["num_classes"]))
                        or tdt_loss(x, *a, **kw))
    model.training_step(model.make_batch(4, 0.5, 3, "cpu"))
    assert seen == [(24, 18)] * calls


def padded_batch(model, device="cpu"):
    batch = model.make_batch(4, 1.0, 6, device, seed=1)
    batch["audio_lens"] = torch.tensor([16000, 9000, 12000, 7000], device=device)
    batch["token_lens"] = torch.tensor([6, 0, 3, 2], device=device)
    return batch


def loss_and_grads(model, batch, dtype=torch.float32):
    model.zero_grad(set_to_none=True)
    loss = model.training_step(batch, dtype=dtype)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def unpadded_joint(monkeypatch):
    """The joint's training layout without padding (the losses then get num_classes = the last dim)."""
    monkeypatch.setattr(Joint, "padded_joint_after_projection", Joint.joint_after_projection)


def assert_padding_changes_nothing(head, monkeypatch, device, chunk_size=0, dtype=torch.float32, tolerance=1e-5,
                                   grad_tolerance=(1e-4, 1e-5)):
    """The padded training step's loss and parameter gradients equal the unpadded step's; grad_tolerance:
    (rtol, atol) of the gradients."""
    torch.manual_seed(0)
    with torch.device(device):
        model = build_model(f"tiny-{head}", vocab_size=12, joint_chunk_size=chunk_size)
    assert padded_width(model.joint.num_outputs) > model.joint.num_outputs
    batch = padded_batch(model, device)
    got_loss, got = loss_and_grads(model, batch, dtype)
    with monkeypatch.context() as patch:
        unpadded_joint(patch)
        want_loss, want = loss_and_grads(model, batch, dtype)
    torch.testing.assert_close(got_loss, want_loss, rtol=tolerance, atol=tolerance)
    assert set(got) == set(want) and "joint.out.weight" in got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=grad_tolerance[0], atol=grad_tolerance[1], msg=name)


@pytest.mark.parametrize("head", ["rnnt", "tdt"])
@pytest.mark.parametrize("chunk_size", [0, 2])
def test_training_step_with_padding_equals_the_unpadded_one(head, chunk_size, monkeypatch):
    assert_padding_changes_nothing(head, monkeypatch, "cpu", chunk_size)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["rnnt", "tdt"])
@pytest.mark.parametrize("chunk_size", [0, 2])
def test_gpu_training_step_with_padding_equals_the_unpadded_one(head, chunk_size, monkeypatch):
    assert_padding_changes_nothing(head, monkeypatch, "cuda", chunk_size)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["rnnt", "tdt"])
def test_gpu_bf16_training_step_with_padding_stays_close_to_the_unpadded_one(head, monkeypatch):
    assert_padding_changes_nothing(head, monkeypatch, "cuda", dtype=torch.bfloat16, tolerance=1e-2,
                                   grad_tolerance=(5e-2, 5e-3))


def joint_gemm_kernels(width_options, steps=2):
    """CUDA kernel names of the matmuls with an operand of one of ``width_options`` columns or rows, in a
    profiled bf16 forward + loss + backward of a large-rnnt-sized joint (vocabulary 1024, hidden 640)."""
    from workbench.models.losses import rnnt_loss

    torch.manual_seed(0)
    joint = Joint(512, 640, 640, 1025).cuda()
    enc, pred = torch.randn(4, 50, 512, device="cuda"), torch.randn(4, 41, 640, device="cuda")
    targets = torch.randint(0, 1024, (4, 40), device="cuda")
    lengths = torch.full((4,), 50, device="cuda"), torch.full((4,), 40, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = joint(enc, pred, padded=True)
            loss = rnnt_loss(logits, targets, *lengths, blank=1024, reduction="sum", num_classes=joint.num_outputs)
        loss.backward()

    step()  # warm-up: cuBLAS heuristics and Triton compiles
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    names = []
    for event in prof.events():
        if "mm" not in event.name or not any(width in shape for shape in event.input_shapes for width in width_options):
            continue
        names += [kernel.name for kernel in event.kernels]
    return names


@pytest.mark.gpu
def test_gpu_padded_joint_gemms_are_aligned(monkeypatch):
    """The joint's forward, grad-input and grad-weight GEMMs run at the padded width 1032 and none is one
    of cuBLAS's 1-element-aligned kernels, which it picks for the unpadded width 1025 (checked too, so the
    test shows the difference it is about)."""
    padded = joint_gemm_kernels((1032,))
    assert len(padded) >= 3 * 2, padded  # forward, grad-input and grad-weight GEMMs of both steps
    assert not [name for name in padded if "align1" in name], padded
    with monkeypatch.context() as patch:
        unpadded_joint(patch)
        assert joint_gemm_kernels((1032,)) == []  # nothing padded any more
        unpadded = joint_gemm_kernels((1025,))
    assert [name for name in unpadded if "align1" in name], (
        f"cuBLAS picked no align1 kernel for the unpadded width 1025 either: {unpadded}")
