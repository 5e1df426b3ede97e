"""The folder a corpus command writes: what makes it hold a corpus, and replacing that corpus whole."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# What a corpus command writes in its --out folder; --overwrite replaces these, and only these.
CORPUS_PARTS = ("cuts.jsonl.gz", "recordings.jsonl.gz", "supervisions.jsonl.gz", "audio")


def corpus_in(folder: str | os.PathLike) -> list[str]:
    """Names of what makes ``folder`` hold a corpus: its manifests (``*.jsonl``, ``*.jsonl.gz``) and its
    ``audio`` folder, sorted (empty when the folder does not exist)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                  if p.name.endswith((".jsonl", ".jsonl.gz")) or p.name == "audio" and p.is_dir())


def check_corpus_target(folder: str | os.PathLike, *, overwrite: bool) -> None:
    """Refuse an --out folder that holds a corpus (or any manifest) unless ``overwrite``: ValueError naming it
    and what it holds."""
    held = corpus_in(folder)
    if held and not overwrite:
        raise ValueError(f"--out {folder}: holds a corpus ({', '.join(held)}); pass --overwrite to replace it "
                         f"(its {', '.join(CORPUS_PARTS)}), or choose another folder")


def remove_corpus_parts(folder: Path, keep: tuple[str, ...] = ()) -> None:
    """Remove the CORPUS_PARTS in ``folder`` but ``keep``: the cuts manifest first, so a folder left halfway
    holds no cuts manifest that names audio or recordings that are gone."""
    for name in CORPUS_PARTS:
        path = folder / name
        if name in keep:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
