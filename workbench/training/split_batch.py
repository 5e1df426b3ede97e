"""A training step that runs out of device memory: train its batch in parts that fit, one optimizer step.

The batch is tried whole; a part that runs out of memory is cut in halves, again and again down to one
utterance, and the parts are trained one after another with their gradients accumulated. Each part's
loss is weighted by its share of the batch's loss normalizer (the count the loss divides its sum by), so
the accumulated gradient is the whole batch's gradient, exactly for models without batch statistics or
randomness: BatchNorm normalizes each part with its own statistics and updates its running averages once
per part (twice for parts trained again after a backward failure), and dropout draws other masks. Only
the forward and backward passes are split; an optimizer step that runs out of memory is not recovered.
Every utterance is trained exactly once:

- out of memory in the forward pass: no gradient was touched, so the part is halved and training goes on;
- out of memory in the backward pass: some gradients may hold part of it, so they are dropped and the
  parts trained so far are trained again, beside the halves of the failed one;
- one utterance that does not fit: gradients are dropped and :class:`UtteranceOutOfMemoryError` names it.

The host batch is cut on the host (rows, with padding trimmed to the part's longest audio and
transcript), so a part costs one copy to the device and no device synchronization.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from workbench.memory.oom import is_oom_error, release_memory


class UtteranceOutOfMemoryError(ValueError):
    """One utterance alone does not fit in device memory: there is nothing left to split.

    ``row``: its index in the host batch."""

    def __init__(self, message: str, row: int):
        super().__init__(message)
        self.row = row


@dataclass
class PartsTrained:
    """What :func:`train_in_parts` did with one batch."""

    loss: torch.Tensor                                    # the batch's loss (weighted sum of the parts'), detached
    part_sizes: list[int]                                 # utterances in each part trained, in batch order
    failed_sizes: list[int] = field(default_factory=list)  # sizes of the tries that ran out of memory, in order

    @property
    def safe_size(self) -> int | None:
        """The largest part size that trained and is smaller than every size that ran out of memory
        (None when nothing ran out of memory)."""
        if not self.failed_sizes:
            return None
        smallest_failed = min(self.failed_sizes)
        return max(s for s in self.part_sizes if s < smallest_failed)


def balanced_parts(num_rows: int, max_rows: int) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges covering ``num_rows`` rows in ceil(num_rows / max_rows) parts whose sizes
    differ by at most one (the larger ones first)."""
    if num_rows < 1 or max_rows < 1:
        raise ValueError(f"balanced_parts: num_rows and max_rows must be >= 1, got {num_rows} and {max_rows}")
    count = -(-num_rows // max_rows)
    small, extra = divmod(num_rows, count)
    bounds, start = [], 0
    for i in range(count):
        stop = start + small + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def slice_batch(host_batch: dict, start: int, stop: int) -> dict:
    """Rows ``[start, stop)`` of a collated batch (``audio [B, S]``, ``audio_lens``, ``tokens [B, U]``,
    ``token_lens``, and any per-row lists), the padding trimmed to the part's longest audio and
    transcript. The whole range gives the batch itself."""
    num_rows = len(host_batch["audio_lens"])
    if (start, stop) == (0, num_rows):
        return host_batch
    part = {}
    for key, value in host_batch.items():
        part[key] = value[start:stop] if isinstance(value, (torch.Tensor, list, tuple)) else value
    if "audio" in part:
        part["audio"] = part["audio"][:, :max(1, int(part["audio_lens"].max()))]
    if "tokens" in part:
        part["tokens"] = part["tokens"][:, :max(1, int(part["token_lens"].max()))]
    return part


def _try_part(part: dict, to_device: Callable[[dict], dict], forward: Callable[[dict], torch.Tensor],
              weight: float) -> tuple[torch.Tensor | None, str | None]:
    """(weighted detached loss, None), or (None, "forward" | "backward") where it ran out of memory.
    The part's device tensors and graph are locals here, so they are gone once this returns."""
    try:
        loss = forward(to_device(part))
    except RuntimeError as e:
        if not is_oom_error(e):
            raise
        return None, "forward"
    try:
        (loss if weight == 1.0 else loss * weight).backward()
    except RuntimeError as e:
        if not is_oom_error(e):
            raise
        return None, "backward"
    return loss.detach() if weight == 1.0 else loss.detach() * weight, None


def train_in_parts(host_batch: dict, *, forward: Callable[[dict], torch.Tensor], to_device: Callable[[dict], dict],
                   normalizer: Callable[[torch.Tensor], float], zero_grad: Callable[[], None],
                   max_rows: int | None = None) -> PartsTrained:
    """Forward and backward of ``host_batch`` (gradients accumulated in ``.grad``; the caller steps the
    optimizer), in parts that fit in memory.

    ``forward(device_batch)`` returns the loss with its graph (the mean the model reduces to);
    ``to_device(host_part)`` moves a part to the device; ``normalizer(token_lens)`` is the count the loss
    divides its sum by (for ``workbench.models.ASRModel``, its ``loss_normalizer``); ``zero_grad()`` drops
    the gradients. ``max_rows``: start from parts of at most this many rows instead of the whole batch.
    Raises :class:`UtteranceOutOfMemoryError` (gradients dropped) when one utterance does not fit."""
    num_rows = len(host_batch["audio_lens"])
    token_lens = host_batch["token_lens"]
    total = float(normalizer(token_lens))
    todo = deque(balanced_parts(num_rows, min(max_rows or num_rows, num_rows)))
    done: list[tuple[int, int]] = []
    losses: list[torch.Tensor] = []
    failed: list[int] = []
    while todo:
        start, stop = todo.popleft()
        weight = 1.0 if (start, stop) == (0, num_rows) else float(normalizer(token_lens[start:stop])) / total
        loss, ran_out_in = _try_part(slice_batch(host_batch, start, stop), to_device, forward, weight)
        if ran_out_in is None:
            done.append((start, stop))
            losses.append(loss)
            continue
        failed.append(stop - start)
        if ran_out_in == "backward" or stop - start == 1:  # gradients may hold part of the failed part
            zero_grad()
        release_memory()
        if stop - start == 1:
            raise UtteranceOutOfMemoryError(f"out of memory on one utterance (row {start} of {num_rows})", start)
        middle = start + (stop - start + 1) // 2
        todo.extendleft([(middle, stop), (start, middle)])
        if ran_out_in == "backward":  # train the parts done so far again, their gradients were dropped
            todo.extendleft(reversed(done))
            done, losses = [], []
    return PartsTrained(loss=losses[0] if len(losses) == 1 else torch.stack(losses).sum(),
                        part_sizes=[stop - start for start, stop in done], failed_sizes=failed)
