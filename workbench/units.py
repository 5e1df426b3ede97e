"""Units shared by the whole library: the audio sample rate and binary byte multiples."""

SAMPLE_RATE = 16_000  # audio samples per second of every corpus, feature front end and model
MiB = 1 << 20  # bytes
GiB = 1 << 30  # bytes
