"""The lean training step: no host sync on CUDA, the attention bias made once, the pointwise convs as
matmuls, and torch.compile of the encoder blocks; each equal to the eager / previous formulation."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from workbench.models import build_model, compile_encoder_layers, rnnt_loss, tdt_loss
from workbench.models.encoder import key_padding_bias, sinusoidal_positions
from workbench.models.model import encoder_layers_compiled


def _padded_batch(model, lengths_s=(1.0, 0.55, 0.8), tokens=(6, 2, 4), seed=0):
    """A batch with different audio and token lengths (padding in both)."""
    batch = model.make_batch(len(lengths_s), max(lengths_s), max(tokens), "cpu", seed=seed)
    batch["audio_lens"] = torch.tensor([round(s * 16000) for s in lengths_s])
    batch["token_lens"] = torch.tensor(tokens)
    for i, n in enumerate(batch["audio_lens"].tolist()):
        batch["audio"][i, n:] = 0.0
    return batch


# --- checks: one-line errors on the CPU path, device asserts only for CUDA tensors --------------------

@pytest.mark.parametrize("head", ["rnnt", "tdt"])
def test_training_step_on_cpu_still_names_the_bad_field(head):
    model = build_model(f"tiny-{head}", vocab_size=12)
    batch = model.make_batch(2, 0.5, 3, "cpu")
    batch["tokens"][1, 0] = 12  # the blank id: not a label
    with pytest.raises(ValueError, match=r"^targets: 1 labels are blank \(12\) or outside \[0, 13\)$"):
        model.training_step(batch)
    batch = model.make_batch(2, 0.5, 3, "cpu")
    batch["token_lens"][0] = 4
    with pytest.raises(ValueError, match=r"^target_lengths: 1 of 2 outside \[0, 3\]$"):
        model.training_step(batch)


def test_device_check_on_cpu_tensors_is_the_host_check():
    logits = torch.randn(2, 3, 2, 4)
    targets, logit_lengths, target_lengths = torch.tensor([[1], [2]]), torch.tensor([3, 4]), torch.tensor([1, 1])
    for check in ("host", "device"):
        with pytest.raises(ValueError, match=r"^logit_lengths: 1 of 2 outside \[1, 3\]$"):
            rnnt_loss(logits, targets, logit_lengths, target_lengths, check=check)
    with pytest.raises(ValueError, match="^check: expected one of"):
        tdt_loss(torch.randn(2, 3, 2, 7), targets, torch.tensor([3, 3]), target_lengths, blank=0, check="later")


@pytest.mark.gpu
def test_gpu_device_check_runs_without_a_sync_and_the_host_check_still_names_the_field():
    logits = torch.randn(2, 3, 2, 4, device="cuda")
    targets = torch.tensor([[1], [2]], device="cuda")
    good, bad = torch.tensor([3, 2], device="cuda"), torch.tensor([3, 4], device="cuda")
    target_lengths = torch.tensor([1, 1], device="cuda")
    expected = rnnt_loss(logits, targets, good, target_lengths)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = rnnt_loss(logits, targets, good, target_lengths, check="device")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="logit_lengths: 1 of 2"):  # the default counts and names on the host
        rnnt_loss(logits, targets, bad, target_lengths)


REFERENCE_MODELS = [("large-rnnt", 0), ("large-rnnt", 8), ("large-tdt", 0), ("large-aed", 0), ("xl-aed", 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("name, joint_chunk_size", REFERENCE_MODELS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_training_step_has_no_host_sync(name, joint_chunk_size, dtype):
    """After a warm-up step, one training step of each reference model on a padded batch runs under
    torch.cuda.set_sync_debug_mode("error"): any device-to-host wait raises. 32 utterances of 120 tokens
    is past the 3072 label lookups where an embedding's backward changes kernels."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_model(name, joint_chunk_size=joint_chunk_size)
    batch = model.make_batch(32, 2.0, 120, "cuda")
    rows = torch.arange(32, device="cuda")
    batch["audio_lens"] = batch["audio_lens"] - rows * 500  # padded in audio and in tokens
    batch["token_lens"] = batch["token_lens"] - rows * 3
    model.training_step(batch, dtype=dtype)  # warm-up: kernels compile, libraries pick their algorithms
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = model.training_step(batch, dtype=dtype)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss)


