"""Perplexity of a masked language model on held-out sequences, one unit masked at a time.

A unit is `token` (the paper's single-token perplexity, §4.2 and Table 4), `word` or a masking
unit set NAME; each masked copy hides exactly one unit (or, with `spacing` K, every K-th chosen
unit: another measure) and scores its original tokens; perplexity = exp(mean NLL). Units are
sampled from (seed, sequence index) alone, so every model on the same corpus and seed is scored
on the same tokens, and every token's NLL is kept (`ScoredTokens`) for `pmi-jax compare` to
pair runs. Details: docs/design.md, "Module notes", perplexity.py.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
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
    import tensorflow as tf
    from pmi_jax.formats import prepared_corpus

    paths = prepared_corpus.PreparedCorpus(data_dir).files(split)
    feature = unit_feature(unit) if unit else None
    names = [prepared_corpus.INPUT_IDS] + ([feature] if feature else [])
    spec = {n: tf.io.RaggedFeature(dtype=tf.int64, row_splits_dtype=tf.int64) for n in names}
    dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
    if max_sequences is not None:
        dataset = dataset.take(max_sequences)
    with prepared_corpus.reading(data_dir):  # a shard whose bytes changed is named
        for features in dataset.as_numpy_iterator():
            ids = features[prepared_corpus.INPUT_IDS]
            yield (ids, features[feature]) if feature else ids


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


def _masked_copies(sequences: Iterable, *, seq_len: int, special_ids, mask_id: int, pad_id: int,
                   positions: int | None, seed: int, spacing: int = 0
                   ) -> Iterator[tuple[int, np.ndarray, list[list[np.ndarray]], np.ndarray]]:
    """Per sequence: (index, ids [k, seq_len], the units masked in each of the k copies, original ids [T]).

    `sequences` yields input_ids (token units) or (input_ids, unit ids) pairs.
    """
    special = np.asarray(sorted(special_ids))
    for index, item in enumerate(sequences):
        ids_T, units_T = (item, None) if isinstance(item, np.ndarray) else item
        if len(ids_T) > seq_len:
            raise UserInputError(f"sequence {index} has {len(ids_T)} tokens, more than the {seq_len} expected")
        units = _units_of(ids_T, units_T, special)
        if positions is not None and len(units) > positions:
            rng = np.random.default_rng([seed, index])  # (seed, sequence) alone: the same units for every run
            units = [units[i] for i in np.sort(rng.choice(len(units), size=positions, replace=False))]
        if not units:
            continue
        groups = _groups(units, spacing)
        ids_KxL = np.full([len(groups), seq_len], pad_id, np.int32)
        ids_KxL[:, :len(ids_T)] = ids_T
        for k, group in enumerate(groups):
            ids_KxL[k, np.concatenate(group)] = mask_id
        yield index, ids_KxL, groups, ids_T


def _width(n: int) -> int:
    """Masked positions per row, rounded up to a power of two so that few shapes compile."""
    return 1 << max(0, n - 1).bit_length()


def _batches(copies, batch_size: int, pad_id: int):
    """Fixed-size batches of masked rows: (ids [B, L], positions [B, P], targets [B, P], weights [B, P], rows).

    `rows` names each real row as (sequence index, masked positions, unit of each, units masked);
    padding rows and padding slots have weight 0.
    """
    pending = []  # (sequence index, ids_L, masked positions, targets, unit (first position) of each)
    for index, ids_KxL, groups, ids_T in copies:
        for k, group in enumerate(groups):
            masked = np.concatenate(group)
            unit_of = np.concatenate([np.full(len(u), u[0]) for u in group])
            pending.append((index, ids_KxL[k], masked, ids_T[masked], unit_of, len(group)))
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


@functools.partial(jax.jit, static_argnames=("model",))
def masked_nll(model: BertForMaskedLM, params, input_ids_BxL, positions_BxP, targets_BxP, pad_id):
    """Negative log-likelihood [B, P] of each row's original tokens at its masked positions."""
    input_mask_BxL = (input_ids_BxL != pad_id).astype(jnp.int32)
    logits_BxPxV = model.apply({"params": params}, input_ids_BxL, input_mask_BxL, deterministic=True,
                               positions_BxP=positions_BxP)
    log_probs_BxPxV = jax.nn.log_softmax(logits_BxPxV, axis=-1)
    return -jnp.take_along_axis(log_probs_BxPxV, targets_BxP[..., None], axis=-1)[..., 0]


