"""kernels="triton" (workbench.decoding.fused) gives the torch stages' decisions: stage by stage on random loop
states, and whole decodes; its LSTM step equals nn.LSTM's within rounding. Without CUDA the kernels run through
Triton's interpreter (small shapes); the ``gpu`` tests compare the graph modes and the kernel kinds on a GPU."""

import triton_interpreter  # noqa: F401, I001 - sets TRITON_INTERPRET before triton is imported

import dataclasses

import pytest
import torch

from workbench import triton_support
from workbench.decoding import GreedyTransducerDecoder, fused, label_looping, make_toy_transducer
from benchmarks.decoding import nemo_peer
from benchmarks.decoding.op_count import predictor_step_ops, stage_ops
from test_gpu import gpu_case  # noqa: E402 - the GPU tests' random cases

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
REASON = fused.triton_unavailable_reason(DEVICE)
needs_triton = pytest.mark.skipif(REASON is not None, reason=str(REASON))
TDT_CASES = [None, [0, 1, 2, 3], [1, 2, 4]]
TDT_IDS = ["rnnt", "tdt-with-0", "tdt-without-0"]
INT_FIELDS = ("time", "active", "searching", "labels", "step_duration", "symbols_at_frame", "num_emitted", "tokens",
              "timestamps", "active_any", "searching_any")


class BlankRows:
    """A joint whose chosen utterances see only blanks (a large blank logit in every window frame)."""

    def __init__(self, joint, blank_id: int, rows: list[int], batch: int):
        self.joint, self.blank_id, self.rows, self.batch = joint, blank_id, rows, batch

    def project_encoder(self, enc):
        return self.joint.project_encoder(enc)

    def project_predictor(self, out):
        return self.joint.project_predictor(out)

    def joint_after_projection(self, enc_proj, pred_proj):
        logits = self.joint.joint_after_projection(enc_proj, pred_proj)
        per_row = logits.view(self.batch, -1, logits.shape[-1]).clone()
        per_row[self.rows, :, self.blank_id] += 100.0
        return per_row.view_as(logits)


def random_loop_state(seed: int, durations, window: int, batch: int, max_symbols: int, kernels: str):
    """Buffers of a small toy transducer in a random mid-decode state: padded rows (length 0), rows at their
    end, symbol counts at the max-symbols limit, random labels, predictor state and projection."""
    with torch.no_grad():
        return _random_loop_state(seed, durations, window, batch, max_symbols, kernels)


def _random_loop_state(seed, durations, window, batch, max_symbols, kernels):
    g = torch.Generator().manual_seed(seed)
    vocab, frames = 9, 7
    predictor, joint = make_toy_transducer(vocab_size=vocab, enc_dim=6, pred_dim=8, joint_dim=8, durations=durations,
                                           blank_bias=0.5, logit_scale=3.0, seed=seed)
    buf = label_looping.make_buffers(predictor, joint, batch_capacity=batch, frame_capacity=frames, enc_dim=6,
                                     dtype=torch.float32, device=DEVICE, blank_id=vocab, durations=durations,
                                     max_symbols=max_symbols, window=window, kernels=kernels)
    lengths = torch.randint(0, frames + 1, (batch,), generator=g)
    lengths[0] = frames
    if batch > 2:
        lengths[1] = 0
    label_looping.load_inputs(buf, torch.randn(batch, frames, 6, generator=g).to(DEVICE), lengths.to(DEVICE))
    label_looping.start(buf, predictor, joint)
    buf.time.copy_(torch.minimum(torch.randint(0, frames + 1, (batch,), generator=g).to(DEVICE), buf.lengths))
    torch.lt(buf.time, buf.lengths, out=buf.active)
    buf.searching.copy_(buf.active & torch.randint(0, 2, (batch,), generator=g, dtype=torch.bool).to(DEVICE))
    buf.labels.copy_(torch.randint(0, vocab + 1, (batch,), generator=g))
    buf.step_duration.copy_(torch.randint(0, 3, (batch,), generator=g))
    buf.symbols_at_frame.copy_(torch.randint(max(0, max_symbols - 2), max_symbols, (batch,), generator=g))
    buf.num_emitted.copy_(torch.randint(0, 4, (batch,), generator=g))
    buf.scores.copy_(torch.randn(batch, generator=g))
    for s in buf.pred_state:
        s.copy_(torch.randn(s.shape, generator=g))
    buf.pred_proj.copy_(torch.randn(buf.pred_proj.shape, generator=g))
    return predictor, joint, buf


