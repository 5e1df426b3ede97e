"""The predictive search on peaks that are piecewise linear in the batch size (upward steps), and the probe
counts of the synthetic scenarios that notebook 02 shows, so that handling steps costs them nothing."""

import pytest
import torch

from workbench.oomptimizer import SyntheticMemory, demo_buckets, search_batch_sizes
from workbench.oomptimizer.synthetic import H200_RNNT_BUCKETS, MODEL_KINDS, SplitBatchMemory

NEMO_SPLIT_ELEMENTS = 2**31 / 256 * 4  # input elements above which NeMo's conv subsampling splits the batch


def _probes_in(result, i):
    return sum(p.bucket_index == i for p in result.probes)


def _check_against_true_max(result, model):
    """Every returned size was probed and fitted, lies below every OOM of its bucket, never above the true
    maximum and within rel_gap of it."""
    for i, (bucket, got) in enumerate(zip(result.buckets, result.batch_sizes)):
        mine = [p for p in result.probes if p.bucket_index == i]
        assert any(p.batch_size == got and not p.oom for p in mine), f"bucket {i}: {got} never fitted"
        assert all(got < p.batch_size for p in mine if p.oom), f"bucket {i}: {got} not below its OOMs"
        true = model.true_max(bucket)
        assert true * (1 - result.rel_gap) <= got <= true, f"bucket {i} {bucket}: got {got}, true max {true}"


def _at_true_max(bucket):
    """The split model whose batch split starts right above the true maximum of ``bucket`` without steps."""
    flat = SplitBatchMemory(split_elements=1e18)
    frames = round(bucket[0] * flat.frames_per_second)
    return SplitBatchMemory(split_elements=flat.true_max(bucket) * frames * flat.features)


def test_split_level_follows_nemo_threshold():
    model = SplitBatchMemory()
    # 24.99 s: 2499 frames x 80 mels = 199,920 elements per item; 2**25 elements split once, 2**26 twice
    assert [model.split_level(24.99, n) for n in (167, 168, 335, 336)] == [0, 1, 1, 2]
    assert model.peak((24.99, 80.0), 168) - model.peak((24.99, 80.0), 167) > 10 * (
        model.peak((24.99, 80.0), 167) - model.peak((24.99, 80.0), 166))


def test_split_model_is_near_the_h200_sizes():
    """The defaults put the true maxima where the H200 search's sizes for NeMo's FastConformer RNN-T say they
    are: at or above each size found, below 1.1x it (which OOMed)."""
    found = [1298, 1033, 694, 488, 412, 283, 205, 132]
    true = [SplitBatchMemory().true_max(b) for b in H200_RNNT_BUCKETS]
    assert true == [1344, 1065, 739, 489, 444, 287, 225, 145]
    assert all(f <= t < 1.1 * f for t, f in zip(true, found))


@pytest.mark.parametrize("name, model, probes, per_bucket", [
    # what-if steps on the H200 buckets (NeMo's measured peaks there are straight lines, see below):
    # 34 probes before pieces were fitted
    ("h200", SplitBatchMemory(), 25, [2, 2, 2, 4, 2, 5, 5, 3]),
    # steps a third as large (4 % of the per-item cost): 29 probes before
    ("small steps", SplitBatchMemory(step_bytes_per_frame=8 * 1024), 20, [2, 2, 2, 2, 3, 3, 3, 3]),
    # the split right above a bucket's true maximum: 33 before
    ("step at the maximum", _at_true_max((9.76, 119.0)), 24, [2, 2, 2, 2, 5, 2, 6, 3]),
    # the same, met in a bucket searched before any step was seen: 26 before
    ("step at the maximum, met first", _at_true_max((24.99, 80.0)), 24, [2, 5, 2, 2, 6, 2, 2, 3]),
])
def test_steps_cost_about_three_probes_per_bucket(name, model, probes, per_bucket):
    result = search_batch_sizes(H200_RNNT_BUCKETS, model.probe, budget_bytes=model.budget_bytes)
    _check_against_true_max(result, model)
    assert [_probes_in(result, i) for i in range(len(H200_RNNT_BUCKETS))] == per_bucket, name
    assert result.num_probes == probes and result.probes_per_bucket <= 3.125


@pytest.mark.parametrize("name, model, probes", [
    # every bucket splits 4-5 times below its maximum: 25 before
    ("several steps", SplitBatchMemory(split_elements=NEMO_SPLIT_ELEMENTS / 16), 24),
    # every bucket splits 2-3 times, the first bucket between its first two probes: 31 before
    ("steps from the first probe", SplitBatchMemory(split_elements=NEMO_SPLIT_ELEMENTS / 4), 32),
    # steps of a third of the per-item cost: 40 before
    ("large steps", SplitBatchMemory(step_bytes_per_frame=72 * 1024), 30),
])
def test_harder_steps_stay_correct(name, model, probes):
    result = search_batch_sizes(H200_RNNT_BUCKETS, model.probe, budget_bytes=model.budget_bytes)
    _check_against_true_max(result, model)
    assert result.num_probes == probes, name


