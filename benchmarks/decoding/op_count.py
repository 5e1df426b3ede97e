"""Ops per label-looping stage, counted on CPU: what one outer iteration launches, before and after fusion.

Every aten op that computes (views and metadata ops left out) is one entry; a Triton kernel of
``workbench.decoding.fused`` is one entry named ``triton:<kernel>``. On CUDA most entries are one kernel
(cuDNN's LSTM and some indexing ops are several), so the counts show where the graph's kernels come from.
``kernels="triton_cudnn"`` is "triton" with the predictor's own step() (an ``lstm`` op, cuDNN on CUDA) in place
of the fused LSTM step (per layer a GEMM and ``triton:lstm``).

    TRITON_INTERPRET=1 python3 -m benchmarks.decoding.op_count     # both models, every kernel kind
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import workbench.decoding.fused as fused
import workbench.decoding.label_looping as label_looping
from workbench.decoding import make_toy_transducer

# aten ops that return views or only change metadata: no kernel on CUDA
VIEW_OPS = {"view", "_unsafe_view", "expand", "unsqueeze", "squeeze", "select", "slice", "transpose", "t",
            "alias", "as_strided", "detach", "permute", "reshape", "split", "unbind", "lift_fresh", "_reshape_alias",
            "empty", "empty_like", "empty_strided", "new_empty"}
STAGES = ("find_label_first", "find_label_again", "emit_labels")


class OpCounter(TorchDispatchMode):
    """Records the name of every computing aten op dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not self.paused and name not in VIEW_OPS and not (name == "to" and args and out is args[0]):
            self.ops.append(name)
        return out


@contextlib.contextmanager
def count_triton_launches(counter: OpCounter):
    """Record ``triton:<kernel>`` in ``counter`` on each launch of a fused kernel, and none of the ops that
    Triton's interpreter runs to launch it."""
    original = fused._k

    def counting(name):
        launcher = original(name)

        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    counter.ops.append(f"triton:{name}")
                    counter.paused = True
                    try:
                        return launcher[grid](*args, **kwargs)
                    finally:
                        counter.paused = False
                return run
        return Launch()

    fused._k = counting
    try:
        yield
    finally:
        fused._k = original


def _started_toy(durations, kernels, window, vocab_size, batch, frames, num_layers):
    """A small random toy transducer and its loop buffers, started (inside inference mode)."""
    predictor, joint = make_toy_transducer(vocab_size=vocab_size, enc_dim=8, pred_dim=16, joint_dim=16,
                                           num_layers=num_layers, durations=durations, blank_bias=-2.0)
    buf = label_looping.make_buffers(predictor, joint, batch_capacity=batch, frame_capacity=frames, enc_dim=8,
                                     dtype=torch.float32, device=torch.device("cpu"), blank_id=vocab_size,
                                     durations=durations, max_symbols=10, window=window, kernels=kernels)
    label_looping.load_inputs(buf, torch.randn(batch, frames, 8), torch.full((batch,), frames))
    label_looping.start(buf, predictor, joint)
    return predictor, joint, buf


def _counted(call) -> list[str]:
    counter = OpCounter()
    with count_triton_launches(counter), counter:
        call()
    return counter.ops


def stage_ops(durations: list[int] | None, kernels: str, *, window: int = 16, vocab_size: int = 32,
              batch: int = 2, frames: int = 6, num_layers: int = 1) -> dict[str, list[str]]:
    """The ops of each stage of one outer iteration (first, one inner step, emit) on a small random toy
    transducer (``num_layers`` LSTM layers), in the order they run."""
    with torch.inference_mode():
        predictor, joint, buf = _started_toy(durations, kernels, window, vocab_size, batch, frames, num_layers)
        calls = {"find_label_first": lambda: label_looping.find_label_first(buf, joint),
                 "find_label_again": lambda: label_looping.find_label_again(buf, joint),
                 "emit_labels": lambda: label_looping.emit_labels(buf, predictor, joint)}
        return {stage: _counted(calls[stage]) for stage in STAGES}


def predictor_step_ops(kernels: str, num_layers: int) -> list[str]:
    """The ops of the predictor step inside emit_labels (``kernels`` "triton" or "triton_cudnn"): the fused LSTM
    step, or the toy predictor's own step(); then ``triton:select``, which keeps the projection, and under
    "triton_cudnn" the new state too (the "triton" LSTM kernel keeps the state itself)."""
    with torch.inference_mode():
        predictor, _, buf = _started_toy(None, kernels, 16, 32, 2, 6, num_layers)
        return _counted(lambda: label_looping.fused_predictor_step(buf, predictor))


def main() -> int:
    reason = fused.triton_unavailable_reason(torch.device("cpu"))
    if reason:
        print(f"note: {reason}; counting the torch stages only")
    fusing = reason is None
    kinds = ["torch"] + (["triton_cudnn", "triton"] if fusing else [])
    for model, durations in (("rnnt", None), ("tdt", [0, 1, 2, 3, 4])):
        for kernels in kinds:
            ops = stage_ops(durations, kernels)
            print(f"{model} kernels={kernels}: " + ", ".join(f"{s} {len(o)}" for s, o in ops.items()))
            for stage, names in ops.items():
                print(f"  {stage}: {_listed(names)}")
    for num_layers in (1, 2, 3) if fusing else ():
        for kernels in ("triton_cudnn", "triton"):
            ops = predictor_step_ops(kernels, num_layers)
            print(f"predictor step, {num_layers} LSTM layer(s), kernels={kernels}: {len(ops)}: {_listed(ops)}")
    return 0


def _listed(names: list[str]) -> str:
    return ", ".join(f"{n} x{c}" if c > 1 else n for n, c in collections.Counter(names).items())


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton (fused imports it lazily)
    sys.exit(main())
