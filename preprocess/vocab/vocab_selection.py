"""Choosing the masking vocabulary (docs/design.md, "Masking vocabulary"): per-length rankings merged
by shares. The check that a list is in this project's word normalisation: preprocess/text/unit_lists.py.

The files themselves are `pmi_jax.formats.masking_vocab`.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pmi_jax.formats import masking_vocab

MIN_N, MAX_N = masking_vocab.MIN_N, masking_vocab.MAX_N


def default_shares(max_n: int) -> tuple[float, ...]:
    """The split for n = 2..5 (1/2, 1/4, 1/8, 1/8): each length takes half of what is left, the
    longest takes the rest. For max_n = 3 that is (1/2, 1/2).

    The split is not in the paper: it is the policy AI21 describe with their published masking
    vocabularies (github.com/AI21Labs/pmi-masking, README section 1: 50% bigrams, 25% trigrams,
    12.5% each for 4- and 5-grams)."""
    shares, left = [], 1.0
    for _ in range(2, max_n):
        shares.append(left / 2)
        left /= 2
    return tuple(shares + [left])


def quotas(size: int, shares: Sequence[float]) -> dict[int, int]:
    """quota_n = floor(size · share_n) for n = 2, 3, ...; the remainder of `size` goes to n = 2."""
    quota = {n: math.floor(size * share + 1e-9) for n, share in enumerate(shares, start=MIN_N)}
    quota[MIN_N] += size - sum(quota.values())
    return quota


def rank(score_C: np.ndarray, count_C: np.ndarray, word_order_CxN: np.ndarray) -> np.ndarray:
    """Candidate indices best first: higher score, then higher count, then the n-gram string.

    `word_order_CxN` holds each word's rank in string order. Words never contain a space and
    every character sorts above it, so comparing word ranks left to right is comparing the
    space-joined strings. The ranks are packed, first word in the highest bits, as many to an
    int64 as fit: packed values compare like the rank columns left to right, and each sort key
    fewer is one pass fewer of np.lexsort.
    """
    bits = max(int(word_order_CxN.max(initial=0)).bit_length(), 1)
    per_key = max(63 // bits, 1)
    packed = []
    for first in range(0, word_order_CxN.shape[1], per_key):
        key = np.zeros([len(word_order_CxN)], np.int64)
        for column in range(first, min(first + per_key, word_order_CxN.shape[1])):
            key = (key << bits) | word_order_CxN[:, column].astype(np.int64)
        packed.append(key)
    return np.lexsort(packed[::-1] + [-count_C, -score_C])
