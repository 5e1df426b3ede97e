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


SMALL_CONFIGS = {  # config overrides that make an adapter small enough for a CPU step in about a second
    "hf-whisper": dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=100),
    "hf-wav2vec2-ctc": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                            conv_dim=(16,) * 7, num_conv_pos_embeddings=16),
}


def build_adapter(name: str, device="cpu", *, small: bool = False, **config):
    """The adapter ``name`` (a key of ADAPTERS) on ``device``; ``small`` applies its SMALL_CONFIGS entry
    (ValueError for an adapter without one); ``config`` overrides any field."""
    if name not in ADAPTERS:
        raise ValueError(f"{name}: not an adapter (adapters: {', '.join(ADAPTERS)})")
    if small and name not in SMALL_CONFIGS:
        raise ValueError(f"{name}: has no small config (small: {', '.join(SMALL_CONFIGS)})")
    factory = load_model_factory(ADAPTERS[name])
    return factory(**{**(SMALL_CONFIGS[name] if small else {}), **config}).to(device)


def user_model_spec(name: str) -> str | None:
    """The ``MODULE:CALLABLE`` spec for ``name`` (a spec, or an adapter's short name); None for a reference
    model name such as ``large-rnnt``."""
    return ADAPTERS.get(name) or (name if is_model_spec(name) else None)


__all__ = ["ADAPTERS", "SMALL_CONFIGS", "AudioInput", "build_adapter", "CheckReport", "FeatureInput", "ModelContractError", "SchemaModel",
           "TokenInput", "build_model_from_spec", "check_model", "is_model_spec", "length_mask",
           "load_model_factory", "user_model_spec"]
