"""What the transducer losses (PyTorch reference and Triton kernels) share: input checks and reductions."""

from __future__ import annotations

from typing import Sequence

import torch

# A finite "log of zero": -inf would turn logsumexp gradients into NaN on unreachable nodes.
LOG_ZERO = -1.0e30


def check_num_classes(logits: torch.Tensor, num_classes: int | None) -> int:
    """How many leading columns of the logits' last dim are real classes (the rest is padding, ignored);
    None: all of them. 0 for logits that are not 4-d (:func:`check_inputs` names that). ValueError naming
    the option when out of [2, last dim]."""
    if logits.dim() != 4:
        return 0
    width = logits.shape[-1]
    if num_classes is None:
        return width
    if isinstance(num_classes, bool) or not isinstance(num_classes, int):
        raise ValueError(f"num_classes: expected an int or None, got {num_classes!r}")
    if not 2 <= num_classes <= width:
        raise ValueError(f"num_classes: {num_classes} is outside [2, {width}] (the logits' last dim)")
    return num_classes


def check_durations(logits: torch.Tensor, durations: Sequence[int],
                    num_classes: int | None = None) -> tuple[list[int], int]:
    """TDT durations as ints and the number of token classes they leave out of the first ``num_classes``
    columns (default: the whole last dim); ValueError naming the field."""
    durations = [int(d) for d in durations]
    if not durations or min(durations) < 0 or len(set(durations)) != len(durations):
        raise ValueError(f"durations: need distinct non-negative frame counts, got {durations}")
    if max(durations) == 0:
        raise ValueError("durations: need at least one duration > 0 for blank, got only 0")
    real = check_num_classes(logits, num_classes)
    num_token_classes = real - len(durations) if logits.dim() == 4 else 0
    if logits.dim() == 4 and num_token_classes < 2:
        where = f"last dim {real}" if num_classes is None else f"num_classes {real}"
        raise ValueError(f"logits: {where} leaves {num_token_classes} token classes "
                         f"after {len(durations)} durations; need at least 2")
    return durations, num_token_classes


CHECKS = ("host", "device")  # how check_inputs tests the values of CUDA lengths and targets


def check_inputs(logits, targets, logit_lengths, target_lengths, blank: int, num_token_classes: int,
                 check: str = "host") -> int:
    """Raise ValueError naming the field and how many entries are wrong; return blank as an index >= 0.

    Shapes and ``blank`` are checked on the host. The values of lengths and targets: with ``check="host"``
    by counting the bad entries (on CUDA one device-to-host copy, which waits for the work queued
    before it); with ``check="device"`` and every tensor on CUDA, by device-side asserts that never wait
    (the training step's way: a bad value then stops the process with a CUDA device-side assert naming
    no field). Tensors on the CPU always get the host check (nothing to wait for there).
    """
    if check not in CHECKS:
        raise ValueError(f"check: expected one of {CHECKS}, got {check!r}")
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
    bad = [(logit_lengths < 1) | (logit_lengths > num_frames),
           (target_lengths < 0) | (target_lengths > num_cols - 1),
           in_use & ((targets < 0) | (targets >= num_token_classes) | (targets == blank))]
    messages = [f"logit_lengths: {{}} of {batch} outside [1, {num_frames}]",
                f"target_lengths: {{}} of {batch} outside [0, {num_cols - 1}]",
                f"targets: {{}} labels are blank ({blank}) or outside [0, {num_token_classes})"]
    on_cuda = all(t.device.type == "cuda" for t in (targets, logit_lengths, target_lengths))
    if check == "device" and on_cuda:
        for flags, message in zip(bad, messages):
            torch._assert_async(~flags.any(), message.format("some"))
        return blank
    # one host copy for the three checks
    bad_counts = torch.stack([flags.sum().to(device) for flags in bad]).tolist()
    for count, message in zip(bad_counts, messages):
        if count:
            raise ValueError(message.format(count))
    return blank


def reduce_losses(losses: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return losses.mean()
    raise ValueError(f"reduction: expected 'none', 'sum' or 'mean', got {reduction!r}")
