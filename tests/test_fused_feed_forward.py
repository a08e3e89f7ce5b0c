"""The feed-forward with its GELU in the matmuls' epilogues (pmi_jax/fused_feed_forward.py), run by
Pallas' interpreter on CPU: its erfc against float64's, its values and gradients against the
model's XLA path (nn.Dense, `model._gelu`), and the model and trainer with it."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import fused_feed_forward
from pmi_jax.config import apply_overrides, load_config
from pmi_jax.errors import UserInputError
from pmi_jax.model import BertForMaskedLM, _gelu, for_evaluation, for_platform
from tests import attention_reference as reference
from tests import resume_check

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")


def test_erfc_is_accurate_relative_to_its_own_size():
    """Float32 erfc within 2e-6 of float64's (relative) up to z = 4 and 1.5e-5 up to 9, where the
    GELU's negative tail needs relative accuracy (1 + erf loses it past z = 2); the CDF within
    float32 rounding of 1 - it on the positive side."""
    z = np.linspace(0.0, 9.0, 20001, dtype=np.float32)
    ours = np.asarray(jax.jit(fused_feed_forward._erfc)(jnp.asarray(z)), np.float64)
    exact = np.array([math.erfc(v) for v in z.astype(np.float64)])
    relative = np.abs(ours / exact - 1.0)
    assert relative[z <= 4].max() < 2e-6 and relative.max() < 1.5e-5
    x = np.linspace(-12.0, 12.0, 4801, dtype=np.float32)
    cdf = np.asarray(fused_feed_forward.normal_cdf(jnp.asarray(x)), np.float64)
    exact_cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x.astype(np.float64)])
    np.testing.assert_allclose(cdf, exact_cdf, rtol=1.5e-5, atol=1e-7)


def test_gelu_and_its_slope_are_the_erf_forms_and_the_models_to_its_float32_tail():
    """Against float64's x P(x) and P(x) + x p(x) (relative 2e-5, or 5e-7 absolute for the slope's
    zero crossing), and against the model's float32 formula within 1e-6 absolute, which is where
    1 + erf loses the negative tail."""
    x = np.linspace(-8.0, 8.0, 3201, dtype=np.float32)
    x64 = x.astype(np.float64)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x64])
    exact_gelu, exact_slope = x64 * cdf, cdf + x64 * np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)
    ours = np.asarray(fused_feed_forward.gelu(jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(ours, exact_gelu, rtol=2e-5, atol=0.0)
    np.testing.assert_allclose(fused_feed_forward.gelu_slope(jnp.asarray(x)), exact_slope, rtol=2e-5, atol=5e-7)
    np.testing.assert_allclose(ours, _gelu("erf", jnp.asarray(x)), rtol=1e-5, atol=1e-6)


def _xla_path(x, w1, b1, w2):
    """What `FeedForward` computes with feed_forward=xla, without the output bias: nn.Dense's matmul
    and bias add in x's dtype, `model._gelu`, the second matmul."""
    h = jnp.dot(x, w1.astype(x.dtype)) + b1.astype(x.dtype)
    return jnp.dot(_gelu("erf", h), w2.astype(x.dtype))


def _inputs(dtype):
    keys = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(keys[0], (64, 48), jnp.float32).astype(dtype)
    w1, w2 = jax.random.normal(keys[1], (48, 96)) * 0.3, jax.random.normal(keys[2], (96, 48)) * 0.3
    b1, g = jax.random.normal(keys[3], (96,)) * 0.5, jax.random.normal(keys[4], (64, 48)).astype(dtype)
    return (x, w1, b1, w2), g


def _kernels(args, g):
    """Several blocks along every axis: 16 x 32 x 16 on [64, 48] x [48, 96]."""
    return reference.values_and_grads(lambda *a: fused_feed_forward.gelu_feed_forward(
        *a, blocks=(16, 32, 16), interpret=True), args, g)


