"""Word splitting (docs/design.md, "Words and n-grams"): a word is what BERT's uncased basic tokenizer yields.

We run tensorflow_text's own BasicTokenizer (the one inside BertTokenizer) rather than a
re-implementation, so that the words counted for the masking vocabulary are exactly the words
that WordPiece later sees when the corpus is prepared and at training time. It case-folds
with NFKC_Casefold, applies NFD, strips combining marks, turns control and format characters
into spaces, and makes every punctuation character and every CJK ideograph a word of its own.

`split_words_spans` yields the same words without a string per word, for the vocabulary
build: ASCII text by a byte-class rule that equals the tokenizer there, the rest by the
tokenizer (see the section comment below).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np
import tensorflow as tf
# BasicTokenizer is not re-exported at the package top level; BertTokenizer uses this class.
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

_TOKENIZER = BasicTokenizer(lower_case=True)


def split_words_ragged(documents: Sequence[str] | tf.Tensor) -> tf.RaggedTensor:
    """[documents] strings -> [documents, (words)] UTF-8 bytes; usable inside tf.data too."""
    return _TOKENIZER.tokenize(documents)


@functools.cache
def _traced_split_words():
    """The tokenizer as one traced call: eager, its dozens of ops cost milliseconds of dispatch."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def split(documents):
        words = split_words_ragged(documents)
        return words.flat_values, words.row_splits

    return split


