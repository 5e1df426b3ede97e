"""Blank windows (several frames decided per search step) give exactly the one-frame-per-step results."""

import random

import pytest
import torch

from test_greedy import assert_matches_reference
from workbench.decoding import GreedyTransducerDecoder, make_toy_transducer


class ScriptedJoint:
    """A joint whose decision at each frame is written in the encoder output (the predictor is ignored)."""

    def project_encoder(self, enc):
        return enc

    def project_predictor(self, out):
        return out.new_zeros(out.shape[0], self.width)

    def joint_after_projection(self, enc_proj, pred_proj):
        return enc_proj + pred_proj


def scripted_tdt(script, frames, vocab, durations, trap=(0, 0)):
    """Encoder output whose frame t decides ``script[t] = (token, duration index)``; other frames ``trap``."""
    joint = ScriptedJoint()
    joint.width = vocab + 1 + len(durations)
    enc = torch.zeros(1, frames, joint.width, dtype=torch.float64)
    for t in range(frames):
        token, k = script.get(t, trap)
        enc[0, t, token] = 5.0
        enc[0, t, vocab + 1 + k] = 5.0
    predictor, _ = make_toy_transducer(vocab_size=vocab, enc_dim=2, pred_dim=4, joint_dim=4, dtype=torch.float64)
    return predictor, joint, enc


def test_tdt_window_follows_jumps_exactly():
    # durations [0, 1, 2, 3, 4]; blank = 3. Frames not in the script emit label 0: visiting one is a bug.
    blank, frames = 3, 20
    script = {0: (blank, 2), 2: (blank, 0), 3: (blank, 4), 7: (1, 1), 8: (blank, 1), 9: (2, 0),
              10: (blank, 4), 14: (blank, 4), 18: (blank, 3)}
    predictor, joint, enc = scripted_tdt(script, frames, vocab=3, durations=[0, 1, 2, 3, 4])
    inner = {}
    for window in (1, 2, 4, 8, 32):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=blank, durations=[0, 1, 2, 3, 4],
                                      max_symbols=2, blank_window=window)
        (hyp,) = dec(enc, torch.tensor([frames]))
        assert (hyp.tokens, hyp.timestamps) == ([1, 2, 2], [7, 9, 9]), window
        assert dec.last_stats["outer_iterations"] == 4, window
        inner[window] = dec.last_stats["inner_iterations"]
    # window 1: 0->2->3->7 (3), 8->9 (1), 10->14->18->end (2); window 8: only 10..17 -> 18 -> end (1)
    # window 2: [0,1] -> 2, [2,3] -> 7 (2), [10,11] -> 14, [14,15] -> 18 -> end (2)
    assert inner == {1: 6, 2: 4, 4: 3, 8: 1, 32: 0}


def test_tdt_window_stops_at_the_length_inside_the_window():
    blank = 2
    script = {0: (blank, 0), 1: (blank, 0), 2: (blank, 0)}  # one frame each; frame 3 would emit label 0 (the trap)
    predictor, joint, enc = scripted_tdt(script, 6, vocab=2, durations=[1, 2])
    for window in (1, 3, 4, 8):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=blank, durations=[1, 2], blank_window=window)
        assert dec(enc, torch.tensor([3]))[0].tokens == []
        assert dec(enc, torch.tensor([4]))[0].timestamps == [3]


WINDOW_DURATIONS = [None, [0, 1, 2, 3, 4], [1, 2], [0, 1], [0, 2, 3], [0, 5, 9], [3], [0]]


def window_case(seed):
    rng = random.Random(1000 + seed)
    vocab = rng.randint(2, 9)
    durations = WINDOW_DURATIONS[seed % len(WINDOW_DURATIONS)]
    blank_id = rng.choice([0, vocab, rng.randint(0, vocab)])
    predictor, joint = make_toy_transducer(
        vocab_size=vocab, enc_dim=rng.randint(3, 8), pred_dim=rng.randint(4, 12), joint_dim=rng.randint(4, 12),
        num_layers=rng.randint(1, 2), durations=durations, blank_id=blank_id,
        blank_bias=rng.uniform(-1.0, 4.0), logit_scale=rng.uniform(2.0, 8.0), seed=seed, dtype=torch.float64)
    batch, frames = rng.randint(1, 6), rng.randint(1, 30)
    enc = torch.randn(batch, frames, joint.enc_proj.in_features, generator=torch.Generator().manual_seed(seed),
                      dtype=torch.float64)
    lengths = torch.tensor([rng.choice([0, frames, rng.randint(0, frames)]) for _ in range(batch)])
    return predictor, joint, enc, lengths, blank_id, durations, rng.choice([1, 2, 3, 10])


