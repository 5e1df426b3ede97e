"""The models bench: training-step time and peak memory of the reference models, and the RNN-T loss check."""
