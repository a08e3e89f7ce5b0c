"""The fused bias + dropout + residual + LayerNorm kernel (pmi_jax/fused_layer_norm.py), run by Pallas'
interpreter on CPU: the model's XLA path (flax's LayerNorm after the same operations) given the
kernel's own mask, in values and all five gradients; the mask's statistics; the model with it."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import fused_layer_norm
from pmi_jax.config import apply_overrides, load_config
from pmi_jax.errors import UserInputError
from pmi_jax.model import BertForMaskedLM, for_platform
from tests import attention_reference as reference
from tests import resume_check

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

B, D, EPS = 2, 96, 1e-12  # D not a power of two: the kernel's masked columns
NAMES = ("y", "da", "dbias", "dx", "dscale", "doffset")


def _inputs(dtype, length):
    keys = jax.random.split(jax.random.key(0), 7)
    a, x, g = (jax.random.normal(k, (B, length, D), jnp.float32).astype(dtype) for k in keys[:3])
    bias, scale, offset = (jax.random.normal(k, (D,), jnp.float32) * 0.1 for k in keys[3:6])
    return (a, bias, x, 1.0 + scale, offset), g, fused_layer_norm.dropout_streams(keys[6], B)


def _kernel(args, g, streams, rate):
    return reference.values_and_grads(lambda *p: fused_layer_norm.residual_layer_norm(
        *p, streams, rate=rate, eps=EPS, interpret=True), args, g)


def _xla_path(args, g, keep, rate):
    """What `BertLayer` computes with residual_norm=xla: the bias add and dropout in the compute
    dtype, then flax's LayerNorm (float32 statistics), given `keep` as the dropout mask."""
    def fn(a, bias, x, scale, offset):
        h = a + bias.astype(a.dtype)
        if rate:
            h = h * keep.astype(h.dtype) / jnp.asarray(1.0 - rate, h.dtype)
        norm = nn.LayerNorm(epsilon=EPS, dtype=x.dtype, param_dtype=jnp.float32)
        return norm.apply({"params": {"scale": scale, "bias": offset}}, x + h)
    return reference.values_and_grads(fn, args, g)


def _mask(streams, length, rate):
    return fused_layer_norm.keep_mask(streams, length, D, rate) if rate else None


@pytest.mark.parametrize("length", [24, 37])  # blocks of 8 rows; one row (an odd length)
@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_float32_values_and_gradients_are_the_xla_paths_with_the_same_mask(rate, length):
    """Same sums in another order (two-pass variance against flax's one-pass): float32 rounding."""
    args, g, streams = _inputs(jnp.float32, length)
    got, want = _kernel(args, g, streams, rate), _xla_path(args, g, _mask(streams, length, rate), rate)
    for name, a, r in zip(NAMES, got, want):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * np.abs(r).max(), err_msg=name)


@pytest.mark.parametrize("rate", [0.1, 0.0])
def test_bfloat16_is_as_close_to_float32_as_the_xla_path_in_bfloat16(rate):
    """bf16 inputs: the kernel's error against the float32 computation on the same (bf16-valued)
    inputs and mask is at most twice the XLA path's own bf16 error, plus 1% of the largest value
    (the kernel rounds the residual sum once; the XLA path after each of its bf16 operations)."""
    length = 24
    args, g, streams = _inputs(jnp.bfloat16, length)
    keep = _mask(streams, length, rate)
    exact = _xla_path([a.astype(jnp.float32) for a in args], g.astype(jnp.float32), keep, rate)
    xla_bf16 = _xla_path(args, g, keep, rate)
    for name, a, w, e in zip(NAMES, _kernel(args, g, streams, rate), xla_bf16, exact):
        assert np.abs(a - e).max() <= 2 * np.abs(w - e).max() + 0.01 * np.abs(e).max(), name


def test_keep_rate_is_one_minus_the_dropout_rate_and_neighbours_are_independent():
    """Over 2 x 512 x 768 entries (BERT-base's rows): the kept share within 5 standard errors of 0.9,
    and the share kept beside a kept entry (next column, next row) the same within 5 errors."""
    streams = fused_layer_norm.dropout_streams(jax.random.key(3), 2)
    keep = np.asarray(fused_layer_norm.keep_mask(streams, 512, 768, 0.1))
    n = keep.size
    assert abs(keep.mean() - 0.9) < 5 * np.sqrt(0.09 / n)
    for after_kept in (keep[:, :, 1:][keep[:, :, :-1]], keep[:, 1:, :][keep[:, :-1, :]]):
        assert abs(after_kept.mean() - 0.9) < 5 * np.sqrt(0.09 / after_kept.size)
    other = np.asarray(fused_layer_norm.keep_mask(fused_layer_norm.dropout_streams(jax.random.key(4), 2), 512, 768,
                                                  0.1))
    assert abs((keep == other).mean() - 0.82) < 5 * np.sqrt(0.82 * 0.18 / n)  # another key: independent masks


def test_dropout_without_streams_is_refused():
    args, _, _ = _inputs(jnp.float32, 8)
    with pytest.raises(ValueError, match="streams of a dropout key"):
        fused_layer_norm.residual_layer_norm(*args, None, rate=0.1, interpret=True)


