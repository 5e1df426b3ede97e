"""The NeMo comparison of the decoding bench: the adapter on NeMo's modules (when NeMo is importable), the
--nemo grid's pure logic (speedups, targets, the rows that run last) on hand-made rows, and a GPU run."""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.decoding import nemo_peer
from benchmarks.decoding import grid as grid_module
from benchmarks.decoding import passes, run_last
from benchmarks.decoding import rows as bench_rows
from benchmarks.decoding import run as bench
from benchmarks.decoding.calibration import calibrate_blank_bias
from benchmarks.decoding.cases import Case, Deferred, Outcome
from benchmarks.decoding.checks import check_row, first_difference
from benchmarks.decoding.grid import NEMO_FULL_GRAPH_LAST_FROM_B, Grid, deferred_methods, plan_methods
from benchmarks.decoding.iterations import add_iteration_counts
from benchmarks.decoding.methods import (
    BLANK,
    ENC,
    METHODS,
    NEMO_METHODS,
    NEMO_TARGET_METHODS,
    VOCAB,
    default_method,
    nemo,
    ours,
)
from benchmarks.decoding.targets import add_nemo_speedups, nemo_targets_of
from workbench.records.results import load_result
from workbench.decoding import label_looping
from workbench.decoding.methods import DecoderMethod

NEMO_MISSING = nemo_peer.nemo_unavailable_reason()
needs_nemo = pytest.mark.skipif(NEMO_MISSING is not None, reason=f"{NEMO_MISSING}; install NeMo's wheels "
                                "(../shared/tools/fetch_nemo_wheels.sh) and put them on PYTHONPATH")
CHILD = "WORKBENCH_NEMO_GPU_TEST_CHILD"  # set in the child process that runs the NeMo gpu test itself


def _row(model, method, ms, batch=16, frames=150, dtype="float32", **extra):
    return {"model": model, "dtype": dtype, "batch": batch, "frames": frames, "audio_seconds": frames * 0.08,
            "method": method, "time_s": {"median": ms / 1e3}, "equal_to_reference": True, **extra}


def test_our_rows_get_nemo_seconds_over_ours_in_the_same_mode_and_full_falls_back_to_partial():
    rows = [_row("rnnt", "label-looping off", 100), _row("rnnt", "NeMo no graphs", 250),
            _row("rnnt", "label-looping full", 10), _row("rnnt", "NeMo full graph", 45),
            _row("tdt", "label-looping full", 20, batch=128, nemo_full_graph="failed"),
            _row("tdt", "NeMo partial graphs", 30, batch=128), _row("tdt", "label-looping partial", 25, batch=128),
            _row("tdt", "label-looping full", 20, batch=64, nemo_full_graph="not run (past the time)"),
            _row("tdt", "NeMo partial graphs", 30, batch=64)]
    add_nemo_speedups(rows)
    assert rows[0]["speedup_vs_nemo"] == 2.5 and rows[0]["speedup_vs_nemo_method"] == "NeMo no graphs"
    assert rows[2]["speedup_vs_nemo"] == 4.5 and rows[2]["speedup_vs_nemo_method"] == "NeMo full graph"
    # NeMo's full graph has no row at B=128 (it failed): our full graph is compared with its partial graphs
    assert rows[4]["speedup_vs_nemo"] == 1.5 and rows[4]["speedup_vs_nemo_method"] == "NeMo partial graphs"
    assert rows[6]["speedup_vs_nemo"] == 1.2
    assert "speedup_vs_nemo" not in rows[1]  # NeMo's own rows carry no ratio
    # at B=64 NeMo's full graph only did not run (time): no fallback, the size is not judged
    assert "speedup_vs_nemo" not in rows[7]

    failures = []
    targets = nemo_targets_of(rows, failures, smoke=False)
    assert targets["full_graph_rows_vs_nemo"] == 2
    assert targets["speedup_vs_nemo_missed"] == ["tdt float32 B=128 T=150: 1.50x NeMo partial graphs"]  # < 2x
    assert targets["sizes_not_judged"] == ["tdt float32 B=64 T=150: not run (past the time)"]
    assert targets["speedup_vs_nemo_full_rnnt"] == 4.5 and targets["nemo_rnnt_full_s"] == 0.045
    assert targets["nemo_fp32_rows"] == 4 and targets["nemo_fp32_rows_unequal"] == []
    assert len(failures) == 2 and "1 of 2 sizes" in failures[0] and "not judged against NeMo at 1 sizes" in failures[1]


