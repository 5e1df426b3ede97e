"""ASRModel: the encoder plus one head (rnnt, tdt, ctc, aed), with what the OOMptimizer needs:
make_batch (the worst case of a bucket) and training_step (forward + loss + backward).

Batches are dicts: audio [B, S] float32 16 kHz, audio_lens [B] long (samples), tokens [B, U] long in
[0, vocab_size), token_lens [B] long. The loss is the negative log-likelihood per target token
(summed over the batch, divided by the number of target tokens), so heads and batches compare.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.models.aed import TransformerDecoder
from workbench.models.config import (DEFAULT_DEPTHWISE, DEFAULT_JOINT_LOSS, DEFAULT_TIME_DEPTHWISE, ModelConfig,
                                     config_from_name)
from workbench.models.encoder import Encoder, depthwise_backend
from workbench.models.fused_joint_loss import fused_joint_loss
from workbench.models.losses import label_smoothed_cross_entropy, rnnt_loss, tdt_loss
from workbench.models.transducer import Joint, Predictor, chunked_joint_loss

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # the names CLIs and configs use
TRAINING_DTYPES = tuple(DTYPES.values())


def check_bucket_request(batch_size: int, duration_s: float, num_tokens: int) -> None:
    """ValueError naming the argument of a ``make_batch`` call that no bucket can have."""
    if batch_size < 1:
        raise ValueError(f"batch_size: need at least 1, got {batch_size}")
    if not duration_s > 0:
        raise ValueError(f"duration_s: need > 0 seconds, got {duration_s}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens: need >= 0, got {num_tokens}")


class ASRModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.encoder = Encoder(config)
        self.blank_id = config.vocab_size  # rnnt, tdt, ctc
        self.durations = list(config.durations) if config.head == "tdt" else None
        if config.head in ("rnnt", "tdt"):
            self.predictor = Predictor(config.vocab_size, config.pred_hidden, config.pred_layers, config.dropout)
            extra = len(config.durations) if config.head == "tdt" else 0
            self.joint = Joint(config.d_model, config.pred_hidden, config.joint_hidden,
                               config.vocab_size + 1 + extra)
        elif config.head == "ctc":
            self.ctc_out = nn.Linear(config.d_model, config.vocab_size + 1)
        else:
            self.decoder = TransformerDecoder(config)

    def encode(self, audio: torch.Tensor, audio_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """audio [B, S] 16 kHz, audio_lens [B] samples -> (enc [B, T, D], enc_lens [B]); 80 ms per frame."""
        return self.encoder(audio, audio_lens)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch (what DistributedDataParallel wraps); see :meth:`loss`."""
        return self.loss(batch)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Scalar loss with its graph: summed NLL / number of target tokens (AED: mean smoothed CE)."""
        tokens, token_lens = batch["tokens"], batch["token_lens"]
        enc, enc_lens = self.encode(batch["audio"], batch["audio_lens"])
        num_targets = self.loss_normalizer(token_lens)
        head = self.config.head
        if head in ("rnnt", "tdt"):
            pred = self.predictor(tokens)
            chunk = self.config.joint_chunk_size
            nll_of = self._transducer_nll(tokens, enc_lens, token_lens)
            if self.config.joint_loss == "fused":  # the logits are never built
                nll = fused_joint_loss(self.joint, enc, pred, tokens, enc_lens, token_lens, blank=self.blank_id,
                                       durations=self.durations, reduction="sum", check="device")
            elif chunk and chunk < tokens.shape[0]:
                nll = chunked_joint_loss(self.joint, enc, pred, nll_of, chunk, padded=True)
            else:  # logits [B, T, U + 1, V + 1 (+ D)], padded to an aligned width
                nll = nll_of(self.joint(enc, pred, padded=True), slice(None))
            return nll / num_targets
        if head == "ctc":
            log_probs = self.ctc_out(enc).float().log_softmax(-1).transpose(0, 1)  # [T, B, V + 1]
            nll = F.ctc_loss(log_probs, tokens, enc_lens, token_lens, blank=self.blank_id, reduction="sum",
                             zero_infinity=True)
            return nll / num_targets
        return self._aed_loss(enc, enc_lens, tokens, token_lens)

    def loss_normalizer(self, token_lens: torch.Tensor) -> torch.Tensor:
        """The count :meth:`loss` divides its summed loss by: target tokens, at least 1 (AED: the tokens and
        one end of sentence per utterance). A part of a batch weighted by its count over the batch's gives
        the batch's loss, and its gradient, when summed (how a batch too large for memory is trained)."""
        if self.config.head == "aed":
            return (token_lens + 1).sum()
        return token_lens.sum().clamp_min(1)

    def _transducer_nll(self, tokens, enc_lens, token_lens):
        """(padded joint logits of some rows of the batch, those rows) -> their summed transducer NLL."""
        num_classes = self.joint.num_outputs  # the columns after it are the joint's alignment padding

        def nll(logits: torch.Tensor, rows: slice) -> torch.Tensor:
            if self.config.head == "rnnt":
                return rnnt_loss(logits, tokens[rows], enc_lens[rows], token_lens[rows], blank=self.blank_id,
                                 reduction="sum", check="device", num_classes=num_classes)
            return tdt_loss(logits, tokens[rows], enc_lens[rows], token_lens[rows], blank=self.blank_id,
                            durations=self.durations, reduction="sum", check="device", num_classes=num_classes)
        return nll

    def _aed_loss(self, enc, enc_lens, tokens, token_lens) -> torch.Tensor:
        batch, max_tokens = tokens.shape
        in_use = torch.arange(max_tokens, device=tokens.device)[None] < token_lens[:, None]
        bos = tokens.new_full((batch, 1), self.decoder.bos_id)  # also when U = 0: the target is EOS alone
        inputs = torch.cat([bos, tokens.masked_fill(~in_use, self.decoder.eos_id)], dim=1)
        targets = torch.cat([tokens.masked_fill(~in_use, -100), torch.full_like(bos, -100)], dim=1)
        at_end = torch.arange(max_tokens + 1, device=tokens.device)[None] == token_lens[:, None]
        targets = targets.masked_fill(at_end, self.decoder.eos_id)  # elementwise: no indexed write
        logits = self.decoder(inputs, enc, enc_lens)
        return label_smoothed_cross_entropy(logits, targets, smoothing=self.config.label_smoothing)

    def make_batch(self, batch_size: int, duration_s: float, num_tokens: int, device: torch.device | str,
                   *, seed: int = 0) -> dict[str, torch.Tensor]:
        """The worst case of a bucket: every item is duration_s seconds of audio with num_tokens labels.

        Audio is Gaussian noise (std 0.1), tokens uniform in [0, vocab_size); the same seed gives the
        same batch.
        """
        check_bucket_request(batch_size, duration_s, num_tokens)
        device = torch.device(device)
        num_samples = max(1, round(duration_s * self.config.sample_rate))
        generator = torch.Generator(device=device).manual_seed(seed)
        audio = torch.randn(batch_size, num_samples, generator=generator, device=device) * 0.1
        tokens = torch.randint(0, self.vocab_size, (batch_size, num_tokens), generator=generator, device=device)
        return {"audio": audio,
                "audio_lens": torch.full((batch_size,), num_samples, dtype=torch.long, device=device),
                "tokens": tokens,
                "token_lens": torch.full((batch_size,), num_tokens, dtype=torch.long, device=device)}

    def training_step(self, batch: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Forward, loss and backward in train mode (bf16 autocast or fp32); returns the detached loss.

        Gradients accumulate into .grad; the caller steps (and zeroes) the optimizer.
        """
        if dtype not in TRAINING_DTYPES:
            raise ValueError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype}")
        self.train()
        device_type = batch["audio"].device.type
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = self.loss(batch)
        loss.backward()
        return loss.detach()


def build_model(name: str, *, vocab_size: int | None = None, joint_chunk_size: int = 0,
                depthwise: str = DEFAULT_DEPTHWISE, time_depthwise: str = DEFAULT_TIME_DEPTHWISE,
                joint_loss: str = DEFAULT_JOINT_LOSS) -> ASRModel:
    """"{tiny,large,xl}-{rnnt,tdt,ctc,aed}" -> ASRModel on the current default device (use
    ``with torch.device("meta"):`` to count parameters without allocating); ``depthwise``: see
    :class:`workbench.models.encoder.Subsampling`; ``time_depthwise``: see
    :class:`workbench.models.encoder.ConvolutionModule`; ``joint_loss``: "materialized" or "fused"
    (transducers: :mod:`workbench.models.fused_joint_loss`)."""
    return ASRModel(config_from_name(name, vocab_size=vocab_size, joint_chunk_size=joint_chunk_size,
                                     depthwise=depthwise, time_depthwise=time_depthwise, joint_loss=joint_loss))


def compile_encoder_layers(model: ASRModel, *, backend: str = "inductor") -> ASRModel:
    """``torch.compile`` each conformer block of the encoder in place, with dynamic shapes (batch size
    and length are symbolic from the first compile, so batches of new shapes reuse the compiled code;
    sizes 0 and 1 are still specialized). The depthwise conv of each convolution module stays eager
    (a graph break): inductor's convolution backward fixes its input's strides, which would recompile the
    block for every new length. A ``time_depthwise="auto"`` is settled first for the device the weights are
    on, so the compiled code holds no device check. Weights, state_dict keys, make_batch and training_step are
    unchanged; the blocks compile on their first call. Returns the model."""
    device = next(model.parameters()).device
    for block in model.encoder.blocks:
        block.conv.time_depthwise = depthwise_backend(block.conv.time_depthwise, device, which="time")
        depthwise = block.conv.depthwise
        depthwise.forward = torch.compiler.disable(depthwise.forward)
        block.conv.time_conv = torch.compiler.disable(block.conv.time_conv)  # the Triton kernels' path
        block.compile(dynamic=True, backend=backend)
    return model


def encoder_layers_compiled(model: nn.Module) -> bool:
    """True when :func:`compile_encoder_layers` was applied to ``model`` (the OOMptimizer's metadata)."""
    encoder = getattr(model, "encoder", None)
    blocks = getattr(encoder, "blocks", None) or []
    return bool(blocks) and all(getattr(b, "_compiled_call_impl", None) is not None for b in blocks)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
