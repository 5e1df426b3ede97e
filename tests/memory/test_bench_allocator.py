"""CPU checks of the allocator benchmark's pieces: the batch shapes, the worker's step order, the rounds."""

import pytest

from workbench.bench.allocator import drawn_shapes, largest_first
from workbench.bench.allocator_worker import worker_plan


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


def test_worker_plan_warms_up_then_measures_passes():
    dynamic = worker_plan(3, "dynamic", 2)
    assert dynamic[:3] == [(1, 0, True, False), (1, 1, True, False), (1, 2, True, False)]  # warm-up pass
    assert [(p, i) for p, i, _, _ in dynamic[3:]] == [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]
    static = worker_plan(2, "static", 1)
    # every measured shape twice in a row; only the repeat is timed
    assert static[2:] == [(2, 0, False, False), (2, 0, True, True), (2, 1, False, False), (2, 1, True, True)]


GIB = 1 << 30


def fake_worker(calls, *, dyn_exp_allocs=0, slow_expandable=1.0, drift=(1.0,), retry_at=None):
    """Stands in for the GPU subprocesses: rows shaped like a worker's (every step in run order), with
    chosen allocations and times. Round r multiplies every time by drift[r] (subprocess drift); ``calls``
    collects (config, fraction) in run order."""
    def run(mode, expandable, tmp, shapes_path, args, fraction=0.0):
        import json

        from workbench.bench.allocator import config_name

        shapes = json.loads(shapes_path.read_text())
        if mode == "calibrate":
            return dict(peak_allocated_bytes=10 * GIB, peaks=[GIB] * len(shapes), total_bytes=100 * GIB, model="fake",
                        wall_s=1.0)
        name = config_name(mode, expandable)
        r = sum(1 for c, _ in calls if c == name)  # this config's round, 0-based
        calls.append((name, fraction))
        factor = drift[r % len(drift)] * (1.0 if mode == "static" else (slow_expandable if expandable else 1.3))
        cols = {k: [] for k in ("time_s", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
                                "peak_reserved_bytes", "device_allocs", "device_frees", "device_alloc_bytes",
                                "alloc_retries", "ooms", "oom_raised", "pass_", "index", "timed", "repeat",
                                "batch_size", "duration_s", "num_tokens")}
        from workbench.bench.allocator_worker import worker_plan

        for pass_, i, timed, repeat in worker_plan(len(shapes), mode, args.passes):
            b, d, u = shapes[i]
            allocs = 5 if pass_ == 1 else 0
            retries = 0
            if name == "dynamic_expandable" and pass_ > 1 and i == 1:
                allocs = dyn_exp_allocs
                retries = 1 if retry_at == i else 0
            if mode == "static" and not repeat and pass_ > 1:
                allocs = 2  # the untimed first occurrence of a shape may allocate: it is a dynamic step
            first_static = 1.3 * drift[r % len(drift)]  # a static run's untimed first occurrence
            row = dict(time_s=(0.1 + 0.01 * b) * (factor if (timed or mode == "dynamic") else first_static),
                       allocated_bytes=GIB, reserved_bytes=4 * GIB, peak_allocated_bytes=3 * GIB,
                       peak_reserved_bytes=4 * GIB, device_allocs=allocs, device_frees=retries,
                       device_alloc_bytes=allocs * GIB, alloc_retries=retries, ooms=0, oom_raised=False, pass_=pass_,
                       index=i, timed=timed, repeat=repeat, batch_size=b, duration_s=d, num_tokens=u)
            for k, v in row.items():
                cols[k].append(v)
        return dict(rows=cols, model="fake", settings="expandable_segments:True" if expandable else "", wall_s=0.5,
                    startup_s=0.1)
    return run


def run_bench_with(monkeypatch, tmp_path, capsys, args=(), **kwargs):
    import json

    from workbench.bench import allocator as bench

    calls = []
    monkeypatch.setattr(bench, "run_worker", fake_worker(calls, **kwargs))
    monkeypatch.setattr(bench, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    rc = bench.main(["--out", str(tmp_path), "--steps", "6", *args])
    record = json.loads((tmp_path / "allocator.json").read_text())
    return rc, record, capsys.readouterr().out, calls


def test_bench_passes_when_targets_hold(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "3"])
    figures = record["figures"]
    assert rc == 0 and figures["targets_met"] and "PASS" in out, figures["failures"]
    assert figures["rounds_run"] == 3
    # ABCD ABCD ABCD: fresh subprocesses alternate, each dynamic config next to a static one
    order = ["static_plain", "dynamic_expandable", "static_expandable", "dynamic_plain"]
    assert [c for c, _ in calls] == order * 3
    block = figures["headrooms"]["0.08"]
    assert block["time_ratio_vs_static_plain"]["dynamic_plain"] == pytest.approx(1.3)
    assert block["time_ratio_vs_static_plain"]["dynamic_expandable"] == pytest.approx(1.0)
    assert block["dynamic_plain"]["device_allocs_per_step"] == 0
    assert block["dynamic_expandable"]["allocation_events"] == []
    assert block["time_target"]["verdict"] == "met" and block["time_target"]["conclusive"]
    # static's untimed first occurrences allocate and are 1.3x slower: the in-process ratio, not the reference
    assert block["static_plain"]["device_allocs_per_step"] == 0
    assert block["static_plain"]["in_process_first_vs_repeat"]["median"] == pytest.approx(1.3)
    assert len(record["params"]["series"]["0.08"]["dynamic_plain"]["time_s"]) == 12  # warm-up + measured pass
    assert len(record["params"]["round_step_times_s"]["0.08"]["static_plain"]) == 3  # one list per round
    assert [o["config"] for o in record["params"]["run_order"]] == order * 3


