"""kernels="triton" (workbench.decoding.fused) gives the torch stages' decisions: stage by stage on random loop
states, and whole decodes. Without CUDA the kernels run through Triton's interpreter (small shapes); the
``gpu`` tests compare the graph modes and the two kernel kinds on a GPU."""

import os

import torch

if not torch.cuda.is_available():  # before triton is imported: the interpreter is chosen then
    os.environ["TRITON_INTERPRET"] = "1"

import dataclasses  # noqa: E402

import pytest  # noqa: E402

from workbench.decoding import GreedyTransducerDecoder, fused, label_looping, make_toy_transducer  # noqa: E402
from workbench.bench.decoding.op_count import stage_ops  # noqa: E402
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
        value = getattr(buf, f.name)
        fields[f.name] = (value.clone() if isinstance(value, torch.Tensor)
                          else tuple(v.clone() for v in value) if isinstance(value, tuple) else value)
    return dataclasses.replace(buf, **{**fields, "kernels": "torch", "emit": None})


def assert_same_state(got, expected):
    """Equal loop state. With window 1 the torch stage's first decision also writes a label (maybe blank) to
    rows that have not found one, which no emit reads: labels and durations are compared where a row holds a
    found label (active, not searching), tokens and timestamps up to each row's count."""
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
    for a, b in zip(got.pred_state, expected.pred_state):
        assert torch.equal(a, b)
    assert torch.equal(got.pred_proj, expected.pred_proj)


@needs_triton
@pytest.mark.parametrize("durations", TDT_CASES, ids=TDT_IDS)
@pytest.mark.parametrize("window", [1, 3, 4])
@pytest.mark.parametrize("batch", [1, 4])
def test_each_fused_stage_equals_the_torch_stage(durations, window, batch):
    for seed in range(3):
        predictor, joint, buf = random_loop_state(seed, durations, window, batch, max_symbols=2, kernels="triton")
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


def small_case(seed: int, durations, batch: int):
    predictor, joint = make_toy_transducer(vocab_size=10, enc_dim=6, pred_dim=8, joint_dim=8, durations=durations,
                                           blank_bias=1.0, logit_scale=3.0, seed=seed, device=DEVICE)
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
@pytest.mark.parametrize("window,max_symbols,batch", [(1, 1, 5), (4, 2, 5), (16, 10, 1)])
def test_fused_decoder_gives_the_torch_hypotheses(durations, window, max_symbols, batch):
    predictor, joint, enc, lengths = small_case(3, durations, batch)
    kw = dict(blank_id=10, durations=durations, blank_window=window, max_symbols=max_symbols, cuda_graphs="off")
    expected = GreedyTransducerDecoder(predictor, joint, **kw)(enc, lengths)
    got = GreedyTransducerDecoder(predictor, joint, kernels="triton", **kw)(enc, lengths)
    assert_same_hypotheses(got, expected)
    assert sum(len(h.tokens) for h in expected) > 0


def test_bad_kernels_option_is_one_clear_error():
    predictor, joint = make_toy_transducer(vocab_size=4, enc_dim=4, pred_dim=4, joint_dim=4)
    with pytest.raises(ValueError, match="kernels must be one of"):
        GreedyTransducerDecoder(predictor, joint, blank_id=4, kernels="cuda")
    with pytest.raises(ValueError, match="kernels='triton' is for label_looping"):
        GreedyTransducerDecoder(predictor, joint, blank_id=4, algorithm="frame_looping", kernels="triton")


@needs_triton
@pytest.mark.parametrize("durations", [None, [0, 1, 2]], ids=["rnnt", "tdt"])
def test_fused_stages_run_far_fewer_ops(durations):
    """Op counts of one stage on CPU: the fused search step is gather, the joint's own ops, decide, scan."""
    torch_ops = stage_ops(durations, "torch", window=4)
    fused_ops = stage_ops(durations, "triton", window=4)
    assert fused_ops["find_label_again"] == ["triton:gather", "add", "relu", "linear", "triton:decide",
                                             "triton:scan"]
    assert fused_ops["emit_labels"] == ["triton:emit", "embedding", "lstm", "linear", "triton:select"]
    assert len(torch_ops["find_label_again"]) > 5 * len(fused_ops["find_label_again"])
    assert len(torch_ops["emit_labels"]) > 3 * len(fused_ops["emit_labels"])


