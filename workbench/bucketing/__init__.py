"""Bucketing: 1D/2D bin estimators, TPS limits, padding waste, and the lhotse sampler factory.

The sampler pieces import lhotse (and torch), which takes seconds, so they load on first use: the
`bins` CLI and the estimators stay fast to start.
"""

from workbench.bucketing.estimate import (Bins2D, DurationGroup, estimate_2d_bins, estimate_duration_bins,
                                          running_total_boundaries)
from workbench.bucketing.fit import BucketFitter, make_fitter, unfit_table
from workbench.bucketing.padding import expected_batch_max, padding_comparison, padding_waste
from workbench.bucketing.profile import BucketProfile, load_profile, profile_from_arrays, save_profile

_LAZY = {
    "BucketBatchSizeConstraint": "workbench.bucketing.constraint",
    "cut_num_tokens": "workbench.bucketing.constraint",
    "UnfitReport": "workbench.bucketing.sampler",
    "close_sampler": "workbench.bucketing.sampler",
    "make_sampler": "workbench.bucketing.sampler",
    "sampler_state_dict": "workbench.bucketing.sampler",
    "load_sampler_state_dict": "workbench.bucketing.sampler",
    "set_bucket_batch_size": "workbench.bucketing.sampler",
    "batches_drawn": "workbench.bucketing.sampler",
}

__all__ = [
    "Bins2D", "BucketBatchSizeConstraint", "BucketFitter", "BucketProfile", "DurationGroup", "UnfitReport",
    "close_sampler", "cut_num_tokens", "estimate_2d_bins", "estimate_duration_bins", "expected_batch_max",
    "load_profile", "load_sampler_state_dict", "make_fitter", "make_sampler", "profile_from_arrays", "sampler_state_dict", "padding_comparison", "padding_waste",
    "running_total_boundaries", "save_profile", "set_bucket_batch_size", "batches_drawn", "unfit_table",
]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench.bucketing' has no attribute {name!r}")
