"""The decoding bench: greedy transducer decoding speed with and without CUDA graphs."""
