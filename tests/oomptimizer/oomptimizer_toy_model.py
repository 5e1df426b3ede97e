"""A small model with the workbench.models contract (make_batch, training_step), for probe tests."""

import torch
from torch import nn


class ToyTransducerLike(nn.Module):
    """Frames -> MLP encoder -> a joint over (frames x tokens), so memory grows like T * U per item."""

    def __init__(self, hidden: int = 256, vocab: int = 128):
        super().__init__()
        self.vocab_size = vocab
        self.config = {"hidden": hidden, "vocab": vocab}
        self.encoder = nn.Sequential(nn.Linear(160, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.embed = nn.Embedding(vocab + 1, hidden)
        self.out = nn.Linear(hidden, vocab + 1)

    def make_batch(self, batch_size, duration_s, num_tokens, device):
        samples = int(duration_s * 16000)
        u = max(int(num_tokens), 1)
        return {"audio": torch.randn(batch_size, samples, device=device),
                "audio_lens": torch.full((batch_size,), samples, dtype=torch.long, device=device),
                "tokens": torch.randint(0, self.vocab_size, (batch_size, u), device=device),
                "token_lens": torch.full((batch_size,), u, dtype=torch.long, device=device)}

    def training_step(self, batch, *, dtype=torch.float32):
        audio = batch["audio"]
        b, s = audio.shape
        frames = audio[:, : s // 160 * 160].reshape(b, -1, 160)[:, ::4]  # 40 ms frames
        with torch.autocast(audio.device.type, dtype=dtype, enabled=dtype != torch.float32):
            enc = self.encoder(frames)
            pred = self.embed(batch["tokens"])
            joint = torch.tanh(enc[:, :, None, :] + pred[:, None, :, :])
            logits = self.out(joint)
            loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        return loss.detach()
