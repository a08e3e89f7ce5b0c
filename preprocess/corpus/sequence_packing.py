"""Packing documents into `[CLS] … [SEP]` sequences of at most seq_len tokens (docs/design.md, "Prepared corpus").

Documents are laid back to back in one stream (RoBERTa's FULL-SENTENCES, no next-sentence task):
each sequence holds C = seq_len - 2 content slots between its [CLS] and [SEP]. A document
starts right after the previous one, behind a separating [SEP], when the open sequence has room
for that [SEP] and at least one token; otherwise the open sequence is closed and the document
starts a new one. A document longer than the room left runs on into the next sequence.

Per token the packer carries a word-start flag and, per masking vocabulary, a unit-start flag;
it numbers words and units afresh in each sequence, so a word or unit cut by a sequence boundary
becomes two. The output does not depend on how the document stream is cut into batches.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np

from pmi_jax.formats import prepared_corpus


class SequencePacker:
    """Streams batches of tokenised documents in, complete packed sequences out."""

    def __init__(self, seq_len: int, cls_id: int, sep_id: int, unit_names: Sequence[str]):
        if seq_len < 8:
            raise ValueError(f"seq_len {seq_len} < 8")
        self.capacity = seq_len - 2
        self.cls_id, self.sep_id = cls_id, sep_id
        self.unit_names = list(unit_names)
        self._carry = self._empty()  # the open, partly filled sequence
        self.tokens = 0  # non-special tokens emitted
        self.multiword_tokens = dict.fromkeys(self.unit_names, 0)

    def _empty(self) -> dict[str, np.ndarray]:
        arrays = {"ids": np.zeros(0, np.int64), "word_start": np.zeros(0, bool), "special": np.zeros(0, bool)}
        arrays.update({name: np.zeros(0, bool) for name in self.unit_names})
        return arrays

    def add(self, ids: np.ndarray, word_start: np.ndarray, unit_start: Mapping[str, np.ndarray],
            doc_splits: np.ndarray) -> Iterator[dict[str, np.ndarray]]:
        """Add documents; yield the sequences they complete, as {feature: int64 [T]}.

        ids, word_start, unit_start[name]: per token of the batch, [T]; doc_splits: [D + 1].
        """
        src = self._source(ids, word_start, unit_start)
        token_slots, sep_slots, end = self._layout(len(self._carry["ids"]), np.diff(doc_splits))
        num_seq = -(-end // self.capacity)
        closed = num_seq if end % self.capacity == 0 else num_seq - 1
        matrix = self._gather(src, token_slots, sep_slots, num_seq * self.capacity)
        yield from self._emit(matrix, closed)
        self._carry = self._empty()
        if closed < num_seq:
            filled = matrix["filled"][closed]
            self._carry = {k: matrix[k][closed][filled] for k in self._carry}

    def finish(self) -> Iterator[dict[str, np.ndarray]]:
        """Close the open sequence, if any."""
        carry_len = len(self._carry["ids"])
        if carry_len:
            no_units = {n: np.zeros(0, bool) for n in self.unit_names}
            src = self._source(np.zeros(0, np.int64), np.zeros(0, bool), no_units)
            yield from self._emit(self._gather(src, np.arange(carry_len), np.zeros(0, np.int64), self.capacity), 1)
        self._carry = self._empty()

    def _source(self, ids, word_start, unit_start) -> dict[str, np.ndarray]:
        """Entries to lay out: the open sequence's, then the batch's tokens, then one [SEP] entry."""
        c = self._carry
        src = {
            "ids": np.concatenate([c["ids"], ids, [self.sep_id]]).astype(np.int64),
            "word_start": np.concatenate([c["word_start"], word_start, [False]]),
            "special": np.concatenate([c["special"], np.zeros(len(ids), bool), [True]]),
        }
        for name in self.unit_names:
            src[name] = np.concatenate([c[name], unit_start[name], [False]])
        return src

    def _layout(self, carry_len: int, doc_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Slots of the open sequence's and the batch's tokens, slots of new separators, first free slot.

        Slot k is position k % C of sequence k // C, counted from the open sequence.
        """
        capacity = self.capacity
        doc_slot = np.empty(len(doc_lengths), np.int64)  # slot of each document's first token
        sep_slots = []
        pos = carry_len
        for d, length in enumerate(doc_lengths.tolist()):
            room = capacity - pos % capacity
            if length and room < capacity:  # the open sequence holds tokens already
                if room >= 2:
                    sep_slots.append(pos)
                    pos += 1
                else:
                    pos += room
            doc_slot[d] = pos
            pos += length
        first_token = np.cumsum(doc_lengths) - doc_lengths
        batch_slots = np.repeat(doc_slot - first_token, doc_lengths) + np.arange(int(doc_lengths.sum()))
        return np.concatenate([np.arange(carry_len), batch_slots]), np.asarray(sep_slots, np.int64), pos

    def _gather(self, src: dict[str, np.ndarray], token_slots: np.ndarray, sep_slots: np.ndarray,
                total: int) -> dict[str, np.ndarray]:
        """[S, C] matrices of the laid-out entries, plus `filled` marking the used slots."""
        sep_entry = len(src["ids"]) - 1
        index = np.full(total, -1, np.int64)
        index[token_slots] = np.arange(len(token_slots))
        index[sep_slots] = sep_entry
        filled = index >= 0
        safe = np.where(filled, index, sep_entry)
        matrix = {k: v[safe].reshape(-1, self.capacity) for k, v in src.items()}
        matrix["filled"] = filled.reshape(-1, self.capacity)
        return matrix

    def _emit(self, matrix: dict[str, np.ndarray], count: int) -> Iterator[dict[str, np.ndarray]]:
        filled = matrix["filled"][:count]
        token = filled & ~matrix["special"][:count]
        word_ids = _number_within_rows(matrix["word_start"][:count], token)
        units = {name: _number_within_rows(matrix[name][:count], token) for name in self.unit_names}
        self.tokens += int(token.sum())
        for name, unit_ids in units.items():
            self.multiword_tokens[name] += _multiword_token_count(unit_ids, word_ids)
        ids = matrix["ids"][:count]
        for row in range(count):
            keep = filled[row]
            features = {prepared_corpus.INPUT_IDS: _frame(ids[row][keep], self.cls_id, self.sep_id),
                        prepared_corpus.WORD_IDS: _frame(word_ids[row][keep], -1, -1)}
            for name in self.unit_names:
                features[prepared_corpus.units_feature(name)] = _frame(units[name][row][keep], -1, -1)
            yield features


