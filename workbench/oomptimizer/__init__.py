"""OOMptimizer: the largest batch size per bucket that fits on the GPU, found with few real training steps.

search.py is pure logic over a probe (CPU-testable); probe.py runs the real step on the GPU; plan.py predicts
its peak without a GPU from a fake trace; run.py turns bins and a model into a profile and soaks it; merge.py
merges equal neighbours; synthetic.py holds memory models with known answers for tests and notebooks. Names load on first use, so that `workbench --help`
and the other sub-commands do not pay for importing torch.
"""

import importlib

_EXPORTS = {
    "merge_equal_buckets": "workbench.oomptimizer.merge",
    "search_batch_sizes": "workbench.oomptimizer.search",
    "SearchResult": "workbench.oomptimizer.search",
    "ProbeRecord": "workbench.oomptimizer.search",
    "SyntheticMemory": "workbench.oomptimizer.synthetic",
    "demo_buckets": "workbench.oomptimizer.synthetic",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'workbench.oomptimizer' has no attribute {name!r}")
