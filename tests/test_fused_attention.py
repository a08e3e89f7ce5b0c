"""The Pallas attention with in-kernel dropout (pmi_jax/fused_attention.py), run by Pallas' interpreter
on CPU: the written-out attention's values and gradients given the same mask, and the mask's statistics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import fused_attention
from tests import attention_reference as reference
from tests import resume_check

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

B, L, H, K = 3, 128, 2, 16
LENGTHS = (1, 37, 128)  # odd padding: one valid key, a partial last block, none
BLOCKS = (32, 32)


def _inputs(dtype):
    return reference.inputs(dtype, B, L, H, K)


def _kernel(qkv, g, lengths_B, streams, rate):
    return reference.values_and_grads(lambda q, k, v: fused_attention.attention(
        q, k, v, lengths_B, streams, rate=rate, blocks=BLOCKS, interpret=True), qkv, g)


@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_float32_values_and_gradients_are_the_written_out_attentions_with_the_same_mask(rate):
    qkv, g, streams = _inputs(jnp.float32)
    reference.assert_float32_matches_written(_kernel, qkv, g, streams, LENGTHS, rate)


@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_bfloat16_is_as_close_to_float32_as_the_written_out_attention_in_bfloat16(rate):
    """The written-out path rounds probabilities to bf16 before the product; the kernel rounds them
    too, in other blocks (the bound: reference.assert_bfloat16_within_the_written_outs_error)."""
    qkv, g, streams = _inputs(jnp.bfloat16)
    reference.assert_bfloat16_matches_written(_kernel, qkv, g, streams, LENGTHS, rate)


@pytest.mark.parametrize("length,lengths", [(80, (1, 37, 80)), (24, (24, 5, 17))])
def test_lengths_the_blocks_do_not_divide_give_the_written_out_attention(length, lengths):
    """The kernel runs padded to a multiple of the blocks (80 -> 96) or to a power of two (24 -> 32);
    values, gradients and the mask of every (q, k) are still those at the length itself."""
    assert fused_attention.padded_length(length, BLOCKS) == {80: 96, 24: 32}[length]
    qkv, g, streams = reference.inputs(jnp.float32, B, length, H, K)
    reference.assert_float32_matches_written(_kernel, qkv, g, streams, lengths, 0.1)


@pytest.mark.parametrize("length,lengths", [(L, LENGTHS), (80, (1, 37, 80))])
def test_the_stacked_input_gives_the_same_bits_as_three_inputs(length, lengths):
    """`attention_stacked` reads q, k and v from one [B, L, 3, H, K] array and writes dQ, then dK and
    dV into one gradient (the dK/dV kernel aliased to the dQ kernel's output): identical values and
    gradients, unpadded and padded (80 -> 96)."""
    qkv, g, streams = reference.inputs(jnp.float32, B, length, H, K)
    stacked_BxLx3xHxK = jnp.stack(qkv, axis=2)
    lengths_B = jnp.array(lengths)

    def run(kernel, x):
        out, vjp = jax.vjp(lambda x: kernel(x, lengths_B, streams, rate=0.1, blocks=BLOCKS, interpret=True), x)
        return out, vjp(g)[0]

    three = run(lambda x, *a, **k: fused_attention.attention(*(x[:, :, i] for i in range(3)), *a, **k),
                stacked_BxLx3xHxK)
    one = run(fused_attention.attention_stacked, stacked_BxLx3xHxK)
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)
    assert all(np.abs(one[1][:, :, slot]).max() > 0.1 for slot in range(3))  # dQ, dK and dV all written


def test_the_stacked_inputs_bias_gradient_is_the_sum_of_its_slots_gradients():
    """With a bias, `attention_stacked(x, bias)` is `attention` on the slots of x + bias: the same
    values and input gradients bit for bit, and the bias's gradient (from the backward kernels'
    block sums) the sum over batch and length of each slot's, to float32 rounding."""
    qkv, g, streams = reference.inputs(jnp.float32, B, 80, H, K)
    stacked_BxLx3xHxK = jnp.stack(qkv, axis=2)
    bias_3xHxK = jax.random.normal(jax.random.key(5), (3, H, K), jnp.float32)
    lengths_B = jnp.array((1, 37, 80))
    common = dict(rate=0.1, blocks=BLOCKS, interpret=True)
    out, vjp = jax.vjp(lambda x, b: fused_attention.attention_stacked(x, lengths_B, streams, b, **common),
                       stacked_BxLx3xHxK, bias_3xHxK)
    d_stack, d_bias = vjp(g)
    biased = stacked_BxLx3xHxK + bias_3xHxK
    three, vjp3 = jax.vjp(lambda *x: fused_attention.attention(*x, lengths_B, streams, **common),
                          *(biased[:, :, i] for i in range(3)))
    d_three = vjp3(g)
    np.testing.assert_array_equal(out, three)
    np.testing.assert_array_equal(d_stack, jnp.stack(d_three, axis=2))
    np.testing.assert_allclose(d_bias, jnp.stack([d.sum(axis=(0, 1)) for d in d_three]), rtol=1e-5, atol=1e-5)
    assert np.abs(d_bias[0]).max() > 0.1 and np.abs(d_bias[2]).max() > 0.1  # the key bias's is ~0 (softmax)


