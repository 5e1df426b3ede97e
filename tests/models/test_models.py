"""Models: parameter counts, worst-case batches, the decoding protocol, padding invariance, training steps."""

import pytest
import torch

from workbench.models import build_model, config_from_name, count_parameters
from workbench.models.encoder import subsampled_length


@pytest.mark.parametrize("name, low, high", [("large-rnnt", 100e6, 130e6), ("large-tdt", 100e6, 130e6),
                                             ("large-ctc", 95e6, 125e6), ("large-aed", 105e6, 140e6),
                                             ("xl-rnnt", 0.9e9, 1.2e9), ("xl-aed", 0.9e9, 1.2e9)])
def test_parameter_counts_of_large_and_xl(name, low, high):
    with torch.device("meta"):
        model = build_model(name)
    count = count_parameters(model)
    print(f"{name}: {count / 1e6:.1f}M parameters")
    assert low <= count <= high


def test_bad_names_and_sizes_are_refused():
    with pytest.raises(ValueError, match="model name"):
        build_model("huge-rnnt")
    with pytest.raises(ValueError, match="head"):
        config_from_name("tiny-rnnt").__class__(head="lstm", vocab_size=3)
    model = build_model("tiny-ctc")
    with pytest.raises(ValueError, match="batch_size"):
        model.make_batch(0, 1.0, 3, "cpu")
    with pytest.raises(ValueError, match="dtype"):
        model.training_step(model.make_batch(1, 0.5, 2, "cpu"), dtype=torch.float16)


@pytest.mark.parametrize("head", ["rnnt", "tdt", "ctc", "aed"])
def test_make_batch_is_the_worst_case_of_the_bucket(head):
    model = build_model(f"tiny-{head}", vocab_size=20)
    batch = model.make_batch(3, 1.25, 7, "cpu", seed=5)
    assert batch["audio"].shape == (3, 20000) and batch["audio"].dtype == torch.float32
    assert batch["audio_lens"].tolist() == [20000] * 3
    assert batch["tokens"].shape == (3, 7) and batch["tokens"].dtype == torch.long
    assert batch["token_lens"].tolist() == [7] * 3
    assert 0 <= int(batch["tokens"].min()) and int(batch["tokens"].max()) < 20
    again = model.make_batch(3, 1.25, 7, "cpu", seed=5)
    assert torch.equal(again["audio"], batch["audio"]) and torch.equal(again["tokens"], batch["tokens"])


@pytest.mark.parametrize("head", ["rnnt", "tdt", "ctc", "aed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_step_gives_finite_loss_and_gradients(head, dtype):
    torch.manual_seed(0)
    model = build_model(f"tiny-{head}")
    batch = model.make_batch(2, 0.8, 4, "cpu")
    loss = model.training_step(batch, dtype=dtype)
    assert loss.dim() == 0 and not loss.requires_grad and torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("head", ["rnnt", "tdt", "ctc", "aed"])
def test_a_batch_whose_transcripts_are_all_empty_trains_on_saying_nothing(head):
    """tokens [B, 0]: the target is no label at all (transducers and CTC: blanks only, AED: EOS at once),
    with a finite loss and gradients, as for a batch with labels."""
    torch.manual_seed(0)
    model = build_model(f"tiny-{head}", vocab_size=12)
    batch = model.make_batch(2, 0.8, 0, "cpu")
    assert batch["tokens"].shape == (2, 0)
    loss = model.training_step(batch)
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    if head == "rnnt":  # the one path: a blank at every frame, at label position 0
        model.eval()
        with torch.no_grad():
            enc, enc_lens = model.encode(batch["audio"], batch["audio_lens"])
            logits = model.joint(enc, model.predictor(batch["tokens"]))[..., :model.joint.num_outputs]
            blank = logits.float().log_softmax(-1)[:, :, 0, model.blank_id]
            valid = torch.arange(enc.shape[1])[None] < enc_lens[:, None]
            expected = -(blank * valid).sum()  # summed over the batch, over one target (the clamp to 1)
            torch.testing.assert_close(model.loss(batch), expected, rtol=1e-4, atol=1e-4)


def test_encoder_output_lengths_and_padding_invariance():
    torch.manual_seed(0)
    model = build_model("tiny-rnnt").eval()
    gen = torch.Generator().manual_seed(1)
    short, long = torch.randn(9000, generator=gen) * 0.1, torch.randn(16000, generator=gen) * 0.1
    audio = torch.zeros(2, 16000)
    audio[0, :9000], audio[1] = short, long
    with torch.no_grad():
        enc, lens = model.encode(audio, torch.tensor([9000, 16000]))
        alone, alone_lens = model.encode(short[None], torch.tensor([9000]))
    frames = torch.tensor([9000 // 160 + 1, 16000 // 160 + 1])
    assert lens.tolist() == subsampled_length(frames).tolist() == [8, 13]
    assert enc.shape == (2, 13, model.config.d_model)
    assert alone_lens.tolist() == [8]
    torch.testing.assert_close(enc[0, :8], alone[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", ["rnnt", "tdt"])
def test_transducer_parts_follow_the_decoding_protocol(head):
    torch.manual_seed(0)
    model = build_model(f"tiny-{head}", vocab_size=12).eval()
    predictor, joint = model.predictor, model.joint
    assert model.blank_id == 12
    targets = torch.tensor([[3, 5, 7], [1, 1, 2]])
    with torch.no_grad():
        teacher = predictor(targets)  # [B, U + 1, H]
        state = predictor.init_state(2)
        assert all(s.shape[0] == 2 for s in state)  # batch first
        labels = torch.full((2,), model.blank_id)
        stepped = []
        for u in range(4):
            out, state = predictor.step(labels, state)
            stepped.append(out)
            if u < 3:
                labels = targets[:, u]
        torch.testing.assert_close(torch.stack(stepped, 1), teacher, rtol=1e-5, atol=1e-5)
        enc = torch.randn(2, 6, model.config.d_model)
        full = joint(enc, teacher)
        one = joint.joint_after_projection(joint.project_encoder(enc)[:, 4], joint.project_predictor(teacher[:, 2]))
    extra = 5 if head == "tdt" else 0
    assert full.shape == (2, 6, 4, 12 + 1 + extra)
    assert one.shape == (2, 13 + extra)
    torch.testing.assert_close(one, full[:, 4, 2])


def test_the_predictor_lstm_runs_in_fp32_under_cpu_autocast():
    """oneDNN's bf16 LSTM cannot start on CPUs without bf16 instructions: under CPU autocast the predictor's
    LSTM runs in fp32, with the same values as outside autocast (teacher forcing and one decoding step)."""
    from workbench.models.transducer import Predictor

    torch.manual_seed(0)
    predictor = Predictor(vocab_size=7, hidden=16, num_layers=2, dropout=0.0).eval()
    targets = torch.randint(0, 7, (3, 5))
    state = predictor.init_state(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = predictor(targets)
        step_out, (h, c) = predictor.step(targets[:, 0], state)
    assert out.dtype == step_out.dtype == h.dtype == torch.float32
    torch.testing.assert_close(out, predictor(targets), rtol=0, atol=0)
    want, (want_h, _) = predictor.step(targets[:, 0], state)
    torch.testing.assert_close(step_out, want, rtol=0, atol=0)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)