def test_nemo_rows_with_other_hypotheses_in_fp32_are_listed():
    rows = [_row("rnnt", "label-looping full", 10), _row("rnnt", "NeMo full graph", 50)]
    rows[1]["equal_to_reference"] = False
    add_nemo_speedups(rows)
    failures = []
    targets = nemo_targets_of(rows, failures, smoke=False)
    assert targets["nemo_fp32_rows_unequal"] == ["rnnt B=16 T=150 NeMo full graph"] and failures == []
    # (the differing utterances themselves are a failure of check_row, where the row is checked)


def test_nemo_full_graph_runs_last_with_its_mode_group_at_every_size():
    def case(batch):
        return Case("rnnt", torch.float32, None, None, None, torch.zeros(batch, 2, 1), torch.zeros(batch),
                    torch.device("cpu"), methods=list(NEMO_METHODS))
    full = [m for m in NEMO_METHODS if m.graph_mode == "full"]
    for batch in (1, 16, NEMO_FULL_GRAPH_LAST_FROM_B):
        assert deferred_methods(case(batch), NEMO_METHODS) == full
    assert deferred_methods(case(256), METHODS) == []  # no NeMo: nothing deferred
    assert deferred_methods(case(16), [m for m in NEMO_METHODS if m != nemo("full")]) == []