def unit_perplexity(model: BertForMaskedLM, params, sequences: Iterable, *, seq_len: int, special_ids,
                    mask_id: int, pad_id: int, positions: int | None = None, seed: int = 0,
                    batch_size: int = 64, spacing: int = 0) -> PerplexityResult:
    """exp(mean NLL) of the tokens of each chosen unit when that unit alone is masked.

    `sequences` yields input_ids (each non-special token a unit) or (input_ids, unit ids) pairs.
    `spacing` K > 0 trades exactness for K-fold fewer forward passes: each copy masks every K-th
    chosen unit of the sequence at once (so masked units have at least K-1 chosen units between
    them), and every chosen unit is still scored exactly once.
    """
    num_sequences = 0

    def counted():
        nonlocal num_sequences
        for item in sequences:
            num_sequences += 1
            yield item

    copies = _masked_copies(counted(), seq_len=seq_len, special_ids=special_ids, mask_id=mask_id, pad_id=pad_id,
                            positions=positions, seed=seed, spacing=spacing)
    columns = {"sequence": [], "position": [], "unit": [], "nll": []}
    num_units = 0
    for ids_BxL, positions_BxP, targets_BxP, weights_BxP, rows in _batches(copies, batch_size, pad_id):
        nll_BxP = np.asarray(masked_nll(model, params, ids_BxL, positions_BxP, targets_BxP, pad_id), np.float64)
        for b, (index, masked, unit_of, count) in enumerate(rows):
            columns["sequence"].append(np.full(len(masked), index))
            columns["position"].append(masked)
            columns["unit"].append(unit_of)  # a unit is named by its first position
            columns["nll"].append(nll_BxP[b, :len(masked)])
            num_units += count
    if not num_units:
        raise UserInputError("no non-special tokens to score")
    scores = ScoredTokens(*(np.concatenate(columns[k]) for k in ("sequence", "position", "unit", "nll")))
    order_N = np.lexsort((scores.position_N, scores.sequence_N))  # spacing groups units out of order
    scores = ScoredTokens(*(a[order_N] for a in (scores.sequence_N, scores.position_N, scores.unit_N, scores.nll_N)))
    mean_nll = float(np.mean(scores.nll_N))
    return PerplexityResult(math.exp(mean_nll), mean_nll, len(scores.nll_N), num_units, num_sequences, scores)


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


def evaluate_checkpoint(path: str, *, data_dir: str | None, split: str, unit: str, positions: int | None,
                        seed: int, max_sequences: int | None, batch_size: int, spacing: int = 0) -> dict:
    """Score one checkpoint with one unit kind: the `eval perplexity` result, as
    `pmi_jax.formats.perplexity_result` writes it (per-token scores and a 95% interval over the
    scored sequences included)."""
    from pmi_jax import checkpoints

    config, params, metadata = checkpoints.restore_for_eval(path)
    data_dir = data_dir or metadata.data_dir
    if not data_dir:
        raise UserInputError(f"checkpoint {path} records no corpus; pass --data")
    corpus = open_corpus_for(data_dir, config, metadata, path)
    check_unit(unit, corpus)
    return score_report(config, params, metadata, path, read_sequences(data_dir, split, max_sequences, unit=unit),
                        seq_len=corpus.seq_len, special_ids=corpus.special_ids, data_dir=data_dir, split=split,
                        unit=unit, positions=positions, seed=seed, max_sequences=max_sequences,
                        batch_size=batch_size, spacing=spacing)


def score_report(config, params, metadata, path: str, sequences: Iterable, *, seq_len: int, special_ids: dict,
                 data_dir: str, split: str, unit: str, positions: int | None, seed: int,
                 max_sequences: int | None, batch_size: int, spacing: int = 0) -> dict:
    """One restored checkpoint scored on `sequences` (as `read_sequences` yields them for `unit`):
    the `eval perplexity` result. Callers that read the held-out text elsewhere (the GPU recipe,
    benchmarks/scheme_compare.py, has no TensorFlow) share this, so their files are the same."""
    from pmi_jax import intervals
    from pmi_jax.formats import perplexity_result

    result = unit_perplexity(
        BertForMaskedLM(config), params, sequences, seq_len=seq_len, special_ids=list(special_ids.values()),
        mask_id=special_ids["mask"], pad_id=special_ids["pad"],
        positions=positions, seed=seed, batch_size=batch_size, spacing=spacing)
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