def test_same_streams_same_bits_and_the_backward_regenerates_the_forwards_mask():
    """Run twice, the kernel gives identical bytes; with streams of another key it gives other values."""
    qkv, g, streams = _inputs(jnp.float32)
    lengths_B = jnp.array(LENGTHS)
    first, again = (_kernel(qkv, g, lengths_B, streams, 0.1) for _ in range(2))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = _kernel(qkv, g, lengths_B, fused_attention.dropout_streams(jax.random.key(7), B, H), 0.1)
    assert np.abs(other[0] - first[0]).max() > 0.05


def _masks(key, rate, shape=(4, 4, 256)):
    b, h, length = shape
    return np.asarray(fused_attention.keep_mask(fused_attention.dropout_streams(key, b, h), length, rate))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_rate_is_one_minus_the_dropout_rate_to_16_bits(rate):
    """The keep probability is round((1 - rate) 2^16) / 2^16, within 2^-17 of 1 - rate; over
    4 x 4 x 256 x 256 = 1,048,576 entries the kept share is that within 5 standard errors; per query
    row and per key column the counts vary as binomials do (variance ratio within 0.8-1.2 over
    4,096 rows or columns: the ratio's standard error is 0.022)."""
    keep_prob = fused_attention.keep_probability(rate)
    assert abs(keep_prob - (1 - rate)) <= 2**-17 and keep_prob * 2**16 == int(keep_prob * 2**16)
    keep = _masks(jax.random.key(3), rate)
    n = keep.size
    assert abs(keep.mean() - keep_prob) <= 5 * np.sqrt(rate * (1 - rate) / n)
    binomial_var = 256 * rate * (1 - rate)
    for axis in (-1, -2):
        counts = keep.sum(axis=axis).ravel()
        assert 0.8 <= counts.var() / binomial_var <= 1.2, axis


def test_a_pair_of_keys_takes_the_halves_of_one_hash():
    """The documented rule: keys 2j and 2j + 1 of query q are kept where the low and the high 16 bits
    of entry_bits(q, j) are below round(0.9 x 2^16) = 58982 (docs/gpu.md)."""
    streams = fused_attention.dropout_streams(jax.random.key(5), 2, 3)
    mask = np.asarray(fused_attention.keep_mask(streams, 64, 0.1))
    assert fused_attention.keep_threshold16(0.9) == 58982
    pos = jnp.arange(64, dtype=jnp.uint32)
    for b in range(2):
        for h in range(3):
            bits = np.asarray(fused_attention.entry_bits(streams[b, h, 0], streams[b, h, 1], pos, pos[:32]))
            np.testing.assert_array_equal(mask[b, h][:, 0::2], (bits & 0xFFFF) < 58982)
            np.testing.assert_array_equal(mask[b, h][:, 1::2], (bits >> 16) < 58982)


