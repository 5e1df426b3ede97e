"""CPU checks of the allocator benchmark's pieces: the batch shapes, the worker's step order, the rounds."""

import pytest

from benchmarks.allocator.shapes import drawn_shapes, largest_first
from benchmarks.allocator.worker import block_plan, parse_blocks
from workbench.units import GiB


def test_drawn_shapes_fill_the_batch_budget_and_vary():
    shapes = drawn_shapes(40, batch_audio_s=300.0, num_buckets=6, seed=3)
    assert len(shapes) == 40
    for b, d, u in shapes:
        assert b >= 1 and 0.5 <= d <= 40.0 and u >= 1
        assert b * d <= 300.0 + 40.0  # padded audio near the budget (one bucket bound of slack)
    assert len({s[0] for s in shapes}) > 3 and len({round(s[1], 2) for s in shapes}) > 10  # dynamic
    assert drawn_shapes(40, batch_audio_s=300.0, num_buckets=6, seed=3) == shapes  # seeded


def test_largest_first_moves_only_the_costliest():
    shapes = [(4, 2.0, 10), (2, 20.0, 90), (8, 1.0, 5)]
    assert largest_first(shapes) == [(2, 20.0, 90), (4, 2.0, 10), (8, 1.0, 5)]


def test_block_plan_warms_up_then_pairs_each_shape_with_its_repeat():
    plan = block_plan(3, 1)
    assert plan[:3] == [(1, 0, False), (1, 1, False), (1, 2, False)]  # warm-up pass
    # every measured shape twice in a row: the first follows another shape (dynamic), the repeat has its own (static)
    assert plan[3:] == [(2, 0, False), (2, 0, True), (2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True)]
    assert [p for p, *_ in block_plan(2, 2)] == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]


def test_blocks_are_letters_p_and_e():
    assert parse_blocks("PEEP") == [False, True, True, False]
    for bad in ("", "PXE", "peep"):
        with pytest.raises(ValueError, match="--blocks"):
            parse_blocks(bad)


def fake_worker(calls, *, dyn_exp_allocs=0, slow_expandable=1.0, drift=(1.0,), retry_at=None, static_plain_oom=False,
                static_expandable_allocs=0, switch_leak=0, block_drift=0.0):
    """Stands in for the GPU subprocess of a round: rows shaped like the worker's (every step in run order,
    blocks of args.blocks), with chosen allocations and times. A repeated (static) step takes the base time;
    a first occurrence (dynamic) 1.3x with the plain allocator, ``slow_expandable`` x with expandable
    segments. Call c (a round of one headroom) multiplies every time by drift[c] (subprocess drift), block b
    by 1 + block_drift * b (drift within the process); reserved bytes differ per block. ``calls`` collects
    (mode, fraction) in run order."""
    def run(mode, tmp, shapes_path, args, fraction=0.0):
        import json

        shapes = json.loads(shapes_path.read_text())
        if mode == "calibrate":
            return dict(peak_allocated_bytes=10 * GiB, peaks=[GiB] * len(shapes), total_bytes=100 * GiB, model="fake",
                        wall_s=1.0)
        r = len(calls)  # this call's round (one headroom), 0-based
        calls.append((mode, fraction))
        cols, blocks = {}, []
        for block, expandable in enumerate(parse_blocks(args.blocks)):
            allocator = "expandable" if expandable else "plain"
            blocks.append(dict(block=block, allocator=allocator, settings=f"expandable_segments:{expandable}",
                               segments_after_switch=dict(plain=GiB, expandable=0),
                               segments_end=dict(plain=GiB + (switch_leak if expandable else 0), expandable=0)))
            for pass_, i, repeat in block_plan(len(shapes), args.passes):
                b, d, u = shapes[i]
                measured_first = pass_ > 1 and not repeat
                allocs = retries = ooms = 0
                if pass_ == 1:
                    allocs = 5
                elif measured_first and not expandable:
                    allocs = 2  # the plain allocator re-allocates for a new shape
                if expandable and measured_first and i == 1:
                    allocs = dyn_exp_allocs
                    retries = 1 if retry_at == i else 0
                if static_plain_oom and not expandable and repeat and i == 2:
                    ooms = 1
                if expandable and repeat and i == 3:
                    allocs = static_expandable_allocs
                factor = 1.0 if pass_ == 1 or repeat else (slow_expandable if expandable else 1.3)
                factor *= drift[r % len(drift)] * (1 + block_drift * block)
                row = dict(time_s=(0.1 + 0.01 * b) * factor, allocated_bytes=GiB,
                           reserved_bytes=(4 + block) * GiB, peak_allocated_bytes=3 * GiB, peak_reserved_bytes=4 * GiB,
                           device_allocs=allocs, device_frees=retries, device_alloc_bytes=allocs * GiB,
                           alloc_retries=retries, ooms=ooms, oom_raised=bool(ooms), block=block, allocator=allocator,
                           pass_=pass_, index=i, repeat=repeat, batch_size=b, duration_s=d, num_tokens=u)
                for k, v in row.items():
                    cols.setdefault(k, []).append(v)
        return dict(rows=cols, model="fake", blocks=blocks, wall_s=0.5, startup_s=0.1, steps_s=0.4)
    return run


