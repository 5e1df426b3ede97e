"""On a CUDA GPU: full and partial graphs give exactly what eager (off) gives; the fallback chain works."""

import logging
import random

import pytest
import torch

from workbench.decoding import GreedyTransducerDecoder, cuda_graphs, make_toy_transducer
from workbench.decoding import greedy as greedy_module
from workbench.decoding import label_looping
from workbench.decoding.frame_looping import run_frame_looping
from workbench.decoding.protocol import hypotheses_from_buffers

pytestmark = pytest.mark.gpu


def gpu_case(seed, dtype=torch.float32):
    rng = random.Random(seed)
    vocab = rng.choice([5, 17, 64, 300])
    durations = rng.choice([None, None, [0, 1, 2, 3, 4], [0, 2, 4], [1, 2]])
    blank_id = rng.choice([0, vocab])
    enc_dim, pred_dim, joint_dim = rng.choice([(8, 16, 16), (32, 64, 48), (64, 128, 128)])
    predictor, joint = make_toy_transducer(
        vocab_size=vocab, enc_dim=enc_dim, pred_dim=pred_dim, joint_dim=joint_dim,
        num_layers=rng.randint(1, 2), durations=durations, blank_id=blank_id,
        blank_bias=rng.uniform(-1.0, 3.0), logit_scale=rng.uniform(2.0, 6.0), seed=seed, dtype=dtype,
        device="cuda")
    batch, frames = rng.choice([1, 3, 16, 33]), rng.randint(1, 60)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    enc = torch.randn(batch, frames, enc_dim, device="cuda", generator=gen)
    lengths = torch.tensor([rng.choice([0, frames, rng.randint(0, frames)]) for _ in range(batch)], device="cuda")
    return predictor, joint, enc, lengths, blank_id, durations, rng.choice([1, 2, 3, 10])


def same(a, b, exact_scores=False):
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.timestamps for h in a] == [h.timestamps for h in b]
    for x, y in zip(a, b):
        assert x.score == pytest.approx(y.score, rel=1e-5, abs=1e-4)


def decoders(predictor, joint, blank_id, durations, max_symbols):
    """The torch stages in each graph mode (test_fused.py checks the fused kernels' modes)."""
    return {mode: GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                          max_symbols=max_symbols, cuda_graphs=mode, kernels="torch")
            for mode in ("off", "partial", "full")}


@pytest.mark.parametrize("seed", range(12))
def test_full_and_partial_equal_off(seed):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(seed)
    decs = decoders(predictor, joint, blank_id, durations, max_symbols)
    ref = decs["off"](enc, lengths)
    for mode in ("partial", "full"):
        same(decs[mode](enc, lengths), ref)
        same(decs[mode](enc, lengths), ref)  # replay again: state fully reset by the graph
        assert decs[mode].mode_used == mode
    if durations is None:
        frame = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, max_symbols=max_symbols,
                                        algorithm="frame_looping")
        same(frame(enc, lengths), ref)


def test_bf16_full_equals_off():
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(3, dtype=torch.bfloat16)
    decs = decoders(predictor, joint, blank_id, durations, max_symbols)
    ref = decs["off"](enc, lengths)
    same(decs["full"](enc, lengths), ref)
    same(decs["partial"](enc, lengths), ref)


@pytest.mark.parametrize("seed", range(6))
def test_the_default_decoder_picks_triton_and_equals_the_torch_stages(seed):
    """What users get (every option at its default) on CUDA: the fused kernels (the LSTM step in cuDNN) in the
    full graph, with the torch stages' tokens and timestamps in fp32."""
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(seed)
    default = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                      max_symbols=max_symbols)
    torch_stages = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                           max_symbols=max_symbols, kernels="torch")
    got = default(enc, lengths)
    assert default.kernels_used == "triton_cudnn"
    assert default.kernels_reason == "triton_cudnn: CUDA inputs and triton importable (the LSTM step through cuDNN)"
    assert default.mode_used == "full"
    same(got, torch_stages(enc, lengths))
    assert torch_stages.kernels_used == "torch"


def test_graphs_reused_for_smaller_inputs_and_recaptured_for_larger():
    predictor, joint = make_toy_transducer(vocab_size=40, enc_dim=16, pred_dim=32, joint_dim=32, seed=1,
                                           blank_bias=1.5, logit_scale=4.0, device="cuda")
    off = GreedyTransducerDecoder(predictor, joint, blank_id=40, cuda_graphs="off")
    for mode in ("full", "partial"):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=40, cuda_graphs=mode)
        shapes = [(8, 30), (3, 12), (8, 30), (1, 1), (10, 20), (4, 40)]
        expected_captures = [1, 1, 1, 1, 2, 3]
        for (b, t), n in zip(shapes, expected_captures):
            enc = torch.randn(b, t, 16, device="cuda")
            lengths = torch.randint(0, t + 1, (b,), device="cuda")
            same(dec(enc, lengths), off(enc, lengths))
            assert dec.captures == n, (mode, b, t)
        assert dec._captured.buffers.batch_capacity == 10 and dec._captured.buffers.frame_capacity == 40
        dec.reset()
        assert dec._captured is None
        enc = torch.randn(2, 5, 16, device="cuda")
        lengths = torch.tensor([5, 3], device="cuda")
        same(dec(enc, lengths), off(enc, lengths))
        assert dec.captures == 4