def twin(buf):
    """A copy of ``buf`` that runs the torch stages."""
    fields = {}
    for f in dataclasses.fields(buf):
        if f.name == "joint_output":            # (joint, layer): not state; the torch stages never read it
            continue
        value = getattr(buf, f.name)
        fields[f.name] = (value.clone() if isinstance(value, torch.Tensor)
                          else tuple(v.clone() for v in value) if isinstance(value, tuple) else value)
    return dataclasses.replace(buf, **{**fields, "kernels": "torch", "emit": None, "lstm": None,
                                     "joint_output": None})


def assert_same_state(got, expected):
    """Equal loop state. With window 1 the torch stage's first decision also writes a label (maybe blank) to
    rows that have not found one, which no emit reads: labels and durations are compared where a row holds a
    found label (active, not searching), tokens and timestamps up to each row's count. The fused LSTM step's
    state and projection equal the module step's within rounding, the others' exactly."""
    loose = {"labels", "step_duration", "tokens", "timestamps"} if got.window == 1 else set()
    for name in set(INT_FIELDS) - loose:
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    decided = expected.active & ~expected.searching
    for name in loose & {"labels", "step_duration"}:
        assert torch.equal(getattr(got, name)[decided], getattr(expected, name)[decided]), name
    written = torch.arange(got.tokens.shape[1]) < expected.num_emitted.unsqueeze(1)
    for name in loose & {"tokens", "timestamps"}:
        assert torch.equal(getattr(got, name)[written], getattr(expected, name)[written]), name
    torch.testing.assert_close(got.scores, expected.scores, rtol=1e-5, atol=1e-5)
    exact = dict(rtol=0, atol=0) if got.lstm is None else dict(rtol=1e-5, atol=1e-6)
    for a, b in zip(got.pred_state, expected.pred_state):
        torch.testing.assert_close(a, b, **exact)
    torch.testing.assert_close(got.pred_proj, expected.pred_proj, **exact)


@needs_triton
@pytest.mark.parametrize("durations", TDT_CASES, ids=TDT_IDS)
@pytest.mark.parametrize("window", [1, 3, 4])
@pytest.mark.parametrize("batch", [1, 4])
def test_each_fused_stage_equals_the_torch_stage(durations, window, batch):
    for seed, kernels in enumerate(["triton", "triton", "triton_cudnn"]):
        predictor, joint, buf = random_loop_state(seed, durations, window, batch, max_symbols=2, kernels=kernels)
        assert (buf.lstm is None) == (kernels == "triton_cudnn")
        ref = twin(buf)
        wrapped = BlankRows(joint, buf.blank_id, rows=[batch - 1], batch=batch)  # the last row: blanks only
        with torch.inference_mode():
            label_looping.find_label_first(buf, wrapped)
            label_looping.find_label_first(ref, wrapped)
            assert_same_state(buf, ref)
            while bool(ref.searching_any):          # emit runs once no row is on a blank
                label_looping.find_label_again(buf, wrapped)
                label_looping.find_label_again(ref, wrapped)
                assert_same_state(buf, ref)
            label_looping.emit_labels(buf, predictor, wrapped)
            label_looping.emit_labels(ref, predictor, wrapped)
            assert_same_state(buf, ref)


def small_case(seed: int, durations, batch: int, num_layers: int = 1):
    predictor, joint = make_toy_transducer(vocab_size=10, enc_dim=6, pred_dim=8, joint_dim=8, durations=durations,
                                           num_layers=num_layers, blank_bias=1.0, logit_scale=3.0, seed=seed,
                                           device=DEVICE)
    g = torch.Generator().manual_seed(seed)
    frames = 9
    enc = torch.randn(batch, frames, 6, generator=g).to(DEVICE)
    lengths = torch.tensor([frames, 0, 4, 1, 7][:batch]).to(DEVICE)
    return predictor, joint, enc, lengths


def assert_same_hypotheses(got, expected):
    assert [h.tokens for h in got] == [h.tokens for h in expected]
    assert [h.timestamps for h in got] == [h.timestamps for h in expected]
    for a, b in zip(got, expected):
        assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-5)


@needs_triton
@pytest.mark.parametrize("durations", TDT_CASES, ids=TDT_IDS)
@pytest.mark.parametrize("window,max_symbols,batch,num_layers,kernels", [
    (1, 1, 5, 1, "triton"), (4, 2, 5, 2, "triton"), (10, 10, 1, 3, "triton"),  # 10: past the 9 frames, masked
    (4, 2, 5, 2, "triton_cudnn")])
def test_fused_decoder_gives_the_torch_hypotheses(durations, window, max_symbols, batch, num_layers, kernels):
    predictor, joint, enc, lengths = small_case(3, durations, batch, num_layers)
    kw = dict(blank_id=10, durations=durations, blank_window=window, max_symbols=max_symbols, cuda_graphs="off")
    expected = GreedyTransducerDecoder(predictor, joint, kernels="torch", **kw)(enc, lengths)
    got = GreedyTransducerDecoder(predictor, joint, kernels=kernels, **kw)(enc, lengths)
    assert_same_hypotheses(got, expected)
    assert sum(len(h.tokens) for h in expected) > 0


