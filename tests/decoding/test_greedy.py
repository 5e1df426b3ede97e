"""Every algorithm equals a slow, obviously-correct reference decoder on many random tiny models (CPU)."""

import logging
import random

import pytest
import torch

from workbench.decoding import GreedyTransducerDecoder, make_toy_transducer, resolve_graph_mode
from workbench.decoding import greedy as greedy_module
from workbench.decoding import label_looping


@torch.no_grad()
def reference_decode(predictor, joint, enc, length, *, blank_id, durations, max_symbols):
    """One utterance, one decision at a time, straight from the greedy semantics in docs/ARCHITECTURE.md."""
    enc_proj = joint.project_encoder(enc[None])[0]
    out, state = predictor.step(torch.tensor([blank_id]), predictor.init_state(1))
    pred_proj = joint.project_predictor(out)
    num_durations = len(durations) if durations else 0
    tokens, timestamps, score = [], [], 0.0
    t, labels_here = 0, 0
    while t < length:
        logits = joint.joint_after_projection(enc_proj[t][None], pred_proj)[0].double()
        token_logits = logits[: logits.numel() - num_durations]
        token = int(torch.argmax(token_logits))
        score += float(torch.log_softmax(token_logits, 0)[token])
        if durations:
            duration_logits = logits[logits.numel() - num_durations:]
            k = int(torch.argmax(duration_logits))
            score += float(torch.log_softmax(duration_logits, 0)[k])
            duration = durations[k]
        else:
            duration = 1 if token == blank_id else 0
        if token == blank_id:
            t += max(duration, 1)
            labels_here = 0
            continue
        tokens.append(token)
        timestamps.append(t)
        out, state = predictor.step(torch.tensor([token]), state)
        pred_proj = joint.project_predictor(out)
        if duration > 0:
            t += duration
            labels_here = 0
        else:
            labels_here += 1
            if labels_here >= max_symbols:
                t += 1
                labels_here = 0
    return tokens, timestamps, score


DURATION_SETS = [None, None, [0, 1, 2, 3, 4], [0, 2, 3], [1, 2], [0, 1]]


def random_case(seed):
    rng = random.Random(seed)
    vocab = rng.randint(2, 9)
    durations = rng.choice(DURATION_SETS)
    kw = dict(vocab_size=vocab, enc_dim=rng.randint(3, 8), pred_dim=rng.randint(4, 12),
              joint_dim=rng.randint(4, 12), num_layers=rng.randint(1, 2), durations=durations,
              blank_id=rng.choice([0, vocab, rng.randint(0, vocab)]), blank_bias=rng.uniform(-1.5, 2.5),
              logit_scale=rng.uniform(2.0, 8.0), seed=seed, dtype=torch.float64)
    predictor, joint = make_toy_transducer(**kw)
    batch, frames = rng.randint(1, 6), rng.randint(1, 16)
    gen = torch.Generator().manual_seed(seed)
    enc = torch.randn(batch, frames, kw["enc_dim"], generator=gen, dtype=torch.float64)
    lengths = torch.tensor([rng.choice([0, frames, rng.randint(0, frames)]) for _ in range(batch)])
    return predictor, joint, enc, lengths, kw["blank_id"], durations, rng.choice([1, 2, 3, 10])


def assert_matches_reference(hyps, predictor, joint, enc, lengths, blank_id, durations, max_symbols):
    assert len(hyps) == enc.shape[0]
    for b, hyp in enumerate(hyps):
        tokens, stamps, score = reference_decode(predictor, joint, enc[b], int(lengths[b]), blank_id=blank_id,
                                                 durations=durations, max_symbols=max_symbols)
        assert hyp.tokens == tokens, f"row {b}"
        assert hyp.timestamps == stamps, f"row {b}"
        assert hyp.score == pytest.approx(score, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed", range(60))
def test_all_algorithms_equal_reference(seed):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = random_case(seed)
    variants = [("label_looping", "auto", 8), ("label_looping", "off", 1), ("label_looping", "off", 3)]
    variants += [("frame_looping", "auto", 8)] if durations is None else []
    with torch.inference_mode():
        for algorithm, mode, window in variants:
            decoder = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                              max_symbols=max_symbols, algorithm=algorithm, cuda_graphs=mode,
                                              blank_window=window)
            hyps = decoder(enc, lengths)
            assert decoder.mode_used == "off"
            assert_matches_reference(hyps, predictor, joint, enc, lengths, blank_id, durations, max_symbols)