def test_paired_ratios_cancel_drift_between_rounds(monkeypatch, tmp_path, capsys):
    # every subprocess of round 2 runs 15 % slower: per-config medians spread, paired ratios do not
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2", "--passes", "2"],
                                        drift=(1.0, 1.15), slow_expandable=1.02)
    block = record["figures"]["headrooms"]["0.08"]
    medians = block["static_plain"]["round_median_step_s"]
    assert medians[1] == pytest.approx(1.15 * medians[0])
    assert block["static_plain"]["step_time_s"]["n"] == 2
    target = block["paired_time_ratios"]["dynamic_expandable/static_plain"]
    assert target["rounds"] == pytest.approx([1.02, 1.02]) and target["max"] - target["min"] < 1e-9
    assert block["dynamic_plain"]["steps"] == 12  # 6 shapes x 2 measured passes
    assert rc == 0


def test_headroom_sweep_gives_one_block_per_headroom(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys,
                                            args=["--rounds", "2", "--headroom", "0.08", "0.25"])
    blocks = record["figures"]["headrooms"]
    assert set(blocks) == {"0.08", "0.25"}
    assert blocks["0.08"]["memory_limit_bytes"] == int(10 * GIB * 1.08)
    assert blocks["0.25"]["memory_fraction"] == pytest.approx(12.5 / 100)
    # per round: every headroom, each in ABCD order
    fractions = [f for _, f in calls]
    assert fractions == [pytest.approx(0.108)] * 4 + [pytest.approx(0.125)] * 4 + \
        [pytest.approx(0.108)] * 4 + [pytest.approx(0.125)] * 4
    assert "headroom 0.25" in out and rc == 0


def test_budget_stops_rounds_and_says_so(monkeypatch, tmp_path, capsys):
    rc, record, out, calls = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "4", "--budget-s", "0"])
    figures = record["figures"]
    assert figures["rounds_run"] == 1 and len(calls) == 4  # the first round always runs
    assert any("stopped after 1 round" in w for w in figures["warnings"])
    assert not figures["headrooms"]["0.08"]["time_target"]["conclusive"]


def test_bench_fails_loudly_and_says_why_when_targets_are_missed(monkeypatch, tmp_path, capsys):
    rc, record, out, _ = run_bench_with(monkeypatch, tmp_path, capsys, args=["--rounds", "2"], dyn_exp_allocs=3,
                                        slow_expandable=1.2, retry_at=1)
    figures = record["figures"]
    assert rc == 1 and not figures["targets_met"]
    assert out.count("FAIL: TARGET missed") == 2
    events = figures["headrooms"]["0.08"]["dynamic_expandable"]["allocation_events"]
    assert [(e["round"], e["index"]) for e in events] == [(1, 1), (2, 1)]
    shapes = record["params"]["shapes"]
    assert events[0]["shape"] == list(shapes[1]) and events[0]["previous_shape"] == list(shapes[0])
    assert events[0]["reason"].startswith("OOM-retry")
    assert "OOM-retry" in out and f"after {list(shapes[0])}" in out  # the failure line says why
    assert figures["headrooms"]["0.08"]["time_target"]["verdict"] == "missed"


def test_straddling_rounds_are_inconclusive(monkeypatch, tmp_path, capsys):
    # dynamic_expandable is 1.04x static in round 1 and 1.04 * 1.03 / 1.0 in round 2: the rounds straddle 1.05
    from workbench.bench import allocator as bench

    calls = []
    base = fake_worker(calls, slow_expandable=1.04)

    def drifting(mode, expandable, tmp, shapes_path, args, fraction=0.0):
        result = base(mode, expandable, tmp, shapes_path, args, fraction)
        if mode == "dynamic" and expandable and sum(c == "dynamic_expandable" for c, _ in calls) == 2:
            result["rows"]["time_s"] = [t * 1.03 for t in result["rows"]["time_s"]]
        return result

    monkeypatch.setattr(bench, "run_worker", drifting)
    monkeypatch.setattr(bench, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    bench.main(["--out", str(tmp_path), "--steps", "6", "--rounds", "2"])
    import json

    target = json.loads((tmp_path / "allocator.json").read_text())["figures"]["headrooms"]["0.08"]["time_target"]
    assert target["verdict"] == "inconclusive" and not target["conclusive"]
    assert target["rounds"] == pytest.approx([1.04, 1.04 * 1.03])
    assert "straddle" in capsys.readouterr().out


def test_a_failed_round_keeps_the_rounds_before_it_on_disk(monkeypatch, tmp_path, capsys):
    import json

    from workbench.bench import allocator as bench

    calls, seen_on_disk = [], []
    base = fake_worker(calls)

    def failing_in_round_two(mode, expandable, tmp, shapes_path, args, fraction=0.0):
        if mode != "calibrate" and len(calls) == 5:  # second round, second subprocess
            seen_on_disk.append(json.loads((tmp_path / "allocator.json").read_text())["figures"])
            raise RuntimeError("worker dynamic expandable=True failed: CUDA error")
        return base(mode, expandable, tmp, shapes_path, args, fraction)

    monkeypatch.setattr(bench, "run_worker", failing_in_round_two)
    monkeypatch.setattr(bench, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    assert bench.main(["--out", str(tmp_path), "--steps", "6", "--rounds", "3"]) == 1
    (partial,) = seen_on_disk  # written after round 1, before round 2 failed
    assert partial["rounds_run"] == 1 and not partial["complete"] and "incomplete" in partial["failures"][-1]
    figures = json.loads((tmp_path / "allocator.json").read_text())["figures"]
    assert figures["complete"] and figures["rounds_run"] == 1 and set(figures["headrooms"]) == {"0.08"}
    assert any(f.startswith("round 2: RuntimeError") and "CUDA error" in f for f in figures["failures"])
