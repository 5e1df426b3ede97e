"""kernels="auto" (the default): which stage kernels a decode runs, why, and the fallback to torch when the fused
kernels fail at first use (CPU; the GPU choice is checked in test_gpu.py)."""

import logging
import re
import warnings

import pytest
import torch

from workbench.decoding import GreedyTransducerDecoder, fused, label_looping, make_toy_transducer
from workbench.decoding import greedy as greedy_module

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def toy(durations=None):
    predictor, joint = make_toy_transducer(vocab_size=12, enc_dim=6, pred_dim=8, joint_dim=8, seed=1,
                                           durations=durations, blank_bias=0.5, logit_scale=3.0)
    enc = torch.randn(3, 11, 6, generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([11, 7, 0])
    return predictor, joint, enc, lengths


def test_auto_picks_torch_on_cpu_and_says_why(caplog):
    assert label_looping.resolve_kernels("auto", device=CPU) == (
        "torch", "torch: inputs on cpu (the Triton kernels run on CUDA)")
    predictor, joint, enc, lengths = toy()
    dec = GreedyTransducerDecoder(predictor, joint, blank_id=12, cuda_graphs="off")
    assert dec.kernels == "auto" and dec.kernels_used is None
    greedy_module._already_logged.clear()
    with caplog.at_level(logging.INFO, logger="workbench.decoding"):
        hyps = dec(enc, lengths)
    assert dec.kernels_used == "torch"
    assert dec.kernels_reason == "torch: inputs on cpu (the Triton kernels run on CUDA)"
    assert [r.message for r in caplog.records if "decoding kernels" in r.message] == [
        "decoding kernels: torch: inputs on cpu (the Triton kernels run on CUDA)"]
    assert dec.kernel_choice("cpu") == ("torch", dec.kernels_reason)
    expected = GreedyTransducerDecoder(predictor, joint, blank_id=12, cuda_graphs="off", kernels="torch")(enc, lengths)
    assert [h.tokens for h in hyps] == [h.tokens for h in expected]


def test_auto_on_cuda_picks_triton_when_it_imports_else_torch_with_the_reason(monkeypatch):
    monkeypatch.setattr(fused, "triton_unavailable_reason", lambda device: None)
    assert label_looping.resolve_kernels("auto", device=CUDA) == (
        "triton_cudnn", "triton_cudnn: CUDA inputs and triton importable (the LSTM step through cuDNN)")
    monkeypatch.setattr(fused, "triton_unavailable_reason",
                        lambda device: "triton is not importable (ModuleNotFoundError: No module named 'triton')")
    kernels, reason = label_looping.resolve_kernels("auto", device=CUDA)
    assert kernels == "torch"
    assert reason == "torch: triton is not importable (ModuleNotFoundError: No module named 'triton')"
    assert label_looping.resolve_kernels("auto", device=CUDA, algorithm="frame_looping") == (
        "torch", "torch: frame_looping runs the torch ops")


def test_explicit_kernels_are_taken_as_asked_and_a_bad_value_is_one_error():
    assert label_looping.resolve_kernels("torch", device=CUDA) == ("torch", "torch: asked for")
    assert label_looping.resolve_kernels("triton", device=CPU) == ("triton", "triton: asked for")
    predictor, joint, enc, lengths = toy()
    dec = GreedyTransducerDecoder(predictor, joint, blank_id=12, kernels="torch")
    dec(enc, lengths)
    assert (dec.kernels_used, dec.kernels_reason) == ("torch", "torch: asked for")
    with pytest.raises(ValueError, match="^" + re.escape(f"kernels must be one of {label_looping.KERNEL_CHOICES}, got 'fused'") + "$"):
        GreedyTransducerDecoder(predictor, joint, blank_id=12, kernels="fused")
    with pytest.raises(ValueError, match="kernels must be one of"):
        label_looping.make_buffers(predictor, joint, batch_capacity=2, frame_capacity=3, enc_dim=6,
                                   dtype=torch.float32, device=CPU, blank_id=12, durations=None, max_symbols=2,
                                   kernels="TRITON")
    buf = label_looping.make_buffers(predictor, joint, batch_capacity=2, frame_capacity=3, enc_dim=6,
                                     dtype=torch.float32, device=CPU, blank_id=12, durations=None, max_symbols=2)
    assert buf.kernels == "torch" and buf.emit is None  # make_buffers' default "auto" on CPU


@pytest.mark.parametrize("durations", [None, [0, 1, 2]], ids=["rnnt", "tdt"])
def test_a_triton_failure_at_first_use_falls_back_to_torch_with_a_warning(monkeypatch, durations):
    predictor, joint, enc, lengths = toy(durations)
    kw = dict(blank_id=12, durations=durations, cuda_graphs="off")
    expected = GreedyTransducerDecoder(predictor, joint, kernels="torch", **kw)(enc, lengths)
    calls = []

    def broken(buf):
        calls.append(1)
        raise RuntimeError("simulated Triton compile failure\nsecond line of the compiler log")

    monkeypatch.setattr(fused, "gather_window", broken)
    monkeypatch.setattr(fused, "joint_hidden_window", broken)   # the toy joint's search starts here
    monkeypatch.setattr(fused, "triton_unavailable_reason", lambda device: None)  # the setup's check passes
    monkeypatch.setattr(label_looping, "resolve_kernels",
                        lambda requested, *, device, algorithm="label_looping":
                        ("triton_cudnn", "triton_cudnn: auto") if requested == "auto"
                        else (requested, f"{requested}: asked for"))
    dec = GreedyTransducerDecoder(predictor, joint, **kw)
    with pytest.warns(RuntimeWarning, match="the Triton kernels failed at first use \\(RuntimeError: simulated "
                                            "Triton compile failure\\): torch$"):
        got = dec(enc, lengths)
    assert calls == [1]
    assert [h.tokens for h in got] == [h.tokens for h in expected]
    assert [h.timestamps for h in got] == [h.timestamps for h in expected]
    assert dec.kernels_used == "torch" and "failed at first use" in dec.kernels_reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the choice is kept: no second warning, no second try
        again = dec(enc, lengths)
    assert calls == [1] and [h.tokens for h in again] == [h.tokens for h in expected]

    # asked for explicitly, the failure is the caller's to see ("triton_cudnn": "triton" would first run the
    # fused LSTM step, which off CUDA needs the interpreter)
    with pytest.raises(RuntimeError, match="simulated Triton compile failure"):
        GreedyTransducerDecoder(predictor, joint, kernels="triton_cudnn", **kw)(enc, lengths)


NO_TRITON = "triton is not importable (ModuleNotFoundError: No module named 'triton')"


@pytest.mark.parametrize("kernels", ["triton", "triton_cudnn"])
def test_a_triton_choice_that_cannot_run_is_one_error_at_setup_before_any_stage(monkeypatch, kernels):
    predictor, joint, enc, lengths = toy()
    monkeypatch.setattr(fused, "triton_unavailable_reason", lambda device: NO_TRITON)
    stages, real_start = [], label_looping.start
    monkeypatch.setattr(label_looping, "start", lambda *args: (stages.append("start"), real_start(*args)))
    dec = GreedyTransducerDecoder(predictor, joint, blank_id=12, cuda_graphs="off", kernels=kernels)
    with pytest.raises(RuntimeError, match="^" + re.escape(f"kernels='triton': {NO_TRITON}") + "$"):
        dec(enc, lengths)
    with pytest.raises(RuntimeError, match="^" + re.escape(f"kernels='triton': {NO_TRITON}") + "$"):
        fused.lstm_step_for(predictor, blank_id=12, tokens=13)
    assert stages == []
    auto = GreedyTransducerDecoder(predictor, joint, blank_id=12, cuda_graphs="off")(enc, lengths)  # CPU: torch
    expected = GreedyTransducerDecoder(predictor, joint, blank_id=12, cuda_graphs="off", kernels="torch")(enc, lengths)
    assert [h.tokens for h in auto] == [h.tokens for h in expected] and stages == ["start", "start"]


def test_the_fused_kernels_refuse_buffers_made_for_the_torch_stages():
    predictor, joint, *_ = toy()
    buf = label_looping.make_buffers(predictor, joint, batch_capacity=2, frame_capacity=3, enc_dim=6,
                                     dtype=torch.float32, device=CPU, blank_id=12, durations=None, max_symbols=2,
                                     kernels="torch")
    message = "the fused kernels need loop buffers made with kernels='triton' or 'triton_cudnn', not 'torch'"
    for call in (lambda: fused.gather_window(buf), lambda: fused.joint_hidden_window(buf),
                 lambda: fused.emit_update(buf, buf.active),
                 lambda: fused.search_epilogue(buf, torch.zeros(2, 13), buf.active)):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            call()
