"""The transducer-losses bench: run.py measures, worker.py runs one risky case in its own process,
record.py owns the record (schema, ratios, targets, summary lines, table)."""
