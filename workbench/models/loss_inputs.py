"""What the transducer losses (PyTorch reference and Triton kernels) share: input checks and reductions."""

from __future__ import annotations

from typing import Sequence

import torch

# A finite "log of zero": -inf would turn logsumexp gradients into NaN on unreachable nodes.
LOG_ZERO = -1.0e30


def check_durations(logits: torch.Tensor, durations: Sequence[int]) -> tuple[list[int], int]:
    """TDT durations as ints and the number of token classes they leave; ValueError naming the field."""
    durations = [int(d) for d in durations]
    if not durations or min(durations) < 0 or len(set(durations)) != len(durations):
        raise ValueError(f"durations: need distinct non-negative frame counts, got {durations}")
    if max(durations) == 0:
        raise ValueError("durations: need at least one duration > 0 for blank, got only 0")
    num_token_classes = logits.shape[-1] - len(durations) if logits.dim() == 4 else 0
    if logits.dim() == 4 and num_token_classes < 2:
        raise ValueError(f"logits: last dim {logits.shape[-1]} leaves {num_token_classes} token classes "
                         f"after {len(durations)} durations; need at least 2")
    return durations, num_token_classes


def check_inputs(logits, targets, logit_lengths, target_lengths, blank: int, num_token_classes: int) -> int:
    """Raise ValueError naming the field and how many entries are wrong; return blank as an index >= 0."""
    if logits.dim() != 4:
        raise ValueError(f"logits: expected 4 dims [B, T, U + 1, classes], got {logits.dim()}")
    batch, num_frames, num_cols, _ = logits.shape
    if targets.dim() != 2 or targets.shape != (batch, num_cols - 1):
        raise ValueError(f"targets: expected shape ({batch}, {num_cols - 1}), got {tuple(targets.shape)}")
    for name, lengths in (("logit_lengths", logit_lengths), ("target_lengths", target_lengths)):
        if lengths.shape != (batch,):
            raise ValueError(f"{name}: expected shape ({batch},), got {tuple(lengths.shape)}")
    if not -num_token_classes <= blank < num_token_classes:
        raise ValueError(f"blank: {blank} is not one of the {num_token_classes} token classes")
    blank = blank % num_token_classes
    device = targets.device
    in_use = torch.arange(num_cols - 1, device=device)[None, :] < target_lengths[:, None].to(device)
    bad_counts = torch.stack([  # one host sync for the three checks (this runs every training step)
        ((logit_lengths < 1) | (logit_lengths > num_frames)).sum().to(device),
        ((target_lengths < 0) | (target_lengths > num_cols - 1)).sum().to(device),
        (in_use & ((targets < 0) | (targets >= num_token_classes) | (targets == blank))).sum()]).tolist()
    bad_logit_lengths, bad_target_lengths, bad_targets = bad_counts
    if bad_logit_lengths:
        raise ValueError(f"logit_lengths: {bad_logit_lengths} of {batch} outside [1, {num_frames}]")
    if bad_target_lengths:
        raise ValueError(f"target_lengths: {bad_target_lengths} of {batch} outside [0, {num_cols - 1}]")
    if bad_targets:
        raise ValueError(f"targets: {bad_targets} labels are blank ({blank}) or outside [0, {num_token_classes})")
    return blank


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return losses.mean()
    raise ValueError(f"reduction: expected 'none', 'sum' or 'mean', got {reduction!r}")
