"""The corpus bench: statistics of the espeak-ng corpora (plain and realistic) beside published figures (CPU)."""
