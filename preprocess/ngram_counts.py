"""Exact counts of the word n-grams of a corpus (DESIGN §1), in bounded memory.

Three stages, all streaming:

1. `tokenise_corpus`: documents -> words (preprocess/words.py, as byte spans) -> an int64 key per
   word (`word_keys`) -> int32 word ids, appended to an id stream on local disk with `SEPARATOR`
   after every document, so no n-gram crosses one. Word ids are given in order of first
   appearance, so they do not depend on the worker count.
2. `count_ngrams`, level 1: unigram counts. A word is *frequent* if count >= min_count.
3. level k = 2..max_n (Apriori): only k-grams whose two (k-1)-sub-grams are frequent can reach
   min_count, so only those are counted. A frequent (k-1)-gram has a dense id g (its rank among
   the sorted frequent keys of its level), and the k-gram starting at position i has the key
   `g_{k-1}[i] * F1 + g_1[i+k-1]` (F1 = number of frequent words); keys of a chunk of the stream
   are counted with a sort, split into hash partitions and accumulated. Accumulated pairs beyond
   the memory budget spill to partition files on disk; each partition is reduced on its own, so
   a corpus larger than RAM finishes. Counts are exact and independent of spilling and workers.
   The index of the frequent n-gram at each position (n = 2..max_n-1) is stored, 4 bytes per
   position, in memory if that fits a quarter of the memory budget, else on disk, for the next
   level and for the coverage pass (`covered_fraction`).

Every sub-span of a frequent n-gram is frequent, so the count of any sub-span of a candidate is
found by chaining key lookups through the levels (`NgramCounts.span_counts`).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import tqdm

from preprocess.segmentation import GOLDEN, mix64

SEPARATOR = 0  # id written after every document; never a word
_PARTITION_BITS = 6
NUM_PARTITIONS = 1 << _PARTITION_BITS  # hash partitions of the (key, count) pairs of one level
_PARTITION_SHIFT = np.uint64(64 - _PARTITION_BITS)  # the top bits of the 64-bit hash pick the partition


def ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """`map(fn, items)` on `workers` threads, results in item order, at most workers+1 in flight.

    Threads suffice: the work is TensorFlow kernels and large numpy operations, which release the
    GIL; the bounded window keeps memory independent of corpus size.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _progress(desc: str, total: int | None, unit: str, enabled: bool) -> tqdm.tqdm:
    return tqdm.tqdm(desc=desc, total=total, unit=unit, unit_scale=True, file=sys.stderr, disable=not enabled,
                     dynamic_ncols=True, leave=False)


# ---------------------------------------------------------------------------------------------
# Stage 1: documents -> id stream


@dataclasses.dataclass
class CorpusStream:
    """The corpus as word ids on disk: `path` holds `length` int32 ids, SEPARATOR after each document."""

    path: str
    length: int
    words: list[bytes]  # id -> UTF-8 word; words[SEPARATOR] is b""
    word_counts: np.ndarray  # int64 [len(words)]
    documents: int
    num_words: int
    num_positions: list[int]  # num_positions[k] = N_k, number of k-gram positions (index 0 unused)
    # Set by count_ngrams: n -> per-position index of the frequent n-gram starting there, int32 [length]
    # (-1 where none), in memory or mapped from a file in the work directory.
    ngram_ids: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)

    def ids(self) -> np.ndarray:
        if self.length == 0:
            return np.zeros([0], np.int32)
        return np.memmap(self.path, dtype=np.int32, mode="r", shape=(self.length,))


class WordKeyCollision(Exception):
    """Two different words got the same key (two long words with equal 56-bit hashes)."""


_SHORT_WORD = 7  # bytes; a word this long or shorter is its own key
_KEY_LENGTH_SHIFT = np.uint64(56)
_KEY_HASH_MASK = np.uint64((1 << 56) - 1)
_LOW_BYTES_MASK = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], np.uint64)


def _load_8_bytes(buffer: np.ndarray) -> np.ndarray:
    """uint64 view in which element i is buffer[i:i + 8] (little-endian), for gathers at word starts."""
    return np.ndarray(shape=(len(buffer) - 7,), dtype="<u8", buffer=buffer, strides=(1,))


