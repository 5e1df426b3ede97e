"""The README's flow as a user types it: corpus, bins, OOMptimizer, training, decoding (record ``flow``)."""
