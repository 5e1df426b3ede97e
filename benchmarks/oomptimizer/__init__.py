"""The OOMptimizer bench: predictive vs bisect batch-size search with real training steps on the GPU."""
