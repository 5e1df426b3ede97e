"""Reference ASR models (FastConformer-like encoder; RNN-T, TDT, CTC, AED heads), their losses in plain
PyTorch (Triton kernels on CUDA). Names load on first use, so that the command line starts without importing
torch."""

import importlib

_EXPORTS = {
    "ModelConfig": "config", "config_from_name": "config", "large_config": "config", "tiny_config": "config",
    "xl_config": "config",
    "fused_joint_loss": "fused_joint_loss",
    "label_smoothed_cross_entropy": "losses", "lattice_log_likelihood": "losses", "rnnt_loss": "losses",
    "tdt_loss": "losses", "loss_backend": "losses",
    "ASRModel": "model", "build_model": "model", "compile_encoder_layers": "model", "count_parameters": "model",
    "Joint": "transducer", "Predictor": "transducer", "chunked_joint_loss": "transducer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"workbench.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'workbench.models' has no attribute {name!r}")
