"""The grid in two passes: every size's first-pass methods, then (with --nemo) the breakdown while the budget
lasts; a size's cases share one model and calibrating decoder per (dtype, model)."""

from __future__ import annotations

import time

import torch

from benchmarks.decoding.cases import Case, Outcome
from benchmarks.decoding.grid import Grid, plan_methods
from benchmarks.decoding.methods import BLANK, ENC, window_runs_here
from benchmarks.decoding.rows import build_models, flatten_lstm_weights, in_dtype, measure_case, print_group
from benchmarks.decoding.run_last import lost_context
from benchmarks.decoding.targets import add_speedups
from workbench.decoding import GreedyTransducerDecoder


def model_parts(models: dict, dtype: torch.dtype, model_name: str) -> tuple:
    """(predictor, joint, durations, calibrator) of a model in ``dtype``; one decoder calibrates every row of
    this model and dtype (graphs captured once, reused)."""
    predictor32, joint32, durations = models[model_name]
    predictor, joint = in_dtype(predictor32, dtype), in_dtype(joint32, dtype)
    flatten_lstm_weights(predictor)
    calibrator = GreedyTransducerDecoder(predictor, joint, blank_id=BLANK, durations=durations)
    return predictor, joint, durations, calibrator


def first_pass(grid: Grid, device: torch.device, outcome: Outcome, *, deadline: float, smoke: bool, nemo: bool,
               kernel_profile: bool) -> list[tuple[Case, list]]:
    """Every (dtype, model, T, B) of the grid with its first-pass methods until ``deadline`` (a
    ``time.perf_counter()`` value); returns (case, second-pass methods) for those that have some."""
    models = build_models(device, nemo=nemo)
    parts: dict[tuple, tuple] = {}  # (dtype, model) -> predictor, joint, durations, calibrator
    base_by_dtype: dict[torch.dtype, dict] = {}
    second: list[tuple[Case, list]] = []
    for dtype, model_name, frames, batch in grid.cells():
        if outcome.context_lost:
            outcome.skipped.append(f"{model_name} {str(dtype)[6:]} B={batch} T={frames}: not run (the CUDA context "
                                   "failed)")
            continue
        if (dtype, model_name) not in parts:
            parts[(dtype, model_name)] = model_parts(models, dtype, model_name)
        predictor, joint, durations, calibrator = parts[(dtype, model_name)]
        first, later = plan_methods(nemo, batch, grid)
        later = [m for m in later if window_runs_here(m.blank_window, batch, durations is not None, dtype)]
        gen = torch.Generator(device=device).manual_seed(batch * 1000 + frames)
        case = Case(model_name, dtype, predictor, joint, durations,
                    torch.randn(batch, frames, ENC, device=device, generator=gen),
                    torch.full((batch,), frames, device=device), device, methods=first + later,
                    profile_kernels=kernel_profile and grid.profiled(dtype, frames, batch))
        if time.perf_counter() > deadline:
            outcome.skipped.append(case.tag)
            continue
        group = measure_case(case, calibrator, outcome, smoke, methods=first)
        add_speedups(group, base_by_dtype.setdefault(dtype, {}))
        outcome.rows += group
        print_group(case.tag, group)
        if not lost_context(case, outcome) and later:
            second.append((case, later))
    return second


def second_pass(second: list[tuple[Case, list]], outcome: Outcome, *, deadline: float, smoke: bool) -> None:
    """Each case's second-pass methods until ``deadline``, after every size's first pass."""
    for case, later in second:
        names = ", ".join(m.label for m in later)
        if outcome.context_lost:
            outcome.skipped.append(f"{case.tag}: {names} (second pass; the CUDA context failed)")
            continue
        if time.perf_counter() > deadline:
            outcome.skipped.append(f"{case.tag}: {names} (second pass)")
            continue
        group = measure_case(case, None, outcome, smoke, methods=later)
        for row in group:
            row["timing_note"] = "second pass: timed after every size's first pass, not interleaved with its rows"
        outcome.rows += group
        print_group(f"{case.tag} (second pass)", group)
        lost_context(case, outcome)


def measure_grid(grid: Grid, device: torch.device, outcome: Outcome, *, t_start: float, budget_s: float,
                 smoke: bool, nemo: bool = False, kernel_profile: bool = False) -> None:
    """Every (dtype, model, T, B) of the grid while the budget lasts, in two passes (``plan_methods``); what the
    budget leaves out is listed as skipped. ``kernel_profile``: the cases of ``grid.profiled`` keep their
    ``profiled_method`` decoder in ``outcome.to_profile``."""
    deadline = t_start + budget_s
    second = first_pass(grid, device, outcome, deadline=deadline, smoke=smoke, nemo=nemo,
                        kernel_profile=kernel_profile)
    second_pass(second, outcome, deadline=deadline, smoke=smoke)