def _frame(values: np.ndarray, first: int, last: int) -> np.ndarray:
    return np.concatenate([[first], values, [last]]).astype(np.int64)


def _number_within_rows(starts_SxC: np.ndarray, token_SxC: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... counting starts along each row, a new one forced at a row's first token; -1 off tokens."""
    first_token_SxC = token_SxC & (np.cumsum(token_SxC, axis=1) == 1)
    begins_SxC = (starts_SxC | first_token_SxC) & token_SxC
    return np.where(token_SxC, np.cumsum(begins_SxC, axis=1) - 1, -1)


def _multiword_token_count(unit_ids_SxC: np.ndarray, word_ids_SxC: np.ndarray) -> int:
    """Tokens whose unit spans two or more words, within each row.

    A unit's tokens are contiguous and its word ids non-decreasing, so a unit is multi-word iff
    its first and last tokens belong to different words.
    """
    token = unit_ids_SxC >= 0
    if not token.any():
        return 0
    units, words = unit_ids_SxC[token], word_ids_SxC[token]  # row-major: rows one after another
    row = np.broadcast_to(np.arange(len(unit_ids_SxC))[:, None], unit_ids_SxC.shape)[token]
    new_unit = np.ones(len(units), dtype=bool)
    new_unit[1:] = (units[1:] != units[:-1]) | (row[1:] != row[:-1])
    first = np.flatnonzero(new_unit)
    last = np.append(first[1:], len(units)) - 1
    multi = words[first] != words[last]
    return int((last - first + 1)[multi].sum())
