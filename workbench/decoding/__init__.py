"""Greedy RNN-T / TDT decoding: label-looping and frame-looping, with CUDA graphs (full, partial, off)."""

from workbench.decoding.cuda_graphs import (
    empty_while_iteration_seconds,
    full_graph_unsupported_reason,
    partial_graph_unsupported_reason,
)
from workbench.decoding.greedy import GreedyTransducerDecoder, resolve_graph_mode
from workbench.decoding.protocol import Hypothesis, Joint, Predictor
from workbench.decoding.toy_models import make_toy_transducer, set_blank_bias

__all__ = [
    "GreedyTransducerDecoder", "Hypothesis", "Predictor", "Joint", "resolve_graph_mode",
    "full_graph_unsupported_reason", "partial_graph_unsupported_reason", "empty_while_iteration_seconds",
    "make_toy_transducer", "set_blank_bias",
]
