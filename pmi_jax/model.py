"""BERT (Devlin et al. 2019) as a Flax module: post-LN encoder and a tied MLM head.

Layout follows the original BERT so that its weights map one to one: word + learned
position + token-type embeddings, LayerNorm, dropout; then per layer self-attention and a
GELU feed-forward block, each wrapped as LayerNorm(x + dropout(block(x))) (post-LN). The
MLM head is dense + GELU + LayerNorm, then a decoder tied to the word embeddings plus an
output bias. There is no next-sentence head (the PMI-Masking paper trains MLM only).

Every parameter carries logical axis names (vocab, embed, heads, kv, mlp, position,
token_type) and activations are constrained by (batch, length, embed, ...); the mapping to
mesh axes is a config choice (`pmi_jax.partitioning`). Outside a mesh-rules context the
constraints are no-ops, so the module also runs as plain Flax on one device.

Shape suffixes: B batch, L length, D hidden, H heads, K head dim, F feed-forward, V vocab.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

from pmi_jax.config import ModelConfig

__all__ = ["ModelConfig", "BertEmbeddings", "SelfAttention", "FeedForward", "BertLayer", "BertEncoder",
           "BertForMaskedLM"]


def _dtype(config: ModelConfig):
    return jnp.dtype(config.dtype)


def _init(config: ModelConfig, *names: str):
    return nn.with_logical_partitioning(nn.initializers.normal(stddev=config.initializer_range), names)


def _zeros(*names: str):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(*names: str):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
    # Statistics in float32 whatever the compute dtype; output in the compute dtype.
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=_dtype(config), param_dtype=jnp.float32,
                        scale_init=_ones("embed"), bias_init=_zeros("embed"), name=name)


def _gelu(x):
    return nn.gelu(x, approximate=False)  # BERT's erf GELU


def _keep_mask(rng, keep_prob: float, shape) -> jax.Array:
    """Bernoulli(keep_prob) of `shape`, using both 32-bit words of every threefry2x32 block.

    `jax.random.bernoulli` with partitionable threefry (JAX's default) runs one
    threefry2x32 block per element and XORs its two output words into one. Here each word
    is the uniform of its own element (adjacent pairs along the last axis), so half the
    blocks are computed; on XLA:CPU, where threefry runs as a rolled loop over the whole
    array, dropout's random bits are its largest cost. Each element still gets 23 random
    bits, turned into a float32 uniform in [0, 1) and compared with keep_prob exactly as
    `jax.random.bernoulli` does, so the keep probability is the same; the masks differ
    from flax's. The counters are element indices, so the mask does not depend on how
    the array is sharded. Falls back to `jax.random.bernoulli` for non-threefry keys, an
    odd last axis, and arrays of 2^33 elements or more (the counter is one 32-bit word).
    """
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        threefry = "threefry" in str(jax.random.key_impl(rng))
        key_data = jax.random.key_data(rng) if threefry else None
    else:
        threefry = rng.shape == (2,) and jax.config.jax_default_prng_impl == "threefry2x32"
        key_data = rng
    half = (*shape[:-1], shape[-1] // 2)
    if not threefry or shape[-1] % 2 or math.prod(half) >= 2**32:
        return jax.random.bernoulli(rng, p=keep_prob, shape=shape)
    counter = jax.lax.iota(jnp.uint32, math.prod(half)).reshape(half)
    bits1, bits2 = threefry2x32_p.bind(key_data[0], key_data[1], jnp.zeros_like(counter), counter)
    bits = jnp.stack([bits1, bits2], axis=-1).reshape(shape)
    uniform = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return uniform < keep_prob


class Dropout(nn.Dropout):
    """Inverted dropout like `nn.Dropout`, cheaper on CPU; same rate, same RNG stream name.

    The mask comes from `_keep_mask` (half the random-number work of flax's). It is
    applied as (inputs * mask) / keep_prob, the same numbers as flax's select between
    inputs / keep_prob and zero, but a plain elementwise product, which XLA fuses into the
    neighbouring matmul and softmax (forward and backward) where the select kept a separate
    pass over the [B, H, L, L] attention probabilities.
    """

    @nn.compact
    def __call__(self, inputs, deterministic: bool | None = None, rng=None):
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep_prob = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        keep = _keep_mask(rng, keep_prob, inputs.shape)
        return inputs * keep.astype(inputs.dtype) / jnp.asarray(keep_prob, inputs.dtype)


@jax.custom_vjp
def _add_output_bias(logits_BxLxV, bias_V):
    """logits + bias, whose bias gradient is a matrix-vector product instead of a reduction.

    The gradient of the bias is the sum of the [B, L, V] logit gradients over B and L. As a
    reduction over the leading axes XLA:CPU runs it several times slower than reading the
    array once; as ones[B, L] . g[B, L, V] it is a GEMV at memory speed (the same sum,
    accumulated in a different order). On accelerators the two are equivalent.
    """
    return logits_BxLxV + bias_V


def _add_output_bias_fwd(logits_BxLxV, bias_V):
    return logits_BxLxV + bias_V, None


def _add_output_bias_bwd(_, g_BxLxV):
    ones_BxL = jnp.ones(g_BxLxV.shape[:-1], g_BxLxV.dtype)
    return g_BxLxV, jnp.einsum("blv,bl->v", g_BxLxV, ones_BxL)


_add_output_bias.defvjp(_add_output_bias_fwd, _add_output_bias_bwd)


class BertEmbeddings(nn.Module):
    """Sum of word, position and token-type embeddings, then LayerNorm and dropout."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.word = nn.Embed(c.vocab_size, c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                             embedding_init=_init(c, "vocab", "embed"))
        self.position = nn.Embed(c.max_position_embeddings, c.hidden_size, dtype=_dtype(c),
                                 param_dtype=jnp.float32, embedding_init=_init(c, "position", "embed"))
        self.token_type = nn.Embed(c.type_vocab_size, c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                                   embedding_init=_init(c, "token_type", "embed"))
        self.layer_norm = _layer_norm(c, "layer_norm")
        self.dropout = Dropout(c.dropout_rate)

    def __call__(self, input_ids_BxL, token_type_ids_BxL, *, deterministic: bool):
        positions_1xL = jnp.arange(input_ids_BxL.shape[1])[None, :]
        x_BxLxD = (self.word(input_ids_BxL) + self.position(positions_1xL)
                   + self.token_type(token_type_ids_BxL))
        x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
        return self.dropout(self.layer_norm(x_BxLxD), deterministic=deterministic)

    def attend(self, x_BxLxD):
        """Float32 logits against the word embeddings: the MLM decoder tied to the input embeddings.

        Inputs are in the compute dtype; accumulation and output are float32 so that the
        softmax over ~30k entries does not lose the small logits to bf16 rounding.
        """
        table_VxD = self.word.embedding.astype(x_BxLxD.dtype)
        if x_BxLxD.dtype == jnp.float32:
            return x_BxLxD @ table_VxD.T  # (a preferred type, even float32, slows XLA:CPU's dot)
        return jnp.matmul(x_BxLxD, table_VxD.T, preferred_element_type=jnp.float32)


class HeadsProjection(nn.Module):
    """A dense projection between the hidden axis D and the heads x head-dim axes (H, K).

    The kernel is stored 3-D, [D, H, K] (`to_heads`) or [H, K, D] (from heads), so that it
    carries the `heads` and `kv` axis names for sharding and maps one to one onto BERT's
    per-head weights. The product itself runs on the kernel reshaped to 2-D ([D, H*K] or
    [H*K, D], a free bitcast of the row-major array) as one plain [B*L, D] matmul: an einsum
    over the 3-D kernel lowers on XLA:CPU to dots on transposed copies of the kernel and its
    gradient, measurably slower than the 2-D matmul of a Dense layer.
    """

    config: ModelConfig
    to_heads: bool

    @nn.compact
    def __call__(self, x):
        c = self.config
        h, k, d = c.num_heads, c.head_dim, c.hidden_size
        if self.to_heads:
            kernel = self.param("kernel", _init(c, "embed", "heads", "kv"), (d, h, k), jnp.float32)
            bias = self.param("bias", _zeros("heads", "kv"), (h, k), jnp.float32)
            kernel_2d, bias_1d = kernel.reshape(d, h * k), bias.reshape(h * k)
            x_2d = x
        else:
            kernel = self.param("kernel", _init(c, "heads", "kv", "embed"), (h, k, d), jnp.float32)
            bias = self.param("bias", _zeros("embed"), (d,), jnp.float32)
            kernel_2d, bias_1d = kernel.reshape(h * k, d), bias
            x_2d = x.reshape(*x.shape[:-2], h * k)
        x_2d, kernel_2d, bias_1d = nn.dtypes.promote_dtype(x_2d, kernel_2d, bias_1d, dtype=_dtype(c))
        y = x_2d @ kernel_2d + bias_1d
        return y.reshape(*y.shape[:-1], h, k) if self.to_heads else y


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention; padding keys are masked out."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, input_mask_BxL, *, deterministic: bool):
        c = self.config
        dtype = _dtype(c)
        q_BxLxHxK = HeadsProjection(c, to_heads=True, name="query")(x_BxLxD)
        k_BxLxHxK = HeadsProjection(c, to_heads=True, name="key")(x_BxLxD)
        v_BxLxHxK = HeadsProjection(c, to_heads=True, name="value")(x_BxLxD)
        q_BxLxHxK = nn.with_logical_constraint(q_BxLxHxK, ("batch", "length", "heads", "kv"))
        k_BxLxHxK = nn.with_logical_constraint(k_BxLxHxK, ("batch", "length", "heads", "kv"))
        v_BxLxHxK = nn.with_logical_constraint(v_BxLxHxK, ("batch", "length", "heads", "kv"))

        q_BxLxHxK = q_BxLxHxK * jnp.asarray(c.head_dim ** -0.5, dtype)
        scores_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32)
        # Padding keys get a large negative additive bias, as in BERT: an add (unlike a
        # select on the [B, H, L, L] scores) fuses into the scores matmul and the softmax.
        bias_Bx1x1xL = jnp.where(input_mask_BxL[:, None, None, :].astype(bool), 0.0, jnp.finfo(jnp.float32).min)
        scores_BxHxLxL = scores_BxHxLxL + bias_Bx1x1xL
        probs_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1).astype(dtype)
        probs_BxHxLxL = Dropout(c.attention_dropout_rate)(probs_BxHxLxL, deterministic=deterministic)
        out_BxLxHxK = jnp.einsum("bhqs,bshk->bqhk", probs_BxHxLxL, v_BxLxHxK)
        out_BxLxHxK = nn.with_logical_constraint(out_BxLxHxK, ("batch", "length", "heads", "kv"))
        return HeadsProjection(c, to_heads=False, name="output")(out_BxLxHxK)