COMPILE_FOR_H200 = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from workbench.decoding import fused_kernels as K

CONSTANTS = {"J": 640, "W": 16, "BLOCK_J": 1024, "K": 5, "BLOCK_V": 2048, "BLOCK_W": 16, "BLOCK_K": 8,
             "BLOCK_B": 128, "LONGEST": 640, "BLOCK": 1024}
FLAGS = {"flag", "rows", "active", "searching", "emit"}
FLOATS = {"enc_proj", "pred_proj", "enc_out", "pred_out", "logits", "scores", "score_out", "score",
          "d0", "d1", "d2", "s0", "s1", "s2"}
LONGS = {"tok_out", "dur_out", "tok", "dur", "time", "durations", "lengths", "labels", "step_duration",
         "symbols_at_frame", "num_emitted", "tokens", "timestamps"}
for tdt in (True, False):
    for kernel in (K.gather_window_kernel, K.decide_kernel, K.scan_kernel, K.emit_kernel, K.select_kernel):
        signature, constexprs = {}, {}
        for name, param in zip(kernel.arg_names, kernel.params):
            if param.is_constexpr:
                signature[name], constexprs[name] = "constexpr", tdt if name == "TDT" else CONSTANTS[name]
            else:
                signature[name] = ("*u8" if name in FLAGS else "*fp32" if name in FLOATS
                                   else "*i64" if name in LONGS else "i64")
        compiled = compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], kernel.__name__
        print(kernel.__name__, tdt, "compiled")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU run compiles them for real")
def test_the_kernels_compile_for_an_h200_without_one(compile_without_interpreter):
    """The interpreter accepts code the compiler may not: compile every kernel to a cubin for sm_90 (RNN-T and
    TDT variants) in a process without TRITON_INTERPRET."""
    pytest.importorskip("triton")
    assert compile_without_interpreter(COMPILE_FOR_H200).count("compiled") == 10


# -- on a GPU ---------------------------------------------------------------------------------------------


def gpu_decoders(predictor, joint, blank_id, durations, max_symbols, kernels):
    return {mode: GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                          max_symbols=max_symbols, cuda_graphs=mode, kernels=kernels)
            for mode in ("off", "partial", "full")}


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(12))
def test_gpu_fused_full_partial_off_agree_and_equal_unfused(seed):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(seed)
    unfused = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                      max_symbols=max_symbols, cuda_graphs="off")(enc, lengths)
    decs = gpu_decoders(predictor, joint, blank_id, durations, max_symbols, "triton")
    ref = decs["off"](enc, lengths)
    assert_same_hypotheses(ref, unfused)
    for mode in ("partial", "full"):
        assert_same_hypotheses(decs[mode](enc, lengths), ref)
        assert_same_hypotheses(decs[mode](enc, lengths), ref)  # replayed again
        assert decs[mode].mode_used == mode


@pytest.mark.gpu
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_gpu_fused_graphs_hold_far_fewer_kernels(durations):
    predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=48, seed=2,
                                           durations=durations, blank_bias=1.5, logit_scale=4.0, device="cuda")
    enc = torch.randn(4, 40, 32, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    lengths = torch.tensor([40, 33, 5, 0], device="cuda")
    kernels = {}
    for kind in ("torch", "triton"):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations, cuda_graphs="partial",
                                      kernels=kind)
        dec(enc, lengths)
        kernels[kind] = {stage: n["kernels"] for stage, n in dec.stage_graph_nodes().items()}
    for stage in ("find_label_first", "find_label_again"):  # 6 ops on CPU: gather, the joint's 3, decide, scan
        assert kernels["triton"][stage] * 4 < kernels["torch"][stage], kernels
    # 19 bookkeeping ops become 2 kernels; the predictor's own kernels stay
    assert kernels["triton"]["emit_labels"] <= kernels["torch"]["emit_labels"] - 15, kernels
