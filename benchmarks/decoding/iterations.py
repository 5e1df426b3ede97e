"""A row's loop figures: label-looping outer and inner iterations, seconds and kernels per outer iteration."""

from __future__ import annotations

from workbench.decoding.methods import DecoderMethod


def add_iteration_counts(row: dict, stats: dict | None) -> None:
    """Outer and inner label-looping iterations, and seconds per iteration, on a label-looping row; on a graph
    row, kernels per outer iteration: those of find_label_first and emit_labels, those of find_label_again
    times inner iterations per outer one, and in the full graph its condition kernels (2 + inner per outer)."""
    method = DecoderMethod.of_label(row["method"])
    if method and method.algorithm == "label_looping" and stats is not None and "outer_iterations" in stats:
        outer, inner, seconds = stats["outer_iterations"], stats["inner_iterations"], row["time_s"]["median"]
        row.update(outer_iterations=outer, inner_iterations=inner,
                   seconds_per_outer_iteration=seconds / max(1, outer),
                   seconds_per_iteration=seconds / max(1, outer + inner))
        nodes = row.get("graph_nodes") or {}
        if all(isinstance(nodes.get(s), dict) for s in ("find_label_first", "find_label_again", "emit_labels")):
            per_outer_inner = inner / max(1, outer)
            kernels = (nodes["find_label_first"]["kernels"] + nodes["emit_labels"]["kernels"]
                       + per_outer_inner * nodes["find_label_again"]["kernels"])
            if row.get("mode_used") == "full":
                kernels += 2 + per_outer_inner
            row["kernels_per_outer_iteration"] = kernels
