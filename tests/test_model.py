"""The Flax BERT: same function as the reference implementation, masking, dtypes, FLOPs count."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pmi_jax import metrics
from pmi_jax.model import BertEncoder, BertForMaskedLM, ModelConfig

CONFIG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                     max_position_embeddings=40, dropout_rate=0.1, attention_dropout_rate=0.1)


def _inputs(batch=3, length=12, seed=0, vocab=CONFIG.vocab_size):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, size=(batch, length)).astype(np.int32)
    lengths = np.array([length, length - 4, 5])[:batch]
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    types = (np.arange(length)[None, :] >= 4).astype(np.int32).repeat(batch, 0)
    return jnp.asarray(ids * mask), jnp.asarray(mask), jnp.asarray(types)


def _init(config=CONFIG):
    model = BertForMaskedLM(config)
    ids, mask, _ = _inputs()
    params = jax.jit(lambda: model.init(jax.random.key(0), ids, mask, deterministic=True))()
    import flax.linen as nn

    return model, nn.unbox(params)["params"]


def _hf_to_ours(hf, num_layers, num_heads):
    """Map transformers' FlaxBertForMaskedLM parameters onto BertForMaskedLM's tree."""
    bert, head = hf["bert"], hf["cls"]["predictions"]
    emb = bert["embeddings"]

    def ln(p):
        return {"scale": p["scale"], "bias": p["bias"]}

    def split_heads(dense):  # [D, D] -> [D, H, K]
        d = dense["kernel"].shape[0]
        return {"kernel": dense["kernel"].reshape(d, num_heads, -1), "bias": dense["bias"].reshape(num_heads, -1)}

    encoder = {"embed": {"word": {"embedding": emb["word_embeddings"]["embedding"]},
                         "position": {"embedding": emb["position_embeddings"]["embedding"]},
                         "token_type": {"embedding": emb["token_type_embeddings"]["embedding"]},
                         "layer_norm": ln(emb["LayerNorm"])}}
    for i in range(num_layers):
        layer = bert["encoder"]["layer"][str(i)]
        attn = layer["attention"]
        out = attn["output"]["dense"]
        d = out["kernel"].shape[1]
        encoder[f"layer_{i}"] = {
            "attention": {"query": split_heads(attn["self"]["query"]), "key": split_heads(attn["self"]["key"]),
                          "value": split_heads(attn["self"]["value"]),
                          "output": {"kernel": out["kernel"].reshape(num_heads, -1, d), "bias": out["bias"]}},
            "attention_layer_norm": ln(attn["output"]["LayerNorm"]),
            "feed_forward": {"intermediate": dict(layer["intermediate"]["dense"]),
                             "output": dict(layer["output"]["dense"])},
            "output_layer_norm": ln(layer["output"]["LayerNorm"]),
        }
    return {"encoder": encoder, "transform": dict(head["transform"]["dense"]),
            "transform_layer_norm": ln(head["transform"]["LayerNorm"]), "output_bias": head["bias"]}


def test_matches_transformers_flax_bert_with_the_same_weights():
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.BertConfig(vocab_size=CONFIG.vocab_size, hidden_size=CONFIG.hidden_size,
                                        num_hidden_layers=CONFIG.num_layers, num_attention_heads=CONFIG.num_heads,
                                        intermediate_size=CONFIG.intermediate_size,
                                        max_position_embeddings=CONFIG.max_position_embeddings,
                                        layer_norm_eps=CONFIG.layer_norm_eps)
    hf_model = transformers.FlaxBertForMaskedLM(hf_config, seed=1)
    ids, mask, types = _inputs()
    expected = hf_model(np.asarray(ids), attention_mask=np.asarray(mask), token_type_ids=np.asarray(types)).logits

    params = _hf_to_ours(hf_model.params, CONFIG.num_layers, CONFIG.num_heads)
    ours = BertForMaskedLM(CONFIG).apply({"params": params}, ids, mask, types, deterministic=True)
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(expected)[real], atol=2e-5, rtol=1e-5)
    # Same parameter count: the decoder is tied, there is no NSP head and no pooler.
    count = sum(x.size for x in jax.tree.leaves(params))
    hf_count = sum(x.size for x in jax.tree.leaves(hf_model.params))
    assert count == hf_count


def test_padding_does_not_leak_into_real_positions():
    model, params = _init()
    ids, mask, types = _inputs()
    noisy_ids = jnp.where(mask == 1, ids, 17)  # different token ids behind the padding
    a = model.apply({"params": params}, ids, mask, types, deterministic=True)
    b = model.apply({"params": params}, noisy_ids, mask, types, deterministic=True)
    real = np.asarray(mask, bool)
    np.testing.assert_array_equal(np.asarray(a)[real], np.asarray(b)[real])
    # ... while without the mask the padding tokens do change them.
    c = model.apply({"params": params}, noisy_ids, jnp.ones_like(mask), types, deterministic=True)
    assert not np.allclose(np.asarray(a)[real], np.asarray(c)[real])


def test_decoder_is_tied_to_word_embeddings():
    model, params = _init()
    ids, mask, types = _inputs()
    unused = 96
    assert not np.any(np.asarray(ids) == unused)
    edited = jax.tree.map(lambda x: x, params)
    table = params["encoder"]["embed"]["word"]["embedding"]
    edited["encoder"]["embed"]["word"]["embedding"] = table.at[unused].set(table[unused] * 3.0)
    a = model.apply({"params": params}, ids, mask, types, deterministic=True)
    b = model.apply({"params": edited}, ids, mask, types, deterministic=True)
    # Only the logit of the edited row changes: the decoder reads the same table.
    changed = np.any(np.asarray(a) != np.asarray(b), axis=(0, 1))
    assert changed.tolist() == [v == unused for v in range(CONFIG.vocab_size)]


def _call_encoder(module, *args, **kwargs):
    return module.encoder(*args, **kwargs)


def test_encoder_alone_returns_hidden_states_and_matches_the_mlm_submodule():
    model, params = _init()
    ids, mask, types = _inputs()
    hidden = BertEncoder(CONFIG).apply({"params": params["encoder"]}, ids, mask, types, deterministic=True)
    assert hidden.shape == (*ids.shape, CONFIG.hidden_size)
    inner = model.apply({"params": params}, ids, mask, types, deterministic=True, method=_call_encoder)
    np.testing.assert_array_equal(np.asarray(hidden), np.asarray(inner))


def test_dropout_follows_the_rng_and_is_off_when_deterministic():
    model, params = _init()
    ids, mask, types = _inputs()

    def run(seed, deterministic):
        return np.asarray(model.apply({"params": params}, ids, mask, types, deterministic=deterministic,
                                      rngs={"dropout": jax.random.key(seed)}))

    np.testing.assert_array_equal(run(0, False), run(0, False))
    assert not np.allclose(run(0, False), run(1, False))
    np.testing.assert_array_equal(run(0, True), run(1, True))


def test_bfloat16_compute_keeps_float32_parameters_and_logits():
    import dataclasses

    config = dataclasses.replace(CONFIG, dtype="bfloat16")
    model, params = _init(config)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    ids, mask, types = _inputs()
    low = model.apply({"params": params}, ids, mask, types, deterministic=True)
    high = BertForMaskedLM(CONFIG).apply({"params": params}, ids, mask, types, deterministic=True)
    assert low.dtype == jnp.float32
    real = np.asarray(mask, bool)
    # bf16 has an 8-bit mantissa: logits agree to about 1e-2 of their spread.
    err = np.abs(np.asarray(low) - np.asarray(high))[real]
    assert err.max() < 0.05 * np.asarray(high)[real].std() + 0.05


def test_flops_formula_matches_the_compiled_training_step():
    """XLA's own count of the loss+gradient computation agrees with the analytic formula.

    The formula counts only matmuls, with full (bidirectional) T x T attention; the
    compiled step also has softmax, GELU, LayerNorm, and the embedding-gradient scatter,
    so it may exceed the formula by a few percent but never fall short of it.
    """
    import dataclasses

    config = dataclasses.replace(CONFIG, vocab_size=512, hidden_size=128, num_heads=4, intermediate_size=512,
                                 max_position_embeddings=128)
    model, params = _init(config)
    batch, length = 4, 128
    ids = jnp.ones((batch, length), jnp.int32)

    def loss(p):
        logits = model.apply({"params": p}, ids, jnp.ones_like(ids), deterministic=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

    cost = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    expected = metrics.training_flops_per_token(config, length) * batch * length
    assert expected <= cost["flops"] <= 1.15 * expected, (cost["flops"], expected)
    # Halving the attention term (a causal count) would fall outside that band.
    attention = 12 * config.num_layers * length * config.hidden_size * batch * length
    assert cost["flops"] > expected - attention / 2


def test_dropout_keep_mask_has_the_keep_rate_and_independent_pairs():
    from pmi_jax.model import Dropout, _keep_mask

    keep = np.asarray(_keep_mask(jax.random.PRNGKey(7), 0.9, (64, 4, 128, 256)))
    n = keep.size
    assert abs(keep.mean() - 0.9) < 4 * np.sqrt(0.09 / n)
    # The two words of one threefry block feed adjacent elements: they must be independent.
    both = (keep[..., 0::2] & keep[..., 1::2]).mean()
    assert abs(both - 0.81) < 4 * np.sqrt(0.81 * 0.19 / (n // 2))
    np.testing.assert_array_equal(keep, np.asarray(_keep_mask(jax.random.key(7), 0.9, keep.shape)))
    assert _keep_mask(jax.random.PRNGKey(7), 0.9, (3, 5)).shape == (3, 5)  # odd last axis: fallback

    x = jnp.arange(1.0, 13.0).reshape(3, 4)
    rng = jax.random.PRNGKey(3)
    y = Dropout(0.5).apply({}, x, deterministic=False, rngs={"dropout": rng})
    kept = np.asarray(y) != 0
    np.testing.assert_allclose(np.asarray(y)[kept], np.asarray(x)[kept] / 0.5)
