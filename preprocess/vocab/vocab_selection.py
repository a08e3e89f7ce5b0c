"""Choosing the masking vocabulary (docs/design.md, "Masking vocabulary"): per-length rankings merged
by shares, and the check that a list is in this project's word normalisation.

The files themselves are `pmi_jax.formats.masking_vocab`.
"""
from __future__ import annotations

import collections
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


def check_ngrams(ngrams: Sequence[tuple[str, ...]], max_examples: int = 3, normalisation: bool = True) -> list[str]:
    """Problems of a masking vocabulary, one line each; empty if it can be used as is.

    An entry is valid iff splitting its text into words (preprocess/text/words.py) gives back exactly
    its words: upper case, accents, or punctuation attached to a word mean the list was made in
    another normalisation and would never match the corpus. Lengths outside 2..5 and duplicate
    entries are reported with their counts. `normalisation=False` skips the word check, for words
    of another tokenizer (preprocess/text/hf_tokenizer.py), which need not survive being re-split.
    """
    from preprocess.text.words import split_words

    problems = []
    lengths = collections.Counter(len(ngram) for ngram in ngrams)
    for n in sorted(lengths):
        if not MIN_N <= n <= MAX_N:
            problems.append(f"{lengths[n]} entries have {n} words (expected {MIN_N} to {MAX_N})")
    texts = [" ".join(ngram) for ngram in ngrams]
    normalised = split_words(texts) if texts and normalisation else [list(g) for g in ngrams]
    wrong = [(t, " ".join(words)) for t, ngram, words in zip(texts, ngrams, normalised) if list(ngram) != words]
    if wrong:
        examples = ", ".join(f"{t!r} (as words: {w!r})" for t, w in wrong[:max_examples])
        problems.append(f"{len(wrong)} entries are not in the uncased BERT word normalisation, e.g. {examples}")
    duplicates = [t for t, c in collections.Counter(texts).items() if c > 1]
    if duplicates:
        problems.append(f"{len(duplicates)} entries appear more than once, e.g. "
                        + ", ".join(repr(t) for t in duplicates[:max_examples]))
    return problems
