"""Exact counts of the word n-grams of a corpus (DESIGN §1), in bounded memory.

Three stages, all streaming:

1. `tokenise_corpus`: documents -> words (preprocess/words.py) -> int32 word ids, appended to an
   id stream on local disk with `SEPARATOR` after every document, so no n-gram crosses one.
   Word ids are given in order of first appearance, so they do not depend on the worker count.
2. `count_ngrams`, level 1: unigram counts. A word is *frequent* if count >= min_count.
3. level k = 2..max_n (Apriori): only k-grams whose two (k-1)-sub-grams are frequent can reach
   min_count, so only those are counted. A frequent (k-1)-gram has a dense id g (its rank among
   the sorted frequent keys of its level), and the k-gram starting at position i has the key
   `g_{k-1}[i] * F1 + g_1[i+k-1]` (F1 = number of frequent words); keys of a chunk of the stream
   are counted with a sort, split into hash partitions and accumulated. Accumulated pairs beyond
   the memory budget spill to partition files on disk; each partition is reduced on its own, so
   a corpus larger than RAM finishes. Counts are exact and independent of spilling and workers.
   The index of the frequent n-gram at each position (n = 2..max_n-1) is stored on disk, 4 bytes
   per position, for the next level and for the coverage pass (`covered_fraction`).

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

SEPARATOR = 0  # id written after every document; never a word
_PARTITION_BITS = 6
NUM_PARTITIONS = 1 << _PARTITION_BITS  # hash partitions of the (key, count) pairs of one level
_PARTITION_SHIFT = np.uint64(64 - _PARTITION_BITS)  # the top bits of the 64-bit hash pick the partition


def _hash64(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a cheap, well-mixed 64-bit hash of int64 keys, vectorised."""
    z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


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
    ngram_id_paths: dict[int, str] = dataclasses.field(default_factory=dict)  # set by count_ngrams

    def ids(self) -> np.ndarray:
        if self.length == 0:
            return np.zeros([0], np.int32)
        return np.memmap(self.path, dtype=np.int32, mode="r", shape=(self.length,))


@functools.cache
def _tokenise_fn():
    """Traced once per process: words of a batch, as the batch's unique words + indices into them."""
    import tensorflow as tf

    from preprocess.words import split_words_ragged

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenise(documents):
        words = split_words_ragged(documents)
        unique, inverse = tf.unique(words.flat_values, out_idx=tf.int32)
        return unique, inverse, words.row_lengths()

    return tokenise


def tokenise_corpus(files: Sequence[str], work_dir: str, max_n: int, workers: int, progress: bool = False,
                    batch_chars: int = 1_000_000) -> CorpusStream:
    """Split every document of `files` into words and write the id stream to `work_dir`."""
    import tensorflow as tf

    from preprocess.documents import iter_document_batches

    tokenise = _tokenise_fn()

    def run(batch: list[str]):
        unique, inverse, lengths = tokenise(tf.constant(batch))
        return unique.numpy(), inverse.numpy(), lengths.numpy(), len(batch)

    path = os.path.join(work_dir, "ids.int32")
    vocab: dict[bytes, int] = {}
    words: list[bytes] = [b""]
    counts = np.zeros([1024], np.int64)
    documents = length = 0
    num_positions = [0] * (max_n + 1)
    bar = _progress("reading words", None, " words", progress)
    with open(path, "wb") as out:
        for unique, inverse, lengths, num_docs in ordered_map(run, iter_document_batches(files, batch_chars), workers):
            first_new = len(words)
            local_to_global = np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in unique), np.int32, len(unique))
            words.extend(unique[local_to_global >= first_new])  # new ids are consecutive, in this order
            if len(words) > len(counts):
                counts = np.concatenate([counts, np.zeros([max(len(words), 2 * len(counts)) - len(counts)], np.int64)])
            counts[local_to_global] += np.bincount(inverse, minlength=len(unique))
            out.write(_with_separators(local_to_global[inverse], lengths).tobytes())
            documents += num_docs
            length += len(inverse) + len(lengths)
            for k in range(1, max_n + 1):
                num_positions[k] += int(np.maximum(lengths - k + 1, 0).sum())
            bar.update(len(inverse))
    bar.close()
    return CorpusStream(path=path, length=length, words=words, word_counts=counts[:len(words)], documents=documents,
                        num_words=num_positions[1], num_positions=num_positions)


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
    partition = (_hash64(keys) >> _PARTITION_SHIFT).astype(np.uint8)
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

    def text(self, words_CxN: np.ndarray) -> list[str]:
        """The n-grams as strings, words joined by single spaces.

        Joined column by column with numpy string operations: a list per row would create
        millions of objects for Python's garbage collector to walk, next to TensorFlow's.
        """
        decoded = np.array([w.decode("utf-8") for w in self.words], dtype=np.dtypes.StringDType())
        joined = decoded[words_CxN[:, 0]]
        for column in words_CxN.T[1:]:
            joined = np.strings.add(np.strings.add(joined, " "), decoded[column])
        return joined.tolist()

    def word_order(self) -> np.ndarray:
        """Rank of each frequent word in string order; UTF-8 byte order is code point order."""
        rank = np.empty([len(self.words)], np.int64)
        rank[sorted(range(len(self.words)), key=self.words.__getitem__)] = np.arange(len(self.words))
        return rank


