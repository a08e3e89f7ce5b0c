"""splitmix64's finaliser on uint64 arrays: the seeded hash both stages use (unit priorities when the
corpus is segmented, count partitions when the vocabulary is built), kept below both."""
from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: splitmix64's increment


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 whose output bits all depend on all input bits.

    The project's one 64-bit mixer in numpy: span priorities (pmi_jax.preprocess.corpus.segmentation) and
    count partitions (pmi_jax.preprocess.vocab.partitioned_counts)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