def word_keys(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """An int64 key per word span of `buffer` (WordSpans layout, zero-padded): equal words, equal keys.

    A word of up to 7 bytes is its key: its bytes, and its length in the top byte. A longer word
    has min(length, 255) in the top byte and a 56-bit hash of its bytes below, so different long
    words may share a key: `tokenise_corpus` checks every long word against the first word with
    its key and raises WordKeyCollision on a mismatch.
    """
    words = _load_8_bytes(buffer)
    lengths_u64 = lengths.astype(np.uint64)
    keys = np.take(words, starts)
    keys &= np.take(_LOW_BYTES_MASK, np.minimum(lengths, 8))
    keys |= lengths_u64 << _KEY_LENGTH_SHIFT
    long = np.flatnonzero(lengths > _SHORT_WORD)
    if len(long):
        long_lengths = np.take(lengths, long)
        keys[long] = (_hash_bytes(words, np.take(starts, long), long_lengths) & _KEY_HASH_MASK) | (
            np.minimum(long_lengths, 255).astype(np.uint64) << _KEY_LENGTH_SHIFT)
    return keys.view(np.int64)


def _hash_bytes(words: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each span, 8 bytes at a time (a multiply-xorshift mix after each)."""
    hashes = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    active = np.arange(len(starts))
    for offset in range(0, int(lengths.max()), 8):
        if offset:
            active = active[lengths[active] > offset]
        part = words[starts[active] + offset] & _LOW_BYTES_MASK[np.minimum(lengths[active] - offset, 8)]
        h = (hashes[active] ^ part) * np.uint64(0xBF58476D1CE4E5B9)
        hashes[active] = (h ^ (h >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
    return hashes ^ (hashes >> np.uint64(29))


def _same_bytes(buffer: np.ndarray, starts_a: np.ndarray, starts_b: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether the spans (starts_a[i], lengths[i]) and (starts_b[i], lengths[i]) of `buffer` hold equal bytes."""
    words = _load_8_bytes(buffer)
    active = np.arange(len(lengths))
    for offset in range(0, int(lengths.max(initial=0)), 8):
        active = active[lengths[active] > offset]
        mask = _LOW_BYTES_MASK[np.minimum(lengths[active] - offset, 8)]
        if ((words[starts_a[active] + offset] ^ words[starts_b[active] + offset]) & mask).any():
            return False
    return True


def _batch_word_ids(documents: list[str]):
    """Words of a batch: (keys of its distinct words in order of first appearance, index of each
    word into them, words per document, the bytes of each distinct word's first occurrence as
    (buffer, starts, lengths)). Raises WordKeyCollision where two different words share a key."""
    import tensorflow as tf

    from preprocess.words import split_words_spans

    spans = split_words_spans(documents)
    keys = word_keys(spans.buffer, spans.starts, spans.lengths)
    unique, inverse = (t.numpy() for t in tf.unique(keys, out_idx=tf.int32))
    # Distinct words are numbered in order of first appearance, so a word's first occurrence is
    # where the running maximum of the indices grows.
    first = np.flatnonzero(np.diff(np.maximum.accumulate(inverse), prepend=-1))
    long = np.flatnonzero(spans.lengths > _SHORT_WORD)
    representative = np.take(first, np.take(inverse, long))
    long_lengths = np.take(spans.lengths, long)
    if not (np.array_equal(long_lengths, np.take(spans.lengths, representative))
            and _same_bytes(spans.buffer, np.take(spans.starts, long), np.take(spans.starts, representative),
                            long_lengths)):
        raise WordKeyCollision
    return unique, inverse, spans.row_lengths, (spans.buffer, np.take(spans.starts, first),
                                                np.take(spans.lengths, first))


def tokenise_corpus(files: Sequence[str], work_dir: str, max_n: int, workers: int, progress: bool = False,
                    batch_chars: int = 1_000_000) -> CorpusStream:
    """Split every document of `files` into words and write the id stream to `work_dir`.

    Words are split by `split_words_spans` and named by `word_keys`; should two different long
    words ever share a key, the corpus is read again with words as strings throughout.
    """
    try:
        return _tokenise_corpus_by_keys(files, work_dir, max_n, workers, progress, batch_chars)
    except WordKeyCollision:
        logging.warning("two different words hash alike; reading the corpus again with exact string keys")
        return _tokenise_corpus_by_strings(files, work_dir, max_n, workers, progress, batch_chars)


class _StreamWriter:
    """Appends batches of word ids to the id stream, with word counts and corpus sizes."""

    def __init__(self, path: str, max_n: int, progress: bool):
        self.path, self.max_n = path, max_n
        self.file = open(path, "wb")
        self.words: list[bytes] = [b""]
        self.counts = np.zeros([1024], np.int64)
        self.documents = self.length = 0
        self.num_positions = [0] * (max_n + 1)
        self.bar = _progress("reading words", None, " words", progress)

    def add(self, local_to_global: np.ndarray, inverse: np.ndarray, lengths: np.ndarray) -> None:
        if len(self.words) > len(self.counts):
            grown = np.zeros([max(len(self.words), 2 * len(self.counts))], np.int64)
            grown[:len(self.counts)] = self.counts
            self.counts = grown
        self.counts[local_to_global] += np.bincount(inverse, minlength=len(local_to_global))
        self.file.write(_with_separators(local_to_global[inverse], lengths).tobytes())
        self.documents += len(lengths)
        self.length += len(inverse) + len(lengths)
        for k in range(1, self.max_n + 1):
            self.num_positions[k] += int(np.maximum(lengths - k + 1, 0).sum())
        self.bar.update(len(inverse))

    def close(self) -> CorpusStream:
        self.file.close()
        self.bar.close()
        return CorpusStream(path=self.path, length=self.length, words=self.words,
                            word_counts=self.counts[:len(self.words)], documents=self.documents,
                            num_words=self.num_positions[1], num_positions=self.num_positions)


def _tokenise_corpus_by_keys(files, work_dir, max_n, workers, progress, batch_chars) -> CorpusStream:
    from preprocess.documents import iter_document_batches

    writer = _StreamWriter(os.path.join(work_dir, "ids.int32"), max_n, progress)
    vocab: dict[int, int] = {}  # word key -> id
    try:
        for unique, inverse, lengths, (buffer, starts, sizes) in ordered_map(
                _batch_word_ids, iter_document_batches(files, batch_chars), workers):
            first_new = len(writer.words)
            local_to_global = np.fromiter((vocab.setdefault(k, len(vocab) + 1) for k in unique.tolist()), np.int32,
                                          len(unique))
            new = local_to_global >= first_new  # new ids are consecutive, in this order
            data = buffer.data
            writer.words.extend(bytes(data[s:s + n]) for s, n in zip(starts[new].tolist(), sizes[new].tolist()))
            # A long word already known under its key must be the word stored for that key.
            known_long = np.flatnonzero(~new & (sizes > _SHORT_WORD))
            for i, s, n in zip(local_to_global[known_long].tolist(), starts[known_long].tolist(),
                               sizes[known_long].tolist()):
                if writer.words[i] != data[s:s + n]:
                    raise WordKeyCollision
            writer.add(local_to_global, inverse, lengths)
    finally:
        stream = writer.close()
    return stream


def _tokenise_corpus_by_strings(files, work_dir, max_n, workers, progress, batch_chars) -> CorpusStream:
    """tokenise_corpus with the words of each batch as strings, unique-d by TensorFlow: exact, slower."""
    import tensorflow as tf

    from preprocess.documents import iter_document_batches
    from preprocess.words import split_words_flat

    def run(batch: list[str]):
        words, row_splits = split_words_flat(batch)
        unique, inverse = tf.unique(words, out_idx=tf.int32)  # in order of first appearance
        return unique.numpy(), inverse.numpy(), np.diff(row_splits)

    writer = _StreamWriter(os.path.join(work_dir, "ids.int32"), max_n, progress)
    vocab: dict[bytes, int] = {}
    try:
        for unique, inverse, lengths in ordered_map(run, iter_document_batches(files, batch_chars), workers):
            first_new = len(writer.words)
            local_to_global = np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in unique), np.int32,
                                          len(unique))
            writer.words.extend(unique[local_to_global >= first_new])
            writer.add(local_to_global, inverse, lengths)
    finally:
        stream = writer.close()
    return stream


