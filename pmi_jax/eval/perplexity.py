"""Perplexity of a masked language model on held-out sequences, one unit masked at a time.

A unit is `token` (the paper's single-token perplexity, §4.2 and Table 4), `word` or a masking
unit set NAME; each masked copy hides exactly one unit (or, with `spacing` K, every K-th chosen
unit: another measure) and scores its original tokens; perplexity = exp(mean NLL). Units are
sampled from (seed, sequence index) alone, so every model on the same corpus and seed is scored
on the same tokens, and every token's NLL is kept (`ScoredTokens`) for `pmi-jax compare` to
pair runs. Details: docs/design.md, "Module notes", perplexity.py.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import logging
import math
from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.model import BertForMaskedLM

TOKEN, WORD = "token", "word"  # the unit kinds that need no unit set; any other is a corpus unit set


@dataclasses.dataclass(frozen=True, eq=False)
class ScoredTokens:
    """One entry per scored token, in scoring order (sequence, then unit, then position)."""
    sequence_N: np.ndarray  # int: the sequence's index in its split (shard order)
    position_N: np.ndarray  # int: the token's position in that sequence
    unit_N: np.ndarray  # int: the unit's id within the sequence (the position itself for `token`)
    nll_N: np.ndarray  # float64: negative log-likelihood of the original token, nats

    def digest(self, spacing: int = 0) -> str:
        """A fingerprint of which tokens were scored, and how (not of their scores): equal for every
        run scored on the same corpus, split, unit kind, seed and spacing."""
        h = hashlib.sha256(f"spacing={spacing};".encode() if spacing else b"")
        for a in (self.sequence_N, self.position_N, self.unit_N):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        return h.hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class PerplexityResult:
    perplexity: float
    mean_nll: float  # nats per scored token
    num_tokens: int
    num_units: int
    num_sequences: int
    scores: ScoredTokens


def unit_feature(unit: str) -> str | None:
    """The prepared-corpus feature that holds a unit kind's ids (None for `token`)."""
    from pmi_jax.formats import prepared_corpus

    if unit == TOKEN:
        return None
    return prepared_corpus.WORD_IDS if unit == WORD else prepared_corpus.units_feature(unit)


def check_unit(unit: str, corpus) -> str:
    """`unit` if the corpus can be scored with it; else a one-line error naming the choices."""
    if unit in (TOKEN, WORD) or unit in corpus.unit_names:
        return unit
    raise UserInputError(f"--unit {unit}: {corpus.data_dir} has no unit set {unit!r} (choices: token, word"
                         + "".join(f", {n}" for n in corpus.unit_names) + ")")


def read_sequences(data_dir: str, split: str = "validation", max_sequences: int | None = None,
                   unit: str | None = None) -> Iterator:
    """The `input_ids` of each sequence of a prepared corpus split, in shard order; with `unit`
    other than token, (input_ids, unit ids) pairs, the unit ids -1 on special tokens."""
    for ids, by_unit in read_unit_sequences(data_dir, split, max_sequences, (unit,) if unit else ()):
        yield (ids, by_unit[unit]) if unit in by_unit else ids


def read_unit_sequences(data_dir: str, split: str = "validation", max_sequences: int | None = None,
                        units: tuple[str, ...] = ()) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """(input_ids, {unit: unit ids}) of each sequence of a split, in shard order: one read for every
    unit kind of `units` (`token` needs no ids and has no entry)."""
    import tensorflow as tf
    from pmi_jax.formats import prepared_corpus

    paths = prepared_corpus.PreparedCorpus(data_dir).files(split)
    features = {unit: unit_feature(unit) for unit in units if unit_feature(unit)}
    names = [prepared_corpus.INPUT_IDS, *dict.fromkeys(features.values())]
    spec = {n: tf.io.RaggedFeature(dtype=tf.int64, row_splits_dtype=tf.int64) for n in names}
    dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
    if max_sequences is not None:
        dataset = dataset.take(max_sequences)
    with prepared_corpus.reading(data_dir):  # a shard whose bytes changed is named
        for parsed in dataset.as_numpy_iterator():
            yield parsed[prepared_corpus.INPUT_IDS], {unit: parsed[name] for unit, name in features.items()}