def _corr(a, b):
    return np.corrcoef(a.ravel().astype(np.float64), b.ravel().astype(np.float64))[0, 1]


def test_masks_of_other_keys_layers_and_positions_are_uncorrelated():
    """|correlation| below 5 / sqrt(n) (n >= 0.5M entries, so below 0.007): between the masks of two
    keys, of two layers' keys (folded in as flax's per-module RNG does), of streams one bit apart,
    and between neighbouring keys, queries, heads and batch rows of one mask, and between the two
    keys whose bits are the halves of one hash (2j and 2j + 1)."""
    rate = 0.1
    key = jax.random.key(11)
    base = _masks(key, rate)
    bound = 5 / np.sqrt(base.size)
    others = {"another key": _masks(jax.random.key(12), rate),
              "another layer": _masks(jax.random.fold_in(key, 1), rate)}
    streams = fused_attention.dropout_streams(key, 4, 4)
    others["stream bit 0 flipped"] = np.asarray(fused_attention.keep_mask(streams ^ jnp.uint32(1), 256, rate))
    for name, other in others.items():
        assert abs(_corr(base, other)) < bound, name
    neighbours = {"next key": (base[..., :-1], base[..., 1:]), "next query": (base[..., :-1, :], base[..., 1:, :]),
                  "next head": (base[:, :-1], base[:, 1:]), "next batch row": (base[:-1], base[1:]),
                  "the other half of the hash": (base[..., 0::2], base[..., 1::2])}
    for name, (a, b) in neighbours.items():
        assert abs(_corr(a, b)) < 5 / np.sqrt(a.size), name


def test_shapes_the_kernel_does_not_take_are_refused():
    qkv, _, streams = _inputs(jnp.float32)
    with pytest.raises(ValueError, match="must be a power of two"):
        fused_attention.attention(*qkv, jnp.array(LENGTHS), streams, rate=0.1, blocks=(48, 32), interpret=True)
    with pytest.raises(ValueError, match="streams of a dropout key"):
        fused_attention.attention(*qkv, jnp.array(LENGTHS), None, rate=0.1, interpret=True)
    for launch in (((3, 2), (4, 2)), ((4, 0), (4, 2)), ((4, 2),), 4):  # warps not a power of two, no stage, ...
        with pytest.raises(ValueError, match=r"attention launch .*: expected \(\(num_warps, num_stages\) forward"):
            fused_attention.attention(*qkv, jnp.array(LENGTHS), streams, rate=0.1, launch=launch, interpret=True)
    with pytest.raises(ValueError, match=r"attention_stacked takes \[B, L, 3, H, K\]; got shape \(3, 128, 2, 16\)"):
        fused_attention.attention_stacked(qkv[0], jnp.array(LENGTHS), streams, rate=0.1, interpret=True)


@pytest.mark.parametrize("fused_qkv", ["never", "always"])  # always: the stacked input, as on GPUs
def test_training_with_the_kernel_resumes_to_the_same_losses(tmp_path, fused_qkv):
    """The trainer with model.attention=pallas (interpreted on CPU) and the paper's attention dropout
    resumes to bitwise the same losses (tests/resume_check.py)."""
    resume_check.assert_resumes_to_the_same_losses(tmp_path, "model.attention=pallas",
                                                   "model.attention_dropout_rate=0.1", f"model.fused_qkv={fused_qkv}")


def test_runs_take_any_sequence_length():
    """The trainer refuses no length for the GPU kernel (it pads: above); split over a mesh too."""
    from pmi_jax import partitioning, train
    from pmi_jax.config import apply_overrides, load_config

    def check(*overrides, devices=1):
        config = apply_overrides(load_config("tiny"), ["model.attention=pallas", "model.max_position_embeddings=128",
                                                       "mesh.model=1", *overrides])
        train.validate(config, partitioning.make_mesh(config.mesh, jax.devices()[:devices]))

    for length in (128, 48, 96):
        check(f"data.seq_len={length}", "mesh.data=1")
    if len(jax.devices()) >= 2:  # split over the mesh (tests/test_model_kernels.py)
        check("data.seq_len=96", "mesh.data=2", devices=2)