"""Training with the workbench's data path: the profile-driven DataLoader for your own loop."""

from workbench.training.data import default_num_workers, loader_for_sampler, make_dataloader

__all__ = ["default_num_workers", "loader_for_sampler", "make_dataloader"]
