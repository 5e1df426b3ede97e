"""The floor of a full-graph outer iteration: seconds of one empty conditional-WHILE iteration on CUDA."""

from __future__ import annotations

import numpy as np
import torch

from workbench.decoding.cuda_graphs import DriverGraph, capture_partial_graphs


def empty_while_iteration_seconds(iterations: int = 2000, repeat: int = 10,
                                  device: torch.device | None = None) -> dict[str, float]:
    """Seconds of one iteration of a conditional WHILE node whose body is only its condition kernel (median
    over ``repeat`` replays; built as the decoders' full graph is), and of a replay with zero iterations."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    remaining = torch.zeros((), dtype=torch.int32, device=device)
    count = torch.zeros((), dtype=torch.int32, device=device)
    start = capture_partial_graphs({"start": lambda: remaining.copy_(count)}, device)["start"]
    graph = DriverGraph(device)
    loop = graph.conditional_handle()
    node = graph.child(graph.root, [], start, "start")
    node = graph.condition(graph.root, [node], "while_count_down", loop, remaining)
    _, body = graph.while_loop(graph.root, [node], loop)
    graph.condition(body, [], "while_count_down", loop, remaining)
    graph.instantiate()

    def replay_seconds(n: int) -> float:
        count.fill_(n)
        samples = []
        for _ in range(repeat + 2):
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_event.record()
            graph.replay()
            end_event.record()
            end_event.synchronize()
            samples.append(start_event.elapsed_time(end_event) / 1000.0)
        if int(remaining) != 0:
            raise RuntimeError(f"count-down loop did not run to 0 (left {int(remaining)})")
        return float(np.median(samples[2:]))

    zero, many = replay_seconds(0), replay_seconds(iterations)
    return {"seconds_per_iteration": (many - zero) / iterations, "replay_seconds_zero_iterations": zero,
            "iterations": iterations}