@torch.inference_mode()
def test_cases_cover_the_interesting_paths():
    """The random cases above hit max_symbols, long blank runs, TDT jumps and empty utterances."""
    hit_max = blanks = empty = tdt_jump = 0
    for seed in range(60):
        predictor, joint, enc, lengths, blank_id, durations, max_symbols = random_case(seed)
        for b in range(enc.shape[0]):
            tokens, stamps, _ = reference_decode(predictor, joint, enc[b], int(lengths[b]), blank_id=blank_id,
                                                 durations=durations, max_symbols=max_symbols)
            empty += not tokens
            blanks += len(tokens) < int(lengths[b])
            hit_max += any(stamps.count(s) == max_symbols for s in set(stamps))
            tdt_jump += durations is not None and any(b2 - a > 1 for a, b2 in zip(stamps, stamps[1:]))
    assert min(hit_max, blanks, empty, tdt_jump) >= 3, (hit_max, blanks, empty, tdt_jump)


@pytest.mark.parametrize("seed", [0, 7])
def test_padded_buffers_give_the_same_result(seed):
    """Rows and frames beyond the input (graph capacity reused for smaller inputs) change nothing."""
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = random_case(seed)
    with torch.inference_mode():
        buf = label_looping.make_buffers(predictor, joint, batch_capacity=enc.shape[0] + 3,
                                         frame_capacity=enc.shape[1] + 5, enc_dim=enc.shape[-1],
                                         dtype=enc.dtype, device=enc.device, blank_id=blank_id,
                                         durations=durations, max_symbols=max_symbols, window=4)
        buf.enc.normal_()  # stale data in the padding must not matter
        label_looping.load_inputs(buf, enc, lengths)
        label_looping.run_eager(buf, predictor, joint)
        from workbench.decoding.protocol import hypotheses_from_buffers
        hyps = hypotheses_from_buffers(buf.tokens, buf.timestamps, buf.num_emitted, buf.scores, enc.shape[0])
    assert_matches_reference(hyps, predictor, joint, enc, lengths, blank_id, durations, max_symbols)
    assert buf.num_emitted[enc.shape[0]:].eq(0).all()


def test_blank_window_takes_fewer_loop_iterations_for_the_same_result():
    predictor, joint = make_toy_transducer(vocab_size=12, enc_dim=8, pred_dim=16, joint_dim=16, seed=5,
                                           blank_bias=2.0, logit_scale=4.0, dtype=torch.float64)
    enc, lengths = torch.randn(4, 40, 8, dtype=torch.float64), torch.tensor([40, 31, 7, 0])
    stats, results = {}, {}
    for window in (1, 8):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=12, blank_window=window)
        results[window] = [(h.tokens, h.timestamps) for h in dec(enc, lengths)]
        stats[window] = dec.last_stats
    assert results[1] == results[8] and sum(len(t) for t, _ in results[1]) > 0
    assert stats[8]["inner_iterations"] < stats[1]["inner_iterations"] / 2, stats


def test_bf16_joint_computes_in_bf16_and_algorithms_agree():
    predictor, joint = make_toy_transducer(vocab_size=30, enc_dim=16, pred_dim=32, joint_dim=32, seed=3,
                                           blank_bias=1.0, logit_scale=4.0, dtype=torch.bfloat16)
    enc = torch.randn(4, 20, 16)  # float32 input: cast to the joint's dtype
    lengths = torch.tensor([20, 13, 1, 0])
    seen = []
    orig = joint.joint_after_projection
    joint.joint_after_projection = lambda e, p: (seen.append(e.dtype), orig(e, p))[1]
    a = GreedyTransducerDecoder(predictor, joint, blank_id=30)(enc, lengths)
    b = GreedyTransducerDecoder(predictor, joint, blank_id=30, algorithm="frame_looping")(enc, lengths)
    assert set(seen) == {torch.bfloat16}
    assert [h.tokens for h in a] == [h.tokens for h in b] and [h.timestamps for h in a] == [h.timestamps for h in b]
    assert sum(len(h.tokens) for h in a) > 0


def tiny():
    return make_toy_transducer(vocab_size=5, enc_dim=4, pred_dim=6, joint_dim=6, seed=0)


def test_bad_input_is_rejected_clearly():
    p, j = tiny()
    dec = GreedyTransducerDecoder(p, j, blank_id=5)
    enc = torch.randn(2, 7, 4)
    with pytest.raises(ValueError, match=r"\[B, T, D\]"):
        dec(torch.randn(7, 4), torch.tensor([7]))
    with pytest.raises(ValueError, match="lengths has 3 entries but enc has a batch of 2"):
        dec(enc, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 7\].*1 of 2"):
        dec(enc, torch.tensor([8, 2]))
    with pytest.raises(ValueError, match=r"1 of 2"):
        dec(enc, torch.tensor([-1, 2]))
    with pytest.raises(ValueError, match="integers"):
        dec(enc, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="max_symbols"):
        GreedyTransducerDecoder(p, j, blank_id=5, max_symbols=0)
    with pytest.raises(ValueError, match="blank_window"):
        GreedyTransducerDecoder(p, j, blank_id=5, blank_window=0)
    with pytest.raises(ValueError, match="algorithm"):
        GreedyTransducerDecoder(p, j, blank_id=5, algorithm="beam")
    with pytest.raises(ValueError, match="cuda_graphs"):
        GreedyTransducerDecoder(p, j, blank_id=5, cuda_graphs="sometimes")
    with pytest.raises(ValueError, match="RNN-T only"):
        GreedyTransducerDecoder(p, j, blank_id=5, durations=[0, 1], algorithm="frame_looping")
    with pytest.raises(ValueError, match="durations"):
        GreedyTransducerDecoder(p, j, blank_id=5, durations=[0, -1])
    with pytest.raises(ValueError, match="frame_looping runs eagerly"):
        GreedyTransducerDecoder(p, j, blank_id=5, algorithm="frame_looping", cuda_graphs="full")
    with pytest.raises(ValueError, match="blank_id=9"):
        GreedyTransducerDecoder(p, j, blank_id=9)(enc, torch.tensor([7, 7]))


