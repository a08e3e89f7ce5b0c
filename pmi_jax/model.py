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

import flax.linen as nn
import jax
import jax.numpy as jnp

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
        self.dropout = nn.Dropout(c.dropout_rate)

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


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention; padding keys are masked out."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, input_mask_BxL, *, deterministic: bool):
        c = self.config
        dtype = _dtype(c)

        def project(name):
            # nn.Einsum (not DenseGeneral) so the kernel is created in its 3-D sharded shape.
            return nn.Einsum((c.hidden_size, c.num_heads, c.head_dim), "bld,dhk->blhk", dtype=dtype,
                             param_dtype=jnp.float32, kernel_init=_init(c, "embed", "heads", "kv"),
                             bias_init=_zeros("heads", "kv"), name=name)

        q_BxLxHxK = project("query")(x_BxLxD)
        k_BxLxHxK = project("key")(x_BxLxD)
        v_BxLxHxK = project("value")(x_BxLxD)
        q_BxLxHxK = nn.with_logical_constraint(q_BxLxHxK, ("batch", "length", "heads", "kv"))
        k_BxLxHxK = nn.with_logical_constraint(k_BxLxHxK, ("batch", "length", "heads", "kv"))
        v_BxLxHxK = nn.with_logical_constraint(v_BxLxHxK, ("batch", "length", "heads", "kv"))

        q_BxLxHxK = q_BxLxHxK * jnp.asarray(c.head_dim ** -0.5, dtype)
        scores_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32)
        keep_Bx1x1xL = input_mask_BxL[:, None, None, :].astype(bool)
        scores_BxHxLxL = jnp.where(keep_Bx1x1xL, scores_BxHxLxL, jnp.finfo(jnp.float32).min)
        probs_BxHxLxL = jax.nn.softmax(scores_BxHxLxL, axis=-1).astype(dtype)
        probs_BxHxLxL = nn.Dropout(c.attention_dropout_rate)(probs_BxHxLxL, deterministic=deterministic)
        out_BxLxHxK = jnp.einsum("bhqs,bshk->bqhk", probs_BxHxLxL, v_BxLxHxK)
        out_BxLxHxK = nn.with_logical_constraint(out_BxLxHxK, ("batch", "length", "heads", "kv"))
        return nn.Einsum((c.num_heads, c.head_dim, c.hidden_size), "blhk,hkd->bld", dtype=dtype,
                         param_dtype=jnp.float32, kernel_init=_init(c, "heads", "kv", "embed"),
                         bias_init=_zeros("embed"), name="output")(out_BxLxHxK)


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
        dropout = nn.Dropout(c.dropout_rate)
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
        logits_BxLxV = self.encoder.embed.attend(h_BxLxD) + self.output_bias
        return nn.with_logical_constraint(logits_BxLxV, ("batch", "length", "vocab"))