def open_corpus_for(data_dir: str, config, metadata, checkpoint: str):
    """The prepared corpus at `data_dir`, checked against the model that will score it.

    Its vocab.txt must be the one the checkpoint recorded (`metadata`, a CheckpointMetadata)
    and have the model's vocab_size; its sequences must fit the model's position embeddings.
    """
    from pmi_jax.formats import prepared_corpus, run_dir

    corpus = prepared_corpus.PreparedCorpus(data_dir)
    run_dir.vocabulary_for(metadata, checkpoint, config.vocab_size, data_dir=data_dir, flag="--data")
    if corpus.seq_len > config.max_position_embeddings:
        raise UserInputError(f"--data {data_dir}: sequences of {corpus.seq_len} tokens, the model takes at most "
                             f"{config.max_position_embeddings}")
    return corpus


def _units_of(ids_T: np.ndarray, units_T: np.ndarray | None, special: np.ndarray) -> list[np.ndarray]:
    """The token positions of each unit of one sequence, in order of first position."""
    content_T = ~np.isin(ids_T, special)
    if units_T is None:
        return [np.array([p]) for p in np.nonzero(content_T)[0]]
    if len(units_T) != len(ids_T):
        raise UserInputError(f"a sequence has {len(ids_T)} input_ids but {len(units_T)} unit ids")
    scored_T = content_T & (units_T >= 0)
    positions = np.nonzero(scored_T)[0]
    ids, first = np.unique(units_T[positions], return_index=True)
    return [positions[units_T[positions] == ids[i]] for i in np.argsort(first)]


def _groups(units: list[np.ndarray], spacing: int) -> list[list[np.ndarray]]:
    """The units masked together in one copy: each alone (spacing 0), or every `spacing`-th unit."""
    if not spacing:
        return [[u] for u in units]
    return [units[g::spacing] for g in range(min(spacing, len(units)))]


def _masked_copy(index: int, ids_T: np.ndarray, units_T: np.ndarray | None, *, seq_len: int, special: np.ndarray,
                 mask_id: int, pad_id: int, positions: int | None, seed: int, spacing: int = 0):
    """(index, ids [k, seq_len], the units masked in each of the k copies, original ids [T]) of one
    sequence (units_T None: token units), or None when it has nothing to score."""
    if len(ids_T) > seq_len:
        raise UserInputError(f"sequence {index} has {len(ids_T)} tokens, more than the {seq_len} expected")
    units = _units_of(ids_T, units_T, special)
    if positions is not None and len(units) > positions:
        rng = np.random.default_rng([seed, index])  # (seed, sequence) alone: the same units for every run
        units = [units[i] for i in np.sort(rng.choice(len(units), size=positions, replace=False))]
    if not units:
        return None
    groups = _groups(units, spacing)
    ids_KxL = np.full([len(groups), seq_len], pad_id, np.int32)
    ids_KxL[:, :len(ids_T)] = ids_T
    for k, group in enumerate(groups):
        ids_KxL[k, np.concatenate(group)] = mask_id
    return index, ids_KxL, groups, ids_T


def _masked_copies(sequences: Iterable, *, seq_len: int, special_ids, mask_id: int, pad_id: int,
                   positions: int | None, seed: int, spacing: int = 0
                   ) -> Iterator[tuple[int, np.ndarray, list[list[np.ndarray]], np.ndarray]]:
    """Per sequence: (index, ids [k, seq_len], the units masked in each of the k copies, original ids [T]).

    `sequences` yields input_ids (token units) or (input_ids, unit ids) pairs.
    """
    special = np.asarray(sorted(special_ids))
    for index, item in enumerate(sequences):
        ids_T, units_T = (item, None) if isinstance(item, np.ndarray) else item
        copy = _masked_copy(index, ids_T, units_T, seq_len=seq_len, special=special, mask_id=mask_id, pad_id=pad_id,
                            positions=positions, seed=seed, spacing=spacing)
        if copy:
            yield copy


def _width(n: int) -> int:
    """Masked positions per row, rounded up to a power of two so that few shapes compile."""
    return 1 << max(0, n - 1).bit_length()


def _rows(index: int, ids_KxL: np.ndarray, groups, ids_T: np.ndarray) -> list[tuple]:
    """One row per masked copy: (sequence index, ids_L, masked positions, targets, unit (first
    position) of each, units masked)."""
    rows = []
    for k, group in enumerate(groups):
        masked = np.concatenate(group)
        unit_of = np.concatenate([np.full(len(u), u[0]) for u in group])
        rows.append((index, ids_KxL[k], masked, ids_T[masked], unit_of, len(group)))
    return rows


