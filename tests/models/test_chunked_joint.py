"""The chunked joint (joint + loss over chunks of the batch) gives the unchunked loss and gradients."""

import pytest
import torch

from workbench.models import build_model
from workbench.models.transducer import Joint, chunked_joint_loss


def padded_batch(model, seed, device="cpu"):
    """Five utterances of different lengths (audio and tokens), so chunks differ in their padding."""
    batch = model.make_batch(5, 1.0, 6, device, seed=seed)
    batch["audio_lens"] = torch.tensor([16000, 12000, 9000, 16000, 7000], device=device)
    batch["token_lens"] = torch.tensor([6, 3, 0, 5, 2], device=device)
    return batch


def loss_and_grads(model, batch, chunk_size, dtype=torch.float32):
    model.config.joint_chunk_size = chunk_size
    model.zero_grad(set_to_none=True)
    loss = model.training_step(batch, dtype=dtype)
    return loss, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", ["rnnt", "tdt"])
@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_training_step_in_chunks_equals_the_whole_batch(head, chunk_size):
    torch.manual_seed(0)
    model = build_model(f"tiny-{head}", vocab_size=12)
    batch = padded_batch(model, seed=1)
    want_loss, want = loss_and_grads(model, batch, 0)
    got_loss, got = loss_and_grads(model, batch, chunk_size)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    assert set(got) == set(want) and any(name.startswith("joint.out") for name in got)
    for name in want:  # encoder, predictor and joint all get the same gradient
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_chunks_under_bf16_autocast_stay_close_to_the_whole_batch():
    torch.manual_seed(0)
    model = build_model("tiny-rnnt", vocab_size=12)
    batch = padded_batch(model, seed=2)
    want_loss, want = loss_and_grads(model, batch, 0, dtype=torch.bfloat16)
    got_loss, got = loss_and_grads(model, batch, 2, dtype=torch.bfloat16)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-2, atol=1e-2)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=5e-2, atol=5e-3, msg=name)


def test_chunked_joint_loss_holds_one_chunk_and_is_only_evaluated_without_gradients():
    torch.manual_seed(0)
    joint = Joint(4, 3, 8, 5)
    enc, pred = torch.randn(5, 6, 4, requires_grad=True), torch.randn(5, 3, 3, requires_grad=True)
    weights = torch.randn(5, 6, 3, 5)
    shapes = []

    def chunk_loss(logits, rows):
        shapes.append(tuple(logits.shape))
        return (logits.square() * weights[rows]).sum()

    whole = chunk_loss(joint(enc, pred), slice(None))
    want = torch.autograd.grad(whole, [enc, pred, *joint.parameters()])
    shapes.clear()
    got_loss = chunked_joint_loss(joint, enc, pred, chunk_loss, 2)
    assert shapes == [(2, 6, 3, 5), (2, 6, 3, 5), (1, 6, 3, 5)]
    got = torch.autograd.grad(got_loss * 3.0, [enc, pred, *joint.parameters()])  # the scale reaches each
    torch.testing.assert_close(got_loss, whole)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, 3.0 * w)
    with torch.no_grad():
        evaluated = chunked_joint_loss(joint, enc, pred, chunk_loss, 4)
    assert not evaluated.requires_grad
    torch.testing.assert_close(evaluated, whole.detach())
    with pytest.raises(ValueError, match="joint_chunk_size: need at least 1"):
        chunked_joint_loss(joint, enc, pred, chunk_loss, 0)


def test_a_negative_chunk_size_is_refused_by_the_config():
    from workbench.models.config import tiny_config

    config = tiny_config("rnnt")
    with pytest.raises(ValueError, match="joint_chunk_size"):
        type(config)(head="rnnt", vocab_size=4, joint_chunk_size=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["rnnt", "tdt"])
def test_chunks_on_a_gpu_with_the_triton_loss_equal_the_whole_batch(head):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_model(f"tiny-{head}", vocab_size=12)
    batch = padded_batch(model, seed=3, device="cuda")
    want_loss, want = loss_and_grads(model, batch, 0)
    got_loss, got = loss_and_grads(model, batch, 2)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
