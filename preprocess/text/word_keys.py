"""An int64 key per word, computed from its UTF-8 bytes in bulk: how the vocabulary build names words.

Building a Python string per word and hashing it costs more than splitting the text; a key
computed with numpy over the whole batch's bytes does not. Short words are their own key, so
only long words can collide, and the caller (preprocess/text/word_stream.py) checks them.
"""
from __future__ import annotations

import numpy as np


class WordKeyCollision(Exception):
    """Two different words got the same key (two long words with equal 56-bit hashes)."""


SHORT_WORD = 7  # bytes; a word this long or shorter is its own key
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
    long = np.flatnonzero(lengths > SHORT_WORD)
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


def same_bytes(buffer: np.ndarray, starts_a: np.ndarray, starts_b: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether the spans (starts_a[i], lengths[i]) and (starts_b[i], lengths[i]) of `buffer` hold equal bytes."""
    words = _load_8_bytes(buffer)
    active = np.arange(len(lengths))
    for offset in range(0, int(lengths.max(initial=0)), 8):
        active = active[lengths[active] > offset]
        mask = _LOW_BYTES_MASK[np.minimum(lengths[active] - offset, 8)]
        if ((words[starts_a[active] + offset] ^ words[starts_b[active] + offset]) & mask).any():
            return False
    return True
