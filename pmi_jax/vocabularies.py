"""The WordPiece vocabulary of a model: a seqio Vocabulary over a BERT `vocab.txt`.

One type serves every reader of a trained model's vocabulary (seqio tooling, evaluation and
fine-tuning, its SHA-256 in checkpoints). Encoding is tensorflow_text's lower-casing
BertTokenizer, the project's word splitting; decoding joins `##` pieces and keeps special tokens
but [PAD] visible. Corpus preparation uses `pmi_jax.preprocess.corpus.wordpiece.WordPieceEncoder`
instead (it needs word boundaries); both give the same ids (tests/test_wordpiece.py).
A model pretrained on a corpus prepared with `--tokenizer` encodes with that corpus's
tokenizer.json instead (`TokenizerVocabulary`): fine-tuning must see the ids pretraining saw.
`model_vocabulary` chooses. Details: docs/design.md, "Module notes", vocabularies.py.
"""
from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
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

    def encode_with_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(ids [T] int32, char_start [T], char_end [T]) of each text: each token's characters in
        the text as given (SQuAD cuts answers from them). Text is split at white space, each word
        into pieces; a piece whose offsets do not check out against the normalised word (NFKC
        expansions, say) spans its whole word."""
        words_of = [[(m.start(), m.end()) for m in re.finditer(r"\S+", t)] for t in texts]
        flat = [t[s:e] for t, words in zip(texts, words_of) for s, e in words]
        piece_ids, piece_starts, piece_ends, row_splits = self.encode_words(flat)
        out, w = [], 0
        for text, words in zip(texts, words_of):
            first = row_splits[w]
            starts, ends = [], []
            for word_start, word_end in words:
                begin, end = row_splits[w], row_splits[w + 1]
                pieces = zip(piece_ids[begin:end], piece_starts[begin:end], piece_ends[begin:end])
                for s, e in _word_piece_spans(text[word_start:word_end], pieces, self._tokens, self.unk_id):
                    starts.append(word_start + s)
                    ends.append(word_start + e)
                w += 1
            out.append((piece_ids[first:row_splits[w]].astype(np.int32), np.array(starts, np.int32),
                        np.array(ends, np.int32)))
        return out

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


def _normalized_owner(word: str) -> tuple[bytes, Sequence[int]]:
    """BERT's normalisation of `word` per character, and the character owning each output byte."""
    if word.isascii():  # lower-casing keeps every byte where it was
        return word.lower().encode("ascii"), range(len(word))
    out, owner = [], []
    for i, ch in enumerate(word):
        folded = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", ch).casefold())
        piece = "".join(c for c in folded if unicodedata.category(c) != "Mn").encode("utf-8")
        out.append(piece)
        owner.extend([i] * len(piece))
    return b"".join(out), owner


def _word_piece_spans(word: str, pieces, vocab: Sequence[str], unk_id: int) -> list[tuple[int, int]]:
    """Character span of each (id, start, end) WordPiece within `word`; the whole word where the
    byte offsets do not check out against the normalised word."""
    normalized, owner = _normalized_owner(word)
    spans = []
    for token_id, start, end in pieces:
        text = vocab[token_id][2:] if vocab[token_id].startswith("##") else vocab[token_id]
        ok = 0 <= start < end <= len(normalized) and (
            token_id == unk_id or normalized[start:end] == text.encode("utf-8"))
        if not ok:
            return [(0, len(word))] * len(pieces)
        spans.append((owner[start], owner[end - 1] + 1))
    return spans


class TokenizerVocabulary(WordPieceVocabulary):
    """The vocabulary of a model pretrained on a corpus prepared with `--tokenizer`: text is
    encoded by that tokenizer.json, through `tokenizers` itself, as `corpus prepare` encoded
    the pretraining text (no special tokens added, truncation and padding off, "[SEP]" in the
    text read as text), so fine-tuning sees the same ids. vocab.txt is its tokens by id; the
    two must agree id for id. Special ids ([CLS], [SEP], [PAD]) are looked up by BERT's names,
    which `corpus prepare --tokenizer` requires."""

    def __init__(self, vocab_path: str, tokenizer_json: str, source: str):
        super().__init__(vocab_path)
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # tokenizers raises plain Exception subclasses on a bad file
            raise UserInputError(f"{source}: not a Hugging Face tokenizer.json ({e})") from None
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._tokenizer.encode_special_tokens = True
        self.tokenizer_sha256 = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        if len(vocab) != len(self._tokens) or any(vocab.get(t) != i for i, t in enumerate(self._tokens)):
            raise UserInputError(f"{source} does not hold the tokens of {vocab_path} id for id ({len(vocab)} "
                                 f"tokens against {len(self._tokens)}): not the tokenizer of this vocabulary")

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens): `tokenizers`' own."""
        return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(ids, char_start, char_end) of each text: `tokenizers`' ids and character offsets into the
        text, a token's leading white space left out (a Metaspace or byte-level token may carry the
        space before its word; an answer cut from the offsets should not)."""
        out = []
        for text, encoding in zip(texts, self._tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            starts, ends = [], []
            for start, end in encoding.offsets:
                while start < end and text[start].isspace():
                    start += 1
                starts.append(start)
                ends.append(end)
            out.append((np.array(encoding.ids, np.int32), np.array(starts, np.int32), np.array(ends, np.int32)))
        return out

    def encode_words(self, words: Sequence[str]):
        raise NotImplementedError("TokenizerVocabulary encodes whole texts (encode_batch, encode_with_offsets)")

    def _encode(self, s: str) -> list[int]:
        return self.encode_batch([s])[0]

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError("TokenizerVocabulary encodes in Python (encode_batch); it has no TensorFlow encoder")

    def __eq__(self, other) -> bool:
        return isinstance(other, TokenizerVocabulary) and (other.path, other.tokenizer_sha256) == (
            self.path, self.tokenizer_sha256)

    def __hash__(self) -> int:
        return hash((self._path, self.tokenizer_sha256))

    def __str__(self) -> str:
        return f"TokenizerVocabulary(path={self._path}, size={len(self._tokens)}, model={self._tokenizer.model})"


def model_vocabulary(vocab_path: str, tokenizer_json: str | None = None, source: str = "tokenizer.json"):
    """The vocabulary that encodes text for a trained model: its corpus's tokenizer.json where it
    was prepared with `--tokenizer` (`tokenizer_json`, the file's text), else BERT's uncased
    WordPiece over vocab.txt."""
    if tokenizer_json is None:
        return WordPieceVocabulary(vocab_path)
    return TokenizerVocabulary(vocab_path, tokenizer_json, source)