@needs_triton
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3]], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("kernels", ["triton", "triton_cudnn"])
def test_an_eager_decode_asks_whether_triton_runs_once_per_call_not_per_launch(monkeypatch, durations, kernels):
    """Whether the kernels run is asked when the buffers are made (and the fused LSTM step found), a bounded number
    of times per call whatever the loop's length, and again for every call's new buffers; the tokens stay the
    torch stages'."""
    asked = []
    real = triton_support.triton_unavailable_reason

    def counted(device, **kw):
        asked.append(torch.device(device))
        return real(device, **kw)

    monkeypatch.setattr(triton_support, "triton_unavailable_reason", counted)
    predictor, joint, enc, lengths = small_case(3, durations, batch=5, num_layers=2)
    kw = dict(blank_id=10, durations=durations, blank_window=1, max_symbols=2, cuda_graphs="off")
    dec = GreedyTransducerDecoder(predictor, joint, kernels=kernels, **kw)
    ref = GreedyTransducerDecoder(predictor, joint, kernels="torch", **kw)
    per_call, iterations = [], []
    for frames in (2, 9):
        short_enc, short_lengths = enc[:, :frames], lengths.clamp(max=frames)
        asked.clear()
        got = dec(short_enc, short_lengths)
        per_call.append(len(asked))
        iterations.append(dec.last_stats["outer_iterations"] + dec.last_stats["inner_iterations"])
        assert_same_hypotheses(got, ref(short_enc, short_lengths))
    assert asked and set(asked) == {DEVICE}
    assert per_call[0] == per_call[1] and 1 <= per_call[0] <= 2, per_call
    assert iterations[1] > iterations[0] + 5, iterations   # a longer loop, and more launches than asks


def test_bad_kernels_option_is_one_clear_error():
    predictor, joint = make_toy_transducer(vocab_size=4, enc_dim=4, pred_dim=4, joint_dim=4)
    with pytest.raises(ValueError, match="kernels must be one of"):
        GreedyTransducerDecoder(predictor, joint, blank_id=4, kernels="cuda")
    with pytest.raises(ValueError, match="kernels='triton' is for label_looping"):
        GreedyTransducerDecoder(predictor, joint, blank_id=4, algorithm="frame_looping", kernels="triton")


@needs_triton
@pytest.mark.parametrize("durations", [None, [0, 1, 2]], ids=["rnnt", "tdt"])
def test_fused_stages_run_far_fewer_ops(durations):
    """Op counts of one stage on CPU: the fused search step is gather (with the joint's add and ReLU), the joint's
    output layer, decide, scan."""
    torch_ops = stage_ops(durations, "torch", window=4)
    fused_ops = stage_ops(durations, "triton", window=4)
    assert fused_ops["find_label_again"] == ["triton:gather", "linear", "triton:decide", "triton:scan"]
    assert fused_ops["emit_labels"] == ["triton:emit", "mm", "triton:lstm", "linear", "triton:select"]
    assert stage_ops(durations, "triton_cudnn", window=4)["emit_labels"] == [
        "triton:emit", "embedding", "lstm", "linear", "triton:select"]
    assert len(torch_ops["find_label_again"]) > 5 * len(fused_ops["find_label_again"])
    assert len(torch_ops["emit_labels"]) > 3 * len(fused_ops["emit_labels"])
    assert predictor_step_ops("triton", 2) == ["mm", "triton:lstm", "addmm", "triton:lstm"]   # per layer: GEMM, cell
    assert predictor_step_ops("triton_cudnn", 2) == ["embedding", "lstm"]


# -- the joint's hidden layer in the gather kernel ---------------------------------------------------------------


