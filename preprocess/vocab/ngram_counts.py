"""Exact counts of the word n-grams of a corpus, in bounded memory (docs/design.md, "Words and n-grams").

Input: the id stream of preprocess/text/word_stream.py. Level 1 counts words; level k counts
only the k-grams whose two (k-1)-sub-grams are frequent (Apriori), keyed by dense ids of the
frequent (k-1)-grams and counted by sort in hash partitions that spill to disk past the memory
budget (preprocess/vocab/partitioned_counts.py). Counts are exact and independent of spilling
and workers; sub-span counts come from chained key lookups (`NgramCounts.span_counts`). The
keys and the per-position index: docs/design.md, "Module notes", ngram_counts.py.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import tempfile
from typing import Callable

import numpy as np

from pmi_jax.preprocess.vocab.byte_pieces import join_pieces
from pmi_jax.preprocess.text.ordered_map import ordered_map
from pmi_jax.preprocess.vocab.partitioned_counts import PartitionedCounts, split_partitions
from pmi_jax.preprocess.text.progress import progress_bar
from pmi_jax.preprocess.vocab.sorted_keys import lookup
from pmi_jax.preprocess.text.word_stream import SEPARATOR, CorpusStream


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



class Positions:
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


class LevelPass:
    """One pass over the stream that counts the k-grams (k >= 2) whose two (k-1)-sub-grams are frequent.

    For k >= 3 it first recomputes, per position, the index of the frequent (k-1)-gram starting
    there (from the stored (k-2)-gram indices) and stores it: the next pass and the coverage
    pass read it back instead of searching again.
    """

    def __init__(self, k: int, positions: Positions, table: NgramCounts,
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
            g_prev = extend_positions(table, self.positions.read(k - 2, start, stop + 2), g1[k - 2:k - 1 + m], k - 1)
            self.store(g_prev[:m], start)
        # Index arrays and np.take rather than boolean masks: about three times faster here.
        valid = np.flatnonzero((g_prev[:-1] >= 0) & (g_prev[1:] >= 0))
        keys = np.take(g_prev, valid).astype(np.int64)
        keys *= table.num_frequent_words
        keys += np.take(g1[k - 1:k - 1 + m], valid)
        return split_partitions(*np.unique(keys, return_counts=True)), m


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


def extend_positions(table: NgramCounts, g: np.ndarray, last: np.ndarray, n: int) -> np.ndarray:
    """Per position i: index of the frequent n-gram at i, from the (n-1)-gram indices g[i], g[i+1] and its last word."""
    out = np.full([len(last)], -1, np.int32)
    valid = np.flatnonzero((g[:-1] >= 0) & (g[1:] >= 0))  # then the n words there are frequent too
    keys = np.take(g, valid).astype(np.int64)
    keys *= table.num_frequent_words
    keys += np.take(last, valid)
    out[valid] = lookup(table.keys[n], keys)
    return out


def index_positions(stream: CorpusStream, positions: Positions, table: NgramCounts, longest: int) -> None:
    """stream.ngram_ids[n] for n = 2..longest, in memory, from a table that holds those lengths already:
    what the level passes store, recomputed for a stream counted elsewhere (one Beam batch)."""
    for n in range(2, longest + 1):
        stream.ngram_ids[n] = extend_positions(table, positions.read(n - 1, 0, stream.length + 1),
                                               positions.read(1, n - 1, stream.length + n - 1), n)


def frequent_words(stream: CorpusStream, min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Stream ids of the frequent words (ascending), and stream id -> frequent-word index (-1 if not frequent)."""
    frequent = np.flatnonzero(stream.word_counts >= min_count)
    frequent = frequent[frequent != SEPARATOR]
    word_index = np.full([len(stream.word_counts)], -1, np.int32)
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
    frequent, word_index = frequent_words(stream, min_count)
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
        level = LevelPass(k, Positions(stream, word_index), table, store, chunk_positions)
        bar = progress_bar(f"counting {k}-grams", stream.length, " pos", progress)
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
