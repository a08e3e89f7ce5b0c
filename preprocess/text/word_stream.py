"""The corpus as a stream of int32 word ids on local disk: the input of n-gram counting.

`tokenise_corpus` splits documents into words (preprocess/text/words.py, as byte spans), names each
word by its key (preprocess/text/word_keys.py) and appends int32 word ids to a file, with `SEPARATOR`
after every document so that no n-gram crosses one. Word ids are given in order of first
appearance, so they do not depend on the worker count. See docs/design.md, "Words and n-grams".
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Sequence

import numpy as np

from pmi_jax.preprocess.text.ordered_map import ordered_map
from pmi_jax.preprocess.text.progress import progress_bar
from pmi_jax.preprocess.text.word_keys import SHORT_WORD, WordKeyCollision, same_bytes, word_keys

SEPARATOR = 0  # id written after every document; never a word


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
    in_memory: np.ndarray | None = None  # the ids themselves, for a stream that is never written (one Beam batch)

    def ids(self) -> np.ndarray:
        if self.in_memory is not None:
            return self.in_memory
        if self.length == 0:
            return np.zeros([0], np.int32)
        return np.memmap(self.path, dtype=np.int32, mode="r", shape=(self.length,))



def batch_word_ids(documents: list[str], tokenizer=None):
    """Words of a batch: (keys of its distinct words in order of first appearance, index of each
    word into them, words per document, the bytes of each distinct word's first occurrence as
    (buffer, starts, lengths)). Raises WordKeyCollision where two different words share a key."""
    import tensorflow as tf

    from pmi_jax.preprocess.text.words import split_words_spans

    spans = split_words_spans(documents) if tokenizer is None else tokenizer.word_spans(documents)
    keys = word_keys(spans.buffer, spans.starts, spans.lengths)
    unique, inverse = (t.numpy() for t in tf.unique(keys, out_idx=tf.int32))
    # Distinct words are numbered in order of first appearance, so a word's first occurrence is
    # where the running maximum of the indices grows.
    first = np.flatnonzero(np.diff(np.maximum.accumulate(inverse), prepend=-1))
    long = np.flatnonzero(spans.lengths > SHORT_WORD)
    representative = np.take(first, np.take(inverse, long))
    long_lengths = np.take(spans.lengths, long)
    if not (np.array_equal(long_lengths, np.take(spans.lengths, representative))
            and same_bytes(spans.buffer, np.take(spans.starts, long), np.take(spans.starts, representative),
                            long_lengths)):
        raise WordKeyCollision
    return unique, inverse, spans.row_lengths, (spans.buffer, np.take(spans.starts, first),
                                                np.take(spans.lengths, first))


def tokenise_corpus(files: Sequence[str], work_dir: str, max_n: int, workers: int, progress: bool = False,
                    batch_chars: int = 1_000_000, text_field: str = "text", tokenizer=None) -> CorpusStream:
    """Split every document of `files` into words and write the id stream to `work_dir`.

    Words are split by `split_words_spans` (or by `tokenizer`, a pmi_jax.preprocess.text.hf_tokenizer.HFTokenizer)
    and named by `word_keys`; should two different long words ever share a key, the corpus is read
    again with words as strings throughout.
    """
    try:
        return _tokenise_corpus_by_keys(files, work_dir, max_n, workers, progress, batch_chars, text_field, tokenizer)
    except WordKeyCollision:
        logging.warning("two different words hash alike; reading the corpus again with exact string keys")
        return _tokenise_corpus_by_strings(files, work_dir, max_n, workers, progress, batch_chars, text_field,
                                           tokenizer)


class _StreamWriter:
    """Appends batches of word ids to the id stream, with word counts and corpus sizes."""

    def __init__(self, path: str | None, max_n: int, progress: bool):
        self.path, self.max_n = path, max_n
        self.file = open(path, "wb") if path is not None else None  # None: count only
        self.words: list[bytes] = [b""]
        self.counts = np.zeros([1024], np.int64)
        self.documents = self.length = 0
        self.num_positions = [0] * (max_n + 1)
        self.bar = progress_bar("reading words", None, " words", progress)

    def add(self, local_to_global: np.ndarray, inverse: np.ndarray, lengths: np.ndarray) -> None:
        if len(self.words) > len(self.counts):
            grown = np.zeros([max(len(self.words), 2 * len(self.counts))], np.int64)
            grown[:len(self.counts)] = self.counts
            self.counts = grown
        self.counts[local_to_global] += np.bincount(inverse, minlength=len(local_to_global))
        if self.file is not None:
            self.file.write(with_separators(local_to_global[inverse], lengths).tobytes())
        self.documents += len(lengths)
        self.length += len(inverse) + len(lengths)
        for k in range(1, self.max_n + 1):
            self.num_positions[k] += int(np.maximum(lengths - k + 1, 0).sum())
        self.bar.update(len(inverse))

    def close(self) -> CorpusStream:
        if self.file is not None:
            self.file.close()
        self.bar.close()
        return CorpusStream(path=self.path, length=self.length, words=self.words,
                            word_counts=self.counts[:len(self.words)], documents=self.documents,
                            num_words=self.num_positions[1], num_positions=self.num_positions)


def _tokenise_corpus_by_keys(files, work_dir, max_n, workers, progress, batch_chars, text_field="text",
                             tokenizer=None) -> CorpusStream:
    from pmi_jax.preprocess.text.documents import iter_document_batches

    writer = _StreamWriter(os.path.join(work_dir, "ids.int32") if work_dir is not None else None, max_n, progress)
    vocab: dict[int, int] = {}  # word key -> id
    try:
        for unique, inverse, lengths, (buffer, starts, sizes) in ordered_map(
                functools.partial(batch_word_ids, tokenizer=tokenizer),
                iter_document_batches(files, batch_chars, text_field), workers):
            first_new = len(writer.words)
            local_to_global = np.fromiter((vocab.setdefault(k, len(vocab) + 1) for k in unique.tolist()), np.int32,
                                          len(unique))
            new = local_to_global >= first_new  # new ids are consecutive, in this order
            data = buffer.data
            writer.words.extend(bytes(data[s:s + n]) for s, n in zip(starts[new].tolist(), sizes[new].tolist()))
            # A long word already known under its key must be the word stored for that key.
            known_long = np.flatnonzero(~new & (sizes > SHORT_WORD))
            for i, s, n in zip(local_to_global[known_long].tolist(), starts[known_long].tolist(),
                               sizes[known_long].tolist()):
                if writer.words[i] != data[s:s + n]:
                    raise WordKeyCollision
            writer.add(local_to_global, inverse, lengths)
    finally:
        stream = writer.close()
    return stream


def batch_words_by_strings(batch: list[str], tokenizer=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Words of a batch as strings: (distinct words as bytes in order of first appearance, index of
    each word into them, words per document). Exact, slower than `batch_word_ids`' keys."""
    import tensorflow as tf

    from pmi_jax.preprocess.text.words import split_words_flat

    words, row_splits = split_words_flat(batch) if tokenizer is None else tokenizer.words_flat(batch)
    unique, inverse = tf.unique(words, out_idx=tf.int32)  # in order of first appearance
    return unique.numpy(), inverse.numpy(), np.diff(row_splits)