def gathered_hidden_rows(dtype, window):
    """(joint_hidden_window, torch's relu(enc + pred) of gather_window) on a random loop state in ``dtype``."""
    _, _, buf = random_loop_state(3, None, window, 4, 2, "triton")
    with torch.no_grad():
        buf.enc_proj.copy_(torch.randn(buf.enc_proj.shape, generator=torch.Generator().manual_seed(5)))
    buf = dataclasses.replace(buf, enc_proj=buf.enc_proj.to(dtype), pred_proj=buf.pred_proj.to(dtype))
    enc, pred = fused.gather_window(buf)
    hidden = fused.joint_hidden_window(buf)
    assert hidden.dtype == dtype and hidden.shape == enc.shape
    expected = torch.relu(enc + pred)
    assert (expected == 0).any() and (expected > 0).any()
    return hidden, expected


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("window", [1, 3])
def test_the_gathered_hidden_rows_are_the_joints_relu_of_the_sum(dtype, window):
    """joint_hidden_window gives relu(enc + pred) of the gathered rows bit for bit, as torch computes it in the
    buffers' dtype (frames past the buffer clamped as the gather does). Triton's interpreter rounds float32 to
    bfloat16 towards zero where the GPU rounds to nearest even as torch does: on CPU bf16 is checked to one
    bf16 step (test_gpu_gathered_hidden_rows_are_exact checks it exactly)."""
    hidden, expected = gathered_hidden_rows(dtype, window)
    if dtype == torch.bfloat16 and DEVICE.type == "cpu":
        torch.testing.assert_close(hidden.float(), expected.float(), rtol=2 ** -7, atol=0)
    else:
        assert torch.equal(hidden, expected)


class NotQuiteRelu(torch.nn.Module):
    """A joint that declares out(relu(enc + pred)) but computes out(tanh(enc + pred))."""

    def __init__(self, joint):
        super().__init__()
        self.inner = joint

    def project_encoder(self, enc):
        return self.inner.project_encoder(enc)

    def project_predictor(self, out):
        return self.inner.project_predictor(out)

    def joint_after_projection(self, enc_proj, pred_proj):
        return self.inner.out(torch.tanh(enc_proj + pred_proj))

    def activation_and_output(self):
        return "relu", self.inner.out