def test_nemo_bench_refuses_clearly_when_nemo_is_missing(tmp_path, capsys):
    if NEMO_MISSING is None:
        pytest.skip("NeMo is importable here")
    assert bench.main(["--nemo", "--smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--nemo: NeMo is not importable" in err and "fetch_nemo_wheels.sh" in err
    assert not list(tmp_path.iterdir())


@needs_nemo
@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_our_decoder_on_nemos_modules_gives_nemos_hypotheses_on_cpu(durations):
    from workbench.decoding import GreedyTransducerDecoder
    from workbench.decoding.toy_models import set_blank_bias

    predictor, joint = nemo_peer.make_nemo_transducer(vocab_size=32, enc_dim=16, pred_dim=24, joint_dim=20,
                                                      durations=durations, seed=1)
    with torch.no_grad():
        joint.out.weight.mul_(4.0)  # sharper decisions: labels, blanks and repeated labels all occur
    set_blank_bias(joint, 32, 2.0)
    enc = torch.randn(4, 25, 16, generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([25, 17, 1, 0])
    for window in (1, 16):
        ours = GreedyTransducerDecoder(predictor, joint, blank_id=32, durations=durations, cuda_graphs="off",
                                       max_symbols=3, blank_window=window)(enc, lengths)
        tokens, frames = nemo_peer.NemoGreedy(predictor, joint, durations, "off", max_symbols=3)(enc, lengths)
        assert [h.tokens for h in ours] == tokens and [h.timestamps for h in ours] == frames
    assert sum(map(len, tokens)) > 5 and tokens[3] == []  # not trivially empty; a zero-length utterance is
    assert any(frames[0].count(f) == 3 for f in set(frames[0])) or durations  # max_symbols reached (RNN-T)


@needs_nemo
def test_nemo_smoke_run_compares_hypotheses_on_cpu(tmp_path):
    assert bench.main(["--nemo", "--smoke", "--out", str(tmp_path)]) == 0
    record = load_result("decoding_nemo", tmp_path)
    assert record["figures"]["smoke"] is True and record["params"]["weights"].startswith("NeMo's")
    fig = record["figures"]
    nemo_rows = [r for r in fig["rows"] if r["method"].startswith("NeMo")]
    assert {r["method"] for r in nemo_rows} == {"NeMo no graphs"}  # CPU: NeMo's eager path only
    assert len(nemo_rows) == 8  # 2 models x 2 dtypes x 2 batch sizes
    for r in nemo_rows:
        assert r["dtype"] == "bfloat16" or r["equal_to_reference"], r
        assert r["reference_method"] == "label-looping off"  # on CPU the default decoder runs eagerly
    assert fig["targets"]["nemo_fp32_rows"] == 4 and fig["targets"]["nemo_fp32_rows_unequal"] == []
    assert fig["peer"]["name"] == "NeMo" and not [f for f in fig["failures"] if "raised" in f]


@needs_nemo
@pytest.mark.gpu
def test_nemo_comparison_on_the_gpu_at_a_small_size(monkeypatch):
    """Every graph mode of ours and NeMo's on NeMo's modules (bench sizes), B=4, 40 frames, fp32: hypotheses
    equal to ours, a ratio on each of our rows; NeMo's full graph runs last, beside our full graphs again.
    It runs in a child process: NeMo's full graph has failed with an illegal memory access, which leaves the
    CUDA context unusable, and a child keeps that from every other gpu test."""
    if os.environ.get(CHILD) != "1":
        child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                f"{__file__}::test_nemo_comparison_on_the_gpu_at_a_small_size"],
                               env={**os.environ, CHILD: "1"}, capture_output=True, text=True, timeout=600)
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
        return
    device = torch.device("cuda")
    outcome = Outcome()
    for name, (predictor, joint, durations) in bench_rows.build_models(device, nemo=True).items():
        calibrator = bench_rows.GreedyTransducerDecoder(predictor, joint, blank_id=BLANK, durations=durations)
        case = Case(name, torch.float32, predictor, joint, durations,
                    torch.randn(4, 40, ENC, device=device), torch.tensor([40, 31, 7, 0], device=device),
                    device, methods=list(NEMO_METHODS))
        outcome.rows += bench_rows.measure_case(case, calibrator, outcome, smoke=True)
    assert [d.case.model for d in outcome.deferred] == ["rnnt", "tdt"]
    outcome.rows += run_last.measure_deferred(outcome)
    add_nemo_speedups(outcome.rows)
    rows_each = len([m for m in NEMO_METHODS if m.blank_window != 16])  # window 16 only where the default is another
    if outcome.failures and outcome.failures[0].startswith("rnnt float32 B=4 T=40: NeMo full graph raised") \
            and outcome.context_lost:
        # NeMo's full graph corrupted the CUDA context (its illegal memory access, which our own graphs do not
        # make): ours keep their rows from the pass, marked, and the TDT group is listed as not run
        assert all(r["equal_to_reference"] for r in outcome.rows)
        lost = [r for r in outcome.rows if r.get("nemo_full_graph")]
        assert lost and all(r["method"].startswith("label-looping") and r["method"].endswith("full") for r in lost)
        assert any("tdt" in s and "not run" in s for s in outcome.skipped), outcome.skipped
        return
    assert not outcome.failures, outcome.failures
    assert len(outcome.rows) == 2 * rows_each  # ours (torch and fused) and NeMo's, every mode
    assert all(r["equal_to_reference"] for r in outcome.rows)
    # the default method's row (the fused full graph, timed in the pass too) is every row's reference
    assert {r["reference_method"] for r in outcome.rows} == {"label-looping fused full"}
    assert not [r for r in outcome.rows if "timing_note" in r]  # NeMo's full graph ran beside ours
    mine = [r for r in outcome.rows if DecoderMethod.of_label(r["method"]).algorithm == "label_looping"]
    assert all(r["speedup_vs_nemo"] > 0
               and r["speedup_vs_nemo_method"] == nemo(DecoderMethod.of_label(r["method"]).graph_mode).label
               for r in mine)  # each against NeMo in its own graph mode


def test_rows_run_last_replace_ours_and_keep_ours_from_the_pass_when_nemo_poisons_the_context(monkeypatch):
    """measure_deferred's bookkeeping with the measuring faked: the small size runs first and its interleaved
    rows replace ours from the pass; at B=128 NeMo's full graph leaves the CUDA context unusable, so ours keep
    their rows from the pass (with a note), and the last group is listed as not run."""
    def case(model, batch):
        return Case(model, torch.float32, None, None, None, torch.zeros(batch, 2, 1), torch.zeros(batch),
                    torch.device("cuda"), methods=list(NEMO_METHODS))  # only named: the measuring is faked
    group = [ours("full", "triton_cudnn"), nemo("full")]
    calls = []

    def row(c, method, seconds):
        return {"model": c.model, "dtype": "float32", "batch": c.batch, "frames": c.frames, "method": method,
                "_key": ([[1]] * c.batch, [[0]] * c.batch), "_stats": {}, "time_s": {"median": seconds}}

    def fake_measure(c, methods, outcome):
        calls.append((c.tag, [m.label for m in methods]))
        if c.batch >= 128:
            outcome.failures.append(f"{c.tag}: NeMo full graph raised")
            return []
        return [row(c, m.label, 0.02) for m in methods]

    monkeypatch.setattr(run_last, "measure_methods", fake_measure)
    monkeypatch.setattr(run_last, "set_blank_bias", lambda *a: None)
    monkeypatch.setattr(run_last, "cuda_context_error",
                        lambda device: "illegal memory access" if len(calls) >= 2 else None)
    cases = [case("tdt", 128), case("rnnt", 128), case("rnnt", 16)]
    outcome = Outcome()
    for c in cases:
        c.reference, c.reference_method, c.blank_bias = ([[1]] * c.batch, [[0]] * c.batch), "label-looping fused full", 0.5
        outcome.rows.append({k: v for k, v in row(c, "label-looping fused full", 0.01).items() if k[0] != "_"})
    outcome.deferred = [Deferred(c, group) for c in cases]
    rows = run_last.measure_deferred(outcome)
    assert [tag for tag, _ in calls] == ["rnnt float32 B=16 T=2", "rnnt float32 B=128 T=2"]  # small sizes first
    assert calls[0][1] == ["label-looping fused full", "NeMo full graph"]
    assert [(r["batch"], r["method"]) for r in rows] == [(16, "NeMo full graph")]  # returned: NeMo's rows only
    kept = [(r["model"], r["batch"], r["time_s"]["median"], r.get("nemo_full_graph")) for r in outcome.rows]
    assert kept == [("tdt", 128, 0.01, "not run (the CUDA context failed earlier: illegal memory access)"),
                    ("rnnt", 128, 0.01, "failed"),
                    ("rnnt", 16, 0.02, None)]  # B=16's pass row gave way, in its place, to the interleaved one
    assert outcome.rows[2]["equal_to_reference"] and rows[0]["equal_to_reference"]
    assert outcome.context_lost == "illegal memory access"
    assert any("CUDA context is unusable after NeMo full graph: illegal memory access" in f for f in outcome.failures)
    assert outcome.skipped == ["tdt float32 B=128 T=2: label-looping fused full, NeMo full graph not run (the CUDA "
                               "context failed earlier: illegal memory access)"]
    assert outcome.deferred == []


def test_rows_run_last_stop_at_their_deadline(monkeypatch):
    def case(batch):
        return Case("rnnt", torch.float32, None, None, None, torch.zeros(batch, 2, 1), torch.zeros(batch),
                    torch.device("cpu"), methods=list(NEMO_METHODS))
    monkeypatch.setattr(run_last, "measure_methods", lambda *a: pytest.fail("nothing runs past the deadline"))
    outcome = Outcome()
    outcome.rows = [{"model": "rnnt", "dtype": "float32", "batch": 1, "frames": 2, "method": "label-looping fused full"}]
    outcome.deferred = [Deferred(case(1), [ours("full", "triton_cudnn"), nemo("full")])]
    assert run_last.measure_deferred(outcome, deadline=run_last.time.perf_counter() - 1) == []
    assert outcome.skipped == ["rnnt float32 B=1 T=2: label-looping fused full, NeMo full graph not run (past the "
                               "time for the rows run last)"]
    assert "without NeMo's full graph" in outcome.rows[0]["timing_note"]
    assert outcome.rows[0]["nemo_full_graph"] == "not run (past the time for the rows run last)"


def test_kernels_per_outer_iteration_count_the_inner_steps_and_the_full_graphs_conditions():
    nodes = {"start": {"nodes": 9, "kernels": 7}, "find_label_first": {"nodes": 12, "kernels": 10},
             "find_label_again": {"nodes": 11, "kernels": 8}, "emit_labels": {"nodes": 20, "kernels": 15}}
    stats = {"outer_iterations": 40, "inner_iterations": 10}
    partial = {"method": "label-looping partial", "mode_used": "partial", "time_s": {"median": 0.01},
               "graph_nodes": nodes}
    full = dict(partial, method="label-looping full", mode_used="full")
    add_iteration_counts(partial, stats)
    add_iteration_counts(full, stats)
    assert partial["kernels_per_outer_iteration"] == 10 + 15 + 0.25 * 8  # 27.0
    assert full["kernels_per_outer_iteration"] == 27.0 + 2 + 0.25  # one condition per loop test
    off = {"method": "label-looping off", "mode_used": "off", "time_s": {"median": 0.01}}
    add_iteration_counts(off, stats)
    assert "kernels_per_outer_iteration" not in off and off["outer_iterations"] == 40


# -- what runs first, what the targets judge, and where a row departs from the reference (CPU) ------------------


def test_the_nemo_grid_measures_what_the_targets_need_at_every_size_and_the_slow_rest_at_b16():
    grid = Grid.of(quick=False, smoke=False)
    cells = grid.cells()
    assert len(cells) == 32 and {c[0] for c in cells[:16]} == {torch.float32}  # fp32 first, then bf16
    names = lambda methods: [m.label for m in methods]  # noqa: E731
    first, later = plan_methods(True, 64, grid)
    assert names(first) == ["label-looping fused full", "label-looping fused partial", "NeMo full graph",
                            "NeMo partial graphs"]
    assert names(later) == ["label-looping full", "label-looping fused+lstm full",
                            "label-looping fused full window 16"]  # every size, second pass (where it applies)
    first16, later16 = plan_methods(True, 16, grid)
    assert first16 == first and names(later16) == ["label-looping full", "label-looping fused+lstm full",
                                                   "label-looping fused full window 16",
                                                   "label-looping off", "label-looping partial",
                                                   "label-looping fused off", "NeMo no graphs"]
    assert sorted(names(first16 + later16)) == sorted(names(NEMO_METHODS))  # B=16 has every method
    assert plan_methods(False, 64, grid) == (METHODS, [])  # decoding.json: one pass, as before
    assert Grid.of(quick=True, smoke=False).breakdown_batches == [16]


def test_the_targets_judge_the_method_users_get_by_default(monkeypatch):
    cpu = torch.device("cpu")
    assert default_method(cpu) == "label-looping full" and default_method(cpu, "off") == "label-looping off"
    monkeypatch.setattr(label_looping, "resolve_kernels",
                        lambda requested, *, device, algorithm="label_looping": ("triton_cudnn", "test"))
    assert default_method(torch.device("cuda")) == "label-looping fused full"
    rows = [_row("tdt", "label-looping full", 16), _row("tdt", "label-looping fused full", 6.5),
            _row("tdt", "NeMo full graph", 15.5), _row("tdt", "label-looping fused partial", 8.5),
            _row("tdt", "NeMo partial graphs", 18.7)]
    add_nemo_speedups(rows)
    failures = []
    targets = nemo_targets_of(rows, failures, smoke=False, target_method="label-looping fused full")
    assert targets["target_method"] == "label-looping fused full" and targets["full_graph_rows_vs_nemo"] == 1
    assert targets["speedup_vs_nemo_missed"] == [] and failures == []  # 15.5 / 6.5 = 2.38x >= 2x
    assert targets["speedup_vs_nemo_full_tdt"] == pytest.approx(15.5 / 6.5)
    assert targets["torch_stages"]["speedup_vs_nemo_missed"] == ["tdt float32 B=16 T=150: 0.97x NeMo full graph"]
    failures = []  # judged on the torch stages (nemo_targets_of's default) the same rows miss
    assert nemo_targets_of(rows, failures, smoke=False)["speedup_vs_nemo_missed"] == [
        "tdt float32 B=16 T=150: 0.97x NeMo full graph"] and len(failures) == 1


def test_measure_grid_runs_every_first_pass_before_any_second_pass_and_lists_what_the_budget_cut(monkeypatch):
    calls, clock = [], [0.0]

    def fake_measure_case(case, calibrator, outcome, smoke, methods=None):
        calls.append((case.tag, [m.label for m in methods]))
        clock[0] += 10.0
        return []

    linear = torch.nn.Linear(1, 1)
    monkeypatch.setattr(passes, "build_models", lambda device, nemo: {"rnnt": (linear, linear, None),
                                                                     "tdt": (linear, linear, [0, 1])})
    monkeypatch.setattr(passes, "measure_case", fake_measure_case)
    monkeypatch.setattr(passes.time, "perf_counter", lambda: clock[0])
    grid = Grid([1, 16], [4], [torch.float32], breakdown_batches=[16])
    outcome = Outcome()
    passes.measure_grid(grid, torch.device("cpu"), outcome, t_start=0.0, budget_s=45.0, smoke=True, nemo=True)
    tags = [tag for tag, _ in calls]
    assert tags == ["rnnt float32 B=1 T=4", "rnnt float32 B=16 T=4", "tdt float32 B=1 T=4", "tdt float32 B=16 T=4",
                    "rnnt float32 B=1 T=4"]  # the first pass at every size, then the second while time lasts
    assert calls[0][1] == calls[3][1] == [m.label for m in NEMO_TARGET_METHODS]
    assert calls[4][1] == ["label-looping full", "label-looping fused+lstm full"]
    assert outcome.skipped == [
        "rnnt float32 B=16 T=4: label-looping full, label-looping fused+lstm full, label-looping off, "
        "label-looping partial, label-looping fused off, NeMo no graphs (second pass)",
        "tdt float32 B=1 T=4: label-looping full, label-looping fused+lstm full (second pass)",
        "tdt float32 B=16 T=4: label-looping full, label-looping fused+lstm full, label-looping off, "
        "label-looping partial, label-looping fused off, NeMo no graphs (second pass)"]



def test_measure_grid_stops_when_a_case_leaves_the_cuda_context_unusable_and_lists_the_rest(monkeypatch):
    calls = []

    def fake_measure_case(case, calibrator, outcome, smoke, methods=None):
        calls.append(case.tag)
        case.measured = [m for m in methods if m != nemo("full")]
        if case.tag == "rnnt float32 B=16 T=4":
            outcome.failures.append(f"{case.tag}: label-looping fused full raised AcceleratorError while timed")
        return []

    linear = torch.nn.Linear(1, 1)
    monkeypatch.setattr(passes, "build_models", lambda device, nemo: {"rnnt": (linear, linear, None),
                                                                     "tdt": (linear, linear, [0, 1])})
    monkeypatch.setattr(passes, "measure_case", fake_measure_case)
    # the case's device is CPU here; the context check is what reports the loss after the second case
    monkeypatch.setattr(run_last, "cuda_context_error",
                        lambda device: "AcceleratorError: illegal memory access" if len(calls) >= 2 else None)
    lost = passes.lost_context
    monkeypatch.setattr(passes, "lost_context", lambda case, outcome: lost(
        dataclasses.replace(case, device=torch.device("cuda")), outcome))
    grid = Grid([1, 16], [4], [torch.float32], breakdown_batches=[16])
    outcome = Outcome()
    passes.measure_grid(grid, torch.device("cpu"), outcome, t_start=passes.time.perf_counter(), budget_s=1e9,
                       smoke=True, nemo=True)
    assert calls == ["rnnt float32 B=1 T=4", "rnnt float32 B=16 T=4"]
    assert outcome.context_lost == "AcceleratorError: illegal memory access"
    assert outcome.failures[0].startswith("rnnt float32 B=16 T=4: label-looping fused full raised")
    assert outcome.failures[1].startswith("rnnt float32 B=16 T=4: the CUDA context is unusable after "
                                          "label-looping fused full, label-looping fused partial, NeMo partial "
                                          "graphs (AcceleratorError")
    assert outcome.skipped[:2] == ["tdt float32 B=1 T=4: not run (the CUDA context failed)",
                                   "tdt float32 B=16 T=4: not run (the CUDA context failed)"]
    assert outcome.skipped[2].startswith("rnnt float32 B=1 T=4: label-looping full") and "the CUDA context" in outcome.skipped[2]
    assert len(outcome.skipped) == 3  # the second pass of the one case before the failure

def _toy_case(durations, batch=3, frames=30):
    from workbench.decoding import make_toy_transducer

    predictor, joint = make_toy_transducer(vocab_size=VOCAB, enc_dim=8, pred_dim=16, joint_dim=16, seed=3,
                                           durations=durations, blank_bias=2.0, logit_scale=4.0)
    enc = torch.randn(batch, frames, 8, generator=torch.Generator().manual_seed(3))
    case = Case("tdt" if durations else "rnnt", torch.float32, predictor, joint, durations, enc,
                torch.tensor([frames, frames - 7, frames - 12]), torch.device("cpu"))
    hyps = case.decoder(cuda_graphs="off", kernels="torch")(case.enc, case.lengths)
    case.reference = ([h.tokens for h in hyps], [h.timestamps for h in hyps])
    case.reference_method = "label-looping off"
    return case


def test_first_difference_finds_the_utterance_label_and_frame_where_two_decodings_part():
    reference = ([[5, 6, 7], [1, 2], []], [[0, 3, 3], [1, 4], []])
    assert first_difference(reference, reference) is None
    changed = ([[5, 6, 7], [1, 9], []], [[0, 3, 3], [1, 4], []])
    assert first_difference(reference, changed) == {
        "utterance": 1, "label_index": 1, "reference_token": 2, "reference_frame": 4, "token": 9, "frame": 4,
        "reference_labels": 2, "labels": 2}
    shorter = ([[5, 6], [1, 2], []], [[0, 3], [1, 4], []])
    assert first_difference(reference, shorter) == {
        "utterance": 0, "label_index": 2, "reference_token": 7, "reference_frame": 3, "token": None, "frame": None,
        "reference_labels": 3, "labels": 2}
    moved = ([[5, 6, 7], [1, 2], []], [[0, 3, 4], [1, 4], []])  # same token, another frame
    assert first_difference(reference, moved)["label_index"] == 2


@pytest.mark.parametrize("durations", [None, [0, 1, 2, 3, 4]], ids=["rnnt", "tdt"])
def test_a_row_that_differs_says_where_and_how_close_our_joint_was_there(durations):
    case = _toy_case(durations)
    tokens, frames = case.reference
    assert len(tokens[1]) >= 3, tokens
    label = len(tokens[1]) - 2
    theirs = ([list(t) for t in tokens], [list(f) for f in frames])
    theirs[0][1] = theirs[0][1][:label]  # the other decoder stops 2 labels early in utterance 1
    theirs[1][1] = theirs[1][1][:label]
    row = {"method": "NeMo full graph", "_key": theirs}
    outcome = Outcome()
    check_row(case, row, outcome)
    assert row["utterances_differing_from_reference"] == 1 and not row["equal_to_reference"]
    assert row["reference_method"] == "label-looping off"
    diff = row["first_difference"]
    assert (diff["utterance"], diff["label_index"], diff["token"], diff["labels"]) == (1, label, None, label)
    assert (diff["reference_token"], diff["reference_frame"]) == (tokens[1][label], frames[1][label])
    # our joint, after the common labels, at that frame: its argmax is the label the reference emitted there
    assert diff["at_frame"] == frames[1][label] and diff["top2_tokens"][0] == tokens[1][label]
    assert diff["top2_token_margin"] > 0
    assert ("top2_duration_margin" in diff) == (durations is not None)
    assert outcome.failures == [f"{case.model} float32 B=3 T=30: NeMo full graph: 1 of 3 utterances differ from "
                                "label-looping off"]
    same = {"method": "label-looping fused full", "_key": case.reference}
    check_row(case, same, outcome)
    assert same["equal_to_reference"] and "first_difference" not in same


def test_blank_bias_calibration_keeps_the_closest_bias_tried_when_the_rate_jumps(monkeypatch):
    """A rate that jumps across the target (0.227 below the jump, 0.5 above): bisection ends at the jump, on
    either side; the calibration returns the bias whose rate came closest, and leaves the joint at it."""
    biases = []
    monkeypatch.setattr("benchmarks.decoding.calibration.set_blank_bias", lambda joint, blank, bias: biases.append(bias))

    class Hyp:
        def __init__(self, n):
            self.tokens = [0] * n

    def decoder(enc, lengths):  # 150 frames; more labels at a lower blank bias
        bias = biases[-1]
        labels = 75 if bias < 1.34 else (48 if bias < 1.35 else 34)
        return [Hyp(labels)]

    decoder.joint = None
    bias, rate = calibrate_blank_bias(decoder, None, torch.tensor([150]), steps=11)
    assert rate == 48 / 150 and 1.34 <= bias < 1.35 and biases[-1] == bias
    # with no bias in the narrow band tried, the closer side of the jump wins
    bias, rate = calibrate_blank_bias(decoder, None, torch.tensor([150]), steps=3)
    assert rate == 34 / 150 and biases[-1] == bias


def test_window_16_runs_only_where_the_default_window_is_another(monkeypatch):
    """The explicit window-16 row shows what blank_window="auto" buys: it runs where auto takes another window
    (TDT in fp32 from 33 utterances), nowhere else."""
    monkeypatch.setattr(grid_module.fused, "triton_unavailable_reason", lambda device: None)  # as on a GPU

    def case(model, batch, dtype):
        return Case(model, dtype, None, None, [0, 1, 2, 3, 4] if model == "tdt" else None,
                    torch.zeros(batch, 2, 1), torch.zeros(batch), torch.device("cuda"),
                    methods=[ours("full", "triton_cudnn", 16), ours("full", window=1), ours("full", "triton_cudnn")])
    runs16 = {(m, b, str(d)[6:]) for m in ("rnnt", "tdt") for b in (16, 32, 33, 128)
              for d in (torch.float32, torch.bfloat16)
              if ours("full", "triton_cudnn", 16) in grid_module.methods_for(case(m, b, d))}
    assert runs16 == {("tdt", 33, "float32"), ("tdt", 128, "float32")}
    assert ours("full", "triton_cudnn", 16).label == "label-looping fused full window 16"
    assert ours("full", "triton_cudnn").label == "label-looping fused full"
