"""A step traced with its runs of identical blocks cut short, and its memory timeline grown back to full depth.

Deep models repeat one block many times (a conformer's 17 to 42 blocks, a decoder's 24 layers), and a fake
trace costs the same for every block. Here each such run (a ``ModuleList`` of at least ``MIN_BLOCKS`` modules
of one class with the same parameter shapes) keeps its first ``KEEP`` blocks for the trace; hooks mark where
the middle kept block's forward and backward start and end in the tracker's timeline (the bytes of the small
and large pools after every allocation and free). The full step's timeline is the traced one with the middle
block's forward and backward stretches repeated once per block cut, and the frees outside those stretches of
what the middle block made (autocast's cache of its weights, say) repeated with them; the cut blocks' weights
and AdamW state are counted before the cut. That is exact where each block's work stays inside its hooks' marks, which
:meth:`workbench.oomptimizer.plan.PlannedProbe.check_block_runs` checks against one full trace before a plan relies on it.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

MIN_BLOCKS = 4  # a run this long or longer is cut
KEEP = 3  # blocks kept per run: the first three (the middle one is the template)
TEMPLATE = 1  # the kept block whose forward and backward stand for every cut block


@dataclass
class BlockRun:
    """A ``ModuleList`` of identical blocks: its name in the model, the list, and its full length."""

    name: str
    blocks: nn.ModuleList
    length: int


def _signature(module: nn.Module) -> tuple:
    return (type(module), tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()),
            tuple((n, m.extra_repr()) for n, m in module.named_modules()))  # strides, rates, flags


def find_block_runs(model: nn.Module) -> list[BlockRun]:
    """The model's runs of at least MIN_BLOCKS identical blocks (same class, parameter and buffer shapes and
    settings of every submodule), outermost only (a run inside another run's block is left whole)."""
    runs: list[BlockRun] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < MIN_BLOCKS:
            continue
        if any(name.startswith(run.name + ".") for run in runs):
            continue
        first = _signature(module[0])
        if all(_signature(block) == first for block in module):
            runs.append(BlockRun(name, module, len(module)))
    return runs


@contextlib.contextmanager
def cut_runs(runs: list[BlockRun], marks: list, timeline_length):
    """Inside: each run holds its first KEEP blocks only, and each kept block marks, in ``marks``, the timeline
    position (``timeline_length()``) where its forward starts and ends ("fs", "fe") and where its backward
    starts and ends ("bs": the gradient of its output arrives; "be": the gradient of its input is complete),
    as (run index, block index, kind, position)."""
    saved, handles = [], []
    try:
        for r, run in enumerate(runs):
            saved.append(run.blocks._modules)
            run.blocks._modules = OrderedDict(list(run.blocks._modules.items())[:KEEP])
            for b, block in enumerate(run.blocks):

                def before(module, args, r=r, b=b):
                    marks.append((r, b, "fs", timeline_length()))
                    x = args[0] if args else None
                    if isinstance(x, torch.Tensor) and x.requires_grad:
                        handles.append(x.register_hook(lambda grad: marks.append((r, b, "be", timeline_length()))))

                def after(module, args, output, r=r, b=b):
                    marks.append((r, b, "fe", timeline_length()))
                    y = output[0] if isinstance(output, tuple) else output
                    if isinstance(y, torch.Tensor) and y.requires_grad:
                        handles.append(y.register_hook(lambda grad: marks.append((r, b, "bs", timeline_length()))))

                handles += [block.register_forward_pre_hook(before), block.register_forward_hook(after)]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for run, modules in zip(runs, saved):
            run.blocks._modules = modules


class NotRepeatable(ValueError):
    """The traced timeline cannot be grown to full depth (a template's marks are missing or out of order)."""


def _stretches(runs: list[BlockRun], marks: list, num_events: int) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """(run, kept block) -> its forward's and backward's (start, end, start, end) positions; NotRepeatable
    where a kept block was not marked once each, in order. A first block whose input needs no gradient has no
    backward end: its backward runs to the last event."""
    out = {}
    for r, run in enumerate(runs):
        for b in range(KEEP):
            at = {kind: [p for rr, bb, k, p in marks if (rr, bb, k) == (r, b, kind)] for kind in ("fs", "fe", "bs", "be")}
            if b == 0 and not at["be"]:
                at["be"] = [num_events]
            if any(len(v) != 1 for v in at.values()):
                raise NotRepeatable(f"{run.name}[{b}]: its forward and backward marked once each expected, got "
                                    f"{ {k: len(v) for k, v in at.items()} }")
            fs, fe, bs, be = (at[k][0] for k in ("fs", "fe", "bs", "be"))
            if not fs <= fe <= bs <= be:
                raise NotRepeatable(f"{run.name}[{b}]: its marks are out of order ({fs}, {fe}, {bs}, {be})")
            out[r, b] = (fs, fe, bs, be)
    return out


def grown_timeline(events: np.ndarray, born: np.ndarray, start: tuple[int, int], runs: list[BlockRun],
                   marks: list) -> tuple[np.ndarray, np.ndarray]:
    """The full step's (small, large) pool bytes before the first event and after every event, from a cut
    trace: ``events`` [E, 2] (the small- and large-pool bytes each allocation adds or each free removes),
    ``born`` [E] (-1 for an allocation; for a free, the event that made its storage, -2 if made before), ``start`` the pools
    before the first event (the whole model's weights and AdamW state included: they are counted before the
    cut), ``marks`` from :func:`cut_runs`.

    Each run's template block's forward and backward events are repeated once per cut block, right after
    themselves. A free outside the template of something the template made is repeated too (each cut block
    frees its own there: autocast's weight cache at the end of the forward), unless it falls in another kept
    block of the run (the next block freeing its input: the cut blocks free theirs inside their copies)."""
    stretches = _stretches(runs, marks, len(events))
    allocation = born == -1
    for r, run in enumerate(runs):  # the kept blocks a chain, with nothing made between them
        for b in range(KEEP - 1):
            (_, fe, bs, _), (fs_next, _, _, be_next) = stretches[r, b], stretches[r, b + 1]
            if not (fe <= fs_next and be_next <= bs):
                raise NotRepeatable(f"{run.name}[{b}] and [{b + 1}] do not run one after the other")
            if allocation[fe:fs_next].any() or allocation[be_next:bs].any():
                raise NotRepeatable(f"{run.name}: the step makes tensors between blocks {b} and {b + 1}, "
                                    "outside both (a cut block's share of them is not known)")
    segments = []  # (start, end, copies, run): events [start, end) repeated `copies` more times after `end`
    block_of = np.full(len(events), -1)  # the run whose kept, non-template block holds the event
    for (r, b), (fs, fe, bs, be) in stretches.items():
        if b == TEMPLATE:
            segments += [(fs, fe, runs[r].length - KEEP, r), (bs, be, runs[r].length - KEEP, r)]
        else:
            block_of[fs:fe] = r
            block_of[bs:be] = r
    segments.sort()
    for (_, e1, _, _), (s2, _, _, _) in zip(segments, segments[1:]):
        if s2 < e1:
            raise NotRepeatable("two runs' template blocks overlap in the timeline")
    segment_of = np.full(len(events), -1)
    for k, (s, e, _, _) in enumerate(segments):
        segment_of[s:e] = k
    repeats = np.zeros(len(events), dtype=np.int64)
    for i in np.nonzero(born >= 0)[0]:
        made_in = segment_of[born[i]]
        if made_in == -1:
            continue
        if segment_of[i] != -1 and segments[segment_of[i]][3] != segments[made_in][3]:
            raise NotRepeatable(f"{runs[segments[made_in][3]].name}'s block makes a tensor that "
                                f"{runs[segments[segment_of[i]][3]].name}'s block frees")
        if segment_of[i] == -1 and block_of[i] != segments[made_in][3]:
            repeats[i] = segments[made_in][2]
    weighted = events * (1 + repeats)[:, None]
    pieces, at = [], 0
    for s, e, copies, _ in segments:
        pieces.append(weighted[at:e])
        pieces += [events[s:e]] * copies
        at = e
    pieces.append(weighted[at:])
    grown = np.concatenate(pieces)
    base = np.array(start, dtype=np.int64)
    pools = np.vstack([base[None], base[None] + np.cumsum(grown, axis=0)])
    if (pools < 0).any():
        raise NotRepeatable("the grown timeline frees more than it holds")
    return pools[:, 0], pools[:, 1]


def grown_allocations(events: np.ndarray, born: np.ndarray, runs: list[BlockRun], marks: list) -> tuple[int, int]:
    """(allocations, bytes allocated) over the full step from a cut trace (see :func:`grown_timeline`): the
    template stretches' allocations counted once more per cut block. A whole trace of the same step must give
    the same two numbers at any shape, which a peak alone does not show."""
    stretches = _stretches(runs, marks, len(events))
    allocation = born == -1
    sizes = np.where(allocation, events.sum(axis=1), 0)
    count, total = int(allocation.sum()), int(sizes.sum())
    for (r, b), (fs, fe, bs, be) in stretches.items():
        if b == TEMPLATE:
            copies = runs[r].length - KEEP
            for s, e in ((fs, fe), (bs, be)):
                count += copies * int(allocation[s:e].sum())
                total += copies * int(sizes[s:e].sum())
    return count, total
