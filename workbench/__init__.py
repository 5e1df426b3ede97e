"""workbench: bucketing, OOMptimizer, allocator settings and graph-mode decoders for speech models."""

__version__ = "0.1.0"