@pytest.mark.parametrize("seed", range(48))
def test_every_window_equals_reference(seed):
    predictor, joint, enc, lengths, blank_id, durations, max_symbols = window_case(seed)
    with torch.inference_mode():
        for window in (1, 2, 3, 5, 8, 16):
            dec = GreedyTransducerDecoder(predictor, joint, blank_id=blank_id, durations=durations,
                                          max_symbols=max_symbols, cuda_graphs="off", blank_window=window)
            hyps = dec(enc, lengths)
            assert_matches_reference(hyps, predictor, joint, enc, lengths, blank_id, durations, max_symbols)


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4], [1, 2], [0, 1]])
def test_window_cuts_inner_iterations_not_outer(durations):
    predictor, joint = make_toy_transducer(vocab_size=12, enc_dim=8, pred_dim=16, joint_dim=16, seed=5,
                                           durations=durations, blank_bias=4.0, logit_scale=4.0,
                                           dtype=torch.float64)
    enc = torch.randn(6, 60, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([60, 60, 45, 31, 7, 0])
    results, stats = {}, {}
    for window in (1, 4, 8):
        dec = GreedyTransducerDecoder(predictor, joint, blank_id=12, durations=durations, blank_window=window)
        results[window] = [(h.tokens, h.timestamps) for h in dec(enc, lengths)]
        stats[window] = dec.last_stats
    assert results[1] == results[4] == results[8]
    assert sum(len(t) for t, _ in results[1]) > 0
    assert stats[1]["outer_iterations"] == stats[4]["outer_iterations"] == stats[8]["outer_iterations"]
    assert stats[8]["inner_iterations"] <= stats[4]["inner_iterations"] < stats[1]["inner_iterations"], stats
    assert stats[8]["inner_iterations"] < stats[1]["inner_iterations"] / 2, stats


def test_the_auto_window_is_16_but_8_for_large_fp32_tdt_batches():
    from workbench.decoding.greedy import auto_blank_window

    for dtype in (torch.float32, torch.float64):
        assert [auto_blank_window(b, tdt=True, dtype=dtype) for b in (1, 32, 33, 128)] == [16, 16, 8, 8]
    for b in (1, 33, 512):
        assert auto_blank_window(b, tdt=False, dtype=torch.float32) == 16     # RNN-T blanks move one frame
        assert auto_blank_window(b, tdt=True, dtype=torch.bfloat16) == 16      # tensor cores: rows are cheap


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_the_decoder_takes_the_auto_window_by_batch_and_says_so(durations):
    """blank_window="auto" (the default) picks the window from the batch (window_used), an integer is taken as
    given, and every window gives the same hypotheses."""
    predictor, joint = make_toy_transducer(vocab_size=6, enc_dim=4, pred_dim=4, joint_dim=4, durations=durations,
                                           blank_bias=1.0, logit_scale=3.0, seed=2)
    enc = torch.randn(40, 9, 4, generator=torch.Generator().manual_seed(0))
    lengths = torch.randint(0, 10, (40,), generator=torch.Generator().manual_seed(1))
    auto = GreedyTransducerDecoder(predictor, joint, blank_id=6, durations=durations, cuda_graphs="off")
    assert auto.blank_window == "auto"
    small = auto(enc[:4], lengths[:4])
    assert auto.window_used == 16
    large = auto(enc, lengths)
    assert auto.window_used == (8 if durations else 16)
    fixed = GreedyTransducerDecoder(predictor, joint, blank_id=6, durations=durations, cuda_graphs="off",
                                    blank_window=3)
    assert [h.tokens for h in fixed(enc, lengths)] == [h.tokens for h in large] and fixed.window_used == 3
    assert [h.tokens for h in small] == [h.tokens for h in large[:4]]
    for bad in ("wide", 0, 2.5, True):
        with pytest.raises(ValueError, match="blank_window must be 'auto' or an integer >= 1"):
            GreedyTransducerDecoder(predictor, joint, blank_id=6, blank_window=bad)
