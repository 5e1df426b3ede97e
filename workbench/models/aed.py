"""Transformer decoder for the attention encoder-decoder head (like Canary): pre-norm layers of causal
self-attention, cross-attention over the encoder, feed-forward. Output classes: V tokens, bos (= V),
eos (= V + 1)."""

from __future__ import annotations

import torch
from torch import nn

from workbench.models.config import ModelConfig
from workbench.models.encoder import Attention, attention_dtype, feed_forward, key_padding_bias, sinusoidal_positions


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, dropout: float):
        super().__init__()
        self.self_norm, self.self_attn = nn.LayerNorm(dim), Attention(dim, num_heads, dropout)
        self.cross_norm, self.cross_attn = nn.LayerNorm(dim), Attention(dim, num_heads, dropout)
        self.ff = feed_forward(dim, 4 * dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, memory_bias):
        """memory_bias [B, 1, 1, T]: :func:`key_padding_bias` of the encoder's valid frames."""
        x = x + self.dropout(self.self_attn(self.self_norm(x), causal=True))  # no mask: the flash kernel
        x = x + self.dropout(self.cross_attn(self.cross_norm(x), memory, key_bias=memory_bias))
        return x + self.ff(x)


class TransformerDecoder(nn.Module):
    """(inputs [B, L] ids, enc [B, T, D], enc_lens [B]) -> logits [B, L, V + 2]."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        dim = config.dec_d_model
        self.bos_id, self.eos_id = config.vocab_size, config.vocab_size + 1
        self.embed = nn.Embedding(config.vocab_size + 2, dim)
        self.enc_proj = nn.Linear(config.d_model, dim) if config.d_model != dim else nn.Identity()
        self.layers = nn.ModuleList(DecoderLayer(dim, config.dec_heads, config.dropout)
                                    for _ in range(config.dec_layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, config.vocab_size + 2)

    def forward(self, inputs: torch.Tensor, enc: torch.Tensor, enc_lens: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        x = x + sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)
        memory = self.enc_proj(enc)
        memory_valid = torch.arange(enc.shape[1], device=enc.device)[None] < enc_lens[:, None]
        memory_bias = key_padding_bias(memory_valid, attention_dtype(x))
        for layer in self.layers:
            x = layer(x, memory, memory_bias)
        return self.out(self.norm(x))
