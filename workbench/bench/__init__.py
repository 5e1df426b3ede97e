"""Benchmark scripts that write benchmarks/results/*.json (see results.py for the file format)."""