def split_words_flat(documents: Sequence[str | bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Words of a batch as (flat array of bytes objects, row_splits int64 [documents + 1])."""
    if not documents:
        return np.zeros([0], dtype=object), np.zeros([1], dtype=np.int64)
    flat, row_splits = _traced_split_words()(tf.constant(list(documents), tf.string))
    return flat.numpy(), row_splits.numpy()


def split_words(documents: Sequence[str]) -> list[list[str]]:
    """Convenience form for tests and small inputs: lists of str words per document."""
    flat, splits = split_words_flat(documents)
    words = [w.decode("utf-8") for w in flat]
    return [words[splits[i]:splits[i + 1]] for i in range(len(splits) - 1)]


# ---------------------------------------------------------------------------------------------
# The same words as byte spans, fast on ASCII text.
#
# On ASCII, tensorflow_text's BasicTokenizer reduces to a byte-class rule (measured character by
# character; tests/test_words_spans.py holds it to the tokenizer on random text): every control
# character (0-31, 127) and the space separate words, letters and digits form words (lower-cased),
# and every other printable character (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~) is a word of its own.
# That rule runs as a few numpy passes over the bytes of a whole batch, without a Python or
# TensorFlow string per word, which is most of the tokenizer's cost.
#
# Text with other characters is left to the tokenizer, one *chunk* at a time: a chunk is a maximal
# run of bytes other than the separators above. A separator is a single-byte UTF-8 character that
# Unicode normalisation never composes with a neighbour and case folding leaves alone, and the
# tokenizer turns it into a split point, so the words of a document are the words of its chunks in
# order, and only chunks holding a non-ASCII byte need the tokenizer.

SPAN_PADDING = 8  # zero bytes after the last word of WordSpans.buffer, so 8-byte loads at any word start stay inside


@dataclasses.dataclass
class WordSpans:
    """Words of a batch of documents as spans of one byte buffer: word i is
    `buffer[starts[i]:starts[i] + lengths[i]]`; the words of document d are the row_lengths[d]
    words after those of the documents before it. `buffer` ends with SPAN_PADDING zero bytes."""

    buffer: np.ndarray  # uint8
    starts: np.ndarray  # int64 [words]
    lengths: np.ndarray  # int64 [words]
    row_lengths: np.ndarray  # int64 [documents]

    def words(self) -> list[bytes]:
        data = self.buffer.tobytes()
        return [data[s:s + n] for s, n in zip(self.starts.tolist(), self.lengths.tolist())]


def _in_range(raw: np.ndarray, first: int, last: int) -> np.ndarray:
    """first <= raw <= last, in one subtraction (uint8 wraps around) and one comparison."""
    return (raw - np.uint8(first)) <= np.uint8(last - first)


def split_words_spans(documents: Sequence[str]) -> WordSpans:
    """The words of `split_words_flat(documents)`, as byte spans (see the section comment above)."""
    encoded = list(map(str.encode, documents))
    # One b"\n" (a separator) after every document keeps words inside their document.
    doc_ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)) + 1)
    text = b"\n".join(encoded + [bytes(SPAN_PADDING)])
    raw = np.frombuffer(text, np.uint8)
    non_ascii = np.flatnonzero(raw >= 128)
    buffer = raw | (_in_range(raw, ord("A"), ord("Z")).view(np.uint8) * np.uint8(32))  # lower-cased
    is_word = _in_range(buffer, ord("a"), ord("z")) | _in_range(raw, ord("0"), ord("9"))
    is_punctuation = _in_range(raw, 33, 126) & ~is_word
    chunks = None
    if len(non_ascii):
        chunks = _tokenizer_chunks(raw, non_ascii)
        inside = _span_indices(*chunks)
        is_word[inside] = False
        is_punctuation[inside] = False
    # A word starts at punctuation or at a letter/digit after something else; likewise for ends.
    # Byte 0 is never padding, and the text ends with a separator.
    starts = np.flatnonzero(is_punctuation[1:] | (is_word[1:] & ~is_word[:-1])) + 1
    if is_word[0] or is_punctuation[0]:
        starts = np.concatenate([[0], starts])
    lengths = np.flatnonzero(is_punctuation[:-1] | (is_word[:-1] & ~is_word[1:])) + 1 - starts
    row_lengths = np.diff(np.searchsorted(starts, doc_ends), prepend=0)
    if chunks is not None:
        buffer, starts, lengths, chunk_words_per_document = _insert_chunk_words(text, buffer, starts, lengths, *chunks,
                                                                                doc_ends)
        row_lengths += chunk_words_per_document
    return WordSpans(buffer=buffer, starts=starts, lengths=lengths, row_lengths=row_lengths)


def _tokenizer_chunks(raw: np.ndarray, non_ascii: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the chunks that hold the non-ASCII bytes at `non_ascii`, in text order."""
    separators = np.flatnonzero((raw <= np.uint8(32)) | (raw == np.uint8(127)))  # the text ends with one
    after = np.unique(np.searchsorted(separators, non_ascii))  # index of the separator ending each chunk
    starts = np.where(after > 0, separators[np.maximum(after - 1, 0)] + 1, 0)
    return starts, separators[after]


def _span_indices(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Every index inside the spans [starts[i], ends[i]), concatenated."""
    lengths = ends - starts
    return np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)


def _insert_chunk_words(text: bytes, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                        chunk_starts: np.ndarray, chunk_ends: np.ndarray, doc_ends: np.ndarray):
    """Tokenise the chunks with tensorflow_text, append their words to the buffer, and place them
    among the ASCII words at their chunks' positions. Also returns the chunk words per document."""
    chunks = [text[s:e] for s, e in zip(chunk_starts.tolist(), chunk_ends.tolist())]
    flat, row_splits = split_words_flat(chunks)
    words, row_lengths = flat.tolist(), np.diff(row_splits)
    chunk_lengths = np.fromiter(map(len, words), np.int64, len(words))
    base = len(buffer) - SPAN_PADDING
    buffer = np.concatenate([buffer[:base], np.frombuffer(b"".join(words + [bytes(SPAN_PADDING)]), np.uint8)])
    # No ASCII word starts inside a chunk, so each chunk's words go before the first ASCII word after it.
    ascii_before_chunk = np.searchsorted(starts, chunk_starts).tolist()
    words_before = np.concatenate([[0], np.cumsum(row_lengths)])
    merged = [_interleave(ascii_values, chunk_values, ascii_before_chunk, words_before.tolist())
              for ascii_values, chunk_values in ((starts, base + np.cumsum(chunk_lengths) - chunk_lengths),
                                                 (lengths, chunk_lengths))]
    per_document = np.diff(words_before[np.searchsorted(chunk_starts, doc_ends)], prepend=0)
    return (buffer, *merged, per_document)


def _interleave(ascii_values: np.ndarray, chunk_values: np.ndarray, ascii_before_chunk: list[int],
                words_before: list[int]) -> np.ndarray:
    """ascii_values with the values of chunk c, chunk_values[words_before[c]:words_before[c + 1]],
    inserted before ascii_values[ascii_before_chunk[c]]: copies of slices, a few per chunk, which
    beats scattering every word when chunks are few (text that is mostly ASCII)."""
    pieces = []
    previous = 0
    for chunk, cut in enumerate(ascii_before_chunk):
        pieces += [ascii_values[previous:cut], chunk_values[words_before[chunk]:words_before[chunk + 1]]]
        previous = cut
    pieces.append(ascii_values[previous:])
    return np.concatenate(pieces)
