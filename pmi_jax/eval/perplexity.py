"""Single-token perplexity of a masked language model on held-out sequences.

For each chosen (sequence, position) holding a non-special token, the model sees the
sequence with exactly that one token replaced by [MASK] (no other corruption) and we score
the original token: perplexity = exp(mean negative log-likelihood) over all chosen positions.
This is the "one token masked at a time" measure, so it does not depend on the masking scheme
a model was trained with, which makes it comparable across schemes.

Positions are either every non-special token (`positions=None`) or a seeded sample of
`positions` of them per sequence, drawn from (seed, sequence index) alone so that batching does
not change which tokens are scored. Rows (one masked copy of a sequence each) are packed
`batch_size` at a time into one jitted forward pass, which computes the MLM head at the masked
position only, not over the whole sequence and vocabulary.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.model import BertForMaskedLM


@dataclasses.dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    mean_nll: float  # nats per token
    num_tokens: int
    num_sequences: int


def read_sequences(data_dir: str, split: str = "validation", max_sequences: int | None = None) -> Iterator[np.ndarray]:
    """The `input_ids` of each sequence of a prepared corpus split, in shard order."""
    import tensorflow as tf
    from pmi_jax.formats import prepared_corpus

    paths = prepared_corpus.PreparedCorpus(data_dir).files(split)
    spec = {prepared_corpus.INPUT_IDS: tf.io.RaggedFeature(dtype=tf.int64, row_splits_dtype=tf.int64)}
    dataset = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
    if max_sequences is not None:
        dataset = dataset.take(max_sequences)
    with prepared_corpus.reading(data_dir):  # a shard whose bytes changed is named
        for features in dataset.as_numpy_iterator():
            yield features[prepared_corpus.INPUT_IDS]


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


def _masked_copies(sequences: Iterable[np.ndarray], *, seq_len: int, special_ids, mask_id: int, pad_id: int,
                   positions: int | None, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per sequence: (ids [k, seq_len] each with one [MASK], masked positions [k], original ids [k])."""
    special = np.asarray(sorted(special_ids))
    for index, ids_T in enumerate(sequences):
        if len(ids_T) > seq_len:
            raise UserInputError(f"sequence {index} has {len(ids_T)} tokens, more than the {seq_len} expected")
        chosen_K = np.nonzero(~np.isin(ids_T, special))[0]
        if positions is not None and len(chosen_K) > positions:
            rng = np.random.default_rng([seed, index])
            chosen_K = np.sort(rng.choice(chosen_K, size=positions, replace=False))
        if not len(chosen_K):
            continue
        ids_KxL = np.full([len(chosen_K), seq_len], pad_id, np.int32)
        ids_KxL[:, :len(ids_T)] = ids_T
        ids_KxL[np.arange(len(chosen_K)), chosen_K] = mask_id
        yield ids_KxL, chosen_K.astype(np.int32), ids_T[chosen_K].astype(np.int32)


def _batches(copies, batch_size: int, pad_id: int):
    """Regroup per-sequence copies into fixed-size batches; the last is padded with weight 0."""
    pending, count = [], 0
    for block in copies:
        pending.append(block)
        count += len(block[1])
        while count >= batch_size:
            ids, pos, tgt = (np.concatenate(parts) for parts in zip(*pending))
            yield ids[:batch_size], pos[:batch_size], tgt[:batch_size], np.ones([batch_size], np.float32)
            pending, count = [(ids[batch_size:], pos[batch_size:], tgt[batch_size:])], count - batch_size
    if count:
        ids, pos, tgt = (np.concatenate(parts) for parts in zip(*pending))
        fill = batch_size - count
        weights = np.concatenate([np.ones([count], np.float32), np.zeros([fill], np.float32)])
        yield (np.concatenate([ids, np.full([fill, ids.shape[1]], pad_id, ids.dtype)]),
               np.pad(pos, (0, fill)), np.pad(tgt, (0, fill)), weights)


def _logits_at(module: BertForMaskedLM, input_ids_BxL, input_mask_BxL, positions_B):
    """The MLM logits [B, V] at one position per row: the model's head on the gathered states only,
    so that the vocabulary projection runs on B vectors instead of B·L."""
    hidden_BxLxD = module.encoder(input_ids_BxL, input_mask_BxL, deterministic=True)
    hidden_Bx1xD = jnp.take_along_axis(hidden_BxLxD, positions_B[:, None, None], axis=1)
    return module.predict(hidden_Bx1xD)[:, 0]


@functools.partial(jax.jit, static_argnames=("model",))
def masked_token_nll(model: BertForMaskedLM, params, input_ids_BxL, positions_B, targets_B, pad_id):
    """Negative log-likelihood [B] of each row's original token at its masked position."""
    input_mask_BxL = (input_ids_BxL != pad_id).astype(jnp.int32)
    logits_BxV = model.apply({"params": params}, input_ids_BxL, input_mask_BxL, positions_B, method=_logits_at)
    log_probs_BxV = jax.nn.log_softmax(logits_BxV, axis=-1)
    return -jnp.take_along_axis(log_probs_BxV, targets_B[:, None], axis=-1)[:, 0]


def single_token_perplexity(model: BertForMaskedLM, params, sequences: Iterable[np.ndarray], *, seq_len: int,
                            special_ids, mask_id: int, pad_id: int, positions: int | None = None, seed: int = 0,
                            batch_size: int = 64) -> PerplexityResult:
    """exp(mean NLL) of each chosen non-special token when it alone is masked."""
    num_sequences = 0

    def counted():
        nonlocal num_sequences
        for ids_T in sequences:
            num_sequences += 1
            yield ids_T

    copies = _masked_copies(counted(), seq_len=seq_len, special_ids=special_ids, mask_id=mask_id, pad_id=pad_id,
                            positions=positions, seed=seed)
    total_nll, num_tokens = 0.0, 0
    for ids_BxL, positions_B, targets_B, weights_B in _batches(copies, batch_size, pad_id):
        nll_B = masked_token_nll(model, params, ids_BxL, positions_B, targets_B, pad_id)
        total_nll += float(np.sum(np.asarray(nll_B, np.float64) * weights_B))
        num_tokens += int(weights_B.sum())
    if not num_tokens:
        raise UserInputError("no non-special tokens to score")
    mean_nll = total_nll / num_tokens
    return PerplexityResult(math.exp(mean_nll), mean_nll, num_tokens, num_sequences)

