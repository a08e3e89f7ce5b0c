"""Look-ups and sums over sorted int64 keys: the array operations n-gram counting is made of."""
from __future__ import annotations

import numpy as np


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


def sum_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys and the sum of their counts."""
    if len(keys) == 0:
        return keys, counts
    order = np.argsort(keys)
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(counts, starts)
