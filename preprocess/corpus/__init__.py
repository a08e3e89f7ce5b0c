"""Stage 2: the prepared corpus (WordPiece, masking units, packing, sharded TFRecords)."""
