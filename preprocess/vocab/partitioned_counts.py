"""(key, count) pairs accumulated in hash partitions within a memory budget, spilling to disk past it.

This is what lets `vocab build` count a corpus larger than RAM exactly: each partition is
reduced on its own at the end, whether or not any of it was spilled.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from pmi_jax.preprocess.text.ordered_map import ordered_map
from pmi_jax.preprocess.text.mix64 import GOLDEN, mix64
from pmi_jax.preprocess.vocab.sorted_keys import sum_by_key

_PARTITION_BITS = 6
NUM_PARTITIONS = 1 << _PARTITION_BITS  # hash partitions of the (key, count) pairs of one level
_PARTITION_SHIFT = np.uint64(64 - _PARTITION_BITS)  # the top bits of the 64-bit hash pick the partition


def split_partitions(keys: np.ndarray, counts: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
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
                self._buffers[p] = [sum_by_key(*map(np.concatenate, zip(*buffer)))]
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
        keys, counts = sum_by_key(*(np.concatenate(column) for column in zip(*pieces)))
        keep = counts >= min_count
        return keys[keep], counts[keep], len(keys)

    def reduce(self, min_count: int, workers: int) -> tuple[np.ndarray, np.ndarray, int]:
        """All keys with count >= min_count (sorted), their counts, and the number of distinct keys."""
        results = list(ordered_map(lambda p: self._reduce_partition(p, min_count), range(NUM_PARTITIONS), workers))
        keys = np.concatenate([r[0] for r in results])
        counts = np.concatenate([r[1] for r in results])
        order = np.argsort(keys)
        return keys[order], counts[order], sum(r[2] for r in results)
