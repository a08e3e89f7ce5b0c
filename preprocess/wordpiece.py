"""WordPiece vocabularies (DESIGN §4): load a BERT `vocab.txt`, or train an uncased one; tokenise.

Tokenisation is split in two so that word boundaries stay exact: words come from
`preprocess.words` (tensorflow_text's BasicTokenizer, lower_case=True) and each word is then cut
into pieces by tensorflow_text's WordpieceTokenizer. That composition is exactly what
`tensorflow_text.BertTokenizer(vocab_txt, lower_case=True).tokenize` does, so the ids written
here are the ids any BERT tokenizer with this vocab.txt produces (tests/test_wordpiece.py checks).

Training uses tensorflow_text's own WordPiece learner (the library behind
`bert_vocab_from_dataset`) on word counts from `preprocess.words`, so a trained vocabulary
splits words the same way as tokenisation does.
"""
from __future__ import annotations

import collections
import hashlib
from typing import Iterable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from preprocess.words import split_words_ragged

# Reserved tokens of a trained vocabulary, at ids 0..4 in this order; [PAD] must be id 0 in any.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_SIZE = 30_522
# Below this many occurrences a piece is not worth a vocabulary entry (tensorflow_text's default).
MIN_PIECE_COUNT = 10


def vocab_sha256(tokens: Sequence[str]) -> str:
    return hashlib.sha256(vocab_text(tokens).encode("utf-8")).hexdigest()


def vocab_text(tokens: Sequence[str]) -> str:
    return "".join(t + "\n" for t in tokens)


def write_vocab(path: str, tokens: Sequence[str]) -> None:
    """Write a BERT vocab.txt atomically: a reader never sees half a vocabulary."""
    with storage.atomic_file(path) as f:
        f.write(vocab_text(tokens))


def read_vocab(path: str) -> list[str]:
    """Tokens of a BERT vocab.txt, one per line; the id of a token is its line number.

    The one reader of vocab.txt files (training's seqio vocabulary uses it too). Strict UTF-8:
    a vocabulary whose bytes do not decode is a broken file, not something to guess at.
    """
    if not storage.gfile.exists(path):
        raise UserInputError(f"{path}: no such vocabulary file")
    with storage.gfile.GFile(path, "rb") as f:
        try:
            text = f.read().decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise UserInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    tokens = [t.rstrip("\r") for t in text.split("\n")]
    while tokens and not tokens[-1]:
        tokens.pop()
    return tokens


def load_vocab(path: str) -> list[str]:
    """Read a BERT vocab.txt and check it has what BERT needs (`check_vocab`)."""
    tokens = read_vocab(path)
    check_vocab(tokens, path)
    return tokens


def check_vocab(tokens: Sequence[str], path: str) -> None:
    if not tokens or tokens[0] != "[PAD]":
        raise UserInputError(f"--wordpiece {path}: the first line must be [PAD] (id 0), "
                             f"found {tokens[0] if tokens else 'an empty file'!r}")
    missing = [t for t in SPECIAL_TOKENS if t not in set(tokens)]
    if missing:
        raise UserInputError(f"--wordpiece {path}: special token(s) {' '.join(missing)} missing "
                             f"(a BERT vocab.txt needs {' '.join(SPECIAL_TOKENS)})")
    counts = collections.Counter(tokens)
    duplicated = sorted(t for t, c in counts.items() if c > 1)
    if duplicated:
        raise UserInputError(f"--wordpiece {path}: {len(duplicated)} token(s) appear twice, e.g. {duplicated[0]!r}")
    blank = [i for i, t in enumerate(tokens) if not t.strip() or t != t.strip()]
    if blank:
        raise UserInputError(f"--wordpiece {path}: line {blank[0] + 1} is blank or has surrounding spaces")


def special_ids(tokens: Sequence[str]) -> dict[str, int]:
    """{"pad", "unk", "cls", "sep", "mask"} -> id."""
    index = {t: i for i, t in enumerate(tokens)}
    return {t.strip("[]").lower(): index[t] for t in SPECIAL_TOKENS}


def count_words(document_batches: Iterable[Sequence[str]]) -> collections.Counter:
    """Word frequencies over a corpus, words as `preprocess.words` splits them."""
    counts: collections.Counter = collections.Counter()
    for batch in document_batches:
        words = split_words_ragged(tf.constant(list(batch))).flat_values.numpy()
        unique, freq = np.unique(words, return_counts=True)
        counts.update(dict(zip((w.decode("utf-8") for w in unique), freq.tolist())))
    return counts


def train_vocab(word_counts: collections.Counter, size: int = DEFAULT_SIZE) -> list[str]:
    """An uncased WordPiece vocabulary of at most `size` tokens learned from word counts.

    The learner binary-searches the piece-frequency threshold that gives about `size` tokens.
    When even the lowest threshold (MIN_PIECE_COUNT) gives fewer tokens, as on a small corpus,
    that vocabulary is the answer and the search is skipped: it would end there anyway, after
    a dozen more passes. Deterministic: counts are fed sorted, and the learner breaks ties by token.
    """
    if size <= len(SPECIAL_TOKENS):
        raise UserInputError(f"--wordpiece-size {size}: must exceed the {len(SPECIAL_TOKENS)} special tokens")
    if not word_counts:
        raise UserInputError("cannot train a WordPiece vocabulary: the corpus has no words")
    counts = sorted(word_counts.items())
    reserved = list(SPECIAL_TOKENS)
    floor_vocab = learner.learn(counts, size, reserved, upper_thresh=MIN_PIECE_COUNT, lower_thresh=MIN_PIECE_COUNT)
    if len(floor_vocab) <= size:
        tokens = floor_vocab
    else:
        tokens = learner.learn(counts, size, reserved, lower_thresh=MIN_PIECE_COUNT)
    tokens = list(tokens)[:size]
    check_vocab(tokens, "(trained)")
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