def run_bench_with(monkeypatch, tmp_path, capsys, args=(), **kwargs):
    import json

    from benchmarks.allocator import rounds, run as bench, shapes

    calls = []
    monkeypatch.setattr(rounds, "run_worker", fake_worker(calls, **kwargs))
    monkeypatch.setattr(bench, "cuda_missing", lambda smoke: False)  # the fake worker stands in for the GPU
    monkeypatch.setattr(shapes, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    rc = bench.main(["--out", str(tmp_path), "--steps", "6", *args])
    record = json.loads((tmp_path / "allocator.json").read_text())
    return rc, record, capsys.readouterr().out, calls


def test_bench_passes_when_targets_hold(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "3"])
    figures = record["figures"]
    assert rc == 0 and figures["targets_met"] and "PASS" in out, figures["failures"]
    assert figures["rounds_run"] == 3
    assert [c for c, _ in calls] == ["interleaved"] * 3  # one fresh subprocess per round
    block = figures["headrooms"]["0.08"]
    assert block["time_ratio_vs_static_plain"]["dynamic_plain"] == pytest.approx(1.3)
    assert block["time_ratio_vs_static_plain"]["dynamic_expandable"] == pytest.approx(1.0)
    assert block["time_target"]["pair"] == "dynamic_expandable/static_plain"
    assert block["time_target"]["verdict"] == "met" and block["time_target"]["conclusive"]
    # the plain allocator's first occurrences allocate: dynamic_plain counts them, static_plain (repeats) does not
    assert block["dynamic_plain"]["device_allocs_per_step"] == 2 and block["dynamic_plain"]["steps"] == 12
    assert block["static_plain"]["device_allocs_per_step"] == 0 and block["static_plain"]["allocation_events"] == []
    assert block["dynamic_plain"]["allocation_events_total"] == 3 * 2 * 6  # rounds x plain blocks x shapes
    assert block["paired_time_ratios"]["dynamic_plain/static_plain"]["rounds"] == pytest.approx([1.3] * 3)
    assert block["dynamic_expandable"]["device_allocs_per_step"] == 0
    assert block["dynamic_expandable"]["allocation_events"] == []
    assert block["dynamic_expandable"]["warmup_device_allocs"] == 60  # 2 blocks x 6 warm-up steps x 5
    series = record["params"]["series"]["0.08"]
    assert len(series["dynamic_plain"]["time_s"]) == 12  # the first block: warm-up + its dynamic steps
    assert series["dynamic_plain"]["pass_"] == [1.0] * 6 + [2.0] * 6
    assert len(record["params"]["round_step_times_s"]["0.08"]["static_plain"]) == 3  # one list per round
    assert [o["blocks"] for o in record["params"]["run_order"]] == ["PEEP"] * 3
    assert [b["allocator"] for b in record["params"]["block_settings"]["0.08"][0]] == \
        ["plain", "expandable", "expandable", "plain"]


def test_paired_ratios_cancel_drift_between_rounds(monkeypatch, tmp_path, capsys):
    # every step of round 2 runs 15 % slower: per-config medians spread, paired ratios do not
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2", "--passes", "2"],
                                        drift=(1.0, 1.15), slow_expandable=1.02)
    block = record["figures"]["headrooms"]["0.08"]
    medians = block["static_plain"]["round_median_step_s"]
    assert medians[1] == pytest.approx(1.15 * medians[0])
    assert block["static_plain"]["step_time_s"]["n"] == 2
    target = block["paired_time_ratios"]["dynamic_expandable/static_plain"]
    assert target["rounds"] == pytest.approx([1.02, 1.02]) and target["max"] - target["min"] < 1e-9
    assert block["dynamic_plain"]["steps"] == 24  # 6 shapes x 2 measured passes x 2 blocks
    assert rc == 0


