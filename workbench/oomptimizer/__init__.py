"""OOMptimizer: the largest batch size per bucket that fits on the GPU, found with few real training steps.

search.py is pure logic over a probe (CPU-testable); probe.py runs the real step on the GPU; run.py turns
bins and a model into a profile and soaks it; merge.py merges equal neighbours; synthetic.py holds memory
models with known answers for tests and notebooks.
"""

from workbench.oomptimizer.merge import merge_equal_buckets
from workbench.oomptimizer.search import ProbeRecord, SearchResult, search_batch_sizes
from workbench.oomptimizer.synthetic import SyntheticMemory, demo_buckets

__all__ = ["search_batch_sizes", "SearchResult", "ProbeRecord", "merge_equal_buckets", "SyntheticMemory",
           "demo_buckets"]