@needs_triton
def test_a_joint_whose_declaration_does_not_hold_runs_its_own_joint(caplog):
    """The declared structure is checked: a joint that is not what it declares, or declares no ReLU, keeps its
    joint_after_projection in the fused search (the torch stages' hypotheses); ours and a plain ReLU joint fuse."""
    predictor, joint = make_toy_transducer(vocab_size=9, enc_dim=6, pred_dim=8, joint_dim=8, blank_bias=0.5,
                                           logit_scale=3.0, seed=4)
    assert fused.joint_output_for(joint) is joint.out
    liar = NotQuiteRelu(joint)
    with caplog.at_level("INFO", logger="workbench.decoding"):
        assert fused.joint_output_for(liar) is None
    assert "differs from output(relu(enc + pred))" in caplog.text
    enc = torch.randn(3, 12, 6, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    lengths = torch.tensor([12, 7, 1], device=DEVICE)
    kw = dict(blank_id=9, cuda_graphs="off", blank_window=2)  # a window of 2: few interpreted programs a launch
    got = GreedyTransducerDecoder(predictor, liar, kernels="triton", **kw)(enc, lengths)
    assert_same_hypotheses(got, GreedyTransducerDecoder(predictor, liar, kernels="torch", **kw)(enc, lengths))
    liar.activation_and_output = lambda: ("tanh", joint.out)
    fused._JOINT_OUTPUTS.pop(liar, None)
    with caplog.at_level("INFO", logger="workbench.decoding"):
        assert fused.joint_output_for(liar) is None
    assert "its activation is 'tanh'" in caplog.text


@needs_triton
def test_a_replaced_output_layer_or_a_mode_switch_is_checked_again():
    """The check is kept per joint, train/eval mode and parameter tensors: a new output layer of the same shape is
    the one the fused search uses, and decodes give the torch stages' hypotheses before and after."""
    predictor, joint = make_toy_transducer(vocab_size=9, enc_dim=6, pred_dim=8, joint_dim=8, blank_bias=0.5,
                                           logit_scale=3.0, seed=5)
    enc = torch.randn(2, 10, 6, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    lengths = torch.tensor([10, 6], device=DEVICE)
    kw = dict(blank_id=9, cuda_graphs="off", blank_window=2)  # a window of 2: few interpreted programs a launch
    decode = lambda kernels: [h.tokens for h in GreedyTransducerDecoder(predictor, joint, kernels=kernels, **kw)(  # noqa: E731
        enc, lengths)]
    assert fused.joint_output_for(joint) is joint.out and decode("triton") == decode("torch")
    with torch.no_grad():
        new_out = torch.nn.Linear(8, 10).to(DEVICE)
        new_out.weight.mul_(6.0)
    joint.out = new_out
    assert fused.joint_output_for(joint) is new_out
    assert decode("triton") == decode("torch")
    joint.train()
    assert fused.joint_output_for(joint) is new_out  # no dropout in ours: train mode fuses too, checked again
    assert fused._JOINT_OUTPUTS[joint][0][0] is True


@needs_triton
def test_a_joint_the_check_cannot_run_on_keeps_its_own_joint(caplog):
    """A declaration the check cannot use (a layer of the wrong width, a malformed answer) is a logged reason, not
    a crash of the decoder."""
    _, joint = make_toy_transducer(vocab_size=9, enc_dim=6, pred_dim=8, joint_dim=8, seed=6)
    wrong = NotQuiteRelu(joint)
    wrong.activation_and_output = lambda: ("relu", torch.nn.Linear(5, 10).to(DEVICE))
    malformed = NotQuiteRelu(joint)
    malformed.activation_and_output = lambda: "relu"
    with caplog.at_level("INFO", logger="workbench.decoding"):
        assert fused.joint_output_for(wrong) is None and fused.joint_output_for(malformed) is None
    assert "checking it raised RuntimeError" in caplog.text
    assert "activation_and_output() gives str, not (activation, layer)" in caplog.text


# -- the fused LSTM step ----------------------------------------------------------------------------------------


class SeqFirstLstm(torch.nn.Module):
    """The shape of NeMo's RNNTDecoder behind its adapter (benchmarks/decoding/nemo_peer.py): the embedding
    and a sequence-first LSTM nested in a module dict and a wrapper, the blank as the embedding's zero padding
    row, the batch-first state transposed around the call."""

    def __init__(self, vocab_size: int, hidden: int, num_layers: int, seed: int):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            rnn = torch.nn.Module()
            rnn.lstm = torch.nn.LSTM(hidden, hidden, num_layers)
            self.prediction = torch.nn.ModuleDict({
                "embed": torch.nn.Embedding(vocab_size + 1, hidden, padding_idx=vocab_size), "dec_rnn": rnn})
        self.layers, self.hidden = num_layers, hidden

    def init_state(self, batch_size: int):
        weight = self.prediction["embed"].weight
        zeros = torch.zeros(batch_size, self.layers, self.hidden, dtype=weight.dtype, device=weight.device)
        return zeros, zeros.clone()

    def step(self, labels, state):
        h, c = (s.transpose(0, 1).contiguous() for s in state)
        out, (h, c) = self.prediction["dec_rnn"].lstm(self.prediction["embed"](labels)[None], (h, c))
        return out[0], (h.transpose(0, 1), c.transpose(0, 1))


class ScaledOutput(torch.nn.Module):
    """An LSTM predictor whose step() doubles its output: the structure of one, not its step."""

    def __init__(self, predictor):
        super().__init__()
        self.inner = predictor

    def init_state(self, batch_size: int):
        return self.inner.init_state(batch_size)

    def step(self, labels, state):
        out, state = self.inner.step(labels, state)
        return 2 * out, state


def lstm_predictor(kind: str, num_layers: int, dtype=torch.float32, hidden: int = 12, seed: int = 0):
    if kind == "ours":
        predictor, _ = make_toy_transducer(vocab_size=10, enc_dim=4, pred_dim=hidden, joint_dim=4,
                                           num_layers=num_layers, seed=seed, dtype=dtype, device=DEVICE)
        return predictor
    return SeqFirstLstm(10, hidden, num_layers, seed).to(device=DEVICE, dtype=dtype).eval()


def check_step_against_module(predictor, step, num_layers: int, hidden: int, dtype, tol: dict, seed: int = 0):
    """One fused step on random labels (blank included), state and emitting rows equals the predictor's own
    step() within ``tol`` where a row emits, and leaves the other rows' state exactly as it was."""
    g = torch.Generator().manual_seed(seed)
    batch = 7
    labels = torch.cat([torch.tensor([10]), torch.randint(0, 11, (batch - 1,), generator=g)]).to(DEVICE)
    emit = torch.tensor([True, True, False, True, False, True, True], device=DEVICE)
    h, c = (torch.randn(batch, num_layers, hidden, generator=g).to(DEVICE, dtype) for _ in range(2))
    with torch.inference_mode():
        out, (h_ref, c_ref) = predictor.step(labels, (h, c))
        state = (h.clone(), c.clone())
        got = fused.lstm_step(step, labels, state, emit)
    torch.testing.assert_close(got[emit], out[emit], **tol)
    torch.testing.assert_close(state[0][emit], h_ref[emit], **tol)
    torch.testing.assert_close(state[1][emit], c_ref[emit], **tol)
    assert torch.equal(state[0][~emit], h[~emit]) and torch.equal(state[1][~emit], c[~emit])
    assert got.data_ptr() == state[0][:, -1].data_ptr()     # the top layer's h, in place


FP32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=2e-2, atol=2e-2)


@needs_triton
@pytest.mark.parametrize("kind", ["ours", "seq-first"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_lstm_step_equals_nn_lstm(kind, num_layers, dtype):
    predictor = lstm_predictor(kind, num_layers, dtype, seed=num_layers)
    step = fused.lstm_step_for(predictor, blank_id=10, tokens=11)
    assert step is not None and step.lstm.num_layers == num_layers
    check_step_against_module(predictor, step, num_layers, 12, dtype, FP32_TOL if dtype == torch.float32 else BF16_TOL)


@needs_triton
def test_fused_lstm_step_covers_wide_layers_in_blocks():
    """More units than one program's block (1024): the grid's second dimension covers the rest."""
    predictor = lstm_predictor("ours", 2, hidden=1100)
    check_step_against_module(predictor, fused.lstm_step_for(predictor, blank_id=10, tokens=11), 2, 1100,
                              torch.float32, FP32_TOL)


@needs_triton
def test_predictors_the_fused_step_does_not_reproduce_keep_their_own_step(caplog, monkeypatch):
    ours = lstm_predictor("ours", 1)
    with monkeypatch.context() as m:
        m.setattr(fused, "LSTM_TABLE_LIMIT_BYTES", 11 * 4 * 12 * 4 - 1)     # 11 tokens x 4 gates x 12 units, fp32
        assert "input table would take" in fused.lstm_parts(ours)
    assert fused.lstm_parts(ours) == (ours.embed, ours.lstm)
    normed = torch.nn.Sequential(ours, torch.nn.LayerNorm(12))      # a module with parameters besides the two
    assert "parameters outside" in fused.lstm_parts(normed)
    gru = torch.nn.Module()
    gru.embed, gru.rnn = torch.nn.Embedding(11, 4), torch.nn.GRU(4, 4)
    assert "0 nn.LSTM" in fused.lstm_parts(gru)
    predictor, joint, enc, lengths = small_case(3, None, 5)
    scaled = ScaledOutput(predictor)                                # the right structure, another step
    assert fused.lstm_parts(scaled) == (scaled.inner.embed, scaled.inner.lstm)
    with caplog.at_level("INFO", logger="workbench.decoding"):
        assert fused.lstm_step_for(scaled, blank_id=10, tokens=11) is None
    assert "differs from an LSTM step in output" in caplog.text
    assert fused.lstm_step_for(ours, blank_id=10, tokens=12) is None        # a label id without an embedding row
    kw = dict(blank_id=10, blank_window=4, max_symbols=2, cuda_graphs="off")
    expected = GreedyTransducerDecoder(scaled, joint, **kw)(enc, lengths)
    assert_same_hypotheses(GreedyTransducerDecoder(scaled, joint, kernels="triton", **kw)(enc, lengths), expected)


@needs_triton
def test_fused_lstm_step_follows_weights_changed_in_place():
    """The prepared weights are made once per predictor and refreshed (in place) when a parameter changes."""
    predictor, joint, enc, lengths = small_case(4, [0, 1, 2], 5, num_layers=2)
    kw = dict(blank_id=10, durations=[0, 1, 2], blank_window=4, max_symbols=2, cuda_graphs="off")
    decoder = GreedyTransducerDecoder(predictor, joint, kernels="triton", **kw)
    before = decoder(enc, lengths)
    step = fused.lstm_step_for(predictor, blank_id=10, tokens=11)
    table = step.table.clone()
    with torch.no_grad():
        predictor.embed.weight.mul_(-3.0)
        predictor.lstm.weight_ih_l1.mul_(2.0)
    after = decoder(enc, lengths)
    assert fused.lstm_step_for(predictor, blank_id=10, tokens=11) is step       # the same tensors, refreshed
    assert not torch.equal(step.table, table)
    assert [h.tokens for h in after] != [h.tokens for h in before]
    assert_same_hypotheses(after, GreedyTransducerDecoder(predictor, joint, kernels="torch", **kw)(enc, lengths))


NEMO_MISSING = nemo_peer.nemo_unavailable_reason()


@needs_triton
@pytest.mark.skipif(NEMO_MISSING is not None, reason=f"{NEMO_MISSING} (../shared/tools/fetch_nemo_wheels.sh)")
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_fused_lstm_step_on_nemos_rnnt_decoder_gives_nemos_hypotheses(durations, strict_fp32):
    """NeMo's RNNTDecoder behind its adapter steps through the fused LSTM step; NeMo's own greedy decoder
    (eager) and the torch stages give the same tokens and frames."""
    predictor, joint = nemo_peer.make_nemo_transducer(vocab_size=40, enc_dim=16, pred_dim=32, joint_dim=24,
                                                      durations=durations, seed=1, device=DEVICE)
    assert fused.lstm_step_for(predictor, blank_id=40, tokens=41) is not None
    assert fused.joint_output_for(joint) is joint.out  # NeMo's ReLU joint: its hidden layer in the gather kernel
    joint.train()
    assert joint.activation_and_output() is None or not any(  # dropout active in train mode: not declared
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in joint.joint.joint_net)
    joint.eval()
    enc = torch.randn(3, 30, 16, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    lengths = torch.tensor([30, 17, 4], device=DEVICE)
    kw = dict(blank_id=40, durations=durations, cuda_graphs="off")
    got = GreedyTransducerDecoder(predictor, joint, kernels="triton", **kw)(enc, lengths)
    assert_same_hypotheses(got, GreedyTransducerDecoder(predictor, joint, kernels="torch", **kw)(enc, lengths))
    tokens, frames = nemo_peer.NemoGreedy(predictor, joint, durations, "off")(enc, lengths)
    assert tokens == [h.tokens for h in got] and frames == [h.timestamps for h in got]
    assert sum(map(len, tokens)) > 0


COMPILE_FOR_H200 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from workbench.decoding import fused_kernels as K

CONSTANTS = {"J": 640, "W": 16, "BLOCK_J": 1024, "K": 5, "BLOCK_V": 2048, "BLOCK_W": 16, "BLOCK_K": 8,
             "BLOCK_B": 128, "LONGEST": 640, "BLOCK": 1024, "H": 640, "BLOCK_H": 1024}
FLAGS = {"flag", "rows", "active", "searching", "emit"}
FLOATS = {"enc_proj", "pred_proj", "enc_out", "pred_out", "logits", "scores", "score_out", "score",
          "d0", "d1", "d2", "s0", "s1", "s2", "gates", "table", "h", "c"}
LONGS = {"tok_out", "dur_out", "tok", "dur", "time", "durations", "lengths", "labels", "step_duration",
         "symbols_at_frame", "num_emitted", "tokens", "timestamps"}
for tdt in (True, False):
    for kernel in (K.gather_window_kernel, K.decide_kernel, K.scan_kernel, K.emit_kernel, K.select_kernel,
                   K.lstm_cell_kernel):
        signature, constexprs = {}, {}
        for name, param in zip(kernel.arg_names, kernel.params):
            if param.is_constexpr:      # TDT: both variants; FIRST (the LSTM's first layer or another): both
                signature[name], constexprs[name] = "constexpr", (tdt if name in ("TDT", "FIRST", "RELU")
                                                                    else CONSTANTS[name])
            else:
                signature[name] = ("*u8" if name in FLAGS else "*fp32" if name in FLOATS
                                   else "*i64" if name in LONGS else "i64")
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], kernel.__name__
        print(kernel.__name__, tdt, "compiled")
signature = {name: "constexpr" if param.is_constexpr else "*bf16" if name in FLOATS else "*i64" if name in LONGS
             else "i64" for name, param in zip(K.gather_window_kernel.arg_names, K.gather_window_kernel.params)}
constexprs = {"J": 640, "W": 16, "BLOCK_J": 1024, "RELU": True}  # bf16 buffers: the hidden rows rounded in-kernel
compiled = compile(ASTSource(fn=K.gather_window_kernel, signature=signature, constexprs=constexprs),
                   target=GPUTarget("cuda", 90, 32))
assert compiled.asm["cubin"]
print("gather_window_kernel bf16 relu compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles them for real")
def test_the_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: compile every kernel to a cubin for sm_90 (RNN-T and
    TDT variants, the LSTM cell's first and later layers, the gather with and without the joint's ReLU) in a
    process without TRITON_INTERPRET."""
    pytest.importorskip("triton")
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 13


# -- on a GPU ---------------------------------------------------------------------------------------------


@pytest.fixture
def strict_fp32():
    """fp32 means fp32 while a test runs: cuDNN's LSTM may otherwise run in TF32, which the fused step's cuBLAS
    GEMMs do not (the decoding bench sets both flags so too)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def gpu_decoders(predictor, joint, blank_id, durations, max_symbols, kernels):
    return {mode: GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                          max_symbols=max_symbols, cuda_graphs=mode, kernels=kernels)
            for mode in ("off", "partial", "full")}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_gathered_hidden_rows_are_exact(dtype):
    """On the GPU the gather kernel's relu(enc + pred) is torch's bit for bit, in bf16 too (buffers of random
    projections and frames, made on the GPU)."""
    predictor, joint = make_toy_transducer(vocab_size=9, enc_dim=6, pred_dim=8, joint_dim=640, device="cuda")
    buf = label_looping.make_buffers(predictor, joint, batch_capacity=16, frame_capacity=20, enc_dim=6,
                                     dtype=torch.float32, device=torch.device("cuda"), blank_id=9, durations=None,
                                     max_symbols=2, window=16, kernels="triton_cudnn")
    g = torch.Generator(device="cuda").manual_seed(0)
    buf.time.copy_(torch.randint(0, 20, (16,), device="cuda", generator=g))
    buf = dataclasses.replace(buf, enc_proj=torch.randn(buf.enc_proj.shape, device="cuda", generator=g).to(dtype),
                              pred_proj=torch.randn(buf.pred_proj.shape, device="cuda", generator=g).to(dtype))
    enc, pred = fused.gather_window(buf)
    hidden = fused.joint_hidden_window(buf)
    expected = torch.relu(enc + pred)
    assert hidden.dtype == dtype and (expected == 0).any() and (expected > 0).any()
    assert torch.equal(hidden, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ours", "seq-first"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_fused_lstm_step_equals_cudnn(kind, num_layers, dtype, strict_fp32):
    """On NeMo's sizes (hidden 640): the fused step against nn.LSTM on CUDA (cuDNN)."""
    predictor = lstm_predictor(kind, num_layers, dtype, hidden=640, seed=num_layers)
    assert next(predictor.parameters()).is_cuda
    step = fused.lstm_step_for(predictor, blank_id=10, tokens=11)
    assert step is not None
    check_step_against_module(predictor, step, num_layers, 640, dtype, FP32_TOL if dtype == torch.float32 else BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["triton", "triton_cudnn"])
@pytest.mark.parametrize("seed", range(12))
def test_gpu_fused_full_partial_off_agree_and_equal_unfused(seed, kernels, strict_fp32):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(seed)
    unfused = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                      max_symbols=max_symbols, cuda_graphs="off", kernels="torch")(enc, lengths)
    decs = gpu_decoders(predictor, joint, blank_id, durations, max_symbols, kernels)
    ref = decs["off"](enc, lengths)
    assert_same_hypotheses(ref, unfused)
    for mode in ("partial", "full"):
        assert_same_hypotheses(decs[mode](enc, lengths), ref)
        assert_same_hypotheses(decs[mode](enc, lengths), ref)  # replayed again
        assert decs[mode].mode_used == mode
        assert (decs[mode]._captured.buffers.lstm is not None) == (kernels == "triton")


@pytest.mark.gpu
def test_gpu_fused_graphs_follow_lstm_weights_changed_in_place(strict_fp32):
    """Captured graphs read the fused step's prepared weights, refreshed in place before each decode."""
    predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=48, num_layers=2,
                                           seed=3, blank_bias=0.5, logit_scale=4.0, device="cuda")
    enc = torch.randn(4, 40, 32, generator=torch.Generator().manual_seed(3)).cuda()
    lengths = torch.tensor([40, 33, 5, 0], device="cuda")
    blank_id, durations, max_symbols = 64, None, 3
    decs = gpu_decoders(predictor, joint, blank_id, durations, max_symbols, "triton")
    before = {mode: dec(enc, lengths) for mode, dec in decs.items()}
    with torch.no_grad():
        predictor.embed.weight.mul_(-3.0)
        predictor.lstm.weight_ih_l0.mul_(2.0)
    fresh = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                    max_symbols=max_symbols, cuda_graphs="off", kernels="torch")(enc, lengths)
    assert [h.tokens for h in fresh] != [h.tokens for h in before["off"]]
    for dec in decs.values():
        assert_same_hypotheses(dec(enc, lengths), fresh)


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_gpu_fused_graphs_hold_far_fewer_kernels(durations):
    predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=48, seed=2,
                                           durations=durations, blank_bias=1.5, logit_scale=4.0, device="cuda")
    enc = torch.randn(4, 40, 32, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    lengths = torch.tensor([40, 33, 5, 0], device="cuda")
    kernels = {}
    for kind in ("torch", "triton_cudnn", "triton"):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations, cuda_graphs="partial",
                                      kernels=kind)
        dec(enc, lengths)
        kernels[kind] = {stage: n["kernels"] for stage, n in dec.stage_graph_nodes().items()}
    for stage in ("find_label_first", "find_label_again"):  # 4 ops: gather (+ add, ReLU), output layer, decide, scan
        # (on the GPU the output layer's GEMM may take more than one kernel)
        assert kernels["triton"][stage] * 4 < kernels["torch"][stage], kernels
    # 19 bookkeeping ops become 2 kernels; with the predictor's own step its kernels stay
    assert kernels["triton_cudnn"]["emit_labels"] <= kernels["torch"]["emit_labels"] - 15, kernels
    # the fused LSTM step: emit, the gate GEMM, the cell, the projection, the projection's keep (5 ops on CPU; a
    # cuBLAS GEMM may take two kernels)
    assert kernels["triton"]["emit_labels"] < kernels["triton_cudnn"]["emit_labels"], kernels
    assert kernels["triton"]["emit_labels"] <= 7, kernels
