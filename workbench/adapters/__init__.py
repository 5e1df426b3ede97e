"""Models we did not write, under the model contract (docs/MODEL_CONTRACT.md): the contract and its check,
the declarative form (:class:`SchemaModel`), and adapters for torchaudio, Hugging Face and NeMo models."""

from workbench.adapters.contract import (CheckReport, ModelContractError, build_model_from_spec, check_model,
                                         is_model_spec, load_model_factory)
from workbench.adapters.schema import AudioInput, FeatureInput, SchemaModel, TokenInput, length_mask

ADAPTERS = {  # short names the command line takes beside MODULE:CALLABLE
    "torchaudio-emformer-rnnt": "workbench.adapters.torchaudio_rnnt:emformer_rnnt",
    "hf-whisper": "workbench.adapters.huggingface:whisper",
    "hf-wav2vec2-ctc": "workbench.adapters.huggingface:wav2vec2_ctc",
    "nemo-fastconformer-rnnt": "workbench.adapters.nemo:fastconformer_rnnt",
}



def user_model_spec(name: str) -> str | None:
    """The ``MODULE:CALLABLE`` spec for ``name`` (a spec, or an adapter's short name); None for a reference
    model name such as ``large-rnnt``."""
    return ADAPTERS.get(name) or (name if is_model_spec(name) else None)


__all__ = ["ADAPTERS", "AudioInput", "CheckReport", "FeatureInput", "ModelContractError", "SchemaModel",
           "TokenInput", "build_model_from_spec", "check_model", "is_model_spec", "length_mask",
           "load_model_factory", "user_model_spec"]
