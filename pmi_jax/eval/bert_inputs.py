"""Fine-tuning inputs packed as BERT packs them.

`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` with token types 0 then 1, a pair that is too long
being cut one token at a time from the end of the longer side. The ids come from the
pretraining vocabulary (`pmi_jax.vocabularies.WordPieceVocabulary`, checked against the
checkpoint's recorded hash by the command), so fine-tuning sees exactly the token ids the
encoder was pretrained on.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from pmi_jax.vocabularies import WordPieceVocabulary


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


def pack(wordpiece: WordPieceVocabulary, pairs: Sequence[tuple[list[int], list[int] | None]], max_len: int) -> Packed:
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
