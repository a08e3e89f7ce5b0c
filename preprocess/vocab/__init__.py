"""Stage 1: the PMI masking vocabulary (exact n-gram counts, measures, selection by quota)."""
