"""The masked-language-model loss: the MLM head on the masked positions only, and its terms.

The loss and accuracy of a (micro-)batch are sums over its masked tokens divided by the masked
count of the whole global batch, so gradient-accumulation terms add up to the full-batch means.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pmi_jax.config import ExperimentConfig
from pmi_jax.errors import UserInputError


def masked_positions(weights_BxL, num: int):
    """(positions_BxP, weights_BxP): the first `num` positions of each row with a non-zero weight.

    Rows with fewer fill up with weight-0 positions. `jax.lax.top_k` keeps the lower index
    among equal values, so the positions come in order. A row with more than `num` weighted
    positions would lose the rest: the trainer rejects such batches before they get here
    (`check_predictions`).
    """
    _, positions_BxP = jax.lax.top_k((weights_BxL != 0).astype(jnp.int32), num)
    return positions_BxP, jnp.take_along_axis(weights_BxL, positions_BxP, axis=1)


def check_predictions(weights_BxL: np.ndarray, config: ExperimentConfig, step: int) -> None:
    """UserInputError if a sequence has more masked positions than the MLM head gathers."""
    limit = config.model.predictions(config.data.seq_len, config.data.highest_mask_rate)
    most = int(np.max(np.count_nonzero(weights_BxL, axis=1), initial=0))
    if most > limit:
        raise UserInputError(
            f"the batch of step {step} has a sequence with {most} masked positions, more than the MLM head's "
            f"{limit} (model.max_predictions_per_seq={config.model.max_predictions_per_seq}); the masking budget "
            f"is floor({config.data.highest_mask_rate:g}) of the tokens, so this data was masked otherwise: raise "
            "model.max_predictions_per_seq or set it to -1 (every position)")


def _target_logits(logits_BxPxV, targets_BxP):
    """logits[..., target], as a sum of the logits selected where the vocabulary index is the target.

    The same values as `jnp.take_along_axis` (one logit plus zeros), but its gradient is a
    one-hot select that XLA fuses into the softmax's backward pass, where the gather's is a
    scatter into a zero float32 [B, P, V] array: a pass of its own over the logits' size.
    """
    vocab_1x1xV = jax.lax.broadcasted_iota(jnp.int32, (1, 1, logits_BxPxV.shape[-1]), 2)
    return jnp.sum(jnp.where(vocab_1x1xV == targets_BxP[..., None], logits_BxPxV, 0.0), axis=-1)


def mlm_loss_terms(model, params, batch, rng, denominator, deterministic: bool, num_predictions: int | None = None):
    """(loss, accuracy) of one (micro-)batch, both as sums over its masked tokens / `denominator`.

    The MLM head runs on the masked positions only, gathered (`masked_positions`), unless the
    config asks for every position (`max_predictions_per_seq=-1`); the sums are the same,
    since the other positions have weight 0. The denominator is the masked-token count of
    the whole global batch, known before the forward pass, so micro-batch terms add up to
    exactly the full-batch means and no pass over the gradients is needed to normalise them.
    The cross-entropy is optax's `softmax_cross_entropy_with_integer_labels` (logsumexp minus
    the target's logit), with the target's logit taken by `_target_logits`. Accuracy compares
    the target's logit with the maximum over the vocabulary, both of which the cross-entropy
    computes anyway, instead of a separate argmax pass over the logits.
    `num_predictions`: positions gathered per sequence (default: the model config's at 15%).
    """
    targets_BxL, weights_BxL = batch["targets"], batch["weights"]
    num = num_predictions or model.config.predictions(targets_BxL.shape[1])
    positions_BxP = None
    if num < targets_BxL.shape[1]:
        positions_BxP, weights_BxL = masked_positions(weights_BxL, num)
        targets_BxL = jnp.take_along_axis(targets_BxL, positions_BxP, axis=1)
    logits_BxPxV = model.apply({"params": params}, batch["inputs"], batch["input_mask"], deterministic=deterministic,
                               positions_BxP=positions_BxP, rngs={"dropout": rng})
    target_logit_BxP = _target_logits(logits_BxPxV, targets_BxL)
    xent_BxP = jax.nn.logsumexp(logits_BxPxV, axis=-1) - target_logit_BxP
    correct_BxP = jax.lax.stop_gradient(target_logit_BxP >= jnp.max(logits_BxPxV, axis=-1)).astype(jnp.float32)
    return jnp.sum(xent_BxP * weights_BxL) / denominator, jnp.sum(correct_BxP * weights_BxL) / denominator