def test_headroom_sweep_gives_one_block_per_headroom(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys,
                                            args=["--rounds", "2", "--headroom", "0.08", "0.25"])
    blocks = record["figures"]["headrooms"]
    assert set(blocks) == {"0.08", "0.25"}
    assert blocks["0.08"]["memory_limit_bytes"] == int(10 * GiB * 1.08)
    assert blocks["0.25"]["memory_fraction"] == pytest.approx(12.5 / 100)
    # per round: every headroom once
    assert [f for _, f in calls] == [pytest.approx(0.108), pytest.approx(0.125)] * 2
    assert "headroom 0.25" in out and rc == 0


def test_budget_stops_rounds_and_says_so(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "4", "--budget-s", "1e-9"])
    figures = record["figures"]
    assert figures["rounds_run"] == 1 and len(calls) == 1  # the first round always runs
    assert any("stopped after 1 round" in w for w in figures["warnings"])
    assert not figures["headrooms"]["0.08"]["time_target"]["conclusive"]


def test_bench_fails_loudly_and_says_why_when_targets_are_missed(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"], dyn_exp_allocs=3,
                                        slow_expandable=1.2, retry_at=1)
    figures = record["figures"]
    assert rc == 1 and not figures["targets_met"]
    assert out.count("FAIL: TARGET missed") == 2
    events = figures["headrooms"]["0.08"]["dynamic_expandable"]["allocation_events"]
    # both expandable blocks of both rounds, at the shape that allocates
    assert [(e["round"], e["block"], e["index"]) for e in events] == [(1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 1)]
    shapes = record["params"]["shapes"]
    assert events[0]["shape"] == list(shapes[1]) and events[0]["previous_shape"] == list(shapes[0])
    assert events[0]["reason"].startswith("OOM-retry")
    assert "OOM-retry" in out and f"after {list(shapes[0])}" in out  # the failure line says why
    # the step before each event is the one before it in its own block: reserved bytes of that block (4 + block GiB)
    assert [e["reserved_before_bytes"] for e in events] == [(4 + e["block"]) * GiB for e in events]
    assert figures["headrooms"]["0.08"]["time_target"]["verdict"] == "missed"


def test_static_plain_that_ooms_leaves_the_target_to_static_expandable(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"], static_plain_oom=True)
    block = record["figures"]["headrooms"]["0.08"]
    assert block["static_plain"]["ooms"] == 4  # 2 blocks x 2 rounds
    assert block["time_target"]["pair"] == "dynamic_expandable/static_expandable"
    assert block["time_target"]["verdict"] == "met"
    assert rc == 0, record["figures"]["failures"]
    assert any("static_plain: 4 OOM(s)" in w and "not a reference" in w for w in record["figures"]["warnings"])


def test_expandable_segments_allocating_in_repeated_steps_fail_the_run(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, static_expandable_allocs=1)
    failures = record["figures"]["failures"]
    assert rc == 1
    assert any(f.startswith("[headroom 0.08] static_expandable: its repeated-shape steps allocated") for f in failures)
    events = record["figures"]["headrooms"]["0.08"]["static_expandable"]["allocation_events"]
    assert {(e["block"], e["index"], e["repeat"]) for e in events} == {(1, 3, True), (2, 3, True)}


def test_no_valid_static_reference_fails_and_says_so(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, static_plain_oom=True,
                                        static_expandable_allocs=1)
    assert rc == 1
    assert any("no valid reference" in f for f in record["figures"]["failures"])
    assert record["figures"]["headrooms"]["0.08"]["time_target"]["verdict"] == "no valid reference"
    assert "time target (no valid reference" in out


def test_abba_blocks_cancel_a_drift_within_the_process(monkeypatch, tmp_path, capsys):
    # every block runs 10 % slower than the one before: PEEP puts both allocators at the same mean position
    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys, block_drift=0.1)
    ratios = record["figures"]["headrooms"]["0.08"]["paired_time_ratios"]
    assert ratios["static_expandable/static_plain"]["median"] == pytest.approx(1.0)
    assert ratios["dynamic_expandable/static_plain"]["median"] == pytest.approx(1.0)
    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys, block_drift=0.1, args=["--blocks", "PPEE"])
    ratios = record["figures"]["headrooms"]["0.08"]["paired_time_ratios"]
    assert ratios["static_expandable/static_plain"]["median"] == pytest.approx((1.2 + 1.3) / (1.0 + 1.1))  # PPEE: no


