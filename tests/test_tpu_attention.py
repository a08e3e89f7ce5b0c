"""The TPU attention kernel (pmi_jax/tpu_attention.py), run by Pallas' interpreter on CPU: the
written-out attention's values and gradients given the same mask as the GPU kernel's keep rule.
Its statistics are the GPU kernel's (tests/test_fused_attention.py): the rule is the same function."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import fused_attention, tpu_attention
from tests import attention_reference as reference

B, L, H, K = 3, 128, 4, 64  # two blocks of two 64-wide heads, as BERT-base's 12 heads make six
LENGTHS = (1, 37, 128)  # odd padding: one valid key, 91 padding keys, none


def _inputs(dtype, heads=H, head_dim=K):
    return reference.inputs(dtype, B, L, heads, head_dim)


def _kernel(qkv, g, lengths_B, streams, rate):
    return reference.values_and_grads(lambda q, k, v: tpu_attention.attention(
        q, k, v, lengths_B, streams, rate=rate, interpret=True), qkv, g)


@pytest.mark.parametrize("rate, heads, head_dim", [(0.1, H, K), (0.0, H, K), (0.1, 2, 16)])
def test_float32_values_and_gradients_are_the_written_out_attentions_with_the_same_mask(rate, heads, head_dim):
    qkv, g, streams = _inputs(jnp.float32, heads, head_dim)
    reference.assert_float32_matches_written(_kernel, qkv, g, streams, LENGTHS, rate)


@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_bfloat16_is_as_close_to_float32_as_the_written_out_attention_in_bfloat16(rate):
    """The bound: reference.assert_bfloat16_within_the_written_outs_error."""
    qkv, g, streams = _inputs(jnp.bfloat16)
    reference.assert_bfloat16_matches_written(_kernel, qkv, g, streams, LENGTHS, rate)


def test_the_gpu_kernel_and_the_tpu_kernel_give_the_same_values_from_the_same_streams():
    """A run moved between a GPU and a TPU keeps its masks: both kernels (interpreted) agree to
    float32 rounding with dropout on, and differ from the values under another key's streams."""
    qkv, g, streams = _inputs(jnp.float32)
    lengths_B = jnp.array(LENGTHS)
    tpu = _kernel(qkv, g, lengths_B, streams, 0.1)
    gpu = reference.values_and_grads(lambda q, k, v: fused_attention.attention(
        q, k, v, lengths_B, streams, rate=0.1, blocks=(32, 32), interpret=True), qkv, g)
    reference.assert_float32_close(tpu, gpu)
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