def _batches(copies, batch_size: int, pad_id: int):
    """Fixed-size batches of masked rows: (ids [B, L], positions [B, P], targets [B, P], weights [B, P], rows).

    `rows` names each real row as (sequence index, masked positions, unit of each, units masked);
    padding rows and padding slots have weight 0.
    """
    pending = []
    for copy in copies:
        pending += _rows(*copy)
        while len(pending) >= batch_size:
            yield _stack(pending[:batch_size], batch_size, pad_id)
            pending = pending[batch_size:]
    if pending:
        yield _stack(pending, batch_size, pad_id)


def _stack(rows, batch_size: int, pad_id: int):
    width = _width(max(len(r[2]) for r in rows))
    seq_len = len(rows[0][1])
    ids_BxL = np.full([batch_size, seq_len], pad_id, np.int32)
    positions_BxP = np.zeros([batch_size, width], np.int32)
    targets_BxP = np.zeros([batch_size, width], np.int32)
    weights_BxP = np.zeros([batch_size, width], np.float32)
    for b, (_, ids_L, masked, targets, _, _) in enumerate(rows):
        ids_BxL[b] = ids_L
        positions_BxP[b, :len(masked)] = masked
        targets_BxP[b, :len(masked)] = targets
        weights_BxP[b, :len(masked)] = 1.0
    return ids_BxL, positions_BxP, targets_BxP, weights_BxP, [(r[0], r[2], r[4], r[5]) for r in rows]


def _encoder_states(model: BertForMaskedLM, input_ids_BxL, input_mask_BxL):
    return model.encoder(input_ids_BxL, input_mask_BxL, deterministic=True)


@functools.partial(jax.jit, static_argnames=("model",))
def encode_at(model: BertForMaskedLM, params, input_ids_BxL, positions_BxW, pad_id):
    """The encoder's last hidden states [B, W, D] at each row's `positions`, without dropout.

    The gather stays in the encoder's program, as in the model's own forward pass with
    positions: XLA:CPU fuses it with the last LayerNorm, and the states (so the NLLs) are then
    bitwise those of that one-program forward, whatever W and the rows beside (tests/test_perplexity.py).
    """
    input_mask_BxL = (input_ids_BxL != pad_id).astype(jnp.int32)
    hidden_BxLxD = model.apply({"params": params}, input_ids_BxL, input_mask_BxL, method=_encoder_states)
    return jnp.take_along_axis(hidden_BxLxD, positions_BxW[..., None], axis=1)


@functools.partial(jax.jit, static_argnames=("model",))
def head_nll(model: BertForMaskedLM, params, hidden_BxPxD, targets_BxP):
    """Negative log-likelihood [B, P] of the original tokens under the MLM head on the hidden states
    at the masked positions."""
    logits_BxPxV = model.apply({"params": params}, hidden_BxPxD, method=BertForMaskedLM.predict)
    log_probs_BxPxV = jax.nn.log_softmax(logits_BxPxV, axis=-1)
    return -jnp.take_along_axis(log_probs_BxPxV, targets_BxP[..., None], axis=-1)[..., 0]