def _with_separators(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat word ids of consecutive documents -> the same ids with SEPARATOR after each document."""
    out = np.full([len(ids) + len(lengths)], SEPARATOR, np.int32)
    doc_of_word = np.repeat(np.arange(len(lengths)), lengths)
    out[np.arange(len(ids)) + doc_of_word] = ids
    return out


# ---------------------------------------------------------------------------------------------
# Stage 2-3: counts per level


def lookup(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Index of each query in `sorted_keys` (int64), -1 where absent.

    Binary searches in query order miss the cache on every step. Instead the queries are sorted
    (each packed with its position into one int64 when the key range leaves room, because a plain
    sort is many times faster than an argsort), their distinct values searched in order, and
    the answers scattered back.
    """
    result = np.full([len(queries)], -1, np.int64)
    if len(sorted_keys) == 0 or len(queries) == 0:
        return result
    low, high = int(queries.min()), int(queries.max())
    position_bits = 63 - high.bit_length()
    if low < 0 or position_bits < 12:
        order = np.argsort(queries)
        result[order] = _search_sorted(sorted_keys, queries[order])
        return result
    block = 1 << min(position_bits, 24)
    for start in range(0, len(queries), block):
        packed = (queries[start:start + block] << position_bits) | np.arange(min(block, len(queries) - start))
        packed.sort()
        result[start + (packed & ((1 << position_bits) - 1))] = _search_sorted(sorted_keys, packed >> position_bits)
    return result


def _search_sorted(sorted_keys: np.ndarray, sorted_queries: np.ndarray) -> np.ndarray:
    """lookup() for sorted queries: each distinct query is searched once."""
    starts = np.flatnonzero(np.concatenate([[True], sorted_queries[1:] != sorted_queries[:-1]]))
    distinct = sorted_queries[starts]
    position = np.minimum(np.searchsorted(sorted_keys, distinct), len(sorted_keys) - 1)
    found = np.where(sorted_keys[position] == distinct, position, -1)
    return np.repeat(found, np.diff(np.append(starts, len(sorted_queries))))


def _sum_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and the sum of their counts."""
    if len(keys) == 0:
        return keys, counts
    order = np.argsort(keys)
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(counts, starts)


def _split_partitions(keys: np.ndarray, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(keys, counts) -> one (keys, counts) pair per hash partition; keys stay sorted inside each."""
    partition = (mix64(keys.astype(np.uint64) + GOLDEN) >> _PARTITION_SHIFT).astype(np.uint8)
    order = np.argsort(partition, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(partition, minlength=NUM_PARTITIONS))])
    keys, counts = keys[order], counts[order]
    return [(keys[bounds[p]:bounds[p + 1]], counts[bounds[p]:bounds[p + 1]]) for p in range(NUM_PARTITIONS)]


