"""CPU checks of the allocator benchmark's pieces: the batch shapes and the stand-in model."""

import torch

from workbench.bench.allocator import FRAME_S, drawn_shapes, largest_first, stand_in_transducer


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


def test_stand_in_step_trains_on_cpu():
    torch.manual_seed(0)
    model = stand_in_transducer(d_model=64, layers=1, hidden=32, vocab=16)
    batch = model.make_batch(2, 1.0, 5, "cpu")
    assert batch["audio"].shape == (2, 16000) and batch["tokens"].shape == (2, 5)
    loss = model.training_step(batch)
    assert torch.isfinite(loss) and not loss.requires_grad
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert FRAME_S == 0.08


def fake_worker(device_allocs_dynamic_expandable: int, slow_expandable: float = 1.0):
    """Stands in for the GPU subprocesses: rows shaped like a worker's, with chosen allocations and times."""
    def run(mode, expandable, tmp, shapes_path, args, fraction=0.0):
        import json

        shapes = json.loads(shapes_path.read_text())
        if mode == "calibrate":
            return dict(peak_allocated_bytes=10 << 30, peaks=[1 << 30] * len(shapes), total_bytes=140 << 30, model="fake")
        n = len(shapes)
        base = [0.1 + 0.01 * b for b, _, _ in shapes]
        time_s = base + [t * (1.0 if mode == "static" else (slow_expandable if expandable else 1.3)) for t in base]
        allocs = [5] * n + [0] * n
        if mode == "dynamic":
            allocs[n:] = [device_allocs_dynamic_expandable if expandable else 2] * n
        rows = dict(time_s=time_s, allocated_bytes=[1 << 30] * 2 * n, reserved_bytes=[2 << 30] * 2 * n,
                    peak_allocated_bytes=[3 << 30] * 2 * n, peak_reserved_bytes=[4 << 30] * 2 * n,
                    device_allocs=allocs, device_frees=[0] * 2 * n, device_alloc_bytes=[0] * 2 * n,
                    alloc_retries=[0] * 2 * n, ooms=[0] * 2 * n, pass_=[1] * n + [2] * n)
        return dict(rows=rows, model="fake", settings="expandable_segments:True" if expandable else "")
    return run


def run_bench_with(monkeypatch, tmp_path, capsys, **kwargs):
    import json

    from workbench.bench import allocator as bench

    monkeypatch.setattr(bench, "run_worker", fake_worker(**kwargs))
    monkeypatch.setattr(bench, "sampler_shapes", lambda n, **kw: (drawn_shapes(n, batch_audio_s=200.0,
                                                                               num_buckets=4, seed=1), "drawn"))
    rc = bench.main(["--out", str(tmp_path), "--steps", "6"])
    record = json.loads((tmp_path / "allocator.json").read_text())
    return rc, record, capsys.readouterr().out


def test_bench_passes_when_targets_hold(monkeypatch, tmp_path, capsys):
    rc, record, out = run_bench_with(monkeypatch, tmp_path, capsys, device_allocs_dynamic_expandable=0)
    figures = record["figures"]
    assert rc == 0 and figures["targets_met"] and "PASS" in out
    assert figures["time_ratio_vs_static_plain"]["dynamic_plain"] > 1.25
    assert figures["time_ratio_vs_static_plain"]["dynamic_expandable"] == 1.0
    assert figures["dynamic_plain"]["device_allocs_per_step"] == 2.0
    assert len(record["params"]["series"]["dynamic_plain"]["time_s"]) == 12


def test_bench_fails_loudly_when_targets_are_missed(monkeypatch, tmp_path, capsys):
    rc, record, out = run_bench_with(monkeypatch, tmp_path, capsys, device_allocs_dynamic_expandable=1,
                                     slow_expandable=1.2)
    assert rc == 1 and not record["figures"]["targets_met"]
    assert out.count("FAIL: TARGET missed") == 2