class _SharedRows:
    """Masked rows through the encoder once each, whichever unit kinds mask them (a one-token word
    is a token unit too), `batch_size` distinct rows per pass. A row's states are kept at position
    0 and its masked positions (all its head reads) until every batch that holds it is scored."""

    def __init__(self, model: BertForMaskedLM, params, pad_id: int, batch_size: int, seq_len: int):
        self.model, self.params, self.pad_id, self.batch_size, self.seq_len = model, params, pad_id, batch_size, seq_len
        self.queue: list[tuple[bytes, np.ndarray, np.ndarray]] = []  # (key, ids_L, masked), not yet encoded
        self.states: dict[bytes, np.ndarray] = {}  # key -> states [1 + masked, D]
        self.holders: collections.Counter = collections.Counter()  # key -> batches that hold it, unscored
        self.rows = self.passes = 0

    def hold(self, ids_L: np.ndarray, masked: np.ndarray) -> bytes:
        """The row's key (its ids and masked positions), queued for the encoder unless held already."""
        key = ids_L.astype(np.int32).tobytes() + np.asarray(masked, np.int32).tobytes()  # ids_L: fixed length
        if not self.holders[key]:
            self.queue.append((key, ids_L, masked))
        self.holders[key] += 1
        return key

    def encode_queued(self, flush: bool = False) -> None:
        """Full batches of queued rows (with `flush`, the last part-filled one too)."""
        while len(self.queue) >= self.batch_size or (flush and self.queue):
            chunk, self.queue = self.queue[:self.batch_size], self.queue[self.batch_size:]
            ids_BxL = np.full([self.batch_size, self.seq_len], self.pad_id, np.int32)
            positions_BxW = np.zeros([self.batch_size, _width(1 + max(len(m) for _, _, m in chunk))], np.int32)
            for b, (_, ids_L, masked) in enumerate(chunk):
                ids_BxL[b], positions_BxW[b, 1:1 + len(masked)] = ids_L, masked
            hidden_BxWxD = np.asarray(encode_at(self.model, self.params, ids_BxL, positions_BxW, self.pad_id))
            for b, (key, _, masked) in enumerate(chunk):
                self.states[key] = hidden_BxWxD[b, :1 + len(masked)]
            self.rows, self.passes = self.rows + len(chunk), self.passes + 1

    def hidden(self, keys: list[bytes], width: int) -> np.ndarray | None:
        """[B, width, D] as the head reads it for these rows (padding slots read position 0), or None
        while one is still queued."""
        if any(key not in self.states for key in keys):
            return None
        first = self.states[keys[0]]
        hidden_BxPxD = np.empty([len(keys), width, first.shape[-1]], first.dtype)
        for b, key in enumerate(keys):
            states = self.states[key]
            hidden_BxPxD[b, :len(states) - 1] = states[1:]
            hidden_BxPxD[b, len(states) - 1:] = states[0]
        return hidden_BxPxD

    def release(self, keys: list[bytes]) -> None:
        for key in keys:
            self.holders[key] -= 1
            if not self.holders[key]:
                del self.holders[key], self.states[key]


class _UnitKind:
    """One unit kind's rows, in exactly the batches it forms scored alone (`_batches`): the head's
    batch [B, P] is part of the computation (its width P changes the last bits of an NLL), so each
    kind keeps its own, and only the encoder's rows are shared."""

    def __init__(self, batch_size: int, pad_id: int):
        self.batch_size, self.pad_id = batch_size, pad_id
        self.pending: list[tuple[tuple, bytes]] = []  # (row as `_rows` makes it, its key)
        self.formed: list[tuple[tuple, list[bytes]]] = []  # (`_stack`ed batch, key of each of its B rows)
        self.columns = {"sequence": [], "position": [], "unit": [], "nll": []}
        self.num_units = 0

    def add(self, rows: list[tuple], shared: _SharedRows) -> None:
        self.pending += [(row, shared.hold(row[1], row[2])) for row in rows]
        while len(self.pending) >= self.batch_size:
            self._form(shared)

    def close(self, shared: _SharedRows) -> None:
        """The last, part-filled batch; its padding rows are all [PAD] (one more row to encode)."""
        if self.pending:
            self._form(shared)

    def _form(self, shared: _SharedRows) -> None:
        chunk, self.pending = self.pending[:self.batch_size], self.pending[self.batch_size:]
        keys = [key for _, key in chunk]
        padding = np.full(shared.seq_len, self.pad_id, np.int32)
        keys += [shared.hold(padding, np.zeros(0, np.int32)) for _ in range(self.batch_size - len(chunk))]
        self.formed.append((_stack([row for row, _ in chunk], self.batch_size, self.pad_id), keys))

    def score_ready(self, shared: _SharedRows) -> None:
        """The formed batches whose rows are encoded, in order."""
        while self.formed:
            (_, positions_BxP, targets_BxP, _, rows), keys = self.formed[0]
            hidden_BxPxD = shared.hidden(keys, positions_BxP.shape[1])
            if hidden_BxPxD is None:
                return
            nll_BxP = np.asarray(head_nll(shared.model, shared.params, hidden_BxPxD, targets_BxP), np.float64)
            for b, (index, masked, unit_of, count) in enumerate(rows):
                self.columns["sequence"].append(np.full(len(masked), index))
                self.columns["position"].append(masked)
                self.columns["unit"].append(unit_of)  # a unit is named by its first position
                self.columns["nll"].append(nll_BxP[b, :len(masked)])
                self.num_units += count
            shared.release(keys)
            self.formed.pop(0)

    def result(self, num_sequences: int) -> PerplexityResult:
        if not self.num_units:
            raise UserInputError("no non-special tokens to score")
        c = self.columns
        scores = ScoredTokens(*(np.concatenate(c[k]) for k in ("sequence", "position", "unit", "nll")))
        order_N = np.lexsort((scores.position_N, scores.sequence_N))  # spacing groups units out of order
        scores = ScoredTokens(*(a[order_N] for a in (scores.sequence_N, scores.position_N, scores.unit_N,
                                                     scores.nll_N)))
        mean_nll = float(np.mean(scores.nll_N))
        return PerplexityResult(math.exp(mean_nll), mean_nll, len(scores.nll_N), self.num_units, num_sequences,
                                scores)


