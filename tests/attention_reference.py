"""What the attention kernels' tests (test_fused_attention.py: GPU, test_tpu_attention.py: TPU) hold
them to: the model's written-out attention, given the kernel's own dropout mask, in values and q/k/v
gradients. One definition, so that both kernels answer to the same reference and tolerances."""
import jax
import jax.numpy as jnp
import numpy as np

from pmi_jax import fused_attention
from pmi_jax.model import written_attention

NAMES = ("out", "dq", "dk", "dv")


def inputs(dtype, batch, length, heads, head_dim):
    """((q, k, v) in `dtype`, the output gradient g, dropout streams), all [B, L, H, K] but the streams."""
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v, g = (jax.random.normal(key, (batch, length, heads, head_dim), jnp.float32) for key in keys[:4])
    streams = fused_attention.dropout_streams(keys[4], batch, heads)
    return (q.astype(dtype), k.astype(dtype), v.astype(dtype)), g, streams


def values_and_grads(fn, args, g):
    """[value, one gradient per argument] of `fn(*args)` as float32 numpy, for the output gradient g
    (attention: out, dq, dk, dv; also the residual LayerNorm's tests)."""
    out, vjp = jax.vjp(fn, *args)
    return [np.asarray(x, np.float32) for x in (out, *vjp(g.astype(out.dtype)))]


def written(qkv, g, lengths_B, mask_BxHxLxL, rate):
    """Values and q/k/v gradients of the model's written-out attention with `mask` as its dropout."""
    length = qkv[0].shape[1]
    valid_BxL = (jnp.arange(length)[None, :] < lengths_B[:, None]).astype(jnp.int32)
    keep = (mask_BxHxLxL, fused_attention.keep_probability(rate)) if rate else (None, 1.0)
    return values_and_grads(lambda q, k, v: written_attention(q, k, v, valid_BxL, *keep), qkv, g)


def assert_float32_close(got, want):
    """Same sums in another order (blocked or whole-row products, the scale on the scores): float32
    rounding only."""
    for name, a, r in zip(NAMES, got, want):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * np.abs(r).max(), err_msg=name)


def assert_padding_keys_take_no_part(got, lengths):
    """Key and value gradients exactly zero at every padding position."""
    for b, n in enumerate(lengths):
        assert not np.any(got[2][b, n:]) and not np.any(got[3][b, n:])


def assert_bfloat16_within_the_written_outs_error(got, qkv, g, lengths_B, mask, rate):
    """bf16 inputs: the kernel's error against the float32 computation on the same (bf16-valued)
    inputs and mask is at most twice the written-out bf16 attention's own error, plus 1% of the
    largest value (both round the probabilities to bf16 before the product with v)."""
    exact = written([x.astype(jnp.float32) for x in qkv], g, lengths_B, mask, rate)
    written_bf16 = written(qkv, g, lengths_B, mask, rate)
    for name, a, w, e in zip(NAMES, got, written_bf16, exact):
        assert np.abs(a - e).max() <= 2 * np.abs(w - e).max() + 0.01 * np.abs(e).max(), name


def assert_float32_matches_written(kernel, qkv, g, streams, lengths, rate):
    """`kernel(qkv, g, lengths_B, streams, rate)` (values and gradients) against the written-out
    attention with the kernel's own mask, to float32 rounding; padding keys take no part."""
    lengths_B = jnp.array(lengths)
    mask = fused_attention.keep_mask(streams, qkv[0].shape[1], rate)
    got = kernel(qkv, g, lengths_B, streams, rate)
    assert_float32_close(got, written(qkv, g, lengths_B, mask, rate))
    assert_padding_keys_take_no_part(got, lengths)


def assert_bfloat16_matches_written(kernel, qkv, g, streams, lengths, rate):
    """`kernel` on bf16 inputs: within `assert_bfloat16_within_the_written_outs_error`."""
    lengths_B = jnp.array(lengths)
    mask = fused_attention.keep_mask(streams, qkv[0].shape[1], rate)
    got = kernel(qkv, g, lengths_B, streams, rate)
    assert_bfloat16_within_the_written_outs_error(got, qkv, g, lengths_B, mask, rate)
