"""The bucketing benches: `workbench bins` on 1M utterances against lhotse, and time to the first batch."""