@pytest.mark.parametrize("budget_given, probes", [(140 * 2**30, 31), (None, 36)])
def test_steps_with_a_budget_learned_from_ooms(budget_given, probes):
    """The H200 buckets when the search is given the whole device (140 GiB) or nothing, so that an OOM may
    be the budget or a step: 36 and 38 probes before."""
    model = SplitBatchMemory()
    result = search_batch_sizes(H200_RNNT_BUCKETS, model.probe, budget_bytes=budget_given)
    _check_against_true_max(result, model)
    assert result.num_probes == probes


@pytest.mark.parametrize("kind, budget_known, probes", [
    ("linear", True, 44), ("linear", False, 48), ("quadratic", True, 38), ("quadratic", False, 44),
    ("noisy", True, 77), ("noisy", False, 76), ("step", True, 53), ("step", False, 51)])
def test_notebook_scenarios_keep_their_probe_counts(kind, budget_known, probes):
    assert kind in MODEL_KINDS
    model = SyntheticMemory(kind=kind)
    result = search_batch_sizes(demo_buckets(15, 2), model.probe,
                                budget_bytes=model.budget_bytes if budget_known else None)
    assert result.num_probes == probes


@pytest.mark.parametrize("step_kib", [8, 24, 72])
@pytest.mark.parametrize("splits_earlier", [1, 4])
@pytest.mark.parametrize("usable", [1.0, 0.97])
def test_steps_never_return_a_size_above_the_true_maximum(step_kib, splits_earlier, usable):
    """Step sizes, split thresholds and a budget overstated like on a GPU (steps fail 3 % before it)."""
    model = SplitBatchMemory(step_bytes_per_frame=step_kib * 1024, split_elements=NEMO_SPLIT_ELEMENTS / splits_earlier,
                             budget_bytes=usable * 126 * 2**30)
    result = search_batch_sizes(H200_RNNT_BUCKETS, model.probe, budget_bytes=126 * 2**30)
    _check_against_true_max(result, model)


# NeMo's FastConformer RNN-T on the H200 (byo_models_nemo.json): the peaks (bytes) its search measured, two
# per bucket where it has them. Each bucket's peak is the line through its two; a bucket with one measured
# peak takes its line through BASE_BYTES. Steps failed near 134 GB under a 135.1 GB budget (0.9 of the GPU).
NEMO_H200_PEAKS = {7: [(32, 34.12e9), (126, 123.51e9)], 6: [(163, 105.84e9), (205, 132.53e9)],
                   5: [(246, 112.92e9), (283, 129.77e9)], 4: [(364, 115.67e9), (412, 130.67e9)],
                   3: [(467, 124.15e9), (488, 129.74e9)], 2: [(694, 129.45e9)], 1: [(1015, 126.86e9)],
                   0: [(1298, 132.77e9)]}
BASE_BYTES, USABLE_BYTES, GIVEN_BUDGET_BYTES = 2e9, 134e9, 135.1e9


class MeasuredLines:
    """Peaks on each bucket's line through the H200 measurements; OOM above USABLE_BYTES."""

    def __init__(self):
        self.lines = {}
        for i, points in NEMO_H200_PEAKS.items():
            (n0, p0), (n1, p1) = points if len(points) == 2 else [(0, BASE_BYTES), points[0]]
            self.lines[H200_RNNT_BUCKETS[i]] = (p0 - n0 * (p1 - p0) / (n1 - n0), (p1 - p0) / (n1 - n0))

    def peak(self, bucket, n):
        base, per_item = self.lines[bucket]
        return base + n * per_item

    def probe(self, bucket, n):
        peak = self.peak(bucket, n)
        if peak > USABLE_BYTES:
            raise torch.OutOfMemoryError(f"{peak / 1e9:.1f} GB")
        return peak

    def true_max(self, bucket):
        base, per_item = self.lines[bucket]
        return int((USABLE_BYTES - base) // per_item)


def test_measured_nemo_lines_take_at_most_three_probes_per_bucket():
    """After an OOM above a bucket's first probe, the search aims just below the largest peak known to fit
    (where splitting the bracket took 5 probes in buckets 4-6 on the H200)."""
    model = MeasuredLines()
    result = search_batch_sizes(H200_RNNT_BUCKETS, model.probe, budget_bytes=GIVEN_BUDGET_BYTES)
    _check_against_true_max(result, model)
    assert result.probes_per_bucket <= 3.0, [_probes_in(result, i) for i in range(len(H200_RNNT_BUCKETS))]