# --- attention and convolution: equal to the previous formulation -------------------------------------

def _previous_attention(attn, x, memory=None, key_mask=None, causal=False):
    """The attention as it was: a boolean key mask handed to SDPA in every call."""
    memory = x if memory is None else memory
    batch, length, dim = x.shape
    q = attn.query(x).view(batch, length, attn.num_heads, -1).transpose(1, 2)
    k, v = attn.key_value(memory).view(batch, memory.shape[1], 2, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    mask = None if key_mask is None else key_mask[:, None, None, :]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return attn.out(y.transpose(1, 2).reshape(batch, length, dim))


def _previous_conv(conv, x, valid):
    """The convolution module as it was: Conv1d modules over [B, C, T]."""
    y = F.glu(conv.pointwise_in(conv.norm(x).transpose(1, 2)), dim=1)
    y = y * valid[:, None, :]
    y = F.silu(conv.batch_norm(conv.depthwise(y)))
    return conv.dropout(conv.pointwise_out(y).transpose(1, 2))


def _previous_encode(encoder, audio, audio_lens):
    features, frames = encoder.features(audio, audio_lens)
    x, lengths = encoder.subsampling(features, frames)
    x = x + sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)
    valid = torch.arange(x.shape[1])[None] < lengths[:, None]
    for block in encoder.blocks:
        x = x + 0.5 * block.ff1(x)
        x = x + _previous_attention(block.attn, block.attn_norm(x), key_mask=valid)
        x = x + _previous_conv(block.conv, x, valid)
        x = block.out_norm(x + 0.5 * block.ff2(x))
    return x, lengths


def _previous_decode(decoder, inputs, enc, enc_lens):
    x = decoder.embed(inputs)
    x = x + sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)
    memory = decoder.enc_proj(enc)
    memory_valid = torch.arange(enc.shape[1])[None] < enc_lens[:, None]
    for layer in decoder.layers:
        x = x + _previous_attention(layer.self_attn, layer.self_norm(x), causal=True)
        x = x + _previous_attention(layer.cross_attn, layer.cross_norm(x), memory, key_mask=memory_valid)
        x = x + layer.ff(x)
    return decoder.out(decoder.norm(x))


def test_key_padding_bias_is_sdpas_own_mask_with_aligned_rows():
    valid = torch.tensor([[True] * 11, [True] * 5 + [False] * 6])
    bias = key_padding_bias(valid, torch.bfloat16)
    assert bias.shape == (2, 1, 1, 11) and bias.dtype == torch.bfloat16
    assert bias.stride()[:3] == (16, 16, 16) and bias.stride(-1) == 1
    expected = torch.where(valid, 0.0, float("-inf"))[:, None, None, :].bfloat16()
    assert torch.equal(bias, expected)
    assert key_padding_bias(torch.ones(1, 16, dtype=torch.bool), torch.float32).stride(0) == 24


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encoder_and_decoder_equal_the_previous_formulation_on_padded_batches(dtype):
    torch.manual_seed(0)
    model = build_model("tiny-aed", vocab_size=16).train()
    batch = _padded_batch(model)
    tokens = batch["tokens"]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        enc, lens = model.encode(batch["audio"], batch["audio_lens"])
        before, before_lens = _previous_encode(model.encoder, batch["audio"], batch["audio_lens"])
        logits = model.decoder(tokens, enc, lens)
        before_logits = _previous_decode(model.decoder, tokens, before, before_lens)
    assert torch.equal(lens, before_lens) and len(set(lens.tolist())) == 3
    tolerance = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(enc, before, **tolerance)
    torch.testing.assert_close(logits, before_logits, **tolerance)
    if dtype == torch.float32:  # and the gradients through both
        grads = torch.autograd.grad(enc.square().sum() + logits.square().sum(), list(model.parameters()))
        before_grads = torch.autograd.grad(before.square().sum() + before_logits.square().sum(),
                                           list(model.parameters()))
        for g, b in zip(grads, before_grads):
            # different summation orders: the error follows the summands, which are far larger than a
            # gradient element that cancels to near zero (seen: 1.1e-5 on an element of 1.7e-5)
            torch.testing.assert_close(g, b, rtol=1e-4, atol=5e-5 + 1e-4 * b.abs().max().item())


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_half_step_residuals_in_one_add_are_bit_for_bit_the_two_op_form(autocast):
    """A conformer block's x + 0.5 * ff(x), taken as one torch.add(alpha=0.5), gives the very values and gradients
    of the multiply-then-add form (halving is exact in floating point)."""
    from workbench.models.config import ModelConfig
    from workbench.models.encoder import ConformerBlock

    torch.manual_seed(0)
    block = ConformerBlock(ModelConfig(head="rnnt", vocab_size=8, d_model=32, num_heads=4, dropout=0.0))

    def two_op_form(x, valid, key_bias):
        x = x + 0.5 * block.ff1(x)
        x = x + block.attn_dropout(block.attn(block.attn_norm(x), key_bias=key_bias))
        x = x + block.conv(x, valid)
        return block.out_norm(x + 0.5 * block.ff2(x))

    valid = torch.arange(12)[None] < torch.tensor([12, 7, 3])[:, None]
    x = torch.randn(3, 12, 32)
    results = []
    for forward in (block, two_op_form):
        xi = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = forward(xi, valid, key_padding_bias(valid, torch.bfloat16 if autocast else torch.float32))
        grads = torch.autograd.grad(y.float().square().sum(), [xi, *block.parameters()])
        results.append((y, grads))
    (y, grads), (y_ref, grads_ref) = results
    assert torch.equal(y, y_ref) and all(torch.equal(g, r) for g, r in zip(grads, grads_ref))


