"""The TPU attention kernel (pmi_jax/tpu_attention.py), run by Pallas' interpreter on CPU: the
written-out attention's values and gradients given the same mask as the GPU kernel's keep rule.
Its statistics are the GPU kernel's (tests/test_fused_attention.py): the rule is the same function."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import fused_attention, tpu_attention
from pmi_jax.model import written_attention

B, L, H, K = 3, 128, 4, 64  # two blocks of two 64-wide heads, as BERT-base's 12 heads make six
LENGTHS = (1, 37, 128)  # odd padding: one valid key, 91 padding keys, none


def _inputs(dtype, heads=H, head_dim=K):
    keys = jax.random.split(jax.random.key(0), 5)
    q, k, v, g = (jax.random.normal(key, (B, L, heads, head_dim), jnp.float32) for key in keys[:4])
    streams = fused_attention.dropout_streams(keys[4], B, heads)
    return (q.astype(dtype), k.astype(dtype), v.astype(dtype)), g, streams


def _written(qkv, g, lengths_B, mask_BxHxLxL, rate):
    """Values and q/k/v gradients of the model's written-out attention with `mask` as its dropout."""
    valid_BxL = (jnp.arange(L)[None, :] < lengths_B[:, None]).astype(jnp.int32)
    drop = (lambda p: p * mask_BxHxLxL.astype(p.dtype) / (1.0 - rate)) if rate else (lambda p: p)
    out, vjp = jax.vjp(lambda q, k, v: written_attention(q, k, v, valid_BxL, drop), *qkv)
    return [np.asarray(x, np.float32) for x in (out, *vjp(g.astype(out.dtype)))]


def _kernel(qkv, g, lengths_B, streams, rate):
    out, vjp = jax.vjp(lambda q, k, v: tpu_attention.attention(q, k, v, lengths_B, streams, rate=rate,
                                                               interpret=True), *qkv)
    return [np.asarray(x, np.float32) for x in (out, *vjp(g.astype(out.dtype)))]


@pytest.mark.parametrize("rate, heads, head_dim", [(0.1, H, K), (0.0, H, K), (0.1, 2, 16)])
def test_float32_values_and_gradients_are_the_written_out_attentions_with_the_same_mask(rate, heads, head_dim):
    qkv, g, streams = _inputs(jnp.float32, heads, head_dim)
    lengths_B = jnp.array(LENGTHS)
    mask = fused_attention.keep_mask(streams, L, rate)
    got = _kernel(qkv, g, lengths_B, streams, rate)
    want = _written(qkv, g, lengths_B, mask, rate)
    for name, a, r in zip(("out", "dq", "dk", "dv"), got, want):
        # Same sums in another order, the scale applied to the scores rather than to q: float32 rounding.
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * np.abs(r).max(), err_msg=name)
    # The padding keys take no part: their key and value gradients are exactly zero.
    for b, n in enumerate(LENGTHS):
        assert not np.any(got[2][b, n:]) and not np.any(got[3][b, n:])


@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_bfloat16_is_as_close_to_float32_as_the_written_out_attention_in_bfloat16(rate):
    """bf16 inputs: the kernel's error against the float32 computation on the same (bf16-valued)
    inputs and mask is at most twice the written-out bf16 attention's own error, plus 1% of the
    largest value (both round the probabilities to bf16 before the product with v)."""
    qkv, g, streams = _inputs(jnp.bfloat16)
    lengths_B = jnp.array(LENGTHS)
    mask = fused_attention.keep_mask(streams, L, rate)
    exact = _written([x.astype(jnp.float32) for x in qkv], g, lengths_B, mask, rate)
    written_bf16 = _written(qkv, g, lengths_B, mask, rate)
    got = _kernel(qkv, g, lengths_B, streams, rate)
    for name, a, w, e in zip(("out", "dq", "dk", "dv"), got, written_bf16, exact):
        scale = np.abs(e).max()
        assert np.abs(a - e).max() <= 2 * np.abs(w - e).max() + 0.01 * scale, name


def test_the_gpu_kernel_and_the_tpu_kernel_give_the_same_values_from_the_same_streams():
    """A run moved between a GPU and a TPU keeps its masks: both kernels (interpreted) agree to
    float32 rounding with dropout on, and differ from the values under another key's streams."""
    qkv, g, streams = _inputs(jnp.float32)
    lengths_B = jnp.array(LENGTHS)
    tpu = _kernel(qkv, g, lengths_B, streams, 0.1)
    out, vjp = jax.vjp(lambda q, k, v: fused_attention.attention(q, k, v, lengths_B, streams, rate=0.1,
                                                                 blocks=(32, 32), interpret=True), *qkv)
    gpu = [np.asarray(x, np.float32) for x in (out, *vjp(g))]
    for name, a, r in zip(("out", "dq", "dk", "dv"), tpu, gpu):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * np.abs(r).max(), err_msg=name)
    other = _kernel(qkv, g, lengths_B, fused_attention.dropout_streams(jax.random.key(7), B, H), 0.1)
    assert np.abs(other[0] - tpu[0]).max() > 0.05


def test_shapes_the_kernel_does_not_take_are_refused():
    qkv, _, streams = _inputs(jnp.float32)
    with pytest.raises(ValueError, match="streams of a dropout key"):
        tpu_attention.attention(*qkv, jnp.array(LENGTHS), None, rate=0.1, interpret=True)
    with pytest.raises(ValueError, match="over the TPU kernel's 512"):
        tpu_attention.check_shapes((1, 1024, 12, 64))
    with pytest.raises(ValueError, match="do not tile"):
        tpu_attention.check_shapes((1, 512, 3, 64))  # 3 heads of 64: a block of 2 leaves one over
