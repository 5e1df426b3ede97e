"""The throughput study: lhotse max_duration vs the 1D and 2D OOMptimizer profiles, trained on one GPU."""