# --- torch.compile of the encoder blocks ---------------------------------------------------------------

def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model.training_step(batch)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_compiled_encoder_gives_the_eager_loss_and_gradients_on_new_shapes():
    """Inductor on the CPU (C++ codegen): the compiled blocks' loss and gradients equal eager ones, with
    the same state_dict keys, and batches of other sizes and lengths (13, 12 and 16 frames) reuse the
    graphs compiled for the first (no recompiles). In a child process: inductor's imports of triton
    would leave the Triton interpreter of the loss tests unusable in this one."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_lean_step as t; " \
           "t.check_compiled_equals_eager()"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def check_compiled_equals_eager():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = build_model("tiny-rnnt", vocab_size=12)
    keys = list(model.state_dict())
    batches = [_padded_batch(model, seed=1), _padded_batch(model, (0.7, 0.9), (3, 5), seed=2),
               _padded_batch(model, (0.7, 1.2, 0.4, 1.0), (3, 5, 2, 2), seed=3)]
    eager = [_loss_and_grads(model, b) for b in batches]
    assert not encoder_layers_compiled(model)
    assert {block.conv.time_depthwise for block in model.encoder.blocks} == {"auto"}
    compile_encoder_layers(model)
    assert encoder_layers_compiled(model) and list(model.state_dict()) == keys
    # "auto" settled for the weights' device before tracing (no device check in the compiled code); a pin stays
    assert {block.conv.time_depthwise for block in model.encoder.blocks} == {"torch"}
    pinned = compile_encoder_layers(build_model("tiny-rnnt", vocab_size=12, time_depthwise="triton"))
    assert {block.conv.time_depthwise for block in pinned.encoder.blocks} == {"triton"}
    graphs = []
    for batch, (loss, grads) in zip(batches, eager):
        got_loss, got_grads = _loss_and_grads(model, batch)
        graphs.append(counters["stats"]["unique_graphs"])
        torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert graphs[0] > 0 and graphs == [graphs[0]] * 3  # made for the first batch, shared by both blocks


def test_profile_check_warns_when_compile_differs_from_the_profile():
    from workbench.bucketing import BucketProfile
    from workbench.training.distributed import Ranks
    from workbench.training.recipe import TrainConfig, check_profile_for_run

    def warnings(meta, compile):
        config = TrainConfig(cuts="c.jsonl", tokenizer="t.model", out_dir="out", model="large-rnnt", compile=compile)
        profile = BucketProfile([2.0, 4.0], [8, 4], metadata={"model": "large-rnnt", **meta})
        return check_profile_for_run(profile, "p.yaml", config, Ranks(), torch.device("cpu"))

    assert warnings({"compile": False}, True) == [
        "--profile p.yaml: metadata.compile is False but this run has True; its batch sizes may not fit"]
    assert warnings({"compile": True}, False) == [
        "--profile p.yaml: metadata.compile is True but this run has False; its batch sizes may not fit"]
    assert warnings({}, True) == ["--profile p.yaml: made without --compile (no metadata.compile) but this run "
                                  "compiles the encoder; its batch sizes may not fit"]
    assert warnings({"compile": True}, True) == warnings({}, False) == []


def test_compile_flag_reaches_train_and_oomptimize():
    from workbench.cli import build_parser

    parser = build_parser()
    common = ["--cuts", "c.jsonl", "--tokenizer", "t.model", "--out", "o"]
    assert parser.parse_args(["train", *common, "--compile"]).compile is True
    assert parser.parse_args(["train", *common]).compile is None  # TrainConfig's default (False) applies
    assert parser.parse_args(["oomptimize", "--model", "large-rnnt", "--bins", "b.yaml", "--compile"]).compile
    assert not parser.parse_args(["oomptimize", "--model", "large-rnnt", "--bins", "b.yaml"]).compile


@pytest.mark.gpu
def test_gpu_compiled_encoder_trains_new_shapes_without_recompiling():
    """tiny-rnnt (the blocks' code is the reference models') with compiled blocks on the GPU: three padded
    batches of different sizes and lengths, one set of graphs (made on the first), finite losses; then
    the compiled step has no host sync."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = compile_encoder_layers(build_model("tiny-rnnt"))
    graphs = []
    for batch_size, seconds, tokens in [(8, 3.0, 30), (6, 4.1, 24), (12, 2.56, 40)]:
        batch = model.make_batch(batch_size, seconds, tokens, "cuda")
        batch["audio_lens"] = batch["audio_lens"] - torch.arange(batch_size, device="cuda") * 800
        loss = model.training_step(batch, dtype=torch.bfloat16)
        model.zero_grad(set_to_none=True)
        assert torch.isfinite(loss)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [graphs[0]] * 3
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.training_step(batch, dtype=torch.bfloat16)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _subsampling_pass(sub, features, lengths, **autocast):
    sub.zero_grad(set_to_none=True)
    features = features.clone().requires_grad_()
    with torch.autocast(features.device.type, **autocast) if autocast else torch.enable_grad():
        out, out_lengths = sub(features, lengths)
    (out.float() * torch.linspace(-1, 1, out.shape[-1], device=out.device)).sum().backward()
    return out.float(), out_lengths, features.grad, [p.grad.clone() for p in sub.parameters()]


