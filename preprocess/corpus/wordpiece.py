"""WordPiece vocabularies (docs/design.md, "Prepared corpus"): train an uncased one; tokenise.

Reading and writing vocab.txt is `pmi_jax.formats.wordpiece_vocab`. Words come from
`pmi_jax.preprocess.text.words` and are cut into pieces by tensorflow_text's WordpieceTokenizer, which
is exactly `tensorflow_text.BertTokenizer(vocab_txt, lower_case=True)`, so the ids are any BERT
tokenizer's with this vocab.txt (tests/test_wordpiece.py). Training learns what tensorflow_text's
WordPiece learner learns (computed by `pmi_jax.preprocess.corpus.wordpiece_learner`, in linear time) on
word counts from the same words.
"""
from __future__ import annotations

import collections
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from pmi_jax.errors import UserInputError
from pmi_jax.formats.wordpiece_vocab import SPECIAL_TOKENS, check_bert_vocab
from pmi_jax.preprocess.corpus.prepare_config import WORDPIECE_SIZE
from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner
from pmi_jax.preprocess.text.words import split_words_ragged

# Below this many occurrences a piece is not worth a vocabulary entry (tensorflow_text's default).
MIN_PIECE_COUNT = 10


def count_words(document_batches: Iterable[Sequence[str]]) -> collections.Counter:
    """Word frequencies over a corpus, words as `pmi_jax.preprocess.text.words` splits them."""
    counts: collections.Counter = collections.Counter()
    for batch in document_batches:
        words = split_words_ragged(tf.constant(list(batch))).flat_values.numpy()
        unique, freq = np.unique(words, return_counts=True)
        counts.update(dict(zip((w.decode("utf-8") for w in unique), freq.tolist())))
    return counts


def train_vocab(word_counts: collections.Counter, size: int = WORDPIECE_SIZE, workers: int = 1) -> list[str]:
    """An uncased WordPiece vocabulary of at most `size` tokens learned from word counts.

    The learner binary-searches the piece-frequency threshold that gives about `size` tokens.
    When even the lowest threshold (MIN_PIECE_COUNT) gives fewer tokens, as on a small corpus,
    that vocabulary is the answer and the search is skipped: it would end there anyway, after
    a dozen more passes. Deterministic: counts are fed sorted, and the learner breaks ties by token.
    The learner is tensorflow_text's, computed in linear time (`wordpiece_learner`, counting in
    `workers` processes on large inputs): same tokens.
    """
    if size <= len(SPECIAL_TOKENS):
        raise UserInputError(f"--wordpiece-size {size}: must exceed the {len(SPECIAL_TOKENS)} special tokens")
    if not word_counts:
        raise UserInputError("cannot train a WordPiece vocabulary: the corpus has no words")
    with WordPieceLearner(sorted(word_counts.items()), size, SPECIAL_TOKENS, workers=workers) as learner:
        floor_vocab = learner.learn(upper_thresh=MIN_PIECE_COUNT, lower_thresh=MIN_PIECE_COUNT)
        if len(floor_vocab) <= size:
            tokens = floor_vocab
        else:
            tokens = learner.learn(lower_thresh=MIN_PIECE_COUNT)
    tokens = list(tokens)[:size]
    check_bert_vocab(tokens, "(trained)")
    return tokens


class WordPieceEncoder:
    """Words -> WordPiece ids, with the word -> pieces row splits kept so boundaries stay exact."""

    def __init__(self, vocab_txt: str):
        self.vocab_txt = vocab_txt
        self._tokenizer = tf_text.WordpieceTokenizer(vocab_txt, token_out_type=tf.int64, unknown_token="[UNK]")

    def encode_words(self, words: tf.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """[W] word strings -> (ids [P] int64, row_splits [W + 1]: word w is ids[s[w]:s[w+1]])."""
        pieces = self._tokenizer.tokenize(words)
        return pieces.flat_values.numpy(), pieces.row_splits.numpy()

    def encode_documents(self, documents: Sequence[str]) -> list[list[int]]:
        """Plain form for tests and small inputs: the flat ids of each document."""
        words = split_words_ragged(tf.constant(list(documents)))
        ids, word_splits = self.encode_words(words.flat_values)
        doc_splits = word_splits[words.row_splits.numpy()]
        return [ids[doc_splits[i]:doc_splits[i + 1]].tolist() for i in range(len(documents))]