def _model_config(residual_norm):
    config = apply_overrides(load_config("tiny"), ["model.vocab_size=128", "model.hidden_size=48", "model.num_heads=2",
                                                   "model.intermediate_size=64", "model.max_position_embeddings=32"])
    return dataclasses.replace(config.model, residual_norm=residual_norm)


def test_the_model_has_the_same_parameters_and_without_dropout_the_same_outputs():
    ids = jax.random.randint(jax.random.key(1), (2, 16), 0, 128)
    mask = jnp.ones((2, 16), jnp.int32)
    outputs = {}
    for residual_norm in ("xla", "pallas"):
        model = BertForMaskedLM(_model_config(residual_norm))
        params = model.init({"params": jax.random.key(0)}, ids, mask, deterministic=True)
        outputs[residual_norm] = params, model.apply(params, ids, mask, deterministic=True)
    (xla_params, xla_logits), (pallas_params, pallas_logits) = outputs["xla"], outputs["pallas"]
    assert jax.tree.structure(xla_params) == jax.tree.structure(pallas_params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(xla_params), jax.tree.leaves(pallas_params)))
    np.testing.assert_allclose(pallas_logits, xla_logits, rtol=1e-5, atol=1e-5)


def test_the_kernel_draws_the_hashed_dropouts_masks():
    """GPU programs' XLA path (`dropout_mask=hash`, no XLA:CPU variants) hashes its hidden dropout
    from the same streams by the same rule, so `residual_norm=auto` changed no mask: in float32
    the kernel's logits are the XLA path's within 1e-5, where another dropout key moves them by
    over 1e-2."""
    ids = jax.random.randint(jax.random.key(1), (2, 16), 0, 128)
    mask = jnp.ones((2, 16), jnp.int32)
    logits = {}
    for residual_norm, key in (("xla", 2), ("pallas", 2), ("xla", 3)):
        config = dataclasses.replace(_model_config(residual_norm), dropout_rate=0.1, dropout_mask="hash",
                                     xla_cpu_variants="never")
        assert config.dtype == "float32"
        model = BertForMaskedLM(config)
        params = model.init({"params": jax.random.key(0)}, ids, mask, deterministic=True)
        logits[residual_norm, key] = np.asarray(model.apply(params, ids, mask, deterministic=False,
                                                            rngs={"dropout": jax.random.key(key)}))
    np.testing.assert_allclose(logits["pallas", 2], logits["xla", 2], rtol=1e-5, atol=1e-5)
    assert np.abs(logits["xla", 3] - logits["xla", 2]).max() > 1e-2


def test_platforms_settle_the_kernel_and_a_tpu_program_refuses_it():
    auto = _model_config("auto")
    assert load_config("base").model.residual_norm == "auto"  # the default
    bf16 = dataclasses.replace(auto, dtype="bfloat16")
    assert [for_platform(bf16, p).residual_norm for p in ("gpu", "cuda", "cpu", "tpu")] == [
        "pallas-triton", "pallas-triton", "xla", "xla"]
    assert for_platform(dataclasses.replace(auto, dtype="float32"), "gpu").residual_norm == "xla"
    config = _model_config("pallas")
    assert for_platform(config, "cuda").residual_norm == "pallas-triton"
    assert for_platform(config, "cpu").residual_norm == "pallas-interpret"
    assert for_platform(_model_config("xla"), "tpu").residual_norm == "xla"
    with pytest.raises(UserInputError, match="model.residual_norm=pallas: .* a tpu program takes model.residual_norm=xla"):
        for_platform(config, "tpu")


def test_training_with_the_kernel_resumes_to_the_same_losses(tmp_path):
    """The trainer with model.residual_norm=pallas (interpreted on CPU) and BERT's hidden dropout
    resumes to bitwise the same losses (tests/resume_check.py)."""
    resume_check.assert_resumes_to_the_same_losses(tmp_path, "model.residual_norm=pallas")



def test_a_run_trained_with_the_kernels_is_evaluated_on_the_xla_paths(tmp_path):
    """Evaluation drops nothing, so `checkpoints.restore_for_eval` gives the config "auto", the XLA
    paths off GPUs (`model.for_evaluation`: the interpreted kernels are slow, and TPUs refuse this
    one); on the restored parameters they give the kernels' logits."""
    from pmi_jax import batches, checkpoints, train

    config = apply_overrides(load_config("tiny"), [*resume_check.TINY, "train.num_steps=2", "model.residual_norm=pallas",
                                                   "model.attention=pallas"])
    source = batches.SyntheticBatches(config.model.vocab_size, config.data.seq_len, config.train.batch_size)
    workdir = str(tmp_path / "run")
    assert train.train(config, workdir, source, devices=jax.devices()[:1]).step == 2
    evaluated, params, _ = checkpoints.restore_for_eval(workdir)
    assert (evaluated.residual_norm, evaluated.attention) == ("auto", "auto")
    assert for_platform(evaluated, "cpu").residual_norm == "xla"
    assert dataclasses.replace(evaluated, residual_norm="pallas", attention="pallas") == config.model
    ids = jax.random.randint(jax.random.key(1), (2, 32), 0, config.model.vocab_size)
    mask = jnp.ones((2, 32), jnp.int32)
    logits = [BertForMaskedLM(c).apply({"params": params}, ids, mask, deterministic=True)
              for c in (evaluated, config.model)]
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)