def test_channels_last_subsampling_equals_the_default_layout():
    from workbench.models.encoder import Subsampling

    torch.manual_seed(0)
    sub = Subsampling(n_mels=16, channels=8, d_model=12)
    features, lengths = torch.randn(3, 37, 16), torch.tensor([37, 20, 9])
    results = {}
    for layout in (False, True):
        sub.channels_last = layout
        results[layout] = _subsampling_pass(sub, features, lengths)
    (a, la, ga, pa), (b, lb, gb, pb) = results[False], results[True]
    assert torch.equal(la, lb) and a.shape == (3, 5, 12)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gb, ga, rtol=1e-5, atol=1e-6)
    for x, y in zip(pb, pa):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert Subsampling(16, 8, 12).channels_last is None  # the default: decided by the input's device


@pytest.mark.gpu
def test_gpu_subsampling_depthwise_convolutions_run_in_cudnn_and_equal_the_default_layout():
    from workbench.models.encoder import Subsampling

    torch.manual_seed(0)
    sub = Subsampling(n_mels=80, channels=64, d_model=128, depthwise="torch").cuda()
    features = torch.randn(8, 400, 80, device="cuda")
    lengths = torch.tensor([400, 380, 300, 250, 200, 150, 100, 33], device="cuda")
    sub.channels_last = False
    a, _, ga, _ = _subsampling_pass(sub, features, lengths, dtype=torch.bfloat16)
    sub.channels_last = None  # the default on CUDA: channels last
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        b, _, gb, _ = _subsampling_pass(sub, features, lengths, dtype=torch.bfloat16)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert names and not [n for n in names if "conv_depthwise2d" in n]  # PyTorch's native depthwise kernels
    torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gb, ga, rtol=2e-2, atol=2e-2)
