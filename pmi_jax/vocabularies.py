"""A seqio Vocabulary over a BERT WordPiece `vocab.txt`, so seqio tooling can show examples.

Encoding runs tensorflow_text's BertTokenizer with lower-casing, the same word splitting as
the rest of the project (`preprocess/words.py`); decoding joins `##` continuation pieces to
the previous token and keeps special tokens visible ([CLS], [SEP], [MASK]) but drops
[PAD], so a decoded masked example reads as text with its masks in place.

BERT has no end-of-sequence id in seqio's sense ([SEP] also separates the documents packed
into one sequence), so `eos_id` is None and decoding never stops early.
"""
from __future__ import annotations

import functools

import seqio
import tensorflow as tf

from pmi_jax.errors import UserInputError
from pmi_jax.formats.wordpiece_vocab import read_vocab

SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


class WordPieceVocabulary(seqio.Vocabulary):
    """BERT WordPiece ids <-> text, in Python and in TensorFlow."""

    def __init__(self, vocab_path: str):
        super().__init__(extra_ids=0)
        self._path = vocab_path
        self._tokens = read_vocab(vocab_path)
        index = {t: i for i, t in enumerate(self._tokens)}
        missing = [t for t in SPECIAL_TOKENS.values() if t not in index]
        if missing:
            raise UserInputError(f"vocabulary {vocab_path}: missing special tokens {' '.join(missing)}")
        self.special_ids = {name: index[token] for name, token in SPECIAL_TOKENS.items()}
        if self.special_ids["pad"] != seqio.vocabularies.PAD_ID:
            raise UserInputError(f"{vocab_path}: [PAD] must be id 0 (line 1), found at id {self.special_ids['pad']}")

    @property
    def path(self) -> str:
        return self._path

    @property
    def tokens(self) -> list[str]:
        return self._tokens

    @property
    def eos_id(self) -> None:
        return None

    @property
    def unk_id(self) -> int:
        return self.special_ids["unk"]

    @property
    def mask_id(self) -> int:
        return self.special_ids["mask"]

    @property
    def _base_vocab_size(self) -> int:
        return len(self._tokens)

    @functools.cached_property
    def bert_tokenizer(self):
        """tensorflow_text's uncased BertTokenizer over these tokens (out-of-vocabulary pieces: [UNK])."""
        import tensorflow_text as tf_text

        table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(self._tokens), tf.range(len(self._tokens), dtype=tf.int64)
            ),
            num_oov_buckets=1,
        )
        return tf_text.BertTokenizer(table, lower_case=True, unknown_token="[UNK]", token_out_type=tf.int64)

    @functools.cached_property
    def _tokens_tf(self) -> tf.Tensor:
        return tf.constant(self._tokens)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        """Text -> int32 ids: a scalar gives [ids], a batch [B] gives ragged [B, ids]."""
        s = tf.convert_to_tensor(s, tf.string)
        pieces_BxWxP = self.bert_tokenizer.tokenize(tf.reshape(s, [-1]))
        if s.shape.rank == 0:
            return tf.cast(pieces_BxWxP.flat_values, tf.int32)
        return tf.cast(pieces_BxWxP.merge_dims(1, 2), tf.int32)

    def _encode(self, s: str) -> list[int]:
        return self._encode_tf(tf.constant(s)).numpy().tolist()

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """int ids [..., L] -> text [...]: the same string as `decode` on every row."""
        ids = tf.cast(ids, tf.int32)
        tokens = tf.gather(self._tokens_tf, ids)
        continues = tf.strings.regex_full_match(tokens, "##.+")
        pieces = tf.where(continues, tf.strings.substr(tokens, 2, -1), tf.strings.join([" ", tokens]))
        pieces = tf.where(ids == self.pad_id, "", pieces)
        return tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=-1), "^ ", "")

    def _decode(self, ids) -> str:
        text = ""
        for i in ids:
            i = int(i)
            if i == self.pad_id:
                continue
            token = self._tokens[i]
            if token.startswith("##") and len(token) > 2:
                text += token[2:]
            else:
                text += (" " if text else "") + token
        return text

    def __eq__(self, other) -> bool:
        return isinstance(other, WordPieceVocabulary) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self._path)

    def __str__(self) -> str:
        return f"WordPieceVocabulary(path={self._path}, size={len(self._tokens)})"
