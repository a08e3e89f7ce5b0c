"""Association measures of n-grams (docs/design.md, "Measures"), vectorised over all candidates of one length.

Every measure is a function of the counts of the spans of an n-gram w = w_1..w_n: `span_counts`
maps each span (i, j), 0 <= i < j <= n, to an array of counts over the candidates, and
p(s) = count(s) / N_len(s) with N_k the number of k-gram positions of the corpus.

  pmi        log p(w) - max over segmentations σ ≠ identity of Σ_{s∈σ} log p(s)   (paper eq. 3)
  pmi-p2     2·log p(w) - the same max                                               (AI21's lists)
  naive-pmi  log p(w) - Σ_i log p(w_i)                                               (paper eq. 2)
  frequency  count(w)                                                                (Frequency-Masking)
"""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

import numpy as np

MEASURES = ("pmi", "pmi-p2", "naive-pmi", "frequency")

Spans = Mapping[tuple[int, int], np.ndarray]


def span_log_probs(span_counts: Spans, num_positions: Sequence[int]) -> dict[tuple[int, int], np.ndarray]:
    """log p(s) = log count(s) - log N_len(s), float64, natural log."""
    return {(i, j): np.log(np.asarray(c, np.float64)) - np.log(float(num_positions[j - i]))
            for (i, j), c in span_counts.items()}


def best_split_log_prob(span_log_prob: Spans, n: int) -> np.ndarray:
    """max over segmentations σ ≠ identity of [0, n) of Σ_{s∈σ} log p(s), per candidate.

    Dynamic program over split points, each step one vectorised max over all candidates:
    best[j] = the best segmentation of the prefix [0, j), any segmentation allowed (for j < n
    the prefix itself is a proper span); the answer puts a last span (i, n) after best[i], i >= 1,
    which excludes exactly the identity. O(n²) array operations instead of 2^(n-1) sums.
    """
    if n < 2:
        raise ValueError(f"an n-gram with n={n} has no segmentation other than itself")
    best = [np.zeros_like(span_log_prob[(0, 1)], dtype=np.float64)]
    for j in range(1, n):
        best.append(functools.reduce(np.maximum, (best[i] + span_log_prob[(i, j)] for i in range(j))))
    return functools.reduce(np.maximum, (best[i] + span_log_prob[(i, n)] for i in range(1, n)))


def score(measure: str, span_counts: Spans, num_positions: Sequence[int], n: int) -> np.ndarray:
    """Score of each candidate n-gram under `measure` (float64; higher = a stronger unit)."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; expected one of {', '.join(MEASURES)}")
    if measure == "frequency":
        return np.asarray(span_counts[(0, n)], np.float64)
    log_prob = span_log_probs(span_counts, num_positions)
    if measure == "naive-pmi":
        return log_prob[(0, n)] - functools.reduce(np.add, (log_prob[(i, i + 1)] for i in range(n)))
    split = best_split_log_prob(log_prob, n)
    return (2.0 if measure == "pmi-p2" else 1.0) * log_prob[(0, n)] - split