class FeedForward(nn.Module):
    """Dense D->F, GELU, dense F->D."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        c = self.config
        h_BxLxF = nn.Dense(c.intermediate_size, dtype=_dtype(c), param_dtype=jnp.float32,
                           kernel_init=_init(c, "embed", "mlp"), bias_init=_zeros("mlp"),
                           name="intermediate")(x_BxLxD)
        h_BxLxF = nn.with_logical_constraint(_gelu(h_BxLxF), ("batch", "length", "mlp"))
        return nn.Dense(c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                        kernel_init=_init(c, "mlp", "embed"), bias_init=_zeros("embed"), name="output")(h_BxLxF)


class BertLayer(nn.Module):
    """One post-LN transformer layer."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, input_mask_BxL, *, deterministic: bool):
        c = self.config
        dropout = Dropout(c.dropout_rate)
        a_BxLxD = SelfAttention(c, name="attention")(x_BxLxD, input_mask_BxL, deterministic=deterministic)
        x_BxLxD = _layer_norm(c, "attention_layer_norm")(x_BxLxD + dropout(a_BxLxD, deterministic=deterministic))
        f_BxLxD = FeedForward(c, name="feed_forward")(x_BxLxD)
        x_BxLxD = _layer_norm(c, "output_layer_norm")(x_BxLxD + dropout(f_BxLxD, deterministic=deterministic))
        return nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))


