import random

import pytest

from workbench.oomptimizer import SyntheticMemory, demo_buckets, search_batch_sizes
from workbench.oomptimizer.synthetic import MODEL_KINDS
from workbench.units import GiB


def _check(result, model, buckets, *, tolerance):
    """Every returned size was probed and fitted; each is within tolerance of the true maximum."""
    fitted = {(p.bucket_index, p.batch_size) for p in result.probes if not p.oom}
    for i, (bucket, got) in enumerate(zip(buckets, result.batch_sizes)):
        assert (i, got) in fitted, f"bucket {i}: batch size {got} was never probed successfully"
        assert model.peak(bucket, got) <= model.budget_bytes
        true = model.true_max(bucket)
        # Within tolerance, or one below when no integer lies within it (small batch sizes).
        assert got >= true - max(1, int(tolerance * true)), f"bucket {i} {bucket}: got {got}, true max {true}"


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("budget_known", [True, False])
def test_predictive_is_safe_close_and_cheap(kind, budget_known):
    probes = []
    for seed in range(3):
        model = SyntheticMemory(kind=kind, seed=seed, jitter=0.01)  # +-1 % on every peak (noisy)
        buckets = demo_buckets()
        random.Random(seed).shuffle(buckets)  # any input order
        result = search_batch_sizes(buckets, model.probe, rel_gap=0.03,
                                    budget_bytes=model.budget_bytes if budget_known else None)
        _check(result, model, buckets, tolerance=0.03)
        probes.append(result.probes_per_bucket)
    assert sum(probes) / len(probes) <= 3.0, probes


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("budget_known", [True, False])
def test_default_gap_with_two_percent_jitter(kind, budget_known):
    probes = []
    for seed in range(3):
        model = SyntheticMemory(kind=kind, seed=seed, jitter=0.02)
        buckets = demo_buckets()
        random.Random(seed + 10).shuffle(buckets)
        result = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes if budget_known else None)
        _check(result, model, buckets, tolerance=0.05)
        probes.append(result.probes_per_bucket)
    assert sum(probes) / len(probes) <= 3.0, probes


def test_budget_overstated_like_a_gpu():
    """On a GPU a step fails before its peak reaches the limit; the search learns the usable budget."""
    for kind in MODEL_KINDS:
        model = SyntheticMemory(kind=kind, budget_bytes=0.95 * 80 * GiB)
        buckets = demo_buckets()
        result = search_batch_sizes(buckets, model.probe, budget_bytes=80 * GiB, rel_gap=0.03)
        _check(result, model, buckets, tolerance=0.03)
        assert result.probes_per_bucket <= 3.0, kind
        assert result.budget_bounds[1] < 80 * GiB


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_default_gap_is_close_and_beats_bisect(kind):
    model = SyntheticMemory(kind=kind, base_bytes=20 * GiB, per_second_sq=3e6, seed=7)
    buckets = demo_buckets(10, 3)
    predictive = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes)
    bisect = search_batch_sizes(buckets, model.probe, strategy="bisect")
    _check(predictive, model, buckets, tolerance=0.05)
    _check(bisect, model, buckets, tolerance=0.05)
    assert predictive.probes_per_bucket <= 3.0
    assert bisect.probes_per_bucket >= 1.5 * predictive.probes_per_bucket


def test_bisect_follows_the_classic_recipe():
    model = SyntheticMemory(kind="linear", per_second=1e9, per_token=0, per_item=0, base_bytes=0,
                            budget_bytes=100e9)
    # 10 s at 1 GB/s per item: 10 items fit exactly, 11 do not.
    result = search_batch_sizes([(10.0, 0.0)], model.probe, strategy="bisect", start_batch_size=4, rel_gap=0.01)
    assert [p.batch_size for p in result.probes] == [4, 8, 16, 12, 10, 11]
    assert [p.oom for p in result.probes] == [False, False, True, True, False, True]
    assert result.batch_sizes == [10]


def test_result_follows_input_order():
    model = SyntheticMemory(kind="quadratic")
    buckets = demo_buckets(6, 1)
    forward = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes)
    backward = search_batch_sizes(buckets[::-1], model.probe, budget_bytes=model.budget_bytes)
    assert forward.batch_sizes == backward.batch_sizes[::-1]
    assert forward.batch_sizes == sorted(forward.batch_sizes, reverse=True)  # longer buckets, smaller batches


def test_exact_model_needs_few_probes_once_learned():
    model = SyntheticMemory(kind="quadratic")
    buckets = demo_buckets(20, 2)
    result = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes)
    assert [model.true_max(b) for b in buckets] == result.batch_sizes
    assert result.probes_per_bucket < 2.0
    assert result.fit.base_known and abs(result.fit.base_bytes - model.base_bytes) < 0.01 * model.base_bytes


