"""The optax chain of BERT pretraining: clip, AdamW with masked weight decay, warmup + decay.

Gradient accumulation is not an optax wrapper here: `pmi_jax.train` scans over
micro-batches inside one jitted step and applies this optimizer once to the summed
gradient, so one optimizer step is one data step, and the checkpointed data position is
simply the step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from pmi_jax.config import OptimizerConfig

# Parameter leaf names that are biases or LayerNorm gains/offsets: no weight decay
# (Devlin et al.'s AdamWeightDecayOptimizer excludes "LayerNorm" and "bias").
_NO_DECAY_LEAVES = ("bias", "scale", "output_bias")


def learning_rate_schedule(config: OptimizerConfig, num_steps: int) -> optax.Schedule:
    """0 -> peak linearly over `warmup_steps`, then peak -> 0 linearly at `num_steps`."""
    warmup = optax.linear_schedule(0.0, config.peak_learning_rate, config.warmup_steps)
    decay = optax.linear_schedule(config.peak_learning_rate, 0.0, max(num_steps - config.warmup_steps, 1))
    return optax.join_schedules([warmup, decay], boundaries=[config.warmup_steps])


def weight_decay_mask(params):
    """True for the leaves that get weight decay: every weight matrix and embedding table."""

    def decays(path, _):
        return getattr(path[-1], "key", None) not in _NO_DECAY_LEAVES

    return jax.tree_util.tree_map_with_path(decays, params)


# Elements: biases, LayerNorm parameters, position embeddings and BERT-base's [768, 768]
# projections. XLA copies larger gradients to concatenate them: grouping BERT-large's [1024, 1024]
# ones added 0.57 GiB per H100 step, BERT-base's [768, 3072] ones 0.4 (benchmarks/README.md).
_SMALL_LEAF = 768 * 768


def global_norm(tree, grouped: bool = False) -> jax.Array:
    """The square root of the sum of every leaf's squares: optax.tree.norm.

    `grouped` reduces all leaves of up to `_SMALL_LEAF` elements in one kernel, where optax
    takes one or two each (177 of BERT-base's 202 leaves; a GPU pays for every kernel launch).
    Only for replicated leaves: concatenating sharded ones would gather them (`pmi_jax.train`
    decides).
    """
    if not grouped:
        return optax.tree.norm(tree)
    leaves = jax.tree.leaves(tree)
    small = [x.ravel() for x in leaves if x.size <= _SMALL_LEAF]
    squares = optax.tree.norm([x for x in leaves if x.size > _SMALL_LEAF], squared=True)
    if small:  # a dot: XLA splits the sum of a concatenation back into one reduction per part
        flat = jnp.concatenate(small)
        squares = squares + jnp.dot(flat, flat, precision=jax.lax.Precision.HIGHEST)
    return jnp.sqrt(squares)


def clip_by_global_norm(max_norm: float, grouped: bool = False) -> optax.GradientTransformation:
    """optax.clip_by_global_norm, with the norm of `global_norm(..., grouped)`."""
    if not grouped:
        return optax.clip_by_global_norm(max_norm)

    def update(updates, state, params=None):
        del params
        norm = global_norm(updates, grouped=True)
        keep = norm < max_norm
        return jax.tree.map(lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def adamw(config: OptimizerConfig, learning_rate: float | optax.Schedule,
          grouped_norm: bool = False) -> optax.GradientTransformation:
    """Gradient clipping (`clip_by_global_norm`), then AdamW with BERT's weight-decay mask, at `learning_rate`.

    Pretraining passes its schedule (`make_optimizer`); fine-tuning passes 1.0 and scales the
    update by a traced learning rate in its step, so that every learning rate of its grid
    shares one compiled step (`pmi_jax.eval.finetune`).
    """
    transform = optax.adamw(learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
                            weight_decay=config.weight_decay, mask=weight_decay_mask)
    if config.grad_clip_norm > 0:
        return optax.chain(clip_by_global_norm(config.grad_clip_norm, grouped_norm), transform)
    return transform


def make_optimizer(config: OptimizerConfig, num_steps: int, grouped_norm: bool = False) -> optax.GradientTransformation:
    """Pretraining's optimizer: `adamw` on `learning_rate_schedule`."""
    return adamw(config, learning_rate_schedule(config, num_steps), grouped_norm)
