"""The manifest-reading bench: workbench.data.read_cut_arrays against lhotse lazy iteration (CPU)."""
