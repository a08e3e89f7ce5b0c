"""A seeded, document-level sample of a corpus (`vocab build --sample-words N`), the same on every runner.

Each document gets a priority, a splitmix64 draw from its key (a hash of its text,
`documents.document_key`) and the seed; the sample is the documents of lowest priority whose
whitespace-separated words first reach N, ties included: a uniform sample without replacement
of whole documents, a function of the texts and the seed alone, in corpus order. Finding the
cut is a cheap pass (read, hash, count spaces); the smallest priorities of any part of the
corpus are enough to find it (`lowest`), so parts combine in any order (Beam's CombineFn).
Duplicated documents share a priority: all of them are in, or none.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from pmi_jax.preprocess.text import documents
from pmi_jax.preprocess.text.mix64 import GOLDEN, mix64

ALL = np.iinfo(np.uint64).max  # the cut when the corpus holds fewer than N words: every document


def priorities(texts: Sequence[str], seed: int) -> np.ndarray:
    """uint64 [D]: each document's draw; lower is sampled first."""
    keys = np.fromiter((documents.document_key(t.encode("utf-8")) for t in texts), np.uint64, len(texts))
    with np.errstate(over="ignore"):
        return mix64((keys ^ mix64(np.uint64(seed % 2**64) + GOLDEN)) + GOLDEN)


def whitespace_words(texts: Sequence[str]) -> np.ndarray:
    return np.fromiter((len(t.split()) for t in texts), np.int64, len(texts))


def lowest(priority: np.ndarray, words: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents of lowest priority whose words first reach `target`, with the ties of the last
    one (all of them if they never reach it), sorted by priority: what any union of parts keeps."""
    order = np.argsort(priority, kind="stable")
    priority, words = priority[order], words[order]
    reached = np.searchsorted(np.cumsum(words), target)
    if reached >= len(priority):
        return priority, words
    end = np.searchsorted(priority, priority[reached], side="right")
    return priority[:end], words[:end]


def cut(priority: np.ndarray, words: np.ndarray, target: int) -> int:
    """The largest priority in the sample (`lowest` of the whole corpus, or any union of parts)."""
    priority, words = lowest(priority, words, target)
    return int(priority[-1]) if words.sum() >= target else int(ALL)


def find_cut(files: Iterable[str], target: int, seed: int, text_field: str = documents.DEFAULT_TEXT_FIELD,
             batch_chars: int = 4_000_000) -> int:
    """The cut of the whole corpus, in one pass that keeps only the lowest priorities."""
    kept = (np.zeros(0, np.uint64), np.zeros(0, np.int64))
    for batch in documents.iter_document_batches(files, batch_chars, text_field):
        kept = lowest(np.concatenate([kept[0], priorities(batch, seed)]),
                      np.concatenate([kept[1], whitespace_words(batch)]), target)
    return cut(*kept, target)


def in_sample(batch: Sequence[str], seed: int, cut_priority: int) -> list[str]:
    """The documents of a batch that are in the sample."""
    return [t for t, p in zip(batch, priorities(batch, seed).tolist()) if p <= cut_priority]


def sampled_batches(files: Iterable[str], target: int, seed: int, text_field: str = documents.DEFAULT_TEXT_FIELD,
                    batch_chars: int = 4_000_000) -> Iterator[list[str]]:
    """The sample's documents in corpus order, in batches (two passes: the cut, then the documents)."""
    files = list(files)
    cut_priority = find_cut(files, target, seed, text_field, batch_chars)
    for batch in documents.iter_document_batches(files, batch_chars, text_field):
        kept = in_sample(batch, seed, cut_priority)
        if kept:
            yield kept


def write_sample(files: Sequence[str], target: int, seed: int, path: str,
                 text_field: str = documents.DEFAULT_TEXT_FIELD) -> str:
    """The sample's documents, in corpus order, as JSON lines at `path` (local scratch): what the
    local commands read instead of the corpus."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for batch in sampled_batches(files, target, seed, text_field):
            f.writelines(json.dumps({documents.DEFAULT_TEXT_FIELD: doc}) + "\n" for doc in batch)
    return path
