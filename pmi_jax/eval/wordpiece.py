"""WordPiece for fine-tuning: the pretraining vocabulary, BERT's uncased tokenizer, BERT's packing.

Fine-tuning must see exactly the token ids the encoder was pretrained on, so we run the same
tensorflow_text `BertTokenizer` (lower_case=True) on the corpus's own `vocab.txt`, and refuse a
vocabulary whose SHA-256 differs from the one recorded in the checkpoint. Inputs are packed as
BERT does: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with token types 0 then 1, a pair that
is too long being cut one token at a time from the end of the longer side.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.vocabularies import WordPieceVocabulary

_CHUNK = 4096  # strings per tensorflow_text call: bounded memory on QQP/MNLI-sized inputs


class WordPiece:
    """BERT uncased WordPiece over a `vocab.txt` (token id = line number): the pretraining
    vocabulary (pmi_jax.vocabularies) plus its SHA-256 and the encodings fine-tuning needs."""

    def __init__(self, vocab_path: str):
        vocabulary = WordPieceVocabulary(vocab_path)
        self.path = vocab_path
        self.sha256 = storage.file_sha256(vocab_path)
        self.tokens = vocabulary.tokens
        ids = vocabulary.special_ids
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            ids[name] for name in ("pad", "unk", "cls", "sep", "mask"))
        self._tokenizer = vocabulary.bert_tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens)."""
        out = []
        for begin in range(0, len(texts), _CHUNK):
            ragged = self._tokenizer.tokenize(list(texts[begin:begin + _CHUNK])).merge_dims(1, 2)
            out.extend(ragged.to_list())
        return out

    def encode_words(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """WordPieces of each word, flat: (ids [P], starts [P], ends [P], row_splits [W + 1]).

        start/end are byte offsets into the word *after* BERT's normalisation (case folding,
        NFD, accents stripped); word w owns pieces row_splits[w]:row_splits[w + 1].
        """
        parts, lengths = [], [np.zeros([1], np.int64)]
        for begin in range(0, len(words), _CHUNK):
            ids, starts, ends = self._tokenizer.tokenize_with_offsets(list(words[begin:begin + _CHUNK]))
            ids, starts, ends = (x.merge_dims(1, 2) for x in (ids, starts, ends))
            parts.append([x.flat_values.numpy() for x in (ids, starts, ends)])
            lengths.append(np.diff(ids.row_splits.numpy()))
        flat = [np.concatenate([p[k] for p in parts]) if parts else np.zeros([0], np.int64) for k in range(3)]
        return flat[0], flat[1], flat[2], np.cumsum(np.concatenate(lengths))


def check_matches_checkpoint(wordpiece: WordPiece, metadata: dict, vocab_size: int, checkpoint: str) -> None:
    """This vocabulary is the one the checkpoint was trained on: same SHA-256, same size."""
    expected = metadata.get("vocab_sha256")
    if expected and expected != wordpiece.sha256:
        raise UserInputError(
            f"vocabulary {wordpiece.path} (sha256 {wordpiece.sha256[:12]}) is not the one checkpoint {checkpoint} "
            f"was trained on (sha256 {expected[:12]}); pass that corpus's vocab.txt")
    if wordpiece.vocab_size != vocab_size:
        raise UserInputError(f"vocabulary {wordpiece.path} has {wordpiece.vocab_size} tokens but checkpoint "
                             f"{checkpoint} has vocab_size {vocab_size}")


def truncate_pair(first: list[int], second: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
    """Cut one token at a time from the end of the longer side until both fit (BERT's rule)."""
    first, second = list(first), list(second)
    while len(first) + len(second) > max_tokens:
        (first if len(first) > len(second) else second).pop()
    return first, second


@dataclasses.dataclass
class Packed:
    """Model inputs for N examples, padded to length L (int32)."""

    input_ids_NxL: np.ndarray
    input_mask_NxL: np.ndarray
    token_type_ids_NxL: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return {"input_ids": self.input_ids_NxL, "input_mask": self.input_mask_NxL,
                "token_type_ids": self.token_type_ids_NxL}


def pack(wordpiece: WordPiece, pairs: Sequence[tuple[list[int], list[int] | None]], max_len: int) -> Packed:
    """`[CLS] a [SEP] (b [SEP])` per (a, b), truncated longest-first and padded to `max_len`."""
    n = len(pairs)
    ids_NxL = np.full([n, max_len], wordpiece.pad_id, np.int32)
    types_NxL = np.zeros([n, max_len], np.int32)
    mask_NxL = np.zeros([n, max_len], np.int32)
    for row, (a, b) in enumerate(pairs):
        if b is None:
            a = a[:max_len - 2]
            tokens, types = [wordpiece.cls_id, *a, wordpiece.sep_id], [0] * (len(a) + 2)
        else:
            a, b = truncate_pair(a, b, max_len - 3)
            tokens = [wordpiece.cls_id, *a, wordpiece.sep_id, *b, wordpiece.sep_id]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        ids_NxL[row, :len(tokens)] = tokens
        types_NxL[row, :len(types)] = types
        mask_NxL[row, :len(tokens)] = 1
    return Packed(ids_NxL, mask_NxL, types_NxL)
