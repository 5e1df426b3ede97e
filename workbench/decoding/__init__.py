"""Greedy RNN-T / TDT decoding: label-looping and frame-looping, with CUDA graphs (full, partial, off).

The names below load on first use, so ``workbench.decoding.methods`` (the decoder vocabulary that record
readers share) imports without torch."""

from importlib import import_module

_HOMES = {
    "GreedyTransducerDecoder": "greedy", "resolve_graph_mode": "greedy",
    "full_graph_unsupported_reason": "cuda_graphs", "partial_graph_unsupported_reason": "cuda_graphs",
    "Hypothesis": "protocol", "JointProtocol": "protocol", "PredictorProtocol": "protocol",
    "make_toy_transducer": "toy_models", "set_blank_bias": "toy_models",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'workbench.decoding' has no attribute {name!r}")
    value = getattr(import_module(f"workbench.decoding.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