def test_full_graph_supported_on_this_gpu():
    assert cuda_graphs.full_graph_unsupported_reason() is None


def test_empty_while_iteration_is_measured():
    from benchmarks.decoding.empty_loop import empty_while_iteration_seconds

    cost = empty_while_iteration_seconds(iterations=500, repeat=3)
    assert 0 < cost["seconds_per_iteration"] < 1e-4


def test_fallback_chain(monkeypatch, caplog):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(5)
    ref = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                  max_symbols=max_symbols, cuda_graphs="off")(enc, lengths)
    def make(mode):
        return GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                       max_symbols=max_symbols, cuda_graphs=mode)
    dec = make("auto")
    same(dec(enc, lengths), ref)
    assert dec.mode_used == "full"

    # an old driver (or no cuda-python): auto -> partial, logged once; forced full raises
    greedy_module._already_logged.clear()
    monkeypatch.setattr(cuda_graphs, "full_graph_unsupported_reason", lambda device=None: "driver 12.2 < 12.6")
    with caplog.at_level(logging.INFO, logger="workbench.decoding"):
        for _ in range(2):
            dec = make("auto")
            same(dec(enc, lengths), ref)
            assert dec.mode_used == "partial"
    assert sum("driver 12.2 < 12.6" in r.message for r in caplog.records) == 1
    with pytest.raises(RuntimeError, match="driver 12.2"):
        make("full")(enc, lengths)

    # partial unavailable too: auto -> off
    monkeypatch.setattr(cuda_graphs, "partial_graph_unsupported_reason", lambda device=None: "no graphs here")
    dec = make("auto")
    same(dec(enc, lengths), ref)
    assert dec.mode_used == "off"

    # a capture that fails at run time: auto falls back and says why; forced raises
    monkeypatch.undo()
    def broken(*a, **k):
        raise RuntimeError("simulated capture failure")
    monkeypatch.setattr(cuda_graphs, "FullGraph", broken)
    greedy_module._already_logged.clear()
    with caplog.at_level(logging.WARNING, logger="workbench.decoding"):
        dec = make("auto")
        same(dec(enc, lengths), ref)
    assert dec.mode_used == "partial"
    assert any("simulated capture failure" in r.message for r in caplog.records)
    with pytest.raises(RuntimeError, match="simulated capture failure"):
        make("full")(enc, lengths)


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
@pytest.mark.parametrize("window", [1, 8])
def test_off_mode_loops_sync_only_to_read_their_flags(monkeypatch, durations, window):
    """Under torch.cuda.set_sync_debug_mode("error") the loop bodies run with no host sync; the only
    syncs allowed are the flag reads (label_looping.read_flag), which the test counts."""
    predictor, joint = make_toy_transducer(vocab_size=64, enc_dim=32, pred_dim=64, joint_dim=48, seed=4,
                                           durations=durations, blank_bias=1.5, logit_scale=4.0, device="cuda")
    enc = torch.randn(5, 50, 32, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
    lengths = torch.tensor([50, 50, 31, 2, 0], device="cuda")
    reads = []

    def counted_read(flag):
        mode = torch.cuda.get_sync_debug_mode()  # "error" only inside the measured loop below
        torch.cuda.set_sync_debug_mode(0)
        try:
            return bool(flag)
        finally:
            reads.append(1)
            torch.cuda.set_sync_debug_mode(mode)

    monkeypatch.setattr(label_looping, "read_flag", counted_read)
    algorithms = ["label_looping"] + (["frame_looping"] if durations is None else [])
    for algorithm in algorithms:
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=64, durations=durations, algorithm=algorithm,
                                      cuda_graphs="off", blank_window=window, kernels="torch")
        expected = dec(enc, lengths)  # warm-up (library handles, workspaces) and the result to match
        buf = dec._new_buffers(enc.shape[0], enc.shape[1], enc)
        label_looping.load_inputs(buf, enc, lengths)
        torch.cuda.synchronize()
        reads.clear()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.inference_mode():
                if algorithm == "label_looping":
                    stats = label_looping.run_eager(buf, predictor, joint)
                else:
                    stats = run_frame_looping(buf, predictor, joint, int(enc.shape[1]))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if algorithm == "label_looping":  # outer flag: outer + 1 reads; inner flag: outer + inner reads
            assert len(reads) == 2 * stats["outer_iterations"] + stats["inner_iterations"] + 1, stats
        else:
            assert len(reads) == stats["joint_evaluations"], stats
        got = hypotheses_from_buffers(buf.tokens, buf.timestamps, buf.num_emitted, buf.scores, enc.shape[0])
        same(got, expected)
        assert sum(len(h.tokens) for h in got) > 0


def test_stage_graph_nodes_are_counted_alike_in_full_and_partial():
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = gpu_case(7)
    decs = decoders(predictor, joint, blank_id, durations, max_symbols)
    for dec in decs.values():
        dec(enc, lengths)
    assert decs["off"].stage_graph_nodes() is None  # nothing captured
    full, partial = decs["full"].stage_graph_nodes(), decs["partial"].stage_graph_nodes()
    assert full == partial  # the full graph runs the very stage graphs that partial replays
    assert set(full) == {"start", "find_label_first", "find_label_again", "emit_labels"}
    assert all(0 < c["kernels"] <= c["nodes"] for c in full.values()), full