def test_a_switch_that_did_not_take_fails_the_run(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, switch_leak=512 << 20)
    failures = record["figures"]["failures"]
    assert rc == 1
    assert any("round 1: block 1 (expandable): plain segments grew by 512 MiB" in f for f in failures), failures
    rc, record, _, _ = run_bench_with(monkeypatch, tmp_path, capsys, switch_leak=8 << 20)  # within tolerance
    assert rc == 0, record["figures"]["failures"]


def test_unequal_blocks_are_refused(monkeypatch, tmp_path, capsys):
    from benchmarks.allocator import run as bench

    with pytest.raises(ValueError, match="as many P as E"):
        bench.main(["--out", str(tmp_path), "--blocks", "PEE"])


def test_straddling_rounds_are_inconclusive(monkeypatch, tmp_path, capsys):
    # dynamic_expandable is 1.04x static in round 1 and 1.04 * 1.03 in round 2: the rounds straddle 1.05
    from benchmarks.allocator import rounds, run as bench, shapes

    calls = []
    base = fake_worker(calls, slow_expandable=1.04)

    def drifting(mode, tmp, shapes_path, args, fraction=0.0):
        result = base(mode, tmp, shapes_path, args, fraction)
        if mode == "interleaved" and len(calls) == 2:
            rows = result["rows"]
            rows["time_s"] = [t * (1.03 if a == "expandable" and p > 1 and not rep else 1.0)
                              for t, a, p, rep in zip(rows["time_s"], rows["allocator"], rows["pass_"], rows["repeat"])]
        return result

    monkeypatch.setattr(rounds, "run_worker", drifting)
    monkeypatch.setattr(bench, "cuda_missing", lambda smoke: False)  # the fake worker stands in for the GPU
    monkeypatch.setattr(shapes, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    bench.main(["--out", str(tmp_path), "--steps", "6", "--rounds", "2"])
    import json

    target = json.loads((tmp_path / "allocator.json").read_text())["figures"]["headrooms"]["0.08"]["time_target"]
    assert target["verdict"] == "inconclusive" and not target["conclusive"]
    assert target["rounds"] == pytest.approx([1.04, 1.04 * 1.03])
    assert "straddle" in capsys.readouterr().out


def test_a_failed_round_keeps_the_rounds_before_it_on_disk(monkeypatch, tmp_path, capsys):
    import json

    from benchmarks.allocator import rounds, run as bench, shapes

    calls, seen_on_disk = [], []
    base = fake_worker(calls)

    def failing_in_round_two(mode, tmp, shapes_path, args, fraction=0.0):
        if mode != "calibrate" and len(calls) == 1:  # the second round's subprocess
            seen_on_disk.append(json.loads((tmp_path / "allocator.json").read_text())["figures"])
            raise RuntimeError("worker interleaved failed: CUDA error")
        return base(mode, tmp, shapes_path, args, fraction)

    monkeypatch.setattr(rounds, "run_worker", failing_in_round_two)
    monkeypatch.setattr(bench, "cuda_missing", lambda smoke: False)  # the fake worker stands in for the GPU
    monkeypatch.setattr(shapes, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    assert bench.main(["--out", str(tmp_path), "--steps", "6", "--rounds", "3"]) == 1
    (partial,) = seen_on_disk  # written after round 1, before round 2 failed
    assert partial["rounds_run"] == 1 and not partial["complete"] and "incomplete" in partial["failures"][-1]
    figures = json.loads((tmp_path / "allocator.json").read_text())["figures"]
    assert figures["complete"] and figures["rounds_run"] == 1 and set(figures["headrooms"]) == {"0.08"}
    assert any(f.startswith("round 2: RuntimeError") and "CUDA error" in f for f in figures["failures"])