def test_empty_batch_and_zero_lengths_give_empty_hypotheses():
    p, j = tiny()
    for algorithm in ("label_looping", "frame_looping"):
        dec = GreedyTransducerDecoder(p, j, blank_id=5, algorithm=algorithm)
        assert dec(torch.randn(0, 7, 4), torch.zeros(0, dtype=torch.long)) == []
        hyps = dec(torch.randn(2, 7, 4), torch.tensor([0, 0]))
        assert [(h.tokens, h.timestamps, h.score) for h in hyps] == [([], [], 0.0)] * 2
        hyps = dec(torch.randn(2, 0, 4), torch.tensor([0, 0]))
        assert [h.tokens for h in hyps] == [[], []]


def test_max_symbols_none_warns_and_uses_10():
    p, j = tiny()
    with pytest.warns(UserWarning, match="max_symbols=None"):
        dec = GreedyTransducerDecoder(p, j, blank_id=5, max_symbols=None)
    assert dec.max_symbols == 10


def test_forced_graph_modes_on_cpu_raise_and_auto_falls_back(caplog):
    p, j = tiny()
    enc, lengths = torch.randn(1, 3, 4), torch.tensor([3])
    for mode in ("full", "partial"):
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            GreedyTransducerDecoder(p, j, blank_id=5, cuda_graphs=mode)(enc, lengths)
    greedy_module._already_logged.clear()
    with caplog.at_level(logging.INFO, logger="workbench.decoding"):
        for _ in range(3):
            dec = GreedyTransducerDecoder(p, j, blank_id=5)
            dec(enc, lengths)
    assert dec.mode_used == "off"
    assert sum("CUDA graphs need CUDA" in r.message for r in caplog.records) == 1  # logged once


def test_resolve_graph_mode_fallback_chain():
    kw = dict(algorithm="label_looping", device_type="cuda")
    assert resolve_graph_mode("auto", full_reason=None, partial_reason=None, **kw) == ("full", [])
    mode, notes = resolve_graph_mode("auto", full_reason="old driver", partial_reason=None, **kw)
    assert mode == "partial" and "old driver" in notes[0]
    mode, notes = resolve_graph_mode("auto", full_reason="no cuda-python", partial_reason="no graphs", **kw)
    assert mode == "off" and len(notes) == 2 and "no graphs" in notes[1]
    with pytest.raises(RuntimeError, match="'full' is not supported here: old driver"):
        resolve_graph_mode("full", full_reason="old driver", partial_reason=None, **kw)
    with pytest.raises(RuntimeError, match="'partial' is not supported here"):
        resolve_graph_mode("partial", full_reason=None, partial_reason="x", **kw)
    assert resolve_graph_mode("partial", full_reason="old", partial_reason=None, **kw) == ("partial", [])
    assert resolve_graph_mode("off", full_reason="a", partial_reason="b", **kw) == ("off", [])
    assert resolve_graph_mode("auto", algorithm="frame_looping", device_type="cuda", full_reason=None,
                              partial_reason=None)[0] == "off"
    assert resolve_graph_mode("auto", algorithm="label_looping", device_type="cpu", full_reason=None,
                              partial_reason=None)[0] == "off"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without CUDA")
def test_support_checks_are_import_safe_without_cuda():
    from workbench.decoding import full_graph_unsupported_reason, partial_graph_unsupported_reason

    assert full_graph_unsupported_reason() == "no CUDA device"
    assert partial_graph_unsupported_reason() == "no CUDA device"


def test_stage_graph_nodes_is_none_without_captured_graphs():
    predictor, joint = make_toy_transducer(vocab_size=5, enc_dim=4, pred_dim=8, joint_dim=8)
    dec = GreedyTransducerDecoder(predictor, joint, blank_id=5, cuda_graphs="auto")
    assert dec.stage_graph_nodes() is None  # before any call
    dec(torch.randn(2, 3, 4), torch.tensor([3, 1]))
    assert dec.mode_used == "off" and dec.stage_graph_nodes() is None  # CPU: eager, no graph
