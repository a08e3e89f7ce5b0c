"""The WordPiece vocabulary of a model: a seqio Vocabulary over a BERT `vocab.txt`.

One type serves every reader of a trained model's vocabulary (seqio tooling, evaluation and
fine-tuning, its SHA-256 in checkpoints). Encoding is tensorflow_text's lower-casing
BertTokenizer, the project's word splitting; decoding joins `##` pieces and keeps special tokens
but [PAD] visible. Corpus preparation uses `preprocess.corpus.wordpiece.WordPieceEncoder`
instead (it needs word boundaries); both give the same ids (tests/test_wordpiece.py). Details:
docs/design.md, "Module notes", vocabularies.py.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import seqio
import tensorflow as tf

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import wordpiece_vocab

_CHUNK = 4096  # strings per tensorflow_text call in batched encoding: bounded memory on QQP/MNLI-sized inputs


class WordPieceVocabulary(seqio.Vocabulary):
    """BERT WordPiece ids <-> text, in Python and in TensorFlow."""

    def __init__(self, vocab_path: str):
        super().__init__(extra_ids=0)
        self._path = vocab_path
        self._tokens = wordpiece_vocab.read_vocab(vocab_path)
        self.special_ids = wordpiece_vocab.special_ids(self._tokens, f"vocabulary {vocab_path}")
        self.cls_id, self.sep_id = self.special_ids["cls"], self.special_ids["sep"]  # what BERT's packing adds
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

    @functools.cached_property
    def sha256(self) -> str:
        """What checkpoints record as `vocab_sha256` (formats.wordpiece_vocab.check_matches_checkpoint)."""
        return storage.file_sha256(self._path)

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

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens), in chunks so memory stays bounded."""
        out = []
        for begin in range(0, len(texts), _CHUNK):
            ragged = self.bert_tokenizer.tokenize(list(texts[begin:begin + _CHUNK])).merge_dims(1, 2)
            out.extend(ragged.to_list())
        return out

    def encode_words(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """WordPieces of each word, flat: (ids [P], starts [P], ends [P], row_splits [W + 1]).

        start/end are byte offsets into the word *after* BERT's normalisation (case folding,
        NFD, accents stripped), which is what SQuAD needs to map answers back to the text;
        word w owns pieces row_splits[w]:row_splits[w + 1].
        """
        parts, lengths = [], [np.zeros([1], np.int64)]
        for begin in range(0, len(words), _CHUNK):
            ids, starts, ends = self.bert_tokenizer.tokenize_with_offsets(list(words[begin:begin + _CHUNK]))
            ids, starts, ends = (x.merge_dims(1, 2) for x in (ids, starts, ends))
            parts.append([x.flat_values.numpy() for x in (ids, starts, ends)])
            lengths.append(np.diff(ids.row_splits.numpy()))
        flat = [np.concatenate([p[k] for p in parts]) if parts else np.zeros([0], np.int64) for k in range(3)]
        return flat[0], flat[1], flat[2], np.cumsum(np.concatenate(lengths))

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
