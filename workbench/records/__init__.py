"""Readers of the committed benchmark records (benchmarks/results/*.json) for the report."""
