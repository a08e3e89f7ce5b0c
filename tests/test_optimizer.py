"""AdamW of BERT pretraining: schedule, which parameters decay, clipping."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax.checkpoints import abstract_model_params
from pmi_jax.config import ModelConfig, OptimizerConfig
from pmi_jax.model import BertForMaskedLM
from pmi_jax.optimizer import _SMALL_LEAF, global_norm, learning_rate_schedule, make_optimizer, weight_decay_mask

CONFIG = OptimizerConfig(peak_learning_rate=1e-4, warmup_steps=100, weight_decay=0.01)


def test_schedule_warms_up_linearly_then_decays_linearly_to_zero():
    schedule = learning_rate_schedule(CONFIG, num_steps=1000)
    lr = np.array([float(schedule(s)) for s in range(0, 1001)])
    assert lr[0] == 0.0
    assert lr[50] == pytest.approx(0.5e-4)
    assert lr[100] == pytest.approx(1e-4)
    assert lr.max() == pytest.approx(1e-4) and lr.argmax() == 100
    assert lr[550] == pytest.approx(0.5e-4)  # halfway through the decay
    assert lr[1000] == pytest.approx(0.0, abs=1e-12)
    assert np.all(np.diff(lr[:101]) > 0) and np.all(np.diff(lr[100:]) < 0)


def test_weight_decay_skips_biases_and_layer_norms_only():
    params = abstract_model_params(BertForMaskedLM(ModelConfig(
        vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, max_position_embeddings=8)))
    mask = weight_decay_mask(params)
    flat = {"/".join(str(k.key) for k in path): decays
            for path, decays in jax.tree_util.tree_flatten_with_path(mask)[0]}
    no_decay = sorted(name for name, decays in flat.items() if not decays)
    assert all(name.endswith(("bias", "scale")) for name in no_decay)
    assert "encoder/layer_1/attention_layer_norm/scale" in no_decay and "output_bias" in no_decay
    decayed = sorted(name for name, decays in flat.items() if decays)
    assert all(name.endswith(("kernel", "embedding")) for name in decayed)
    assert len(decayed) == 3 + 2 * 6 + 1  # 3 embedding tables, 6 matrices per layer, the MLM transform


def test_adamw_shrinks_only_decayed_weights_by_lr_times_decay():
    """With zero gradients Adam's step is zero, leaving exactly the decoupled weight decay."""
    params = {"dense": {"kernel": jnp.full((3, 2), 2.0), "bias": jnp.full((2,), 2.0)},
              "norm": {"scale": jnp.full((2,), 2.0)}}
    config = OptimizerConfig(peak_learning_rate=0.1, warmup_steps=1, weight_decay=0.5, grad_clip_norm=1.0)
    tx = make_optimizer(config, num_steps=10)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    _, state = tx.update(zeros, state, params)  # step 0: learning rate 0
    updates, _ = tx.update(zeros, state, params)  # step 1: the peak
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.1 * 0.5 * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(updates["dense"]["bias"], 0.0)
    np.testing.assert_array_equal(updates["norm"]["scale"], 0.0)


@pytest.mark.parametrize("grouped", [False, True])
def test_clipping_rescales_gradients_to_the_norm_before_adamw(grouped):
    # A large eps makes Adam's update depend on the gradient's scale, so clipping shows.
    config = OptimizerConfig(peak_learning_rate=1.0, warmup_steps=1, eps=1.0, weight_decay=0.0)
    clipping = make_optimizer(dataclasses.replace(config, grad_clip_norm=1.0), num_steps=10, grouped_norm=grouped)
    plain = make_optimizer(dataclasses.replace(config, grad_clip_norm=0.0), num_steps=10)
    params = {"w": jnp.zeros((4,))}
    grads = {"w": jnp.array([30.0, -40.0, 0.0, 0.0])}  # norm 50

    def second_update(tx, g):  # the first has learning rate 0
        _, state = tx.update(g, tx.init(params), params)
        return tx.update(g, state, params)[0]["w"]

    clipped = second_update(clipping, grads)
    np.testing.assert_allclose(clipped, second_update(plain, jax.tree.map(lambda g: g / 50.0, grads)), rtol=1e-6)
    assert not np.allclose(clipped, second_update(plain, grads))
    small = {"w": jnp.array([0.3, -0.4, 0.0, 0.0])}  # norm 0.5: left alone
    np.testing.assert_allclose(second_update(clipping, small), second_update(plain, small), rtol=1e-6)


def test_the_grouped_norm_is_optaxs_norm():
    """Leaves above and below the small-leaf size, a scalar, a bf16 leaf, all in one tree: the
    grouped norm (small leaves in one dot at HIGHEST precision) equals optax's to float32
    rounding, jitted as in the train step (clipping with it: the test above)."""
    import optax

    keys = jax.random.split(jax.random.key(0), 5)
    tree = {"big": jax.random.normal(keys[0], (_SMALL_LEAF // 64 + 1, 64)),
            "bias": 3.0 * jax.random.normal(keys[1], (768,)), "heads": jax.random.normal(keys[2], (12, 64)),
            "scalar": jnp.float32(-2.5), "half": jax.random.normal(keys[3], (96,)).astype(jnp.bfloat16),
            "edge": jax.random.normal(keys[4], (_SMALL_LEAF,))}
    expected = float(optax.tree.norm(jax.tree.map(lambda x: x.astype(jnp.float32), tree)))
    for grouped in (False, True):
        assert float(jax.jit(global_norm, static_argnums=1)(tree, grouped)) == pytest.approx(expected, rel=1e-6)
    small = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([[0.0], [4.0]])}  # 5 exactly
    assert float(global_norm(small, True)) == 5.0
