"""Greedy RNN-T / TDT decoding: label-looping and frame-looping, with CUDA graphs (full, partial, off)."""

from workbench.decoding.cuda_graphs import (
    full_graph_unsupported_reason,
    partial_graph_unsupported_reason,
)
from workbench.decoding.greedy import GreedyTransducerDecoder, resolve_graph_mode
from workbench.decoding.protocol import Hypothesis, JointProtocol, PredictorProtocol
from workbench.decoding.toy_models import make_toy_transducer, set_blank_bias

__all__ = [
    "GreedyTransducerDecoder", "Hypothesis", "PredictorProtocol", "JointProtocol", "resolve_graph_mode",
    "full_graph_unsupported_reason", "partial_graph_unsupported_reason",
    "make_toy_transducer", "set_blank_bias",
]