def test_bucket_that_never_fits_is_an_error():
    model = SyntheticMemory(kind="linear", budget_bytes=1 * GiB)  # base alone is 6 GiB
    with pytest.raises(RuntimeError, match="even at batch size 1"):
        search_batch_sizes([(5.0, 30.0)], model.probe)


def test_other_errors_propagate():
    def probe(bucket, n):
        raise ValueError("broken model")

    with pytest.raises(ValueError, match="broken model"):
        search_batch_sizes([(1.0, 5.0)], probe)


@pytest.mark.parametrize("kwargs, field", [({"rel_gap": 0}, "rel_gap"), ({"strategy": "x"}, "strategy"),
                                           ({"start_batch_size": 0}, "start_batch_size"),
                                           ({"budget_bytes": -1}, "budget_bytes")])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        search_batch_sizes([(1.0, 5.0)], SyntheticMemory().probe, **kwargs)


def test_bad_bucket_names_the_index():
    with pytest.raises(ValueError, match=r"buckets\[1\]"):
        search_batch_sizes([(1.0, 5.0), (-2.0, 3.0)], SyntheticMemory().probe)
    with pytest.raises(ValueError, match="at least 1"):
        search_batch_sizes([], SyntheticMemory().probe)


def test_trace_and_callbacks():
    model = SyntheticMemory(kind="quadratic")
    seen, done = [], []
    result = search_batch_sizes(demo_buckets(3, 1), model.probe, on_probe=seen.append,
                                on_bucket=lambda i, bs, recs: done.append((i, bs, len(recs))))
    assert seen == result.probes
    assert sorted(i for i, _, _ in done) == [0, 1, 2]
    assert sum(n for _, _, n in done) == result.num_probes
    assert all(p.oom == (model.peak(result.buckets[p.bucket_index], p.batch_size) > model.budget_bytes)
               for p in result.probes)


def test_max_batch_size_caps_tiny_buckets():
    model = SyntheticMemory(kind="linear")
    result = search_batch_sizes([(0.1, 1.0)], model.probe, max_batch_size=100)
    assert result.batch_sizes == [100]


@pytest.mark.parametrize("strategy", ["predictive", "bisect"])
def test_stop_between_buckets_leaves_the_rest_not_searched(strategy):
    model = SyntheticMemory(kind="quadratic")
    buckets = demo_buckets(4, 1)  # ascending: searched largest first, so 3, then 2
    done, asked, probes_when_stopped = [], [], []

    def stop():
        asked.append(len(done))
        if len(done) >= 2:
            probes_when_stopped.append(len(seen))
        return len(done) >= 2

    seen = []
    result = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes, strategy=strategy,
                                on_probe=seen.append, on_bucket=lambda i, bs, recs: done.append(i), stop=stop)
    assert done == [3, 2] and asked == [1, 2]  # asked between buckets only, never before the first
    assert result.not_searched == [0, 1] and result.num_searched == 2
    assert result.batch_sizes[:2] == [None, None] and result.stop_reasons[:2] == ["not searched"] * 2
    full = search_batch_sizes(buckets, model.probe, budget_bytes=model.budget_bytes, strategy=strategy)
    assert result.batch_sizes[2:] == full.batch_sizes[2:]  # the searched buckets as in a full search
    assert probes_when_stopped == [len(seen)] == [result.num_probes]  # no probe after the stop
    assert {p.bucket_index for p in result.probes} == {2, 3}
    assert result.probes_per_bucket == result.num_probes / 2
    with pytest.raises(ValueError, match=r"stopped after 2 of 4 buckets \(not searched: \[0, 1\]\): no profile"):
        result.profile_batch_sizes()
    assert full.profile_batch_sizes() == full.batch_sizes and full.not_searched == []


def test_stop_is_not_asked_after_the_last_bucket():
    asked = []
    result = search_batch_sizes([(1.0, 5.0)], SyntheticMemory().probe, stop=lambda: asked.append(1) or True)
    assert asked == [] and result.not_searched == [] and result.batch_sizes[0] >= 1


@pytest.mark.parametrize("option, value", [("max_batch_size", -5), ("max_batch_size", 0), ("start_batch_size", 2.5),
                                           ("max_probes_per_bucket", True)])
def test_size_options_must_be_positive_integers(option, value):
    with pytest.raises(ValueError, match=f"{option}: must be an integer >= 1, got {value!r}"):
        search_batch_sizes([(2.0, 10)], lambda bucket, size: 1.0, **{option: value})
