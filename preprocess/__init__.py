"""Offline stages: masking vocabulary from a corpus, then the prepared (segmented, packed) corpus."""
