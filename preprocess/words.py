"""Word splitting (DESIGN §1): a word is what BERT's uncased basic tokenizer yields.

We run tensorflow_text's own BasicTokenizer (the one inside BertTokenizer) rather than a
re-implementation, so that the words counted for the masking vocabulary are exactly the words
that WordPiece later sees when the corpus is prepared and at training time. It case-folds
with NFKC_Casefold, applies NFD, strips combining marks, turns control and format characters
into spaces, and makes every punctuation character and every CJK ideograph a word of its own.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
# BasicTokenizer is not re-exported at the package top level; BertTokenizer uses this class.
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

_TOKENIZER = BasicTokenizer(lower_case=True)


def split_words_ragged(documents: Sequence[str] | tf.Tensor) -> tf.RaggedTensor:
    """[documents] strings -> [documents, (words)] UTF-8 bytes; usable inside tf.data too."""
    return _TOKENIZER.tokenize(documents)


def split_words_flat(documents: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Words of a batch as (flat array of bytes objects, row_splits int64 [documents + 1])."""
    if not documents:
        return np.zeros([0], dtype=object), np.zeros([1], dtype=np.int64)
    ragged = split_words_ragged(tf.constant(list(documents)))
    return ragged.flat_values.numpy(), ragged.row_splits.numpy()


def split_words(documents: Sequence[str]) -> list[list[str]]:
    """Convenience form for tests and small inputs: lists of str words per document."""
    flat, splits = split_words_flat(documents)
    words = [w.decode("utf-8") for w in flat]
    return [words[splits[i]:splits[i + 1]] for i in range(len(splits) - 1)]
