"""NVIDIA NeMo's FastConformer RNN-T (``EncDecRNNTBPEModel``) built from a config (no download), wrapped to
keep the model contract: raw 16 kHz audio through NeMo's own preprocessor, SpecAugment, encoder, predictor
and joint, and NeMo's RNN-T loss through the joint's fused loss path (sub-batches of ``fused_batch_size``),
as its training step computes it. A BPE tokenizer is trained on the synthetic corpus's text, since NeMo
builds its vocabulary from a tokenizer folder.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from workbench.adapters.schema import AudioInput, SchemaModel, TokenInput

ENCODER = dict(feat_in=80, feat_out=-1, n_layers=17, d_model=512, subsampling="dw_striding", subsampling_factor=8,
               subsampling_conv_channels=256, causal_downsampling=False, ff_expansion_factor=4,
               self_attention_model="rel_pos", n_heads=8, att_context_size=[-1, -1], xscaling=True,
               untie_biases=True, pos_emb_max_len=5000, conv_kernel_size=9, conv_norm_type="batch_norm",
               dropout=0.1, dropout_pre_encoder=0.1, dropout_emb=0.0, dropout_att=0.1)  # FastConformer large


def fastconformer_rnnt(vocab_size: int = 1024, fused_batch_size: int = 4, loss_name: str = "default",
                       **encoder) -> SchemaModel:
    """FastConformer-large RNN-T (about 115M parameters) over a ``vocab_size`` BPE vocabulary."""
    import numpy as np
    from omegaconf import OmegaConf

    if not hasattr(np, "row_stack"):  # NeMo's numba loss calls it; numpy 2 removed it (same as vstack)
        np.row_stack = np.vstack
    from nemo.collections.asr.models import EncDecRNNTBPEModel

    folder = Path(tempfile.mkdtemp(prefix="nemo_tokenizer_"))
    try:
        cfg = OmegaConf.create(_config(_tokenizer_folder(folder, vocab_size), fused_batch_size, loss_name,
                                       {**ENCODER, **encoder}))
        module = EncDecRNNTBPEModel(cfg=cfg)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    vocab = module.tokenizer.vocab_size
    inputs = [AudioInput(key="audio", sample_rate=16000), TokenInput(vocab_size=vocab)]
    return SchemaModel(module, inputs, _nemo_rnnt_loss, name="nemo-fastconformer-rnnt")


def _tokenizer_folder(folder: Path, vocab_size: int) -> str:
    from workbench.data.synthetic import write_synthetic_corpus
    from workbench.data.tokenizer import train_tokenizer

    manifest = write_synthetic_corpus(folder / "corpus", 5000, progress=False)
    model = train_tokenizer(manifest, folder / "bpe", vocab_size=vocab_size, progress=False)
    shutil.copy(model, folder / "tokenizer.model")
    pieces = [line.split("\t")[0] for line in model.with_suffix(".vocab").read_text().splitlines()]
    (folder / "tokenizer.vocab").write_text(model.with_suffix(".vocab").read_text())
    (folder / "vocab.txt").write_text("".join(p + "\n" for p in pieces))  # NeMo registers both as artifacts
    return str(folder)


def _config(tokenizer_dir: str, fused_batch_size: int, loss_name: str, encoder: dict) -> dict:
    modules = "nemo.collections.asr.modules"
    return {
        "sample_rate": 16000, "train_ds": None, "validation_ds": None, "test_ds": None,
        "model_defaults": {"enc_hidden": encoder["d_model"], "pred_hidden": 640, "joint_hidden": 640},
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "preprocessor": {"_target_": f"{modules}.AudioToMelSpectrogramPreprocessor", "sample_rate": 16000,
                         "normalize": "per_feature", "window_size": 0.025, "window_stride": 0.01,
                         "window": "hann", "features": 80, "n_fft": 512, "frame_splicing": 1, "dither": 1e-5,
                         "pad_to": 0},
        "spec_augment": {"_target_": f"{modules}.SpectrogramAugmentation", "freq_masks": 2, "time_masks": 10,
                         "freq_width": 27, "time_width": 0.05},
        "encoder": {"_target_": f"{modules}.ConformerEncoder", **encoder},
        "decoder": {"_target_": f"{modules}.RNNTDecoder", "normalization_mode": None, "random_state_sampling": False,
                    "blank_as_pad": True, "prednet": {"pred_hidden": 640, "pred_rnn_layers": 1, "t_max": None,
                                                      "dropout": 0.2}},
        "joint": {"_target_": f"{modules}.RNNTJoint", "log_softmax": None, "preserve_memory": False,
                  "fuse_loss_wer": True, "fused_batch_size": fused_batch_size,
                  "jointnet": {"joint_hidden": 640, "activation": "relu", "dropout": 0.2}},
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": 10}},
        "loss": {"loss_name": loss_name},
        "optim": None,
    }


def _nemo_rnnt_loss(module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    # The fused joint sets its loss's reduction to None around each sub-batch and restores it only when the
    # sub-batch returns, so an OOM there (every probe past the limit) leaves per-utterance losses behind.
    module.joint.loss.reduction = module.cfg.get("rnnt_reduction", "mean_batch")
    encoded, encoded_len = module(input_signal=batch["audio"], input_signal_length=batch["audio_lens"])
    tokens, token_lens = batch["tokens"], batch["token_lens"]
    decoder, target_len, _ = module.decoder(targets=tokens, target_length=token_lens)
    loss, _, _, _ = module.joint(encoder_outputs=encoded, decoder_outputs=decoder, encoder_lengths=encoded_len,
                                 transcripts=tokens, transcript_lengths=target_len, compute_wer=False)
    return loss
