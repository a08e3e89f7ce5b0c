"""Coverage of a masking vocabulary: the share of corpus words inside an occurrence of one of its n-grams.

Computed on the word stream and the per-position n-gram indices that counting left behind
(preprocess/vocab/ngram_counts.py), so it costs one more pass and no second look-up of the text.
"""
from __future__ import annotations

import numpy as np

from pmi_jax.preprocess.vocab.ngram_counts import NgramCounts, Positions, frequent_words
from pmi_jax.preprocess.text.ordered_map import ordered_map
from pmi_jax.preprocess.text.progress import progress_bar
from pmi_jax.preprocess.vocab.sorted_keys import lookup
from pmi_jax.preprocess.text.word_stream import CorpusStream

_MAX_REACH = 8  # a match reaches at most this far past the chunk it starts in (n <= 5)


def covered_fraction(stream: CorpusStream, table: NgramCounts, selected: dict[int, np.ndarray], workers: int,
                     chunk_positions: int = 1 << 20, progress: bool = False) -> float:
    """Fraction of the corpus words that lie inside at least one occurrence of a selected n-gram."""
    if stream.num_words == 0:
        return 0.0
    return covered_words(stream, table, selected, workers, chunk_positions, progress) / stream.num_words


def covered_words(stream: CorpusStream, table: NgramCounts, selected: dict[int, np.ndarray], workers: int,
                  chunk_positions: int = 1 << 20, progress: bool = False) -> int:
    """Number of the stream's words that lie inside at least one occurrence of a selected n-gram.

    `selected[n]` holds indices into `table.keys[n]`. Where the level passes stored per-position
    n-gram indices this is a table look-up per position; the longest length, which has no such
    file, is matched by key, only where its prefix starts a selected n-gram.
    """
    if stream.num_words == 0:
        return 0
    positions = Positions(stream, frequent_words(stream, table.min_count)[1])
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
    bar = progress_bar("coverage", stream.length, " pos", progress)
    for start, (inside, first_reach, reach) in zip(range(0, stream.length, chunk_positions), ordered_map(
            covered_in_chunk, range(0, stream.length, chunk_positions), workers)):
        # Matches from earlier chunks add the first positions that the chunk's own do not cover.
        head = np.arange(min(carried, len(first_reach)))
        covered += inside + int((first_reach[:len(head)] <= head).sum())
        size = min(chunk_positions, stream.length - start)
        carried = max(carried, reach) - size
        bar.update(size)
    bar.close()
    return covered
