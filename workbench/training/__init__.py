"""Training: the recipe (`workbench train`), batch collation from lhotse cuts, torchrun ranks, and the
profile-driven DataLoader for your own loop. Names load on first use, so that the command line starts
without importing torch."""

import importlib

_EXPORTS = {
    "default_num_workers": "data", "loader_for_sampler": "data", "make_dataloader": "data",
    "collate_cuts": "collate", "cut_text": "collate", "CutBatchDataset": "collate",
    "TrainConfig": "recipe", "train": "recipe", "load_checkpoint": "recipe", "save_checkpoint": "recipe",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"workbench.training.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'workbench.training' has no attribute {name!r}")
