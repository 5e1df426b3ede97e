"""collate_cuts: real lhotse cuts -> the model's batch dict (audio loaded from disk, text tokenized)."""

from __future__ import annotations

from typing import Iterable

import torch

from workbench.units import SAMPLE_RATE


def cut_text(cut) -> str:
    """The transcript of a cut: its supervisions' texts joined by spaces (empty when there are none)."""
    return " ".join(s.text for s in (cut.supervisions or []) if s.text)


def collate_cuts(cuts: Iterable, tokenizer, *, sample_rate: int = SAMPLE_RATE) -> dict[str, torch.Tensor]:
    """Batch dict from lhotse cuts: audio [B, S] float32 (mono, resampled to sample_rate when needed),
    audio_lens [B] samples, tokens [B, U] (tokenizer.encode of each transcript, zero-padded), token_lens [B].

    ``tokenizer`` is a sentencepiece processor (anything whose ``encode(list[str])`` gives id lists).
    """
    cuts = list(cuts)
    if not cuts:
        raise ValueError("cuts: empty batch (0 cuts)")
    audios = []
    for cut in cuts:
        if cut.sampling_rate != sample_rate:
            cut = cut.resample(sample_rate)
        samples = torch.from_numpy(cut.load_audio()).float()
        audios.append(samples.mean(0) if samples.dim() == 2 else samples)
    token_ids = tokenizer.encode([cut_text(cut) for cut in cuts])
    audio_lens = torch.tensor([a.numel() for a in audios], dtype=torch.long)
    token_lens = torch.tensor([len(ids) for ids in token_ids], dtype=torch.long)
    audio = torch.zeros(len(cuts), int(audio_lens.max()))
    tokens = torch.zeros(len(cuts), int(token_lens.max()), dtype=torch.long)
    for i, (a, ids) in enumerate(zip(audios, token_ids)):
        audio[i, :a.numel()] = a
        tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return {"audio": audio, "audio_lens": audio_lens, "tokens": tokens, "token_lens": token_lens}
