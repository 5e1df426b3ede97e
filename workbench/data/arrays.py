"""CutArrays: the columns of a corpus that bucketing needs, as numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class CutArrays:
    ids: list[str]  # cut ids, in manifest order
    durations: np.ndarray  # float64, seconds, one per cut
    num_tokens: np.ndarray | None = None  # int64 output tokens per cut; None when unknown
    texts: list[str] | None = None  # transcript per cut (supervision texts joined by spaces)
    source: str = ""  # where the arrays came from (file path or 'synthetic(...)')

    def __post_init__(self) -> None:
        n = len(self.ids)
        if len(self.durations) != n:
            raise ValueError(f"{self.source}: {len(self.durations)} durations for {n} cut ids")
        if self.num_tokens is not None and len(self.num_tokens) != n:
            raise ValueError(f"{self.source}: {len(self.num_tokens)} token counts for {n} cut ids")
        if self.texts is not None and len(self.texts) != n:
            raise ValueError(f"{self.source}: {len(self.texts)} texts for {n} cut ids")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tokens_per_second(self) -> np.ndarray:
        """Output tokens per second of audio, per cut (needs num_tokens)."""
        if self.num_tokens is None:
            raise ValueError(f"{self.source}: no token counts (pass a tokenizer, or add them first)")
        return self.num_tokens / self.durations

    def summary(self) -> dict:
        """Count, total hours and duration/token quantiles, for printing."""
        d = self.durations
        out = {"cuts": len(self), "hours": float(d.sum() / 3600), "min_s": float(d.min()),
               "median_s": float(np.median(d)), "max_s": float(d.max())}
        if self.num_tokens is not None:
            out.update(median_tokens=float(np.median(self.num_tokens)), max_tokens=int(self.num_tokens.max()),
                       median_tps=float(np.median(self.tokens_per_second)))
        return out