def unit_perplexities(model: BertForMaskedLM, params, sequences: Iterable, *, units: tuple[str, ...], seq_len: int,
                      special_ids, mask_id: int, pad_id: int, positions: int | None = None, seed: int = 0,
                      batch_size: int = 64, spacing: int = 0) -> dict[str, PerplexityResult]:
    """`unit_perplexity` of every unit kind of `units` in one pass over `sequences`, which yields
    (input_ids, {unit: unit ids}) as `read_unit_sequences` does (no ids: token units).

    Each kind's numbers are exactly those it gets scored alone: its masked copies are batched as
    alone, while a copy that several kinds make (a one-token word is also a token unit) goes
    through the encoder once, so three kinds cost about half the encoder passes of three runs.
    """
    special = np.asarray(sorted(special_ids))
    shared = _SharedRows(model, params, pad_id, batch_size, seq_len)
    kinds = {unit: _UnitKind(batch_size, pad_id) for unit in units}
    num_sequences = 0
    for index, (ids_T, by_unit) in enumerate(sequences):
        num_sequences += 1
        for unit, kind in kinds.items():
            copy = _masked_copy(index, ids_T, by_unit.get(unit), seq_len=seq_len, special=special, mask_id=mask_id,
                                pad_id=pad_id, positions=positions, seed=seed, spacing=spacing)
            if copy:
                kind.add(_rows(*copy), shared)
        shared.encode_queued()
        for kind in kinds.values():
            kind.score_ready(shared)
    for kind in kinds.values():
        kind.close(shared)
    shared.encode_queued(flush=True)
    for kind in kinds.values():
        kind.score_ready(shared)
    logging.info("%s: %d distinct masked rows in %d encoder passes", ", ".join(units), shared.rows, shared.passes)
    return {unit: kind.result(num_sequences) for unit, kind in kinds.items()}


def unit_perplexity(model: BertForMaskedLM, params, sequences: Iterable, *, seq_len: int, special_ids,
                    mask_id: int, pad_id: int, positions: int | None = None, seed: int = 0,
                    batch_size: int = 64, spacing: int = 0) -> PerplexityResult:
    """exp(mean NLL) of the tokens of each chosen unit when that unit alone is masked.

    `sequences` yields input_ids (each non-special token a unit) or (input_ids, unit ids) pairs.
    `spacing` K > 0 trades exactness for K-fold fewer forward passes: each copy masks every K-th
    chosen unit of the sequence at once (so masked units have at least K-1 chosen units between
    them), and every chosen unit is still scored exactly once.
    """
    return unit_perplexities(model, params, _keyed(sequences, "unit"), units=("unit",), seq_len=seq_len,
                             special_ids=special_ids, mask_id=mask_id, pad_id=pad_id, positions=positions, seed=seed,
                             batch_size=batch_size, spacing=spacing)["unit"]


def _keyed(sequences: Iterable, unit: str) -> Iterator[tuple[np.ndarray, dict]]:
    """input_ids or (input_ids, unit ids) items as (input_ids, {unit: unit ids})."""
    for item in sequences:
        yield (item, {}) if isinstance(item, np.ndarray) else (item[0], {unit: item[1]})


def single_token_perplexity(model: BertForMaskedLM, params, sequences: Iterable[np.ndarray], **kwargs
                            ) -> PerplexityResult:
    """exp(mean NLL) of each chosen non-special token when it alone is masked (the paper's Table 4 measure)."""
    return unit_perplexity(model, params, sequences, **kwargs)


def multi_token_subset(scores: ScoredTokens) -> np.ndarray:
    """Boolean [N]: the scored tokens that belong to units of two or more tokens (for `word`: the
    words WordPiece splits into several pieces)."""
    keys_N = scores.sequence_N.astype(np.int64) * (1 << 32) + scores.unit_N
    _, inverse, counts = np.unique(keys_N, return_inverse=True, return_counts=True)
    return counts[inverse] >= 2


