"""Strings assembled from pieces of one UTF-8 byte buffer, many rows at once.

The vocabulary's texts and TSV rows number in the millions: one gather and one decode over
all of them costs less than a Python string per row.
"""
from __future__ import annotations

import numpy as np


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