class _Positions:
    """Per-position ids read from disk: n = 1 the frequent-word index of the word there (from the id
    stream), n >= 2 the index of the frequent n-gram starting there (files written by the level
    passes); -1 where there is none, at separators and past the end of the stream."""

    def __init__(self, stream: CorpusStream, word_index: np.ndarray):
        self.stream, self.word_index = stream, word_index
        self._ids = stream.ids()
        self._ngram_ids = {n: np.memmap(path, dtype=np.int32, mode="r", shape=(max(stream.length, 1),))
                           for n, path in stream.ngram_id_paths.items()}

    def read(self, n: int, start: int, stop: int) -> np.ndarray:
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

    def __init__(self, k: int, positions: _Positions, table: NgramCounts, out_ids: np.ndarray | None, chunk: int):
        self.k, self.positions, self.table, self.out_ids, self.chunk = k, positions, table, out_ids, chunk

    def __call__(self, start: int):
        k, table = self.k, self.table
        stop = min(start + self.chunk, self.positions.stream.length)
        m = stop - start
        g1 = self.positions.read(1, start, stop + k - 1)
        if k == 2:
            g_prev = g1[:m + 1]  # the (k-1)-gram index on [start, stop]
        else:
            g_prev = _extend_positions(table, self.positions.read(k - 2, start, stop + 2), g1[k - 2:k - 1 + m], k - 1)
            self.out_ids[start:stop] = g_prev[:m]
        left, right = g_prev[:-1], g_prev[1:]
        valid = (left >= 0) & (right >= 0)
        keys = left[valid].astype(np.int64) * table.num_frequent_words + g1[k - 1:k - 1 + m][valid]
        return _split_partitions(*np.unique(keys, return_counts=True)), m


def _extend_positions(table: NgramCounts, g: np.ndarray, last: np.ndarray, n: int) -> np.ndarray:
    """Per position i: index of the frequent n-gram at i, from the (n-1)-gram indices g[i], g[i+1] and its last word."""
    out = np.full([len(last)], -1, np.int32)
    valid = np.flatnonzero((g[:-1] >= 0) & (g[1:] >= 0))
    out[valid] = table.extend(g[valid], last[valid], n)
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
    (`stream.ngram_id_paths`, 4 bytes per position each).
    """
    frequent, word_index = _frequent_words(stream, min_count)
    table = NgramCounts(words=[stream.words[i] for i in frequent], keys={},
                        counts={1: stream.word_counts[frequent]}, counted={1: len(stream.words) - 1},
                        num_positions=stream.num_positions, documents=stream.documents, num_words=stream.num_words,
                        min_count=min_count, spilled=False)
    stream.ngram_id_paths.clear()
    for k in range(2, max_n + 1):
        if len(table.counts[k - 1]) * max(table.num_frequent_words, 1) >= 2**63:
            raise OverflowError(f"too many frequent {k - 1}-grams to index {k}-grams; raise --min-count")
        out_ids = None
        if k >= 3:
            out_path = os.path.join(work_dir, f"ngram_ids_{k - 1}.int32")
            out_ids = np.memmap(out_path, dtype=np.int32, mode="w+", shape=(max(stream.length, 1),))
        spill_dir = tempfile.mkdtemp(prefix=f"spill{k}-", dir=work_dir)
        accumulator = PartitionedCounts(spill_dir, memory_budget_bytes)
        level = _LevelPass(k, _Positions(stream, word_index), table, out_ids, chunk_positions)
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
            out_ids.flush()
            del out_ids, level
            stream.ngram_id_paths[k - 1] = out_path
    return table


# ---------------------------------------------------------------------------------------------
# Coverage of a selection


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
    is_selected, selected_keys, is_prefix = {}, {}, {}
    for n, index in selected.items():
        if n in stream.ngram_id_paths:
            is_selected[n] = np.zeros([len(table.keys[n])], bool)
            is_selected[n][index] = True
        else:
            selected_keys[n] = np.sort(table.keys[n][index])
            is_prefix[n] = np.zeros([len(table.counts[n - 1])], bool)
            is_prefix[n][selected_keys[n] // table.num_frequent_words] = True

    def match_ends(start: int) -> np.ndarray:
        stop = min(start + chunk_positions, stream.length)
        longest = np.zeros([stop - start], np.int64)
        for n in sorted(selected):
            if n in is_selected:
                g = positions.read(n, start, stop)
                match = np.flatnonzero(g >= 0)
                match = match[is_selected[n][g[match]]]
            else:
                g, last = positions.read(n - 1, start, stop), positions.read(1, start + n - 1, stop + n - 1)
                match = np.flatnonzero((g >= 0) & (last >= 0))
                match = match[is_prefix[n][g[match]]]
                keys = g[match].astype(np.int64) * table.num_frequent_words + last[match]
                match = match[lookup(selected_keys[n], keys) >= 0]
            longest[match] = n
        return np.where(longest > 0, np.arange(start, stop) + longest, 0)

    covered = 0
    reach = 0  # first position after every match that started before the current chunk
    bar = _progress("coverage", stream.length, " pos", progress)
    for start, ends in zip(range(0, stream.length, chunk_positions),
                           ordered_map(match_ends, range(0, stream.length, chunk_positions), workers)):
        reach_here = np.maximum.accumulate(np.maximum(ends, reach))
        covered += int((reach_here > np.arange(start, start + len(ends))).sum())
        reach = int(reach_here[-1])
        bar.update(len(ends))
    bar.close()
    return covered / stream.num_words
