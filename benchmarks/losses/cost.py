"""What each Triton transducer-loss kernel does for one forward + backward, counted on the CPU.

The logits passes are bound by HBM bytes, the lattice recursion by its sequential diagonal steps and what
each step loads; :func:`kernel_work` counts both from the shape alone, for the kernels of
:mod:`workbench.models.losses_triton` (full lengths, gradient wanted).
"""

from __future__ import annotations

from dataclasses import dataclass

SECTOR_BYTES = 32  # the unit a GPU's L1/L2 moves


@dataclass
class KernelWork:
    """One kernel launch: programs, bytes it reads and writes (the logits passes: HBM; the lattice's: small
    buffers that mostly stay in L2), sequential steps of one program and (lattice) what one diagonal step
    of one program loads and evaluates."""
    kernel: str
    programs: int
    read_bytes: int
    written_bytes: int
    sequential_steps: int = 1
    edges_per_node: int = 0              # lattice: edges into (alpha) or out of (beta) a node
    sectors_per_step: int = 0            # lattice: 32-byte sectors one diagonal step loads (alpha or beta)
    exps_per_node: int = 0               # lattice: exp evaluations per node per recursion


def kernel_work(shape: list[int], num_durations: int = 0, logit_bytes: int = 4,
                durations: tuple[int, ...] | None = None) -> list[KernelWork]:
    """The three launches of one loss call with its backward on logits [B, T, U + 1, V + 1 + D].

    ``shape`` is [B, T, U, V] (V without blank); ``num_durations`` D is 0 for RNN-T; ``durations`` (TDT)
    says how many have a blank edge (those > 0; all of them when not given); ``logit_bytes`` 4 for fp32,
    2 for bf16. Small per-node buffers are fp32.
    """
    batch, frames, labels, vocab = shape
    cols = labels + 1
    rows = batch * frames * cols
    classes = vocab + 1 + num_durations
    slots = max(num_durations, 1)
    if num_durations == 0:
        blank_edges = 1
    else:
        blank_edges = sum(d > 0 for d in durations) if durations is not None else num_durations
    edges = blank_edges + slots
    diagonals = frames + labels
    logits = rows * classes * logit_bytes
    weights = rows * 2 * slots * 4  # blank and label edge weight per slot
    per_node = rows * (4 + 4 * num_durations)  # log-normalizer, duration log-probs
    lattice_reads = 2 * 4 * edges * cols * batch * diagonals  # per recursion: source + weight per edge
    return [
        KernelWork("normalize", programs=rows, read_bytes=logits, written_bytes=per_node + weights),
        KernelWork("lattice", programs=2 * batch, read_bytes=2 * lattice_reads,
                   written_bytes=2 * batch * diagonals * cols * 4, sequential_steps=diagonals,
                   edges_per_node=edges, sectors_per_step=2 * edges * -(-cols * 4 // SECTOR_BYTES),
                   exps_per_node=edges),
        KernelWork("grad", programs=rows, read_bytes=logits + per_node + rows * 4 * (1 + edges),  # alpha, betas
                   written_bytes=logits),
    ]

