"""Reference ASR models (FastConformer-like encoder; RNN-T, TDT, CTC, AED heads), their losses in plain
PyTorch, batch collation from lhotse cuts, and the training recipe."""

from workbench.models.collate import collate_cuts, cut_text
from workbench.models.config import ModelConfig, config_from_name, large_config, tiny_config, xl_config
from workbench.models.losses import label_smoothed_cross_entropy, lattice_log_likelihood, rnnt_loss, tdt_loss
from workbench.models.model import ASRModel, build_model, count_parameters
from workbench.models.transducer import Joint, Predictor

__all__ = [
    "ASRModel", "Joint", "ModelConfig", "Predictor", "build_model", "collate_cuts", "config_from_name",
    "count_parameters", "cut_text", "label_smoothed_cross_entropy", "large_config", "lattice_log_likelihood",
    "rnnt_loss", "tdt_loss", "tiny_config", "xl_config",
]
