"""Benchmarks that write benchmarks/results/*.json: one package per bench, ``<name>/run.py`` (the CLI,
``python -m workbench.bench.<name>``), ``worker.py`` where a subprocess is needed, and ``record.py``, which
owns the record's fields and every reading of them. ``results.py`` writes records with their provenance;
``summary.py`` renders benchmarks/SUMMARY.md from the records' ``summary_lines``."""
