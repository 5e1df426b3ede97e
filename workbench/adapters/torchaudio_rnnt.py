"""torchaudio's Emformer RNN-T (``emformer_rnnt_base``, 72M parameters with 4097 symbols), wrapped to keep
the model contract the way torchaudio's LibriSpeech recipe trains it: 80 log-mel features at 100 frames per
second, right-padded with the Emformer's right context (4 frames after the 4x time reduction), the
predictor fed the targets behind a blank (the blank-first convention: blank is the last symbol), and
``torchaudio.functional.rnnt_loss`` summed and divided by the number of target tokens.
"""

from __future__ import annotations

import torch

from workbench.adapters.schema import FeatureInput, SchemaModel, TokenInput

RIGHT_CONTEXT_FRAMES = 4 * 4  # right_context_length 4 after time_reduction_stride 4


def emformer_rnnt(vocab_size: int = 4096) -> SchemaModel:
    """The base Emformer RNN-T over ``vocab_size`` tokens plus a blank (id ``vocab_size``)."""
    from torchaudio.models import emformer_rnnt_base

    module = emformer_rnnt_base(num_symbols=vocab_size + 1)
    module.blank_id = vocab_size
    inputs = [FeatureInput(key="features", dim=80, frame_rate=100.0, extra_frames=RIGHT_CONTEXT_FRAMES),
              TokenInput(vocab_size=vocab_size)]
    return SchemaModel(module, inputs, _emformer_rnnt_loss, name="torchaudio-emformer-rnnt")


def _emformer_rnnt_loss(module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from torchaudio.functional import rnnt_loss

    tokens, token_lens = batch["tokens"], batch["token_lens"]
    blank = torch.full_like(tokens[:, :1], module.blank_id)
    logits, logit_lens, _, _ = module(batch["features"], batch["feature_lens"], torch.cat([blank, tokens], 1),
                                      token_lens + 1)
    frames = min(logits.shape[1], int(logit_lens.max()))  # the loss wants the longest length to be the frames
    logits, logit_lens = logits[:, :frames], logit_lens.clamp(max=frames)
    nll = rnnt_loss(logits.float().contiguous(), tokens.int(), logit_lens.int(), token_lens.int(), blank=module.blank_id,
                    reduction="sum")
    return nll / token_lens.sum().clamp_min(1)