def _tokenise_corpus_by_strings(files, work_dir, max_n, workers, progress, batch_chars,
                                text_field="text", tokenizer=None) -> CorpusStream:
    """tokenise_corpus with the words of each batch as strings, unique-d by TensorFlow: exact, slower."""
    from pmi_jax.preprocess.text.documents import iter_document_batches

    writer = _StreamWriter(os.path.join(work_dir, "ids.int32") if work_dir is not None else None, max_n, progress)
    vocab: dict[bytes, int] = {}
    try:
        batches = iter_document_batches(files, batch_chars, text_field)
        for unique, inverse, lengths in ordered_map(functools.partial(batch_words_by_strings, tokenizer=tokenizer),
                                                    batches, workers):
            first_new = len(writer.words)
            local_to_global = np.fromiter((vocab.setdefault(w, len(vocab) + 1) for w in unique), np.int32,
                                          len(unique))
            writer.words.extend(unique[local_to_global >= first_new])
            writer.add(local_to_global, inverse, lengths)
    finally:
        stream = writer.close()
    return stream


def count_words(files: Sequence[str], workers: int, text_field: str = "text", progress: bool = False,
                batch_chars: int = 1_000_000) -> dict[str, int]:
    """{word: count} over the corpus, words as `pmi_jax.preprocess.text.words` splits them, on `workers` threads.

    The vocabulary build's reader without its id stream: memory grows with the distinct words,
    not with the corpus. Equal to `preprocess.wordpiece.count_words` over the same documents
    (tests/test_wordpiece.py), which runs the tokenizer in one thread.
    """
    stream = tokenise_corpus(files, None, 1, workers, progress, batch_chars, text_field)
    return {w.decode("utf-8"): c for w, c in zip(stream.words[1:], stream.word_counts[1:].tolist())}


def with_separators(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat word ids of consecutive documents -> the same ids with SEPARATOR after each document."""
    out = np.full([len(ids) + len(lengths)], SEPARATOR, np.int32)
    doc_of_word = np.repeat(np.arange(len(lengths)), lengths)
    out[np.arange(len(ids)) + doc_of_word] = ids
    return out