def evaluate_checkpoint(path: str, *, data_dir: str | None, split: str, units: tuple[str, ...],
                        positions: int | None, seed: int, max_sequences: int | None, batch_size: int,
                        spacing: int = 0) -> list[dict]:
    """Score one checkpoint with each unit kind of `units`: one restore, one read of the split and
    one pass (`unit_perplexities`); per kind, the `eval perplexity` result as
    `pmi_jax.formats.perplexity_result` writes it (per-token scores and a 95% interval over the
    scored sequences included)."""
    from pmi_jax import checkpoints

    config, params, metadata = checkpoints.restore_for_eval(path)
    data_dir = data_dir or metadata.data_dir
    if not data_dir:
        raise UserInputError(f"checkpoint {path} records no corpus; pass --data")
    corpus = open_corpus_for(data_dir, config, metadata, path)
    for unit in units:
        check_unit(unit, corpus)
    return score_reports(config, params, metadata, path, read_unit_sequences(data_dir, split, max_sequences, units),
                         units=units, seq_len=corpus.seq_len, special_ids=corpus.special_ids, data_dir=data_dir,
                         split=split, positions=positions, seed=seed, max_sequences=max_sequences,
                         batch_size=batch_size, spacing=spacing)


def score_report(config, params, metadata, path: str, sequences: Iterable, *, unit: str, **kwargs) -> dict:
    """`score_reports` of one unit kind, `sequences` as `read_sequences` yields them for `unit`."""
    return score_reports(config, params, metadata, path, _keyed(sequences, unit), units=(unit,), **kwargs)[0]


def score_reports(config, params, metadata, path: str, sequences: Iterable, *, units: tuple[str, ...], seq_len: int,
                  special_ids: dict, data_dir: str, split: str, positions: int | None, seed: int,
                  max_sequences: int | None, batch_size: int, spacing: int = 0) -> list[dict]:
    """One restored checkpoint scored on `sequences` (as `read_unit_sequences` yields them): the
    `eval perplexity` result of each unit kind. Callers that read the held-out text elsewhere (the
    GPU recipe, benchmarks/scheme_compare.py, has no TensorFlow) share this, so their files are the same."""
    results = unit_perplexities(
        BertForMaskedLM(config), params, sequences, units=units, seq_len=seq_len,
        special_ids=list(special_ids.values()), mask_id=special_ids["mask"], pad_id=special_ids["pad"],
        positions=positions, seed=seed, batch_size=batch_size, spacing=spacing)
    return [_report(results[unit], metadata, path, data_dir=data_dir, split=split, unit=unit, positions=positions,
                    seed=seed, max_sequences=max_sequences, spacing=spacing) for unit in units]


def _report(result: PerplexityResult, metadata, path: str, *, data_dir: str, split: str, unit: str,
            positions: int | None, seed: int, max_sequences: int | None, spacing: int) -> dict:
    from pmi_jax import intervals
    from pmi_jax.formats import perplexity_result

    s = result.scores
    _, sums_S, counts_S = intervals.per_sequence(s.sequence_N, s.nll_N)
    interval = intervals.mean_interval(sums_S, counts_S)
    report = {"checkpoint": path, "step": metadata.step, "scheme": metadata.run_scheme,
              "train_seed": metadata.config.get("train", {}).get("seed"),
              "data": data_dir, "split": split, "unit": unit,
              "positions": "all" if positions is None else positions, "seed": seed, "max_sequences": max_sequences,
              "spacing": spacing,
              "perplexity": result.perplexity, "mean_nll": result.mean_nll,
              "interval": {"confidence": intervals.CONFIDENCE, "over": "scored sequences (bootstrap)",
                           "mean_nll": [interval.low, interval.high],
                           "perplexity": [math.exp(interval.low), math.exp(interval.high)]},
              "num_tokens": result.num_tokens, "num_units": result.num_units,
              "num_sequences": result.num_sequences}
    if unit != TOKEN:
        multi_N = multi_token_subset(s)
        if multi_N.any():
            report["multi_token"] = {"mean_nll": float(np.mean(s.nll_N[multi_N])),
                                     "perplexity": math.exp(float(np.mean(s.nll_N[multi_N]))),
                                     "num_tokens": int(multi_N.sum())}
    report["scored_set"] = s.digest(spacing)
    report["scores"] = perplexity_result.encode_scores(s.sequence_N, s.position_N, s.unit_N, s.nll_N)
    return report