class PartitionedCounts:
    """(key, count) pairs of one level in hash partitions, within a memory budget.

    Pairs are buffered in memory; past the budget the buffers are first summed in place and, if
    still more than half the budget, appended to one pair of files per partition (a spill). At
    the end every partition is reduced on its own: its memory need is 1/NUM_PARTITIONS of the
    level's distinct pairs, and the result is the same whether or not anything was spilled.
    """

    def __init__(self, spill_dir: str, budget_bytes: int):
        self._buffers: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(NUM_PARTITIONS)]
        self._bytes = 0
        self._spill_dir = spill_dir
        self._budget = budget_bytes
        self.spills = 0

    def add(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
        for buffer, (keys, counts) in zip(self._buffers, parts):
            if len(keys):
                buffer.append((keys, counts))
                self._bytes += keys.nbytes + counts.nbytes
        if self._bytes > self._budget:
            self._compact()
            if self._bytes > self._budget // 2:
                self._spill()

    def _compact(self) -> None:
        for p, buffer in enumerate(self._buffers):
            if len(buffer) > 1:
                self._buffers[p] = [_sum_by_key(*map(np.concatenate, zip(*buffer)))]
        self._bytes = sum(k.nbytes + c.nbytes for buffer in self._buffers for k, c in buffer)

    def _spill_path(self, partition: int, field: str) -> str:
        return os.path.join(self._spill_dir, f"part{partition:03d}.{field}.int64")

    def _spill(self) -> None:
        for p, buffer in enumerate(self._buffers):
            for field, column in (("keys", 0), ("counts", 1)):
                with open(self._spill_path(p, field), "ab") as f:
                    for pair in buffer:
                        pair[column].astype(np.int64).tofile(f)
            buffer.clear()
        self._bytes = 0
        self.spills += 1

    def _reduce_partition(self, partition: int, min_count: int) -> tuple[np.ndarray, np.ndarray, int]:
        pieces = self._buffers[partition]
        if self.spills and os.path.exists(self._spill_path(partition, "keys")):
            pieces = pieces + [tuple(np.fromfile(self._spill_path(partition, f), np.int64) for f in ("keys", "counts"))]
        self._buffers[partition] = []
        if not pieces:
            return np.zeros([0], np.int64), np.zeros([0], np.int64), 0
        keys, counts = _sum_by_key(*(np.concatenate(column) for column in zip(*pieces)))
        keep = counts >= min_count
        return keys[keep], counts[keep], len(keys)

    def reduce(self, min_count: int, workers: int) -> tuple[np.ndarray, np.ndarray, int]:
        """All keys with count >= min_count (sorted), their counts, and the number of distinct keys."""
        results = list(ordered_map(lambda p: self._reduce_partition(p, min_count), range(NUM_PARTITIONS), workers))
        keys = np.concatenate([r[0] for r in results])
        counts = np.concatenate([r[1] for r in results])
        order = np.argsort(keys)
        return keys[order], counts[order], sum(r[2] for r in results)


@dataclasses.dataclass
class NgramCounts:
    """Frequent n-grams (count >= min_count) of every length 1..max_n, with exact counts.

    A frequent word is named by its index among the frequent words (`words`, ordered by first
    appearance in the corpus). A frequent n-gram (n >= 2) is `keys[n][g]`, where
    `key = (index of its (n-1)-prefix in keys[n-1]) * num_frequent_words + index of its last word`,
    and `keys[n]` is sorted, so the index g of an n-gram is its rank in `keys[n]`.
    """

    words: list[bytes]  # the frequent words
    keys: dict[int, np.ndarray]  # n >= 2 -> sorted int64 keys of the frequent n-grams
    counts: dict[int, np.ndarray]  # n >= 1 -> counts aligned with words (n = 1) or keys[n]
    counted: dict[int, int]  # n -> distinct n-grams counted (n >= 2: those whose two (n-1)-sub-grams are frequent)
    num_positions: list[int]  # num_positions[k] = N_k
    documents: int
    num_words: int
    min_count: int
    spilled: bool

    @property
    def num_frequent_words(self) -> int:
        return len(self.words)

    def ngram_words(self, n: int) -> np.ndarray:
        """Word indices of every frequent n-gram, int32 [C, n], in the order of `keys[n]` / `counts[n]`."""
        if n == 1:
            return np.arange(len(self.words), dtype=np.int32)[:, None]
        index = np.arange(len(self.keys[n]), dtype=np.int64)
        columns = []
        for level in range(n, 1, -1):
            key = self.keys[level][index]
            columns.append(key % self.num_frequent_words)
            index = key // self.num_frequent_words
        columns.append(index)
        return np.stack(columns[::-1], axis=1).astype(np.int32)

    def extend(self, index: np.ndarray, word: np.ndarray, n: int) -> np.ndarray:
        """Index of (the (n-1)-gram `index`) + `word` among the frequent n-grams; -1 where not frequent."""
        result = np.full([len(index)], -1, np.int64)
        valid = (index >= 0) & (word >= 0)
        result[valid] = lookup(self.keys[n], index[valid].astype(np.int64) * self.num_frequent_words + word[valid])
        return result

    def span_counts(self, words_CxN: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Count of every span (i, j), 0 <= i < j <= n, of each row of frequent n-grams.

        Every span of a frequent n-gram is frequent, so every lookup succeeds.
        """
        n = words_CxN.shape[1]
        counts = {}
        for i in range(n):
            index = words_CxN[:, i].astype(np.int64)
            counts[(i, i + 1)] = self.counts[1][index]
            for j in range(i + 2, n + 1):
                index = self.extend(index, words_CxN[:, j - 1], j - i)
                if (index < 0).any():
                    raise AssertionError(f"a span of a frequent {n}-gram is missing from the {j - i}-gram counts")
                counts[(i, j)] = self.counts[j - i][index]
        return counts

    @functools.cached_property
    def _word_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each frequent word followed by b" ", back to back: (buffer, start of each word, its length)."""
        lengths = np.fromiter(map(len, self.words), np.int64, len(self.words))
        return np.frombuffer(b" ".join(self.words) + b" ", np.uint8), np.cumsum(lengths + 1) - lengths - 1, lengths

    def text_spans(self, words_CxN: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The n-grams as pieces of a byte buffer, words joined by single spaces: (buffer, starts [C, n],
        lengths [C, n]); row c is the concatenation of its pieces (see `join_pieces`)."""
        buffer, word_starts, word_lengths = self._word_bytes
        lengths = word_lengths[words_CxN]
        lengths[:, :-1] += 1  # every word but the last with the space after it
        return buffer, word_starts[words_CxN], lengths

    def text(self, words_CxN: np.ndarray) -> list[str]:
        """The n-grams as strings, words joined by single spaces.

        Assembled as one byte string and split: a string per word and per join would cost
        Python objects by the million.
        """
        return join_pieces(*self.text_spans(words_CxN))

    def word_order(self) -> np.ndarray:
        """Rank of each frequent word in string order; UTF-8 byte order is code point order."""
        rank = np.empty([len(self.words)], np.int64)
        rank[sorted(range(len(self.words)), key=self.words.__getitem__)] = np.arange(len(self.words))
        return rank


def join_pieces(buffer: np.ndarray, starts_RxP: np.ndarray, lengths_RxP: np.ndarray) -> list[str]:
    """Row r: the UTF-8 pieces buffer[starts[r, p]:starts[r, p] + lengths[r, p]] (p = 0, 1, ...) joined.

    Every row is gathered into one byte string, with a newline after each, decoded once and split,
    which is many times faster than joining strings row by row. No piece may hold a newline.
    """
    return join_pieces_as_lines(buffer, starts_RxP, lengths_RxP).split("\n")[:-1]


def join_pieces_as_lines(buffer: np.ndarray, starts_RxP: np.ndarray, lengths_RxP: np.ndarray) -> str:
    """The rows of `join_pieces`, each followed by a newline, as one string."""
    rows = len(starts_RxP)
    if rows == 0:
        return ""
    buffer = np.append(buffer, np.uint8(ord("\n")))
    starts = np.concatenate([starts_RxP, np.full([rows, 1], len(buffer) - 1)], axis=1).ravel()
    lengths = np.concatenate([lengths_RxP, np.ones([rows, 1], np.int64)], axis=1).ravel()
    if not lengths.all():
        keep = np.flatnonzero(lengths)
        starts, lengths = np.take(starts, keep), np.take(lengths, keep)
    offsets = np.cumsum(lengths) - lengths
    # The byte index to copy next is one more than the last, except where a piece starts:
    # a running sum of steps, in 32 bits where the buffer allows it.
    step = np.ones([offsets[-1] + lengths[-1]], np.int32 if len(buffer) < 2**31 else np.int64)
    step[0] = starts[0]
    step[offsets[1:]] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
    return np.take(buffer, np.cumsum(step, dtype=step.dtype)).tobytes().decode("utf-8")


class _Positions:
    """Per-position ids read from disk: n = 1 the frequent-word index of the word there (from the id
    stream), n >= 2 the index of the frequent n-gram starting there (files written by the level
    passes); -1 where there is none, at separators and past the end of the stream."""

    def __init__(self, stream: CorpusStream, word_index: np.ndarray):
        self.stream, self.word_index = stream, word_index
        self._ids = stream.ids()
        self._ngram_ids = stream.ngram_ids

    def read(self, n: int, start: int, stop: int) -> np.ndarray:
        """Read-only view where it can be: the caller must not write into it."""
        if stop <= self.stream.length:
            return np.take(self.word_index, self._ids[start:stop]) if n == 1 else self._ngram_ids[n][start:stop]
        out = np.full([stop - start], -1, np.int32)
        end = min(stop, self.stream.length)
        if end > start:
            out[:end - start] = self.word_index[self._ids[start:end]] if n == 1 else self._ngram_ids[n][start:end]
        return out


class _LevelPass:
    """One pass over the stream that counts the k-grams (k >= 2) whose two (k-1)-sub-grams are frequent.

    For k >= 3 it first recomputes, per position, the index of the frequent (k-1)-gram starting
    there (from the stored (k-2)-gram indices) and stores it: the next pass and the coverage
    pass read it back instead of searching again.
    """

    def __init__(self, k: int, positions: _Positions, table: NgramCounts,
                 store: Callable[[np.ndarray, int], None] | None, chunk: int):
        self.k, self.positions, self.table, self.store, self.chunk = k, positions, table, store, chunk

    def __call__(self, start: int):
        k, table = self.k, self.table
        stop = min(start + self.chunk, self.positions.stream.length)
        m = stop - start
        g1 = self.positions.read(1, start, stop + k - 1)
        if k == 2:
            g_prev = g1[:m + 1]  # the (k-1)-gram index on [start, stop]
        else:
            g_prev = _extend_positions(table, self.positions.read(k - 2, start, stop + 2), g1[k - 2:k - 1 + m], k - 1)
            self.store(g_prev[:m], start)
        # Index arrays and np.take rather than boolean masks: about three times faster here.
        valid = np.flatnonzero((g_prev[:-1] >= 0) & (g_prev[1:] >= 0))
        keys = np.take(g_prev, valid).astype(np.int64)
        keys *= table.num_frequent_words
        keys += np.take(g1[k - 1:k - 1 + m], valid)
        return _split_partitions(*np.unique(keys, return_counts=True)), m


def _store_in(out: np.ndarray, values: np.ndarray, start: int) -> None:
    out[start:start + len(values)] = values


def _write_at(fd: int, values: np.ndarray, start: int) -> None:
    """pwrite int32 `values` at element `start` of the file: from any thread, and without the page
    fault per 4 KiB page that writing through a memmap costs. Later passes map the file: the
    page cache shares the writes with them."""
    data, offset = memoryview(np.ascontiguousarray(values, np.int32)).cast("B"), 4 * start
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _extend_positions(table: NgramCounts, g: np.ndarray, last: np.ndarray, n: int) -> np.ndarray:
    """Per position i: index of the frequent n-gram at i, from the (n-1)-gram indices g[i], g[i+1] and its last word."""
    out = np.full([len(last)], -1, np.int32)
    valid = np.flatnonzero((g[:-1] >= 0) & (g[1:] >= 0))  # then the n words there are frequent too
    keys = np.take(g, valid).astype(np.int64)
    keys *= table.num_frequent_words
    keys += np.take(last, valid)
    out[valid] = lookup(table.keys[n], keys)
    return out


def _frequent_words(stream: CorpusStream, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stream ids of the frequent words (ascending), and stream id -> frequent-word index (-1 if not frequent)."""
    frequent = np.flatnonzero(stream.word_counts >= min_count)
    frequent = frequent[frequent != SEPARATOR]
    word_index = np.full([len(stream.words)], -1, np.int32)
    word_index[frequent] = np.arange(len(frequent), dtype=np.int32)
    return frequent, word_index


def count_ngrams(stream: CorpusStream, max_n: int, min_count: int, work_dir: str, workers: int,
                 memory_budget_bytes: int = 2 << 30, chunk_positions: int = 1 << 20,
                 progress: bool = False) -> NgramCounts:
    """Exact counts of all n-grams (n <= max_n) with count >= min_count, one pass over the stream per n >= 2.

    Also stores, for n = 2..max_n-1, the per-position index of the frequent n-gram starting there
    (`stream.ngram_ids`, 4 bytes per position each): in memory if all of them take at most a
    quarter of the memory budget, else in files in `work_dir`.
    """
    frequent, word_index = _frequent_words(stream, min_count)
    table = NgramCounts(words=[stream.words[i] for i in frequent], keys={},
                        counts={1: stream.word_counts[frequent]}, counted={1: len(stream.words) - 1},
                        num_positions=stream.num_positions, documents=stream.documents, num_words=stream.num_words,
                        min_count=min_count, spilled=False)
    stream.ngram_ids.clear()
    in_memory = 4 * stream.length * max(max_n - 2, 0) <= memory_budget_bytes // 4
    for k in range(2, max_n + 1):
        if len(table.counts[k - 1]) * max(table.num_frequent_words, 1) >= 2**63:
            raise OverflowError(f"too many frequent {k - 1}-grams to index {k}-grams; raise --min-count")
        out_ids = out_fd = store = None
        if k >= 3 and in_memory:
            out_ids = np.empty([max(stream.length, 1)], np.int32)
            store = functools.partial(_store_in, out_ids)
        elif k >= 3:
            out_path = os.path.join(work_dir, f"ngram_ids_{k - 1}.int32")
            out_fd = os.open(out_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(out_fd, 4 * max(stream.length, 1))
            store = functools.partial(_write_at, out_fd)
        spill_dir = tempfile.mkdtemp(prefix=f"spill{k}-", dir=work_dir)
        accumulator = PartitionedCounts(spill_dir, memory_budget_bytes)
        level = _LevelPass(k, _Positions(stream, word_index), table, store, chunk_positions)
        bar = _progress(f"counting {k}-grams", stream.length, " pos", progress)
        for parts, done in ordered_map(level, range(0, stream.length, chunk_positions), workers):
            accumulator.add(parts)
            bar.update(done)
        bar.close()
        keys, counts, distinct = accumulator.reduce(min_count, workers)
        shutil.rmtree(spill_dir)
        if len(keys) >= 2**31:
            raise OverflowError(f"more than 2^31 frequent {k}-grams; raise --min-count")
        table.keys[k], table.counts[k], table.counted[k] = keys, counts, distinct
        table.spilled |= accumulator.spills > 0
        if accumulator.spills:
            logging.info("%d-gram counts spilled to disk %d times (memory budget %d MB)", k, accumulator.spills,
                         memory_budget_bytes >> 20)
        if out_ids is not None:
            stream.ngram_ids[k - 1] = out_ids
        elif out_fd is not None:
            os.close(out_fd)
            stream.ngram_ids[k - 1] = np.memmap(out_path, dtype=np.int32, mode="r", shape=(max(stream.length, 1),))
    return table


# ---------------------------------------------------------------------------------------------
# Coverage of a selection


_MAX_REACH = 8  # a match reaches at most this far past the chunk it starts in (n <= 5)


def covered_fraction(stream: CorpusStream, table: NgramCounts, selected: dict[int, np.ndarray], workers: int,
                     chunk_positions: int = 1 << 20, progress: bool = False) -> float:
    """Fraction of the corpus words that lie inside at least one occurrence of a selected n-gram.

    `selected[n]` holds indices into `table.keys[n]`. Where the level passes stored per-position
    n-gram indices this is a table look-up per position; the longest length, which has no such
    file, is matched by key, only where its prefix starts a selected n-gram.
    """
    if stream.num_words == 0:
        return 0.0
    positions = _Positions(stream, _frequent_words(stream, table.min_count)[1])
    # Boolean tables indexed by an n-gram index read at a position; one extra False entry at the
    # end is what the index -1 (no frequent n-gram there) reads.
    is_selected, selected_keys, is_prefix = {}, {}, {}
    for n, index in selected.items():
        if n in stream.ngram_ids:
            is_selected[n] = np.zeros([len(table.keys[n]) + 1], bool)
            is_selected[n][index] = True
        else:
            selected_keys[n] = np.sort(table.keys[n][index])
            is_prefix[n] = np.zeros([len(table.counts[n - 1]) + 1], bool)
            is_prefix[n][selected_keys[n] // table.num_frequent_words] = True

    def covered_in_chunk(start: int) -> tuple[int, np.ndarray, int]:
        """Positions of the chunk covered by matches that start inside it; how far those matches
        reach past each of the chunk's first MAX_N positions (relative to the chunk); the chunk's
        overall reach (relative)."""
        stop = min(start + chunk_positions, stream.length)
        # Length of the longest selected n-gram starting at each position. (np.maximum and np.take:
        # a boolean-mask assignment or fancy indexing costs several times more per position.)
        longest = np.zeros([stop - start], np.int8)
        for n in sorted(selected):
            if n in is_selected:
                hit = np.take(is_selected[n], positions.read(n, start, stop))
                np.maximum(longest, hit.view(np.int8) * np.int8(n), out=longest)
            else:
                g, last = positions.read(n - 1, start, stop), positions.read(1, start + n - 1, stop + n - 1)
                match = np.flatnonzero(np.take(is_prefix[n], g) & (last >= 0))
                keys = g[match].astype(np.int64) * table.num_frequent_words + last[match]
                match = match[lookup(selected_keys[n], keys) >= 0]
                longest[match] = np.maximum(longest[match], n)
        here = np.arange(stop - start, dtype=np.int32)
        reach = np.maximum.accumulate(here + longest)  # first position not covered by the matches so far
        return np.count_nonzero(reach > here), reach[:_MAX_REACH], int(reach[-1])

    covered = 0
    carried = 0  # reach of the matches that started before the current chunk, relative to its start
    bar = _progress("coverage", stream.length, " pos", progress)
    for start, (inside, first_reach, reach) in zip(range(0, stream.length, chunk_positions), ordered_map(
            covered_in_chunk, range(0, stream.length, chunk_positions), workers)):
        # Matches from earlier chunks add the first positions that the chunk's own do not cover.
        head = np.arange(min(carried, len(first_reach)))
        covered += inside + int((first_reach[:len(head)] <= head).sum())
        size = min(chunk_positions, stream.length - start)
        carried = max(carried, reach) - size
        bar.update(size)
    bar.close()
    return covered / stream.num_words
