"""The benchmarks (not installed; run from the repository root as ``python -m benchmarks.<name>``): one package
per bench, ``<name>/run.py`` its CLI and ``worker.py`` where a subprocess is needed; ``harness.py`` what they
share (smoke checks, incremental saves, failures, writing a record with its provenance). Each record's fields
and every reading of them live in :mod:`workbench.records`, which the notebooks, SUMMARY.md and
`workbench report` use."""
