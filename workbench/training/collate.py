"""collate_cuts: real lhotse cuts -> the model's batch dict (audio loaded from disk, text tokenized)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from workbench.units import SAMPLE_RATE


def cut_text(cut) -> str:
    """The transcript of a cut: its supervisions' texts joined by spaces (empty when there are none)."""
    return " ".join(s.text for s in (cut.supervisions or []) if s.text)


def cut_token_count(cut, tokenizer) -> int:
    """The token count a cut is bucketed by: ``custom["num_tokens"]`` when the manifest has it (``workbench
    corpus tokenizer --add-counts`` writes it), else the tokenizer's count of its transcript."""
    custom = cut.custom or {}
    return int(custom["num_tokens"]) if "num_tokens" in custom else len(tokenizer.encode(cut_text(cut)))


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


def cut_has_audio(cut) -> bool:
    """True when the cut has a recording whose file sources exist (the synthetic corpus names files that
    were never written); URL and command sources are taken on trust."""
    if not getattr(cut, "has_recording", False):
        return False
    return all(Path(src.source).is_file() for src in cut.recording.sources if src.type == "file")


class CutBatchDataset(torch.utils.data.Dataset):
    """Map-style dataset for lhotse samplers: ``dataset[cuts]`` is :func:`collate_cuts` of that CutSet.

    Meant for ``DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=N)``: the sampler in
    the main process yields CutSets, the workers read, resample and collate their audio; the batch
    dict also lists, per cut and left on the host, the ``cut_ids``, the ``durations`` (seconds) and the
    ``num_tokens`` it is bucketed by (:func:`cut_token_count`), which name its bucket. The tokenizer
    is loaded from ``tokenizer_path`` once per process, so nothing unpicklable crosses to the workers.
    """

    def __init__(self, tokenizer_path: str, *, sample_rate: int = SAMPLE_RATE):
        self.tokenizer_path = str(tokenizer_path)
        self.sample_rate = sample_rate
        self._tokenizer = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokenizer": None}

    def __getitem__(self, cuts) -> dict:
        if self._tokenizer is None:
            from workbench.data.tokenizer import load_tokenizer  # sentencepiece: only where batches are made

            self._tokenizer = load_tokenizer(self.tokenizer_path)
        for cut in cuts:
            if not cut_has_audio(cut):
                raise ValueError(f"cut {cut.id!r} has no audio (no recording, or its file is missing): "
                                 "training needs real audio")
        batch = collate_cuts(cuts, self._tokenizer, sample_rate=self.sample_rate)
        batch["cut_ids"] = [cut.id for cut in cuts]
        batch["durations"] = [float(cut.duration) for cut in cuts]
        batch["num_tokens"] = [cut_token_count(cut, self._tokenizer) for cut in cuts]
        return batch
