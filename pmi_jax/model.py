"""BERT (Devlin et al. 2019) as a Flax module: post-LN encoder and a tied MLM head.

The layout is the original BERT's, so its weights map one to one; there is no next-sentence
head (the PMI-Masking paper trains MLM only). The initialiser and the MLM head gathered at the
masked positions follow google-research/bert; the GELU is transformers' exact (erf) one, so an
exported model gives the same numbers there. Layers run as a loop or one `nn.scan`;
`for_platform` settles platform-dependent kernels; every axis has a logical name
(`pmi_jax.partitioning`). Why each choice: docs/design.md, "Module notes", model.py.

Shape suffixes: B batch, L length, D hidden, H heads, K head dim, F feed-forward, V vocab.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

from pmi_jax import fused_attention, fused_feed_forward, fused_layer_norm, tpu_attention
from pmi_jax.config import PALLAS_ATTENTION, ModelConfig
from pmi_jax.errors import UserInputError

__all__ = ["ModelConfig", "BertEmbeddings", "SelfAttention", "FeedForward", "BertLayer", "BertEncoder",
           "BertForMaskedLM", "stack_layers", "unstack_layers", "SCANNED_LAYERS"]

SCANNED_LAYERS = "layers"  # encoder/<this>: the stacked parameters of scanned layers
_QKV = ("batch", "length", "heads", "kv")  # the logical axes of queries, keys and values
_QKV_STACKED = ("batch", "length", None, "heads", "kv")  # ... stacked on axis 2 (`fused_qkv`)
STACKED_ATTENTION = ("pallas-triton", "pallas-interpret")  # the kernels that read the stack in place
_LAYER = re.compile(r"layer_(\d+)")


def _dtype(config: ModelConfig):
    return jnp.dtype(config.dtype)


def _init(config: ModelConfig, *names: str):
    # BERT's initializer: a normal of std `initializer_range` truncated to +-2 of those stds
    # (so the values' own std is about 0.88 x 0.02; TF and JAX both parametrise by the
    # untruncated std).
    init = nn.initializers.truncated_normal(stddev=config.initializer_range, lower=-2.0, upper=2.0)
    return nn.with_logical_partitioning(init, names)


def _zeros(*names: str):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(*names: str):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _layer_norm(config: ModelConfig, name: str) -> nn.LayerNorm:
    # Statistics in float32 whatever the compute dtype; output in the compute dtype.
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=_dtype(config), param_dtype=jnp.float32,
                        scale_init=_ones("embed"), bias_init=_zeros("embed"), name=name)


def _gelu_f32(form: str, x_f32):
    # "erf" by default: the GELU of transformers' BERT (module docstring: why), in its formula
    # x (1 + erf(x / sqrt 2)) / 2. jax.nn.gelu writes it with erfc, whose expansion (two rational
    # approximations, exp, two divisions) made the forward compute-bound on an H100; the values
    # differ by float32 rounding in the negative tail only. "tanh": jax.nn.gelu's approximation.
    if form.startswith("tanh"):
        return nn.gelu(x_f32, approximate=True)
    return 0.5 * x_f32 * (1.0 + jax.lax.erf(x_f32 * (1.0 / math.sqrt(2.0))))


def _gelu_slope_f32(form: str, x_f32):
    """d gelu / dx in float32."""
    if form.startswith("tanh"):
        c = math.sqrt(2.0 / math.pi)
        t = jnp.tanh(c * (x_f32 + 0.044715 * x_f32 ** 3))
        return 0.5 * (1.0 + t) + 0.5 * x_f32 * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x_f32 ** 2)
    cdf = 0.5 * (1.0 + jax.lax.erf(x_f32 * (1.0 / math.sqrt(2.0))))
    return cdf + x_f32 * jnp.exp(-0.5 * x_f32 * x_f32) * (1.0 / math.sqrt(2.0 * math.pi))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _gelu(form: str, x):
    """GELU computed in float32, rounded once to x's dtype, whose backward pass keeps only x.

    Differentiated by JAX, the erf form's backward reads residuals the forward wrote beside its
    output (erf's argument, the CDF), three [B, L, F] tensors per layer in a bf16 GPU program
    (benchmarks/README.md, "GPU program bytes"). Here the backward recomputes the slope from x,
    which the matmul before it wrote anyway, so the forward writes only its output.
    "tanh-epilogue" (`for_platform`'s tanh on GPUs) is written in x's dtype: the pattern XLA:GPU
    moves into the cuBLAS matmul before it, which computes the GELU in float32 in its epilogue.
    """
    if form == "tanh-epilogue":
        return nn.gelu(x, approximate=True)
    return _gelu_f32(form, x.astype(jnp.float32)).astype(x.dtype)


def _gelu_fwd(form, x):
    return _gelu(form, x), x


def _gelu_bwd(form, x, g):
    return ((g.astype(jnp.float32) * _gelu_slope_f32(form, x.astype(jnp.float32))).astype(x.dtype),)


_gelu.defvjp(_gelu_fwd, _gelu_bwd)


def _threefry_key_words(rng):
    """The two 32-bit words of a threefry2x32 key (typed or raw), or None for another generator."""
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng) if "threefry" in str(jax.random.key_impl(rng)) else None
    return rng if rng.shape == (2,) and jax.config.jax_default_prng_impl == "threefry2x32" else None


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
    key_words = _threefry_key_words(rng)
    half = (*shape[:-1], shape[-1] // 2)
    if key_words is None or shape[-1] % 2 or math.prod(half) >= 2**32:
        return jax.random.bernoulli(rng, p=keep_prob, shape=shape)
    counter = jax.lax.iota(jnp.uint32, math.prod(half)).reshape(half)
    bits1, bits2 = threefry2x32_p.bind(key_words[0], key_words[1], jnp.zeros_like(counter), counter)
    bits = jnp.stack([bits1, bits2], axis=-1).reshape(shape)
    uniform = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return uniform < keep_prob


def _keep_mask16(rng, keep_prob: float, shape) -> tuple[jax.Array, float]:
    """(mask, realised keep probability): Bernoulli(threshold / 2^16) from 16 bits per element.

    GPU programs' dropout. Every threefry2x32 block's two output words decide four elements,
    one 16-bit half each, in the four quarters of the second-to-last axis, so a mask costs a
    quarter of `jax.random.bernoulli`'s blocks (one per element). XLA:GPU computes the masks
    before the forward pass (they depend only on the step's key) and writes them: here two
    u32 words per four elements instead of one per element (benchmarks/README.md, "Dropout
    masks from 16 bits"). The counters are element indices, so the mask does not depend on
    sharding; same key, same mask (exact resume). Falls back to `jax.random.bernoulli` with
    the same realised probability for non-threefry keys, a second-to-last axis not divisible
    by 4, and 2^34 elements or more.
    """
    threshold = fused_attention.keep_threshold16(keep_prob)
    realised = threshold / 2**16
    key_words = _threefry_key_words(rng)
    if key_words is None or len(shape) < 2 or shape[-2] % 4 or math.prod(shape) >= 2**34:
        # threshold / 2^16 is a multiple of bernoulli's 2^-23 resolution: the same probability exactly.
        return jax.random.bernoulli(rng, p=realised, shape=shape), realised
    quarter = (*shape[:-2], shape[-2] // 4, shape[-1])
    counter = jax.lax.iota(jnp.uint32, math.prod(quarter)).reshape(quarter)
    word1, word2 = threefry2x32_p.bind(key_words[0], key_words[1], jnp.zeros_like(counter), counter)
    low16 = jnp.uint32(0xFFFF)
    # Row r of the mask takes quarter r // (rows / 4) of the words: whole rows, no interleaving
    # along the last (TPU lane) axis.
    halves = jnp.stack([word1 & low16, word1 >> 16, word2 & low16, word2 >> 16], axis=-3).reshape(shape)
    return halves < jnp.uint32(threshold), realised


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _hashed_dropout(x_BxLxD, streams_Bx2, rate: float):
    """Inverted dropout of x by `fused_layer_norm`'s keep rule, whose backward pass redraws the mask.

    The rule is a hash of (the sequence's streams, position, column): XLA computes it inside
    the kernels that apply it, forward and backward, so no mask is written or kept between the
    two passes, where threefry's masks were computed ahead and written (benchmarks/README.md,
    "Hidden dropout from a hash"). Same key, same mask: exact resume.
    """
    _, length, width = x_BxLxD.shape
    keep_BxLxD = fused_layer_norm.keep_mask(streams_Bx2, length, width, rate)
    return x_BxLxD * keep_BxLxD.astype(x_BxLxD.dtype) / jnp.asarray(1.0 - rate, x_BxLxD.dtype)


def _hashed_dropout_fwd(x_BxLxD, streams_Bx2, rate):
    return _hashed_dropout(x_BxLxD, streams_Bx2, rate), streams_Bx2


def _hashed_dropout_bwd(rate, streams_Bx2, g_BxLxD):
    return _hashed_dropout(g_BxLxD, streams_Bx2, rate), None


_hashed_dropout.defvjp(_hashed_dropout_fwd, _hashed_dropout_bwd)


class Dropout(nn.Dropout):
    """Inverted dropout like `nn.Dropout`; same rate, same RNG stream name.

    `mask` (settled by `_dropout` from the config): "cpu", the XLA:CPU variant `_keep_mask`
    (half the random-number work of flax's); "bits16", `_keep_mask16` (16 bits per element,
    GPU programs: fewer bytes; the keep probability is then `fused_attention.keep_threshold16`'s);
    "hash", `_hashed_dropout` on [B, L, D] (GPU programs: no mask in memory; bernoulli for
    other ranks); "bernoulli", `jax.random.bernoulli` (TPU programs). Either way it is applied as
    (inputs * mask) / keep probability, the same numbers as flax's select between inputs / keep_prob
    and zero, but a plain elementwise product, which XLA fuses into the neighbouring matmul
    and softmax (forward and backward) where the select kept a separate pass over the
    [B, H, L, L] attention probabilities.
    """

    mask: str = "cpu"  # "cpu" (`_keep_mask`), "bits16" (`_keep_mask16`), "hash" or "bernoulli"

    @nn.compact
    def __call__(self, inputs, deterministic: bool | None = None, rng=None, streams_Bx2=None):
        """`streams_Bx2`: the hashed mask's streams where the caller drew them (`BertEncoder`), else
        they are drawn from this module's key."""
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 1.0 and not deterministic:
            return jnp.zeros_like(inputs)
        if self.mask == "hash" and inputs.ndim == 3 and 0.0 < self.rate and not deterministic:
            if streams_Bx2 is None:
                rng = self.make_rng(self.rng_collection) if rng is None else rng
                streams_Bx2 = fused_layer_norm.dropout_streams(rng, inputs.shape[0])
            return _hashed_dropout(inputs, streams_Bx2, float(self.rate))
        keep, keep_prob = self.keep_mask(inputs.shape, deterministic, rng)
        if keep is None:
            return inputs
        return inputs * keep.astype(inputs.dtype) / jnp.asarray(keep_prob, inputs.dtype)

    def keep_mask(self, shape, deterministic: bool | None = None, rng=None) -> tuple[jax.Array | None, float]:
        """(the bool mask of the kept entries, the realised keep probability), or (None, 1.0) where
        nothing is dropped: what `__call__` applies, for `written_attention`, which applies it itself."""
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return None, 1.0
        if self.rate == 1.0:
            return jnp.zeros(shape, bool), 1.0
        keep_prob = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        if self.mask == "cpu":
            return _keep_mask(rng, keep_prob, shape), keep_prob
        if self.mask == "bits16":
            return _keep_mask16(rng, keep_prob, shape)
        if self.mask == "hash" and len(shape) == 3:  # what `_hashed_dropout` applies
            streams_Bx2 = fused_layer_norm.dropout_streams(rng, shape[0])
            return fused_layer_norm.keep_mask(streams_Bx2, shape[1], shape[2], self.rate), keep_prob
        return jax.random.bernoulli(rng, p=keep_prob, shape=shape), keep_prob


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _lookup_sorted_grad(table_VxD, ids_N, dtype):
    """table[ids] in `dtype`, whose table gradient is a sorted segment sum instead of a scatter-add.

    XLA's gradient of a gather is a scatter-add of every token's row into a [V, D] buffer: on a
    GPU one atomic add per element, serialised where tokens repeat ([CLS], [SEP], common words).
    Sorting the ids first turns it into a segment sum over runs of equal ids. The sum is taken
    in float32 (the parameters' dtype) whatever the compute dtype, so bf16 gradients of a
    frequent token are not summed in bf16.
    """
    return table_VxD[ids_N].astype(dtype)


def _lookup_sorted_grad_fwd(table_VxD, ids_N, dtype):
    # The residuals: the ids, and an empty [V, 0] array that carries the table's rows and dtype.
    return _lookup_sorted_grad(table_VxD, ids_N, dtype), (ids_N, jnp.zeros((table_VxD.shape[0], 0), table_VxD.dtype))


def _lookup_sorted_grad_bwd(dtype, residuals, g_NxD):
    ids_N, rows_Vx0 = residuals
    order_N = jnp.argsort(ids_N)
    grad_VxD = jax.ops.segment_sum(g_NxD[order_N].astype(rows_Vx0.dtype), ids_N[order_N],
                                   num_segments=rows_Vx0.shape[0], indices_are_sorted=True)
    return grad_VxD, None


_lookup_sorted_grad.defvjp(_lookup_sorted_grad_fwd, _lookup_sorted_grad_bwd)


def for_platform(config: ModelConfig, platform: str) -> ModelConfig:
    """`config` with its platform-dependent choices settled for a program compiled for `platform`.

    The trainer calls this with its mesh's platform, which is not the default backend when
    it compiles for a TPU slice on a CPU-only machine (`pmi_jax.compile_only`). Settled here:
    - `xla_cpu_variants="cpu"`: the XLA:CPU rewrites on CPU only. Compiled for a v5p-8,
      BERT-base's step with them needed 2.9 GiB more per chip and an estimated 17% more time
      (benchmarks/README.md, "tpu compile").
    - `attention="auto"`: cuDNN's fused attention where it applies (`cudnn_attention_applies`),
      the Triton kernel with its dropout in GPU programs with attention dropout
      (`pallas_attention_applies`), jax.nn.dot_product_attention's XLA path elsewhere.
    - `embedding_grad="auto"`: the sorted segment sum on GPUs, where the scatter's atomics cost
      14.5 of BERT-base's 92.8 ms per step on an H100; XLA's scatter elsewhere.
    - `dropout_mask="auto"`: hashed masks (`_hashed_dropout`) on GPUs, where no mask is then
      written (2.0 GiB less per BERT-base H100 step than 16-bit masks); `jax.random.bernoulli`
      elsewhere (on a v5p-8 the hash was estimated 0.5% faster: not worth other masks there).
    - `attention="pallas"`: the kernel compiled by Triton on GPUs, `tpu_attention`'s (Mosaic) on
      TPUs, the GPU kernel run by Pallas' interpreter on CPUs; refused elsewhere.
    - `residual_norm="auto"`: the fused residual LayerNorm's Triton kernel in bf16 GPU programs
      (`pallas_norm_applies`), XLA's LayerNorm elsewhere.
    - `residual_norm="pallas"`: Triton on GPUs, the interpreter on CPUs; refused elsewhere.
    - `feed_forward="pallas"`: the same.
    - `fused_qkv="auto"`: one query-key-value matmul on GPUs, whose bias add cuBLAS takes into
      the matmul (3.0 GiB and 180 kernel launches less in BERT-base's H100 step); three elsewhere.
    - `gelu="tanh"`: the same function written for cuBLAS on GPUs ("tanh-epilogue"), which
      computes it in the matmul's epilogue (5.7 GiB less per BERT-base H100 step than the
      float32 formula). Off GPUs XLA would round the bf16 formula at every operation.
    - `decoder_grad="auto"`: the tied decoder differentiated in the compute dtype on GPUs
      (`_tied_logits`: 0.8 GiB less per BERT-base H100 step, and no TF32 matmuls); autodiff's
      float32 elsewhere (a v5p-8 fuses that gradient into its matmuls; estimated 0.1% faster).
    - `scan_unroll=0`: scanned layers unrolled on GPUs, on their stacked parameters (BERT-large's
      H100 step, remat as configured: 1,652 kernel launches against 2,893 for the loop); the
      loop elsewhere, where a scan is chosen for compile time.
    Other explicit choices are kept.
    """
    changes, gpu = {}, platform in ("gpu", "cuda")
    if config.xla_cpu_variants == "cpu":
        changes["xla_cpu_variants"] = "always" if platform == "cpu" else "never"
    if config.attention == "auto":
        changes["attention"] = ("cudnn" if cudnn_attention_applies(config, platform) else
                                "pallas-triton" if pallas_attention_applies(config, platform) else "xla")
    if config.attention == "pallas":
        if platform not in ("gpu", "cuda", "cpu", "tpu"):
            raise UserInputError(f"model.attention=pallas: the kernels are written for GPUs and TPUs; a {platform} "
                                 "program takes model.attention=xla")
        changes["attention"] = {"cpu": "pallas-interpret", "tpu": "pallas-mosaic"}.get(platform, "pallas-triton")
    if config.residual_norm == "auto":
        changes["residual_norm"] = "pallas-triton" if pallas_norm_applies(config, platform) else "xla"
    if config.residual_norm == "pallas":
        if platform not in ("gpu", "cuda", "cpu"):
            raise UserInputError(f"model.residual_norm=pallas: the kernel is written for GPUs; a {platform} program "
                                 "takes model.residual_norm=xla")
        changes["residual_norm"] = "pallas-interpret" if platform == "cpu" else "pallas-triton"
    if config.feed_forward == "pallas":
        if platform not in ("gpu", "cuda", "cpu"):
            raise UserInputError(f"model.feed_forward=pallas: the kernels are written for GPUs; a {platform} program "
                                 "takes model.feed_forward=xla")
        changes["feed_forward"] = "pallas-interpret" if platform == "cpu" else "pallas-triton"
    if config.embedding_grad == "auto":
        changes["embedding_grad"] = "sorted" if gpu else "scatter"
    if config.dropout_mask == "auto":
        changes["dropout_mask"] = "hash" if gpu else "bernoulli"
    if config.fused_qkv == "auto":
        changes["fused_qkv"] = "always" if gpu else "never"
    if config.decoder_grad == "auto":
        changes["decoder_grad"] = "compute" if gpu else "float32"
    if config.scan_unroll == 0:
        changes["scan_unroll"] = config.num_layers if gpu and config.scan_layers else 1
    if config.gelu == "tanh" and gpu:
        changes["gelu"] = "tanh-epilogue"
    return dataclasses.replace(config, **changes) if changes else config


def for_evaluation(config: ModelConfig) -> ModelConfig:
    """`config` for evaluation, where nothing is dropped: the Pallas kernels' choices go back to
    "auto", which computes the same function there on every platform (XLA's paths on CPUs, where
    the interpreted kernels are slow, and on TPUs, which refuse the residual LayerNorm's; "auto"
    may take the Triton kernels again on GPUs), the feed-forward's to "xla" (the same to bf16
    rounding). The parameters are the same."""
    changes = {"feed_forward": "xla"} if config.feed_forward != "xla" else {}
    if config.residual_norm not in ("xla", "auto"):
        changes["residual_norm"] = "auto"
    if config.attention in PALLAS_ATTENTION:
        changes["attention"] = "auto"
    return dataclasses.replace(config, **changes) if changes else config


def cudnn_attention_applies(config: ModelConfig, platform: str) -> bool:
    """Whether `attention="auto"` takes cuDNN's fused attention in a program for `platform`.

    Only without attention dropout (the fused kernel's dropout takes a static seed: docs/gpu.md),
    on NVIDIA GPUs, with bf16 inputs and a head dimension cuDNN's flash attention takes (a
    multiple of 8, at most 128; BERT's is 64).
    """
    return (platform in ("gpu", "cuda") and config.attention_dropout_rate == 0.0 and config.dtype == "bfloat16"
            and config.head_dim % 8 == 0 and config.head_dim <= 128)


def pallas_attention_applies(config: ModelConfig, platform: str) -> bool:
    """Whether `attention="auto"` takes the Triton kernel (`pmi_jax.fused_attention`) for `platform`.

    Where cuDNN's does not apply because of attention dropout, on NVIDIA GPUs with bf16 inputs
    and a head dimension Triton's blocks take (a power of two of at least 16): BERT-base's step
    in the paper's setting took 36.4 ms instead of 53.6 on an H100 (benchmarks/README.md).
    """
    return (platform in ("gpu", "cuda") and config.attention_dropout_rate > 0.0 and config.dtype == "bfloat16"
            and config.head_dim_fits_pallas)


def pallas_norm_applies(config: ModelConfig, platform: str) -> bool:
    """Whether `residual_norm="auto"` takes the fused residual LayerNorm (`pmi_jax.fused_layer_norm`).

    In bf16 GPU programs: BERT-base's paper step ran 1.2 ms less kernel time with it on an H200
    (1.9 on an H100) and moves 1.9 GiB less in 206 fewer launches (benchmarks/README.md). The
    hashed hidden dropout draws the same masks either way (same streams, same rule).
    """
    return platform in ("gpu", "cuda") and config.dtype == "bfloat16"


def attention_implementation(config: ModelConfig) -> str:
    """`jax.nn.dot_product_attention`'s implementation for `config` (used when attention dropout is 0)."""
    return _settled(config).attention


def _settled(config: ModelConfig) -> ModelConfig:
    """`config` settled for the default backend where the trainer did not settle it (evaluation, tests)."""
    return for_platform(config, jax.default_backend())


def _uses_cpu_variants(config: ModelConfig) -> bool:
    """Settled by `for_platform`; an unsettled "cpu" (evaluation, tests) follows the default backend."""
    return _settled(config).xla_cpu_variants == "always"


def _output_bias(config: ModelConfig, logits_BxLxV, bias_V):
    """logits + bias; the GEMV-gradient variant only with the XLA:CPU variants (else the plain add)."""
    return _add_output_bias(logits_BxLxV, bias_V) if _uses_cpu_variants(config) else logits_BxLxV + bias_V


def _dropout(config: ModelConfig, rate: float, attention: bool = False) -> Dropout:
    """The dropout of `config`'s platform. `dropout_mask` only for the hidden dropouts: over the
    attention probabilities (the written-out attention) XLA:GPU wrote 576 MiB more per layer with
    16-bit masks than with `jax.random.bernoulli`, whose pred mask it writes directly
    (benchmarks/README.md); the Pallas kernels draw theirs inside."""
    if attention and not _uses_cpu_variants(config):
        return Dropout(rate, mask="bernoulli")
    return Dropout(rate, mask=_hidden_mask(config))


def _hidden_mask(config: ModelConfig) -> str:
    """The hidden dropouts' `Dropout.mask`."""
    return "cpu" if _uses_cpu_variants(config) else _settled(config).dropout_mask


class BertEmbeddings(nn.Module):
    """Sum of word, position and token-type embeddings, then LayerNorm and dropout."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.word = nn.Embed(c.padded_vocab_size, c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                             embedding_init=_init(c, "vocab", "embed"))
        self.position = nn.Embed(c.max_position_embeddings, c.hidden_size, dtype=_dtype(c),
                                 param_dtype=jnp.float32, embedding_init=_init(c, "position", "embed"))
        self.token_type = nn.Embed(c.type_vocab_size, c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                                   embedding_init=_init(c, "token_type", "embed"))
        self.layer_norm = _layer_norm(c, "layer_norm")
        self.dropout = _dropout(c, c.dropout_rate)

    def __call__(self, input_ids_BxL, token_type_ids_BxL, *, deterministic: bool):
        c = self.config
        positions_1xL = jnp.arange(input_ids_BxL.shape[1])[None, :]
        # Token types (BERT has 2) enter as a one-hot product, not a gather: the gather's gradient
        # is a scatter-add of every token's gradient onto the same one or two rows, which an H100
        # serialises on atomics (55 of BERT-base's 148 ms per step at batch 32 x 512, bf16;
        # benchmarks/README.md, "GPU"). The product's gradient is a plain reduction; the values are
        # the gathered rows exactly (1 x row + 0 x other rows).
        types_BxLxT = jax.nn.one_hot(token_type_ids_BxL, c.type_vocab_size, dtype=_dtype(c))
        x_BxLxD = (self._words(input_ids_BxL) + self.position(positions_1xL)
                   + types_BxLxT @ self.token_type.embedding.astype(_dtype(c)))
        x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
        return self.dropout(self.layer_norm(x_BxLxD), deterministic=deterministic)

    def _words(self, input_ids_BxL):
        """The word embeddings, with the table gradient chosen by `embedding_grad` (same values)."""
        c = _settled(self.config)
        if c.embedding_grad == "scatter":
            return self.word(input_ids_BxL)
        ids_N = input_ids_BxL.reshape(-1)
        return _lookup_sorted_grad(self.word.embedding, ids_N, _dtype(c)).reshape(*input_ids_BxL.shape, -1)

    def attend(self, x_BxLxD):
        """Float32 logits [..., padded V] against the word embeddings: the MLM decoder tied to the inputs.

        Inputs are in the compute dtype; accumulation and output are float32 so that the
        softmax over ~30k entries does not lose the small logits to bf16 rounding; their
        gradient's dtype in the backward matmuls is `decoder_grad`'s (`_tied_logits`). The
        padding rows are excluded by the output bias (`BertForMaskedLM.predict`).
        """
        table_VxD = self.word.embedding
        if x_BxLxD.dtype == jnp.float32:
            return x_BxLxD @ table_VxD.T  # (a preferred type, even float32, slows XLA:CPU's dot)
        if _settled(self.config).decoder_grad == "compute":
            return _tied_logits(x_BxLxD, table_VxD)
        return _logits_f32(x_BxLxD, table_VxD)


def _logits_f32(x_BxPxD, table_VxD):
    """x (compute dtype) against the float32 table cast to it, accumulated and returned in float32."""
    return jnp.matmul(x_BxPxD, table_VxD.astype(x_BxPxD.dtype).T, preferred_element_type=jnp.float32)


@jax.custom_vjp
def _tied_logits(x_BxPxD, table_VxD):
    """Float32 logits of x (compute dtype) against the float32 table, differentiated in the compute dtype.

    Autodiff would hand both backward products the float32 logit gradient, and XLA:GPU (excess
    precision allowed) would run them on the float32 table: TF32 matmuls of 120 GFLOP each at
    BERT-base's shapes, with the [B, P, V] gradient written and read twice in float32. Here that
    gradient is rounded once to the compute dtype, as every other cotangent of the model is; the
    table's gradient is still accumulated and returned in float32.
    """
    return _logits_f32(x_BxPxD, table_VxD)


def _tied_logits_fwd(x_BxPxD, table_VxD):
    return _tied_logits(x_BxPxD, table_VxD), (x_BxPxD, table_VxD)


def _tied_logits_bwd(residuals, g_BxPxV):
    x_BxPxD, table_VxD = residuals
    g_BxPxV = g_BxPxV.astype(x_BxPxD.dtype)
    dx_BxPxD = jnp.matmul(g_BxPxV, table_VxD.astype(x_BxPxD.dtype))
    dtable_VxD = jnp.einsum("...v,...d->vd", g_BxPxV, x_BxPxD, preferred_element_type=jnp.float32)
    return dx_BxPxD, dtable_VxD


_tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


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
        """The projection of `x`; with `x` None, the 2-D kernel and 1-D bias themselves (for `fused_qkv`)."""
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
            x_2d = x.reshape(*x.shape[:-2], h * k) if x is not None else None
        if x is None:
            return kernel_2d, bias_1d
        x_2d, kernel_2d, bias_1d = nn.dtypes.promote_dtype(x_2d, kernel_2d, bias_1d, dtype=_dtype(c))
        y = x_2d @ kernel_2d + bias_1d
        return y.reshape(*y.shape[:-1], h, k) if self.to_heads else y


def written_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, input_mask_BxL, keep_BxHxLxL=None,
                      keep_prob: float = 1.0) -> jax.Array:
    """Attention with its scores, softmax and dropout written out as XLA operations: the path of
    attention dropout > 0 on TPUs and CPUs. `keep_BxHxLxL` (bool, or None: no dropout) keeps the
    probabilities where it is true, divided by `keep_prob`. The backward pass is FlashAttention's,
    written as XLA operations (`_written_attention_bwd`). A function of its own so that
    benchmarks/gpu_step.py times exactly this beside the fused kernels."""
    q_BxLxHxK = q_BxLxHxK * jnp.asarray(q_BxLxHxK.shape[-1] ** -0.5, q_BxLxHxK.dtype)
    # Padding keys get a large negative additive bias, as in BERT: an add (unlike a select on
    # the [B, H, L, L] scores) fuses into the scores matmul and the softmax.
    bias_Bx1x1xL = jnp.where(input_mask_BxL[:, None, None, :].astype(bool), 0.0, jnp.finfo(jnp.float32).min)
    return _written_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, keep_prob)


def _probabilities(q_BxLxHxK, k_BxLxHxK, bias_Bx1x1xL, rows=None):
    """(softmax(q k^T + bias) in float32, each row's (max, sum)): `jax.nn.softmax`'s operations, so
    the same values; with `rows` given, the probabilities from those instead of new reductions."""
    scores_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32) + bias_Bx1x1xL
    if rows is None:
        max_BxHxLx1 = jnp.max(scores_BxHxLxL, axis=-1, keepdims=True)
        exp_BxHxLxL = jnp.exp(scores_BxHxLxL - max_BxHxLx1)
        rows = (max_BxHxLx1, jnp.sum(exp_BxHxLxL, axis=-1, keepdims=True))
    else:
        exp_BxHxLxL = jnp.exp(scores_BxHxLxL - rows[0])
    return exp_BxHxLxL / rows[1], rows


def _dropped(probs_BxHxLxL, keep_BxHxLxL, keep_prob: float, dtype):
    probs_BxHxLxL = probs_BxHxLxL.astype(dtype)
    if keep_BxHxLxL is None:
        return probs_BxHxLxL
    return probs_BxHxLxL * keep_BxHxLxL.astype(dtype) / jnp.asarray(keep_prob, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _written_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, keep_prob):
    return _written_attention_fwd(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, keep_prob)[0]


def _written_attention_fwd(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, keep_prob):
    probs_BxHxLxL, rows = _probabilities(q_BxLxHxK, k_BxLxHxK, bias_Bx1x1xL)
    dropped_BxHxLxL = _dropped(probs_BxHxLxL, keep_BxHxLxL, keep_prob, q_BxLxHxK.dtype)
    out_BxLxHxK = jnp.einsum("bhqs,bshk->bqhk", dropped_BxHxLxL, v_BxLxHxK)
    return out_BxLxHxK, (q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, rows, out_BxLxHxK)


def _written_attention_bwd(keep_prob, residuals, g_out_BxLxHxK):
    """Keeps nothing [B, H, L, L] from the forward pass: the probabilities are recomputed from q, k
    and each row's max and sum, and the softmax's row term sum_j dP_ij P_ij is taken as
    sum_k dO_ik O_ik (equal, dropout or not), a [B, L, H, K] product instead of a pass over the
    [B, H, L, L] gradients. XLA then fuses the recomputation into the gradients' products: BERT-base's
    attention on one v5p chip is estimated 1.65 ms forward and backward against autodiff's 2.46
    (benchmarks/README.md). Values: autodiff's up to rounding (the row term from the rounded output)."""
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, bias_Bx1x1xL, keep_BxHxLxL, rows, out_BxLxHxK = residuals
    dtype = q_BxLxHxK.dtype
    g_out_BxLxHxK = g_out_BxLxHxK.astype(dtype)
    probs_BxHxLxL, _ = _probabilities(q_BxLxHxK, k_BxLxHxK, bias_Bx1x1xL, rows)
    g_v = jnp.einsum("bhqs,bqhk->bshk", _dropped(probs_BxHxLxL, keep_BxHxLxL, keep_prob, dtype), g_out_BxLxHxK)
    g_probs_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", g_out_BxLxHxK, v_BxLxHxK).astype(jnp.float32)
    if keep_BxHxLxL is not None:
        g_probs_BxHxLxL = g_probs_BxHxLxL * keep_BxHxLxL.astype(jnp.float32) / keep_prob
    row_BxHxLx1 = jnp.einsum("bqhk,bqhk->bhq", g_out_BxLxHxK.astype(jnp.float32),
                             out_BxLxHxK.astype(jnp.float32))[..., None]
    g_scores_BxHxLxL = (probs_BxHxLxL * (g_probs_BxHxLxL - row_BxHxLx1)).astype(dtype)
    g_q = jnp.einsum("bhqs,bshk->bqhk", g_scores_BxHxLxL, k_BxLxHxK)
    g_k = jnp.einsum("bhqs,bqhk->bshk", g_scores_BxHxLxL, q_BxLxHxK)
    return g_q, g_k, g_v, None, None


_written_attention.defvjp(_written_attention_fwd, _written_attention_bwd)


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention; padding keys are masked out.

    With attention dropout (BERT's 0.1, the default) the scores, softmax and dropout are
    written out, so XLA compiles them on every platform. With `attention_dropout_rate` 0 it is
    `jax.nn.dot_product_attention` with the padding given as each sequence's length
    (`key_value_seq_lengths`: padding is a suffix, as the pipeline and the trainer's batches
    make it), with `implementation` from `config.attention`: "cudnn" (cuDNN's fused flash
    attention; settled for GPU programs in bf16, `for_platform`) or "xla" (JAX's reference
    path, which XLA compiles like the written-out one). Lengths rather than a boolean mask,
    because cuDNN takes a mask as a bias whose full [B, H, L, L] gradient the backward pass
    computes, whereas with lengths it skips the padding blocks. With `config.attention` "pallas"
    (either dropout rate) it is `fused_attention.attention`, whose dropout mask is a function of
    this layer's streams (`BertEncoder`'s draw, else this module's key) and the entry's position,
    drawn inside the kernel: the same masks as long as the key is the same, so a resumed run
    redraws them (with `fused_qkv`, `attention_stacked` on the one matmul's output, read in place).
    With `residual_norm` "pallas" it returns the output projection without its bias, and the bias,
    for `_ResidualNorm` to add.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, input_mask_BxL, *, deterministic: bool, streams_BxHx2=None):
        c = self.config
        stacked = c.attention in PALLAS_ATTENTION and _settled(c).attention in STACKED_ATTENTION
        inputs = self._queries_keys_values(x_BxLxD, stacked)
        if c.attention in PALLAS_ATTENTION:
            out_BxLxHxK = self._pallas(inputs, input_mask_BxL, deterministic, streams_BxHx2)
        elif c.attention_dropout_rate == 0.0:
            lengths_B = jnp.sum(input_mask_BxL.astype(jnp.int32), axis=-1)
            out_BxLxHxK = jax.nn.dot_product_attention(*inputs, key_value_seq_lengths=lengths_B,
                                                       implementation=attention_implementation(c))
        else:
            q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = inputs
            batch, length, heads, _ = q_BxLxHxK.shape
            keep_BxHxLxL, keep_prob = _dropout(c, c.attention_dropout_rate, attention=True).keep_mask(
                (batch, heads, length, length), deterministic=deterministic)
            out_BxLxHxK = written_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, input_mask_BxL, keep_BxHxLxL, keep_prob)
        out_BxLxHxK = nn.with_logical_constraint(out_BxLxHxK, _QKV)
        if not _fused_residual_norm(c):
            return HeadsProjection(c, to_heads=False, name="output")(out_BxLxHxK)
        kernel_HKxD, bias_D = HeadsProjection(c, to_heads=False, name="output")(None)
        return out_BxLxHxK.reshape(*out_BxLxHxK.shape[:-2], -1) @ kernel_HKxD.astype(_dtype(c)), bias_D

    def _queries_keys_values(self, x_BxLxD, stacked: bool) -> tuple:
        """(q, k, v), each [B, L, H, K]; with `fused_qkv` and `stacked` (the Triton kernel or its
        interpreter), (qkv [B, L, 3, H, K] without its bias, the bias [3, H, K]): the kernel reads the
        matmul's output in place and returns the bias's gradient from its own block sums."""
        c = self.config
        if _settled(c).fused_qkv != "always":
            return tuple(nn.with_logical_constraint(HeadsProjection(c, to_heads=True, name=n)(x_BxLxD), _QKV)
                         for n in ("query", "key", "value"))
        # One [D, 3 H K] matmul on the three kernels concatenated (the parameters stay three).
        weights = [HeadsProjection(c, to_heads=True, name=n)(None) for n in ("query", "key", "value")]
        x_BxLxD, kernel_Dx3HK, bias_3HK = nn.dtypes.promote_dtype(
            x_BxLxD, jnp.concatenate([w for w, _ in weights], axis=1), jnp.concatenate([b for _, b in weights]),
            dtype=_dtype(c))
        heads_3xHxK = (3, c.num_heads, c.head_dim)
        if stacked:
            qkv_BxLx3xHxK = (x_BxLxD @ kernel_Dx3HK).reshape(*x_BxLxD.shape[:-1], *heads_3xHxK)
            return nn.with_logical_constraint(qkv_BxLx3xHxK, _QKV_STACKED), bias_3HK.reshape(heads_3xHxK)
        qkv_BxLx3xHxK = (x_BxLxD @ kernel_Dx3HK + bias_3HK).reshape(*x_BxLxD.shape[:-1], *heads_3xHxK)
        return tuple(nn.with_logical_constraint(qkv_BxLx3xHxK[..., i, :, :], _QKV) for i in range(3))

    def _pallas(self, inputs: tuple, input_mask_BxL, deterministic: bool, streams_BxHx2):
        """The Pallas kernel on (q, k, v) or on (the stack, its bias); its streams are the encoder's
        draw for this layer, else drawn from this module's "dropout" RNG, as `Dropout`'s would be."""
        c = _settled(self.config)
        rate = 0.0 if deterministic else c.attention_dropout_rate
        batch, heads = inputs[0].shape[0], inputs[0].shape[-2]
        if not rate:  # no dropout: the streams are not read
            streams_BxHx2 = jnp.zeros((batch, heads, 2), jnp.uint32)
        elif streams_BxHx2 is None:
            streams_BxHx2 = fused_attention.dropout_streams(self.make_rng("dropout"), batch, heads)
        lengths_B = jnp.sum(input_mask_BxL.astype(jnp.int32), axis=-1)
        interpret = c.attention == "pallas-interpret"
        if c.attention == "pallas-mosaic":
            kernel = functools.partial(tpu_attention.attention, rate=rate)
        elif len(inputs) == 2:
            def kernel(qkv_BxLx3xHxK, bias_3xHxK, lengths_B, streams_BxHx2):
                return fused_attention.attention_stacked(qkv_BxLx3xHxK, lengths_B, streams_BxHx2, bias_3xHxK,
                                                         rate=rate, interpret=interpret)
        else:
            kernel = functools.partial(fused_attention.attention, rate=rate, interpret=interpret)
        axes = (_QKV_STACKED, (None, "heads", "kv")) if len(inputs) == 2 else (_QKV,) * 3
        return _on_each_shard(kernel, (*inputs, lengths_B, streams_BxHx2),
                              (*axes, ("batch",), ("batch", "heads", None)), _QKV)


def _on_each_shard(kernel, args: tuple, axes: tuple, out_axes: tuple):
    """`kernel(*args)` on each device's part of the mesh in context, argument i split along its logical
    `axes[i]` (None: an axis every device holds whole). XLA cannot partition a Pallas kernel: unsplit,
    it would gather the batch onto every device. Called directly where there is no mesh or one
    device, or where an array does not split evenly (the batch of 1 that initialisation traces)."""
    mesh = jax.sharding.get_abstract_mesh()
    specs = tuple(nn.logical_to_mesh_axes(a) for a in axes)

    def split(mesh_axes):  # devices along the mesh axes of one array axis
        return math.prod(mesh.shape[a] for a in ((mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes or ()))

    if (mesh.empty or math.prod(mesh.shape.values()) == 1
            or any(n % split(s) for x, spec in zip(args, specs) for n, s in zip(x.shape, spec))):
        return kernel(*args)
    return jax.shard_map(kernel, in_specs=specs, out_specs=nn.logical_to_mesh_axes(out_axes),
                         check_vma=False)(*args)


class FeedForward(nn.Module):
    """Dense D->F, GELU, dense F->D (with `residual_norm` "pallas": its product and bias, apart; with
    `feed_forward` "pallas": the GELU in the matmuls' kernels, `_fused`)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD):
        c = self.config
        if _settled(c).feed_forward != "xla":
            return self._fused(x_BxLxD)
        h_BxLxF = nn.Dense(c.intermediate_size, dtype=_dtype(c), param_dtype=jnp.float32,
                           kernel_init=_init(c, "embed", "mlp"), bias_init=_zeros("mlp"),
                           name="intermediate")(x_BxLxD)
        h_BxLxF = nn.with_logical_constraint(_gelu(_settled(c).gelu, h_BxLxF), ("batch", "length", "mlp"))
        if _fused_residual_norm(c):  # the fused residual LayerNorm adds the bias itself
            shape_FxD = (c.intermediate_size, c.hidden_size)
            kernel_FxD, bias_D = _DenseParams(c, ("mlp", "embed"), shape_FxD, name="output")()
            return h_BxLxF @ kernel_FxD.astype(_dtype(c)), bias_D
        return nn.Dense(c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                        kernel_init=_init(c, "mlp", "embed"), bias_init=_zeros("embed"), name="output")(h_BxLxF)

    def _fused(self, x_BxLxD):
        """`fused_feed_forward` on the two `nn.Dense`s' parameters (`_DenseParams`), whole on each
        device: a model-parallel mesh gathers them (the kernels do not split the intermediate axis)."""
        c = _settled(self.config)
        d, f = c.hidden_size, c.intermediate_size
        w1_DxF, b1_F = _DenseParams(c, ("embed", "mlp"), (d, f), name="intermediate")()
        w2_FxD, b2_D = _DenseParams(c, ("mlp", "embed"), (f, d), name="output")()

        def kernel(x_BxLxD, w1_DxF, b1_F, w2_FxD):
            y_TxD = fused_feed_forward.gelu_feed_forward(x_BxLxD.reshape(-1, d), w1_DxF, b1_F, w2_FxD,
                                                         interpret=c.feed_forward == "pallas-interpret")
            return y_TxD.reshape(x_BxLxD.shape)

        rows = ("batch", None, None)
        y_BxLxD = _on_each_shard(kernel, (x_BxLxD.astype(_dtype(c)), w1_DxF, b1_F, w2_FxD),
                                 (rows, (None, None), (None,), (None, None)), rows)
        if _fused_residual_norm(c):
            return y_BxLxD, b2_D
        return y_BxLxD + b2_D.astype(_dtype(c))


class _DenseParams(nn.Module):
    """An `nn.Dense`'s parameters (same names, shapes and initialisers), for code that applies them
    itself: the fused feed-forward's kernels, the output projection whose bias the fused residual
    LayerNorm adds."""

    config: ModelConfig
    axes: tuple[str, str]
    shape: tuple[int, int]

    @nn.compact
    def __call__(self):
        kernel = self.param("kernel", _init(self.config, *self.axes), self.shape, jnp.float32)
        return kernel, self.param("bias", _zeros(self.axes[1]), (self.shape[1],), jnp.float32)


class _ResidualNorm(nn.Module):
    """LayerNorm(x + dropout(a + bias)) as one kernel (`fused_layer_norm`), with `nn.LayerNorm`'s
    parameters, so that checkpoints are the same with either `residual_norm`; the dropout mask
    comes from the layer's streams (`BertEncoder`'s draw), else from this module's dropout key."""

    config: ModelConfig

    @nn.compact
    def __call__(self, a_BxLxD, bias_D, x_BxLxD, deterministic: bool, streams_Bx2=None):
        c = _settled(self.config)
        scale_D = self.param("scale", _ones("embed"), (c.hidden_size,), jnp.float32)
        offset_D = self.param("bias", _zeros("embed"), (c.hidden_size,), jnp.float32)
        rate = 0.0 if deterministic else c.dropout_rate
        batch = x_BxLxD.shape[0]
        if not rate:  # no dropout: the streams are not read
            streams_Bx2 = jnp.zeros((batch, 2), jnp.uint32)
        elif streams_Bx2 is None:
            streams_Bx2 = fused_layer_norm.dropout_streams(self.make_rng("dropout"), batch)
        kernel = functools.partial(fused_layer_norm.residual_layer_norm, rate=rate, eps=c.layer_norm_eps,
                                   interpret=c.residual_norm == "pallas-interpret")
        rows, vector = ("batch", None, None), (None,)
        return _on_each_shard(kernel, (a_BxLxD, bias_D, x_BxLxD, scale_D, offset_D, streams_Bx2),
                              (rows, vector, rows, vector, vector, ("batch", None)), rows)


def _fused_residual_norm(config: ModelConfig) -> bool:
    return _settled(config).residual_norm != "xla"


def layer_streams(config: ModelConfig) -> tuple[int, int]:
    """(hidden, heads): the [B, 2] stream pairs each layer's hashed dropouts take from `BertEncoder`'s
    one draw, uint32 [layers, B, hidden + heads, 2]: the two hidden dropouts' (the hash mask or the
    fused LayerNorm's), then every head's of the Pallas attention's. (0, 0): nothing is drawn."""
    c = _settled(config)
    hidden = c.dropout_rate > 0.0 and (_fused_residual_norm(c) or _hidden_mask(c) == "hash")
    heads = c.attention_dropout_rate > 0.0 and c.attention in PALLAS_ATTENTION
    return 2 * hidden, c.num_heads * heads


class BertLayer(nn.Module):
    """One post-LN transformer layer; `streams_BxSx2`: its part of the encoder's draw (`layer_streams`)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x_BxLxD, input_mask_BxL, *, deterministic: bool, streams_BxSx2=None):
        c = self.config
        hidden, heads = layer_streams(c)
        drawn = streams_BxSx2 is not None
        first, second = (streams_BxSx2[:, 0], streams_BxSx2[:, 1]) if drawn and hidden else (None, None)
        heads_BxHx2 = streams_BxSx2[:, hidden:hidden + heads] if drawn and heads else None
        attention = functools.partial(SelfAttention(c, name="attention"), x_BxLxD, input_mask_BxL,
                                      deterministic=deterministic, streams_BxHx2=heads_BxHx2)
        if _fused_residual_norm(c):
            a_BxLxD, bias_D = attention()
            x_BxLxD = _ResidualNorm(c, name="attention_layer_norm")(a_BxLxD, bias_D, x_BxLxD, deterministic, first)
            f_BxLxD, bias_D = FeedForward(c, name="feed_forward")(x_BxLxD)
            x_BxLxD = _ResidualNorm(c, name="output_layer_norm")(f_BxLxD, bias_D, x_BxLxD, deterministic, second)
            return nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
        dropout = _dropout(c, c.dropout_rate)
        x_BxLxD = _layer_norm(c, "attention_layer_norm")(
            x_BxLxD + dropout(attention(), deterministic=deterministic, streams_Bx2=first))
        f_BxLxD = FeedForward(c, name="feed_forward")(x_BxLxD)
        x_BxLxD = _layer_norm(c, "output_layer_norm")(
            x_BxLxD + dropout(f_BxLxD, deterministic=deterministic, streams_Bx2=second))
        return nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))


class _ScanStep(BertLayer):
    """BertLayer as a scan body, (carry, mask, deterministic, streams) -> (carry, None); same parameter names."""

    def __call__(self, x_BxLxD, input_mask_BxL, deterministic: bool, streams_BxSx2=None):
        return super().__call__(x_BxLxD, input_mask_BxL, deterministic=deterministic, streams_BxSx2=streams_BxSx2), None


class _LoopStep(BertLayer):
    """BertLayer with `deterministic` positional, as `nn.remat`'s static argument."""

    def __call__(self, x_BxLxD, input_mask_BxL, deterministic: bool, streams_BxSx2=None):
        return super().__call__(x_BxLxD, input_mask_BxL, deterministic=deterministic, streams_BxSx2=streams_BxSx2)


def _remat(config: ModelConfig, layer_cls):
    """The layer class rematerialised by `config.remat` (deterministic, argument 3 with self, is static)."""
    if config.remat == "none":
        return layer_cls
    # dots_saveable keeps the outputs of matmuls without batch dimensions, i.e. the weight
    # projections (Q, K, V, output, feed-forward); attention scores, softmax, dropout, GELU and
    # LayerNorm are recomputed. full keeps only each layer's input.
    policy = None if config.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    # A rolled scan's loop keeps XLA from merging the recomputation with the forward pass; unrolled, it does not.
    rolled = config.scan_layers and _settled(config).scan_unroll == 1
    return nn.remat(layer_cls, policy=policy, prevent_cse=not rolled, static_argnums=(3,))


class BertEncoder(nn.Module):
    """Embeddings and `num_layers` post-LN layers; returns the last hidden states [B, L, D]."""

    config: ModelConfig

    def setup(self):
        c = self.config
        self.embed = BertEmbeddings(c)
        if c.scan_layers:
            scan = nn.scan(_remat(c, _ScanStep), variable_axes={"params": 0},
                           split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast, nn.broadcast, 0),
                           length=c.num_layers, unroll=min(_settled(c).scan_unroll, c.num_layers),
                           metadata_params={nn.PARTITION_NAME: "layers"})
            self.layers = scan(c, name=SCANNED_LAYERS)
        else:
            layer_cls = _remat(c, _LoopStep)
            self.layers = [layer_cls(c, name=f"layer_{i}") for i in range(c.num_layers)]

    def __call__(self, input_ids_BxL, input_mask_BxL, token_type_ids_BxL=None, *, deterministic: bool):
        if token_type_ids_BxL is None:
            token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
        x_BxLxD = self.embed(input_ids_BxL, token_type_ids_BxL, deterministic=deterministic)
        streams_NxBxSx2 = self._streams(input_ids_BxL.shape[0], deterministic)
        if self.config.scan_layers:
            return self.layers(x_BxLxD, input_mask_BxL, deterministic, streams_NxBxSx2)[0]
        for i, layer in enumerate(self.layers):
            streams_BxSx2 = None if streams_NxBxSx2 is None else streams_NxBxSx2[i]
            x_BxLxD = layer(x_BxLxD, input_mask_BxL, deterministic, streams_BxSx2)
        return x_BxLxD

    def _streams(self, batch: int, deterministic: bool):
        """Every layer's hashed-dropout streams, [layers, B, S, 2], or None where none is hashed.

        One draw from the encoder's key: a key and a draw per module cost a GPU step 12 small
        kernels a layer (benchmarks/README.md, "Every layer's dropout streams at once").
        """
        hidden, heads = layer_streams(self.config)
        if deterministic or not hidden + heads:
            return None
        shape = (self.config.num_layers, batch, hidden + heads, 2)
        return jax.random.bits(self.make_rng("dropout"), shape, jnp.uint32)


class BertForMaskedLM(nn.Module):
    """Encoder + MLM head; float32 logits over the (padded) vocabulary.

    Called with `positions_BxP` (int32, P per sequence), the head runs on those positions
    only and the logits are [B, P, V]; without, at every position, [B, L, V].
    """

    config: ModelConfig

    def setup(self):
        c = self.config
        self.encoder = BertEncoder(c)
        # D -> D: the output axis is left unsharded (it feeds the tied decoder's contraction).
        self.transform = nn.Dense(c.hidden_size, dtype=_dtype(c), param_dtype=jnp.float32,
                                  kernel_init=_init(c, "embed", None), bias_init=_zeros(None))
        self.transform_layer_norm = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=_dtype(c), param_dtype=jnp.float32,
                                                 scale_init=_ones(None), bias_init=_zeros(None))
        self.output_bias = self.param("output_bias", _zeros("vocab"), (c.padded_vocab_size,), jnp.float32)

    def predict(self, hidden_BxPxD):
        """The MLM head on hidden states: transform, GELU, LayerNorm, tied decoder + bias.

        The padding rows of the vocabulary get a bias of -inf, so their logits are -inf: they
        take no probability and never win an argmax. Masking the [V] bias rather than the
        logits is one select over V instead of a pass over [B, P, V]: on XLA:CPU the select
        over the logits made the full-logit step 1.8x slower at seq 512.
        """
        c = self.config
        bias_V = self.output_bias
        if c.padded_vocab_size != c.vocab_size:
            bias_V = jnp.where(jnp.arange(c.padded_vocab_size) < c.vocab_size, bias_V, -jnp.inf)
        h_BxPxD = self.transform_layer_norm(_gelu(_settled(c).gelu, self.transform(hidden_BxPxD)))
        logits_BxPxV = _output_bias(c, self.encoder.embed.attend(h_BxPxD), bias_V)
        return nn.with_logical_constraint(logits_BxPxV, ("batch", "length", "vocab"))

    def __call__(self, input_ids_BxL, input_mask_BxL, token_type_ids_BxL=None, *, deterministic: bool,
                 positions_BxP=None):
        x_BxLxD = self.encoder(input_ids_BxL, input_mask_BxL, token_type_ids_BxL, deterministic=deterministic)
        if positions_BxP is not None:
            x_BxLxD = _gather_positions(x_BxLxD, positions_BxP)
        return self.predict(x_BxLxD)


@jax.custom_vjp
def _gather_positions(x_BxLxD, positions_BxP):
    """x at P positions of each row, whose gradient is a product with the positions' one-hot.

    The gather's own gradient scatters into a zero [B, L, D] array, which XLA:GPU kept in memory
    and shared with every dropout's select: each layer read 24 MiB of zeros forward and backward
    (BERT-base at 32 x 512; benchmarks/README.md, "The gathered head's gradient"). The one-hot
    product is exact: one row of g per entry, or their sum where a position repeats.
    """
    return jnp.take_along_axis(x_BxLxD, positions_BxP[..., None], axis=1)


def _gather_positions_fwd(x_BxLxD, positions_BxP):
    at_BxLxP = positions_BxP[:, None, :] == jnp.arange(x_BxLxD.shape[1])[None, :, None]
    return _gather_positions(x_BxLxD, positions_BxP), at_BxLxP


def _gather_positions_bwd(at_BxLxP, g_BxPxD):
    # Accumulated in float32 whatever the dtype (HIGHEST keeps float32 g exact on TF32 GPUs).
    dx_BxLxD = jnp.einsum("blp,bpd->bld", at_BxLxP.astype(g_BxPxD.dtype), g_BxPxD,
                          precision=jax.lax.Precision.HIGHEST, preferred_element_type=g_BxPxD.dtype)
    return dx_BxLxD, None


_gather_positions.defvjp(_gather_positions_fwd, _gather_positions_bwd)


def unstack_layers(params: dict) -> dict:
    """BertForMaskedLM params with scanned layers -> BERT's per-layer layout (`encoder/layer_<i>`).

    The per-layer names are those of a model built with `scan_layers=False`, so exports and
    checkpoints of either layout read the same. Params already per layer come back as they are.
    """
    encoder = dict(params["encoder"])
    if SCANNED_LAYERS not in encoder:
        return params
    stacked = encoder.pop(SCANNED_LAYERS)
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    for i in range(num_layers):
        encoder[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return {**params, "encoder": encoder}


def stack_layers(params: dict) -> dict:
    """The inverse of `unstack_layers`: `encoder/layer_<i>` -> `encoder/layers` with a leading layer axis."""
    encoder = dict(params["encoder"])
    indices = sorted(int(m.group(1)) for k in encoder if (m := _LAYER.fullmatch(k)))
    if not indices:
        return params
    if indices != list(range(len(indices))):
        raise ValueError(f"encoder layers {indices} are not numbered 0..{len(indices) - 1}")
    layers = [encoder.pop(f"layer_{i}") for i in indices]
    encoder[SCANNED_LAYERS] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return {**params, "encoder": encoder}
