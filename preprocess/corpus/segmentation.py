"""Masking units (docs/design.md, "Prepared corpus"): segment each document's words by a masking vocabulary of n-grams.

Units are chosen in rounds over the document's matches: the longest match wins, overlaps are
settled by a seeded 64-bit hash priority (`span_priority(seed, doc_index, s, e)`), and matches
that lost only to a losing container get another round. Every other word is a single-word unit.
The same seed gives the same units whatever the batching or sharding. Matching runs on integer
word ids with an integer trie (no string joins, no Python loop over words). The full
definition and its tested consequences: docs/design.md, "Module notes", segmentation.py.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import tensorflow as tf

from pmi_jax.preprocess.text.mix64 import GOLDEN, mix64


def span_priority(seed: int, doc_index: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Pseudo-random uint64 priority of span [start, end) of document `doc_index` (broadcasts)."""
    with np.errstate(over="ignore"):
        h = mix64(np.full(np.shape(start), seed, dtype=np.uint64) + GOLDEN)
        for value in (doc_index, start, end):
            h = mix64((h ^ np.asarray(value).astype(np.uint64)) + GOLDEN)
    return h


class NgramMatcher:
    """A masking vocabulary compiled to an integer trie, matched on whole batches of words."""

    def __init__(self, ngrams: Sequence[Sequence[str]]):
        multi = [tuple(g) for g in ngrams if len(g) >= 2]
        self.words = sorted({w for g in multi for w in g})
        self.num_entries = len(set(multi))
        self.max_n = max((len(g) for g in multi), default=0)
        index = {w: i for i, w in enumerate(self.words)}
        vocab_size = len(self.words)
        # Nodes 0..V-1 are the one-word prefixes (the words themselves); longer prefixes follow.
        child: dict[tuple[int, int], int] = {}
        terminal: set[int] = set()
        for gram in multi:
            node = index[gram[0]]
            for word in gram[1:]:
                node = child.setdefault((node, index[word]), vocab_size + len(child))
            terminal.add(node)
        self._vocab_size = vocab_size
        self._terminal = np.zeros(vocab_size + len(child), dtype=bool)
        self._terminal[list(terminal)] = True
        # Both lookups are TensorFlow hash tables: C++ hashing, several times faster than a
        # binary search over sorted keys at corpus scale.
        self._word_table = _hash_table(tf.constant(self.words, dtype=tf.string), tf.range(vocab_size, dtype=tf.int64))
        self._child_table = _hash_table(tf.constant([p * vocab_size + w for p, w in child], dtype=tf.int64),
                                        tf.constant(list(child.values()), dtype=tf.int64))

    def word_ids(self, words: tf.Tensor) -> np.ndarray:
        """[W] word strings -> int64 [W]: the word's index in this vocabulary, -1 if in no entry."""
        return self._word_table.lookup(words).numpy()

    def find_matches(self, word_ids: np.ndarray, doc_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All vocabulary matches over a flat batch of word ids, as (starts [M], ends [M]) sorted
        by start, then end. `doc_end[i]` is the end of word i's document: no match crosses it.
        """
        found_WxL = np.zeros((len(word_ids), max(self.max_n - 1, 0)), dtype=bool)
        pos = np.flatnonzero(word_ids >= 0)
        node = word_ids[pos]
        for length in range(2, self.max_n + 1):
            nxt = pos + length - 1
            inside = nxt < doc_end[pos]
            pos, node, nxt = pos[inside], node[inside], nxt[inside]
            word = word_ids[nxt]
            key = np.where(word >= 0, node * self._vocab_size + word, -1)
            node = self._child_table.lookup(tf.constant(key)).numpy()
            alive = node >= 0
            pos, node = pos[alive], node[alive]
            found_WxL[pos[self._terminal[node]], length - 2] = True
            if not len(pos):
                break
        starts, column = np.nonzero(found_WxL)  # row-major: by start, then length
        return starts, starts + column + 2


def _hash_table(keys: tf.Tensor, values: tf.Tensor) -> tf.lookup.StaticHashTable:
    if keys.shape[0] == 0:  # a table needs at least one entry; this one maps a key never looked up
        keys, values = tf.constant([""] if keys.dtype == tf.string else [-1], keys.dtype), tf.constant([-1], tf.int64)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=-1)


def _not_contained(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the spans not strictly inside another; spans distinct and sorted by start, then end."""
    contained = np.zeros(len(starts), dtype=bool)
    contained[1:] = np.maximum.accumulate(ends)[:-1] >= ends[1:]  # an earlier start reaches as far
    contained[:-1] |= starts[1:] == starts[:-1]  # the next span has this start and ends later
    return ~contained


def _accept_by_priority(starts: np.ndarray, ends: np.ndarray, priority: np.ndarray, max_len: int) -> np.ndarray:
    """Greedy independent set in decreasing priority (ties: earlier start) among spans sorted by
    start, none inside another.

    With starts (and so ends) strictly increasing, span j can overlap only j±1 .. j±(max_len-1).
    Each round accepts the undecided spans that outrank all undecided overlapping neighbours and
    rejects those neighbours; this reaches the same set as visiting spans one by one by rank.
    """
    undecided = np.ones(len(starts), dtype=bool)
    accepted = np.zeros(len(starts), dtype=bool)
    offsets = range(1, max_len)
    overlaps = {d: starts[d:] < ends[:-d] for d in offsets}  # j overlaps j + d
    first_wins = {d: priority[:-d] >= priority[d:] for d in offsets}  # j outranks j + d
    while undecided.any():
        best = undecided.copy()
        for d in offsets:
            live = overlaps[d] & undecided[:-d] & undecided[d:]
            best[:-d] &= ~(live & ~first_wins[d])
            best[d:] &= ~(live & first_wins[d])
        accepted |= best
        undecided &= ~best
        for d in offsets:
            undecided[d:] &= ~(overlaps[d] & best[:-d])
            undecided[:-d] &= ~(overlaps[d] & best[d:])
    return accepted


def _covered_counts(starts: np.ndarray, ends: np.ndarray, num_words: int) -> np.ndarray:
    """Prefix sums [num_words + 1] of "word i lies inside one of the spans"."""
    delta = np.bincount(starts, minlength=num_words + 1) - np.bincount(ends, minlength=num_words + 1)
    inside = np.cumsum(delta[:num_words]) > 0
    return np.concatenate([[0], np.cumsum(inside)])


def choose_units(starts: np.ndarray, ends: np.ndarray, doc_index: np.ndarray, doc_start: np.ndarray,
                 num_words: int, seed: int) -> np.ndarray:
    """Mask of the matches accepted as multi-word units (the module docstring's procedure).

    Matches are sorted by start, then end; `doc_index[m]` and `doc_start[m]` are the global
    index and the first flat word of match m's document.
    """
    max_len = int((ends - starts).max()) if len(starts) else 0
    accepted = np.zeros(len(starts), dtype=bool)
    index, s, e = np.arange(len(starts)), starts, ends  # the candidates; filtering keeps them sorted
    while len(index):
        top = _not_contained(s, e)
        top_index = index[top]

        def priority(i: np.ndarray) -> np.ndarray:  # of top spans i, positions relative to the document
            m = top_index[i]
            return span_priority(seed, doc_index[m], starts[m] - doc_start[m], ends[m] - doc_start[m])

        won = top_index[_choose_among_overlaps(s[top], e[top], max_len, priority)]
        accepted[won] = True
        covered = _covered_counts(starts[won], ends[won], num_words)
        rest = np.flatnonzero(~top)
        free = rest[covered[e[rest]] == covered[s[rest]]]
        index, s, e = index[free], s[free], e[free]
    return accepted


def _choose_among_overlaps(starts: np.ndarray, ends: np.ndarray, max_len: int, priority_of) -> np.ndarray:
    """Step 2 for spans sorted by start, none inside another: uncontested spans win outright;
    priorities are computed only for the spans that overlap a neighbour."""
    overlap_next = starts[1:] < ends[:-1]
    contested = np.zeros(len(starts), dtype=bool)
    contested[:-1] |= overlap_next
    contested[1:] |= overlap_next
    won = ~contested
    if contested.any():
        # Spans lying between two overlapping spans overlap them too, so the contested spans
        # keep their neighbourhoods when taken out on their own.
        which = np.flatnonzero(contested)
        won[which] = _accept_by_priority(starts[which], ends[which], priority_of(which), max_len)
    return won


def unit_starts(matcher: NgramMatcher, words: tf.Tensor, doc_splits: np.ndarray, doc_indices: np.ndarray,
                seed: int) -> np.ndarray:
    """Segment a batch: bool [W], True where a masking unit begins.

    words: flat [W] word strings of the batch; doc_splits: [D + 1] word row splits of its
    documents; doc_indices: [D] global document indices (they seed the random choices).
    """
    num_words = int(doc_splits[-1])
    starts_w = np.ones(num_words, dtype=bool)
    if matcher.max_n < 2 or num_words == 0:
        return starts_w
    lengths = np.diff(doc_splits)
    doc_of_word = np.repeat(np.arange(len(lengths)), lengths)
    doc_end = doc_splits[1:][doc_of_word]
    starts, ends = matcher.find_matches(matcher.word_ids(words), doc_end)
    doc = doc_of_word[starts]
    keep = choose_units(starts, ends, np.asarray(doc_indices)[doc], doc_splits[doc], num_words, seed)
    inner = _covered_counts(starts[keep] + 1, ends[keep], num_words)
    starts_w &= np.diff(inner) == 0
    return starts_w


def ngrams_sha256(ngrams: Sequence[Sequence[str]]) -> str:
    """Content hash of a vocabulary as loaded: one n-gram per line, words joined by spaces."""
    digest = hashlib.sha256()
    for gram in ngrams:
        digest.update((" ".join(gram) + "\n").encode("utf-8"))
    return digest.hexdigest()