class BertEncoder(nn.Module):
    """Embeddings and `num_layers` post-LN layers; returns the last hidden states [B, L, D]."""

    config: ModelConfig

    def setup(self):
        self.embed = BertEmbeddings(self.config)
        self.layers = [BertLayer(self.config, name=f"layer_{i}") for i in range(self.config.num_layers)]

    def __call__(self, input_ids_BxL, input_mask_BxL, token_type_ids_BxL=None, *, deterministic: bool):
        if token_type_ids_BxL is None:
            token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
        x_BxLxD = self.embed(input_ids_BxL, token_type_ids_BxL, deterministic=deterministic)
        for layer in self.layers:
            x_BxLxD = layer(x_BxLxD, input_mask_BxL, deterministic=deterministic)
        return x_BxLxD


class BertForMaskedLM(nn.Module):
    """Encoder + MLM head; logits over the vocabulary at every position, in float32."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.encoder = BertEncoder(c)
        # D -> D: the output axis is left unsharded (it feeds the tied decoder's contraction).
        self.transform = nn.Dense(c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                                  kernel_init=_init(c, "embed", None), bias_init=_zeros(None))
        self.transform_layer_norm = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=_dtype(c), param_dtype=jnp.float32,
                                                 scale_init=_ones(None), bias_init=_zeros(None))
        self.output_bias = self.param("output_bias", _zeros("vocab"), (c.vocab_size,), jnp.float32)

    def __call__(self, input_ids_BxL, input_mask_BxL, token_type_ids_BxL=None, *, deterministic: bool):
        x_BxLxD = self.encoder(input_ids_BxL, input_mask_BxL, token_type_ids_BxL, deterministic=deterministic)
        h_BxLxD = self.transform_layer_norm(_gelu(self.transform(x_BxLxD)))
        logits_BxLxV = _add_output_bias(self.encoder.embed.attend(h_BxLxD), self.output_bias)
        return nn.with_logical_constraint(logits_BxLxV, ("batch", "length", "vocab"))
