"""Hugging Face transformers models built from a config (no download), wrapped to keep the model contract.

- :func:`whisper`: ``WhisperForConditionalGeneration``, an attention encoder-decoder on 80 log-mel features
  at 100 frames per second, padded to Whisper's fixed 30 s window; labels are the tokens, -100 past each
  length (the model shifts them right behind its start token).
- :func:`wav2vec2_ctc`: ``Wav2Vec2ForCTC`` on raw 16 kHz audio with an attention mask from the lengths;
  CTC over token ids 1..V-1 (0 is its pad/blank), summed and divided by the number of target tokens.

``pip install -e .[adapters]`` brings transformers.
"""

from __future__ import annotations

import torch

from workbench.adapters.schema import AudioInput, FeatureInput, SchemaModel, TokenInput, length_mask

WHISPER_BASE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)  # 74M parameters
WAV2VEC2_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)  # 94M


def whisper(vocab_size: int = 51865, **config) -> SchemaModel:
    """Whisper (base dimensions by default; ``config`` overrides any WhisperConfig field)."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    defaults = dict(num_mel_bins=80, max_source_positions=1500, max_target_positions=448, pad_token_id=0,
                    bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **WHISPER_BASE)
    cfg = WhisperConfig(vocab_size=vocab_size, **{**defaults, **config})
    module = WhisperForConditionalGeneration(cfg)
    window = 2 * cfg.max_source_positions  # frames: the encoder's two convolutions halve them once
    inputs = [FeatureInput(key="input_features", dim=cfg.num_mel_bins, frame_rate=100.0, channels_first=True,
                           fixed_frames=window),
              TokenInput(vocab_size=vocab_size, low=3, max_tokens=cfg.max_target_positions - 1)]
    return SchemaModel(module, inputs, _whisper_loss, name="hf-whisper")


def _whisper_loss(module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    tokens, lens = batch["tokens"], batch["token_lens"]
    labels = tokens.masked_fill(~length_mask(lens, tokens.shape[1]), -100)
    return module(input_features=batch["input_features"], labels=labels).loss


def wav2vec2_ctc(vocab_size: int = 32, **config) -> SchemaModel:
    """Wav2Vec2 for CTC (base dimensions, layer-norm feature encoder; ``config`` overrides any field).

    LayerDrop is off: a step that skips layers at random would probe less memory than the worst case."""
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    cfg = Wav2Vec2Config(vocab_size=vocab_size, pad_token_id=0, feat_extract_norm="layer", layerdrop=0.0,
                         do_stable_layer_norm=True, ctc_loss_reduction="sum", ctc_zero_infinity=True,
                         **{**WAV2VEC2_BASE, **config})
    module = Wav2Vec2ForCTC(cfg)
    inputs = [AudioInput(key="audio", sample_rate=16000), TokenInput(vocab_size=vocab_size, low=1)]
    return SchemaModel(module, inputs, _wav2vec2_ctc_loss, name="hf-wav2vec2-ctc")


def _wav2vec2_ctc_loss(module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    audio, tokens, token_lens = batch["audio"], batch["tokens"], batch["token_lens"]
    mask = length_mask(batch["audio_lens"], audio.shape[1])
    labels = tokens.masked_fill(~length_mask(token_lens, tokens.shape[1]), -100)
    loss = module(input_values=audio * mask, attention_mask=mask.long(), labels=labels).loss
    return loss / token_lens.sum().clamp_min(1)