def _relative_error(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_float32_values_and_gradients_are_the_xla_paths():
    """The output and all four gradients within 1e-5 of the XLA path's largest value."""
    args, g = _inputs(jnp.float32)
    for name, ours, theirs in zip(("y", "dx", "dw1", "db1", "dw2"), _kernels(args, g),
                                  reference.values_and_grads(_xla_path, args, g)):
        assert ours.shape == theirs.shape and _relative_error(ours, theirs) <= 1e-5, name


def test_bfloat16_is_as_close_to_float32_as_the_xla_path_in_bfloat16():
    """Against the float32 XLA path, each of the output and the four gradients in bf16 is within
    1.5 times the XLA path's own bf16 error, or 2^-8 of the largest value (the bias gradient sums
    in float32, where XLA:CPU sums bf16)."""
    args, g = _inputs(jnp.bfloat16)
    exact = reference.values_and_grads(_xla_path, (args[0].astype(jnp.float32), *args[1:]), g.astype(jnp.float32))
    for name, ours, theirs, truth in zip(("y", "dx", "dw1", "db1", "dw2"), _kernels(args, g),
                                         reference.values_and_grads(_xla_path, args, g), exact):
        assert _relative_error(ours, truth) <= max(1.5 * _relative_error(theirs, truth), 2.0 ** -8), name


def test_blocks_adapt_to_the_shapes_and_a_width_not_a_multiple_of_16_is_refused():
    assert fused_feed_forward._fit((128, 128, 64), 16384, 3072, 768) == (128, 128, 64)
    assert fused_feed_forward._fit((128, 128, 64), 96, 48, 80) == (32, 16, 16)
    x, w1 = jnp.ones((32, 24), jnp.float32), jnp.ones((24, 32), jnp.float32)
    with pytest.raises(ValueError, match=r"the contraction \(24\) is not a multiple of 16"):
        fused_feed_forward.gelu_feed_forward(x, w1, jnp.ones(32), w1.T, interpret=True)


def _model_config(feed_forward, **changes):
    config = apply_overrides(load_config("tiny"), ["model.vocab_size=128", "model.hidden_size=48", "model.num_heads=2",
                                                   "model.intermediate_size=64", "model.max_position_embeddings=32"])
    return dataclasses.replace(config.model, feed_forward=feed_forward, **changes)


@pytest.mark.parametrize("residual_norm", ["xla", "pallas"])
def test_the_model_has_the_same_parameters_and_the_same_loss_and_gradients(residual_norm):
    """In bf16, with dropout: the same parameter tree and initial values, the same dropout masks
    (the kernels draw none), the loss within 1e-3 and every gradient within 2^-7 of the largest."""
    from pmi_jax.mlm_loss import mlm_loss_terms

    ids = jax.random.randint(jax.random.key(1), (2, 16), 5, 128)
    batch = {"inputs": ids, "input_mask": jnp.ones((2, 16), jnp.int32), "targets": jnp.roll(ids, 1, axis=1),
             "weights": (jax.random.uniform(jax.random.key(2), (2, 16)) < 0.3).astype(jnp.float32)}
    results = {}
    for feed_forward in ("xla", "pallas"):
        config = for_platform(_model_config(feed_forward, dtype="bfloat16", residual_norm=residual_norm), "cpu")
        model = BertForMaskedLM(config)
        params = model.init({"params": jax.random.key(0)}, ids, batch["input_mask"], deterministic=True)["params"]
        loss = jax.value_and_grad(lambda p: mlm_loss_terms(model, p, batch, jax.random.key(3), 4.0, False)[0])
        results[feed_forward] = params, *loss(params)
    (params_a, loss_a, grads_a), (params_b, loss_b, grads_b) = results["xla"], results["pallas"]
    assert jax.tree.structure(params_a) == jax.tree.structure(params_b)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)))
    assert abs(float(loss_a) - float(loss_b)) <= 1e-3 * abs(float(loss_a))
    largest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads_a))
    assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b))) \
        <= 2.0 ** -7 * largest


def test_platforms_settle_the_kernels_and_refuse_them_where_they_do_not_apply():
    assert load_config("base").model.feed_forward == "xla"  # the default until a GPU times it
    config = _model_config("pallas")
    assert [for_platform(config, p).feed_forward for p in ("gpu", "cuda", "cpu")] == [
        "pallas-triton", "pallas-triton", "pallas-interpret"]
    assert for_evaluation(config).feed_forward == "xla"
    with pytest.raises(UserInputError, match="feed_forward=pallas: .* a tpu program takes model.feed_forward=xla"):
        for_platform(config, "tpu")
    with pytest.raises(UserInputError, match="computes the erf GELU: set model.gelu=erf"):
        _model_config("pallas", gelu="tanh")
    with pytest.raises(UserInputError, match="model.feed_forward='fused': expected one of xla, pallas"):
        _model_config("fused")


def test_training_with_the_kernels_resumes_to_the_same_losses(tmp_path):
    """The trainer with model.feed_forward=pallas (interpreted on CPU) resumes to bitwise the same
    losses (tests/resume_check.py)."""
    resume_check.assert_resumes_to_the_same_losses(tmp_path, "model.feed_forward=pallas")
