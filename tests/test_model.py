"""The Flax BERT: same function as the reference implementation, masking, dtypes, FLOPs count."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pmi_jax import flops
from pmi_jax.errors import UserInputError
from pmi_jax.model import BertEncoder, BertForMaskedLM, ModelConfig

# Unpadded vocabulary (vocab_multiple=1): these tests compare logits column by column with
# transformers and count parameters; the padded layout has its own tests below.
CONFIG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                     max_position_embeddings=40, dropout_rate=0.1, attention_dropout_rate=0.1, vocab_multiple=1)


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
                                 max_position_embeddings=128, max_predictions_per_seq=-1)  # the full head
    model, params = _init(config)
    batch, length = 4, 128
    ids = jnp.ones((batch, length), jnp.int32)

    def loss(p):
        logits = model.apply({"params": p}, ids, jnp.ones_like(ids), deterministic=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

    cost = jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    expected = flops.training_flops_per_token(config, length) * batch * length
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


def test_accelerator_dropout_mask_has_its_16_bit_keep_rate_and_independent_quadruples():
    """The TPU/GPU mask (`_keep_mask16`): P(keep) = 58982 / 2^16 for dropout 0.1, checked within
    4 standard errors over 8.4M entries (s.e. 1.0e-4: a rate off by 4e-4 or more fails);
    the four elements one threefry block decides
    are independent: P(both kept) for every pair of the four, and P(all four kept), each
    within 4 s.e. of the product; neighbours across blocks too. Same key, same mask (raw or
    typed key); another key, another mask; a shape the fast path does not take falls back to
    `jax.random.bernoulli` with the same probability."""
    from pmi_jax.fused_attention import keep_threshold16
    from pmi_jax.model import _keep_mask16

    assert keep_threshold16(0.9) == 58982 and keep_threshold16(0.5) == 32768
    keep, p = _keep_mask16(jax.random.PRNGKey(7), 0.9, (64, 4, 128, 256))
    assert p == 58982 / 65536
    keep = np.asarray(keep)
    n = keep.size
    assert abs(keep.mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    # The four elements of one block: the same place in the four quarters of the second-to-last axis.
    quads = np.moveaxis(keep.reshape(64 * 4, 4, 128 // 4, 256), 1, -1).reshape(-1, 4)
    for i in range(4):
        for j in range(i + 1, 5):  # j == 4: the first element of the next block
            other = quads[:, j] if j < 4 else np.roll(quads[:, 0], -1)  # the next block's
            both = (quads[:, i] & other).mean()
            assert abs(both - p * p) < 4 * np.sqrt(p * p * (1 - p * p) / len(quads)), (i, j)
    all4 = quads.all(axis=1).mean()
    assert abs(all4 - p ** 4) < 4 * np.sqrt(p ** 4 * (1 - p ** 4) / len(quads))
    np.testing.assert_array_equal(keep, np.asarray(_keep_mask16(jax.random.key(7), 0.9, keep.shape)[0]))
    assert np.mean(keep != np.asarray(_keep_mask16(jax.random.PRNGKey(8), 0.9, keep.shape)[0])) > 0.15
    odd, p_odd = _keep_mask16(jax.random.PRNGKey(7), 0.9, (1001, 1000))  # rows not a multiple of 4: fallback
    assert p_odd == p and abs(np.asarray(odd).mean() - p) < 4 * np.sqrt(p * (1 - p) / odd.size)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_hashed_dropout_applies_the_fused_kernels_rule_and_redraws_it_backward(dtype):
    """GPU programs' hidden dropout (`mask="hash"`, `model._hashed_dropout`): the mask is
    `fused_layer_norm.keep_mask` on streams of the module's key (its keep rate and independence:
    tests/test_fused_layer_norm.py), applied as x * keep / 0.9; the backward pass, which redraws
    the mask from the streams, gives g * keep / 0.9 bit for bit. Same key, same mask; another
    key, another; without dropout, x itself."""
    from pmi_jax import fused_layer_norm
    from pmi_jax.model import Dropout

    x_BxLxD = jax.random.normal(jax.random.key(0), (4, 96, 80), dtype)
    g_BxLxD = jax.random.normal(jax.random.key(1), x_BxLxD.shape, dtype)
    module = Dropout(0.1, mask="hash")

    def apply(x, key=2):
        return module.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(key)})

    keep, keep_prob = module.apply({}, x_BxLxD.shape, deterministic=False, rngs={"dropout": jax.random.key(2)},
                                   method=Dropout.keep_mask)
    key = module.apply({}, method=lambda m: m.make_rng("dropout"), rngs={"dropout": jax.random.key(2)})
    rule = fused_layer_norm.keep_mask(fused_layer_norm.dropout_streams(key, 4), 96, 80, 0.1)
    np.testing.assert_array_equal(np.asarray(keep), np.asarray(rule))
    assert keep_prob == 0.9 and 0.85 < float(jnp.mean(keep)) < 0.95
    expected = x_BxLxD * keep.astype(dtype) / jnp.asarray(0.9, dtype)
    y, vjp = jax.vjp(apply, x_BxLxD)
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(expected, np.float32))
    expected_dx = g_BxLxD * keep.astype(dtype) / jnp.asarray(0.9, dtype)
    np.testing.assert_array_equal(np.asarray(vjp(g_BxLxD)[0], np.float32), np.asarray(expected_dx, np.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(apply)(x_BxLxD), np.float32), np.asarray(y, np.float32))
    assert np.mean(np.asarray(apply(x_BxLxD, key=3) != y)) > 0.1
    same = module.apply({}, x_BxLxD, deterministic=True)
    np.testing.assert_array_equal(np.asarray(same, np.float32), np.asarray(x_BxLxD, np.float32))


def test_accelerator_dropout_scales_by_the_realised_keep_probability():
    """Dropout with 16-bit masks keeps x / (58982 / 2^16) (float32) or zero; its mean over
    many entries is x within 4 s.e. (s.e. of the mean of x * Bernoulli(p) / p is sqrt((1-p)/(p n)))."""
    from pmi_jax.model import Dropout

    x = jnp.full((512, 1024), 3.0)
    y = np.asarray(Dropout(0.1, mask="bits16").apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(4)}))
    kept = y != 0
    np.testing.assert_allclose(y[kept], 3.0 * 65536 / 58982, rtol=1e-7)
    p = 58982 / 65536
    assert abs(y.mean() / 3.0 - 1.0) < 4 * np.sqrt((1 - p) / (p * y.size))


# ---------------------------------------------------------------- initialisation


def test_initialisation_is_berts_truncated_normal():
    """Every weight matrix: within two standard deviations (0.04) and with the std of a
    normal(0.02) truncated there, 0.02 x 0.8796 (TF's truncated_normal_initializer(0.02))."""
    import dataclasses

    config = dataclasses.replace(CONFIG, vocab_size=3000, hidden_size=128, intermediate_size=512)
    _, params = _init(config)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    weights = np.concatenate([np.asarray(x).ravel() for path, x in flat
                              if str(path[-1].key) in ("kernel", "embedding")])
    assert weights.size > 700_000
    assert np.abs(weights).max() <= 0.04
    assert np.abs(weights).max() > 0.0399  # the cut is at 2 std, not far inside it
    # Truncated normal's std: sigma * sqrt(1 - 2 a phi(a) / (2 Phi(a) - 1)), a = 2.
    from scipy.stats import norm

    expected = 0.02 * np.sqrt(1 - 2 * 2 * norm.pdf(2) / (2 * norm.cdf(2) - 1))
    # std of n draws has a relative standard error of about sqrt(kurtosis-ish / 2n); 1% is > 10 of them.
    assert abs(weights.std() - expected) < 0.01 * expected, (weights.std(), expected)
    assert abs(weights.mean()) < 5 * expected / np.sqrt(weights.size)
    biases = [np.asarray(x) for path, x in flat if str(path[-1].key) == "bias"]
    assert all(not b.any() for b in biases)


# ---------------------------------------------------------------- the gathered head, padding, scan, remat


def test_gathered_head_gives_the_logits_of_the_full_head_at_those_positions():
    model, params = _init()
    ids, mask, types = _inputs()
    positions = jnp.asarray([[0, 3, 5, 11], [1, 2, 7, 0], [4, 4, 0, 1]], jnp.int32)
    full = model.apply({"params": params}, ids, mask, types, deterministic=True)
    gathered = model.apply({"params": params}, ids, mask, types, deterministic=True, positions_BxP=positions)
    assert gathered.shape == (3, 4, CONFIG.vocab_size)
    np.testing.assert_allclose(np.asarray(gathered), np.take_along_axis(np.asarray(full), np.asarray(positions)[..., None],
                                                                        axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gathered_heads_gradient_is_the_gathers_gradient(dtype):
    """The head's gather takes its gradient from a one-hot product instead of a scatter: the
    same values bit for bit at distinct positions (the trainer's), the sum where one repeats."""
    from pmi_jax.model import _gather_positions

    x_BxLxD = jax.random.normal(jax.random.key(0), (3, 12, 8), dtype)
    g_BxPxD = jax.random.normal(jax.random.key(1), (3, 4, 8), dtype)
    distinct = jnp.asarray([[0, 3, 5, 11], [7, 2, 1, 0], [4, 9, 10, 6]], jnp.int32)
    repeated = jnp.asarray([[0, 3, 5, 11], [7, 2, 1, 0], [4, 4, 0, 4]], jnp.int32)

    def grad(gather, positions):
        _, vjp = jax.vjp(lambda x: gather(x, positions), x_BxLxD)
        return np.asarray(vjp(g_BxPxD)[0], np.float32)

    def reference(x, positions):
        return jnp.take_along_axis(x, positions[..., None], axis=1)

    np.testing.assert_array_equal(np.asarray(_gather_positions(x_BxLxD, distinct), np.float32),
                                  np.asarray(reference(x_BxLxD, distinct), np.float32))
    np.testing.assert_array_equal(grad(_gather_positions, distinct), grad(reference, distinct))
    ours, theirs = grad(_gather_positions, repeated), grad(reference, repeated)
    # Row 2 gets three rows of g at position 4: summed in float32 and rounded once by ours, in
    # the gradient's dtype by the scatter; the other entries are single rows of g or zero.
    np.testing.assert_allclose(ours, theirs, rtol=1e-6 if dtype == jnp.float32 else 2e-2, atol=1e-6)
    np.testing.assert_array_equal(ours[:2], theirs[:2])
    assert not ours[2, [1, 2, 3, 5, 7, 8, 11]].any()


def test_tied_logits_are_differentiated_in_the_compute_dtype():
    """The MLM decoder's float32 logits from bf16 inputs, with the logit gradient rounded once to
    bf16 for the backward products: the values are the float32 product's; the input gradient is
    bf16 and the table's float32, both within the rounding of the logit gradient (2^-9 relative per
    entry) of the exact float64 gradients, as autodiff's float32 gradients are."""
    from pmi_jax.model import _logits_f32, _tied_logits

    x_BxPxD = jax.random.normal(jax.random.key(0), (3, 5, 32), jnp.bfloat16)
    table_VxD = jax.random.normal(jax.random.key(1), (97, 32), jnp.float32)
    g_BxPxV = jax.random.normal(jax.random.key(2), (3, 5, 97), jnp.float32)
    x64, t64, g64 = (np.asarray(a, np.float64) for a in (x_BxPxD, table_VxD.astype(jnp.bfloat16), g_BxPxV))

    logits, vjp = jax.vjp(_tied_logits, x_BxPxD, table_VxD)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), x64 @ t64.T, rtol=1e-6, atol=1e-5)
    dx, dtable = vjp(g_BxPxV)
    assert (dx.dtype, dtable.dtype) == (jnp.bfloat16, jnp.float32)
    exact_dx, exact_dtable = g64 @ t64, np.einsum("bpv,bpd->vd", g64, x64)

    autodiff_dx, autodiff_dtable = jax.vjp(_logits_f32, x_BxPxD, table_VxD)[1](g_BxPxV)
    for ours, autodiff, exact in ((dx, autodiff_dx, exact_dx), (dtable, autodiff_dtable, exact_dtable)):
        scale = np.abs(exact).max()
        # Each entry sums 97 (dx) or 15 (dtable) products whose g was rounded by at most 2^-9 of
        # itself; dx is rounded once more to bf16. 1% of the largest entry is several such bounds.
        assert np.abs(np.asarray(ours, np.float64) - exact).max() < 1e-2 * scale
        assert np.abs(np.asarray(autodiff, np.float64) - exact).max() < 1e-2 * scale
    # The table's gradient is float32 accumulated from bf16 operands: its error is g's rounding only.
    np.testing.assert_allclose(np.asarray(dtable), np.einsum(
        "bpv,bpd->vd", np.asarray(g_BxPxV.astype(jnp.bfloat16), np.float64), x64), rtol=1e-5, atol=1e-5)


def test_decoder_grad_compute_changes_the_gradients_by_rounding_only():
    """`model.decoder_grad=compute` (GPU programs' choice) against autodiff's float32 logit
    gradient, through the whole bf16 model: the same loss, and each parameter's gradient within
    2% of its norm (about five bf16 roundings, 2^-8 each: the logit gradient's, carried back
    through bf16 activations; 0.6% at most here), yet not the same gradients: the choice takes
    effect. The key biases are left out: their exact gradient is zero (softmax ignores a shift
    per query), so what both give is rounding noise."""
    import dataclasses

    ids, mask, types = _inputs()
    base = dataclasses.replace(CONFIG, dtype="bfloat16", xla_cpu_variants="never")
    _, params = _init(base)

    def grads(choice):
        model = BertForMaskedLM(dataclasses.replace(base, decoder_grad=choice))

        def loss(p):
            logits = model.apply({"params": p}, ids, mask, types, deterministic=True)
            return -jnp.mean(jax.nn.log_softmax(logits)[..., 7])

        return jax.value_and_grad(loss)(params)

    (loss32, g32), (loss16, g16) = grads("float32"), grads("compute")
    assert float(loss32) == float(loss16)
    leaves32, leaves16 = jax.tree_util.tree_leaves_with_path(g32), jax.tree.leaves(g16)
    assert all(a.dtype == b.dtype == jnp.float32 for (_, a), b in zip(leaves32, leaves16))
    for (path, a), b in zip(leaves32, leaves16):
        name = jax.tree_util.keystr(path)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if "['key']['bias']" not in name:
            assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(a), name
    assert any(not np.array_equal(a, b) for (_, a), b in zip(leaves32, leaves16))


def test_padded_vocabulary_rows_never_take_probability():
    import dataclasses

    config = dataclasses.replace(CONFIG, vocab_multiple=128)
    model, params = _init(config)
    assert params["encoder"]["embed"]["word"]["embedding"].shape == (128, CONFIG.hidden_size)
    assert params["output_bias"].shape == (128,)
    ids, mask, types = _inputs()
    logits = np.asarray(model.apply({"params": params}, ids, mask, types, deterministic=True))
    assert np.all(logits[..., 97:] == -np.inf) and np.all(np.isfinite(logits[..., :97]))
    # The real columns are those of the unpadded model with the same real rows.
    unpadded = {**params, "output_bias": params["output_bias"][:97],
                "encoder": {**params["encoder"], "embed": {**params["encoder"]["embed"], "word": {
                    "embedding": params["encoder"]["embed"]["word"]["embedding"][:97]}}}}
    expected = BertForMaskedLM(CONFIG).apply({"params": unpadded}, ids, mask, types, deterministic=True)
    np.testing.assert_allclose(logits[..., :97], np.asarray(expected), rtol=1e-5, atol=1e-6)
    probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
    assert float(jnp.max(probs[..., 97:])) == 0.0


def _scanned(config=CONFIG, **changes):
    import dataclasses

    return dataclasses.replace(config, scan_layers=True, **changes)


def test_scanned_layers_compute_the_loop_with_stacked_parameters():
    from pmi_jax.model import stack_layers, unstack_layers

    model, params = _init()
    scanned_model, scanned_params = _init(_scanned())
    assert "layers" in scanned_params["encoder"] and "layer_0" not in scanned_params["encoder"]
    # Round trip of the layouts: names and values kept, leaf for leaf.
    unstacked = unstack_layers(scanned_params)
    assert jax.tree.structure(unstacked) == jax.tree.structure(params)
    assert jax.tree.map(jnp.shape, unstacked) == jax.tree.map(jnp.shape, params)
    restacked = stack_layers(unstacked)
    assert jax.tree.structure(restacked) == jax.tree.structure(scanned_params)
    jax.tree.map(np.testing.assert_array_equal, restacked, scanned_params)
    assert unstack_layers(params) is params and stack_layers(scanned_params) is scanned_params
    # The scan computes what the loop computes on the same parameters.
    ids, mask, types = _inputs()
    looped = model.apply({"params": params}, ids, mask, types, deterministic=True)
    scanned = scanned_model.apply({"params": stack_layers(params)}, ids, mask, types, deterministic=True)
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(looped), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("remat", ["none", "dots_saveable"])
def test_an_unrolled_scan_computes_the_rolled_one(remat):
    """scan_unroll runs the layers without a loop on the same stacked parameters: the same
    dropout masks, so the same loss and gradients up to XLA's order of float32 operations."""
    import dataclasses

    ids, mask, types = _inputs()
    rolled = _scanned(remat=remat, scan_unroll=1)
    _, params = _init(rolled)

    def loss_and_grads(config):
        model = BertForMaskedLM(config)

        def loss(p):
            logits = model.apply({"params": p}, ids, mask, types, deterministic=False,
                                 rngs={"dropout": jax.random.key(3)})
            return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

        return jax.jit(jax.value_and_grad(loss))(params)

    reference = loss_and_grads(rolled)
    unrolled = loss_and_grads(dataclasses.replace(rolled, scan_unroll=CONFIG.num_layers))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), unrolled, reference)


@pytest.mark.parametrize("scan", [False, True])
def test_remat_policies_give_the_gradients_of_no_remat(scan):
    import dataclasses

    ids, mask, types = _inputs()
    _, params = _init(dataclasses.replace(CONFIG, scan_layers=scan))

    def grads(remat):
        model = BertForMaskedLM(dataclasses.replace(CONFIG, scan_layers=scan, remat=remat))

        def loss(p):
            logits = model.apply({"params": p}, ids, mask, types, deterministic=False,
                                 rngs={"dropout": jax.random.key(3)})
            return optax.softmax_cross_entropy_with_integer_labels(logits, ids).mean()

        return jax.jit(jax.grad(loss))(params)

    reference = grads("none")
    for remat in ("full", "dots_saveable"):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads(remat), reference)


def test_fused_attention_path_computes_the_explicit_one():
    """attention_dropout_rate=0 goes through jax.nn.dot_product_attention: same function."""
    import dataclasses

    config = dataclasses.replace(CONFIG, attention_dropout_rate=0.0)
    model, params = _init(config)
    ids, mask, types = _inputs()
    fused = model.apply({"params": params}, ids, mask, types, deterministic=True)
    explicit = BertForMaskedLM(dataclasses.replace(config, attention_dropout_rate=1e-30)).apply(
        {"params": params}, ids, mask, types, deterministic=True)  # explicit path, dropout off
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(fused)[real], np.asarray(explicit)[real], rtol=1e-4, atol=1e-5)


def test_plain_kernels_keep_the_rates_of_the_cpu_variants():
    """xla_cpu_variants="never": jax.random.bernoulli dropout and a plain bias add; same
    deterministic function, same keep rate in training."""
    import dataclasses

    plain = dataclasses.replace(CONFIG, xla_cpu_variants="never")
    model, params = _init()
    ids, mask, types = _inputs()
    a = model.apply({"params": params}, ids, mask, types, deterministic=True)
    b = BertForMaskedLM(plain).apply({"params": params}, ids, mask, types, deterministic=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    from pmi_jax.model import Dropout

    x = jnp.ones((256, 512))
    for variant in ("cpu", "bernoulli", "bits16"):
        y = Dropout(0.1, mask=variant).apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)})
        kept = float(jnp.mean(y != 0))
        assert abs(kept - 0.9) < 4 * np.sqrt(0.09 / x.size)


def test_cpu_variants_are_settled_by_the_programs_platform():
    """"cpu" (the default) becomes "always" for a CPU program and "never" for a TPU or GPU one;
    an explicit choice is kept; a bool from a config saved before the choice existed still loads.
    The hidden-dropout masks and the scanned layers' unrolling are settled by platform too."""
    import dataclasses

    from pmi_jax.config import model_config_from_dict
    from pmi_jax.model import _uses_cpu_variants, for_platform

    assert CONFIG.xla_cpu_variants == "cpu"
    assert for_platform(CONFIG, "cpu").xla_cpu_variants == "always"
    assert for_platform(CONFIG, "tpu").xla_cpu_variants == "never"
    assert for_platform(CONFIG, "gpu").xla_cpu_variants == "never"
    assert [for_platform(CONFIG, p).dropout_mask for p in ("cpu", "tpu", "gpu")] == ["bernoulli", "bernoulli", "hash"]
    assert for_platform(dataclasses.replace(CONFIG, dropout_mask="bernoulli"), "gpu").dropout_mask == "bernoulli"
    scanned = _scanned()  # scan_unroll=0: every layer on GPUs, the loop elsewhere; no loop to unroll unscanned
    assert [for_platform(scanned, p).scan_unroll for p in ("cpu", "tpu", "gpu")] == [1, 1, CONFIG.num_layers]
    assert for_platform(CONFIG, "gpu").scan_unroll == 1
    assert for_platform(dataclasses.replace(scanned, scan_unroll=1), "gpu").scan_unroll == 1
    for explicit in ("always", "never"):
        assert for_platform(dataclasses.replace(CONFIG, xla_cpu_variants=explicit), "tpu").xla_cpu_variants == explicit
    assert _uses_cpu_variants(CONFIG) == (jax.default_backend() == "cpu")
    saved = dataclasses.asdict(CONFIG)
    assert model_config_from_dict({**saved, "xla_cpu_variants": True}).xla_cpu_variants == "cpu"
    assert model_config_from_dict({**saved, "xla_cpu_variants": False}).xla_cpu_variants == "never"
    with pytest.raises(UserInputError, match="xla_cpu_variants='gpu'"):
        dataclasses.replace(CONFIG, xla_cpu_variants="gpu")


def test_a_tpu_program_draws_flax_bernoulli_dropout():
    """Settled for a TPU, the dropout mask is `jax.random.bernoulli`'s, bit for bit: the plain
    version a reader finds beside the CPU variant in pmi_jax/model.py."""
    from pmi_jax.model import _dropout, for_platform

    x = jnp.ones((8, 64))
    key = jax.random.key(3)
    y = _dropout(for_platform(CONFIG, "tpu"), 0.1).apply({}, x, deterministic=False, rngs={"dropout": key})
    reference = nn.Dropout(0.1).apply({}, x, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(np.asarray(y) != 0, np.asarray(reference) != 0)



@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_token_type_embedding_equals_the_gather_it_replaces(dtype):
    """The embeddings' one-hot product for token types gives what a gather of the table's rows
    gives, values and gradients: only the gradient's computation changed (a reduction, no scatter)."""
    import dataclasses


    from pmi_jax.model import BertEmbeddings

    config = dataclasses.replace(CONFIG, dtype=dtype, dropout_rate=0.0)
    module = BertEmbeddings(config)
    rng = np.random.default_rng(0)
    ids_BxL = jnp.asarray(rng.integers(0, 97, (3, 10)), jnp.int32)
    types_BxL = jnp.asarray(rng.integers(0, 2, (3, 10)), jnp.int32)
    params = nn.unbox(module.init(jax.random.key(0), ids_BxL, types_BxL, deterministic=True))["params"]
    g_BxLxD = jax.random.normal(jax.random.key(2), (3, 10, config.hidden_size))

    def gathered(m, ids, types):  # the plain nn.Embed lookups, then the module's own LayerNorm
        return m.layer_norm(m.word(ids) + m.position(jnp.arange(10)[None, :]) + m.token_type(types))

    def loss(p, method):
        out = module.apply({"params": p}, ids_BxL, types_BxL, method=method, **(
            {} if method else {"deterministic": True}))
        return jnp.sum(out.astype(jnp.float32) * g_BxLxD)

    ours = module.apply({"params": params}, ids_BxL, types_BxL, deterministic=True)
    reference = module.apply({"params": params}, ids_BxL, types_BxL, method=gathered)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(reference, np.float32))
    grad_ours = jax.grad(loss)(params, None)["token_type"]["embedding"]
    grad_reference = jax.grad(loss)(params, gathered)["token_type"]["embedding"]
    # bf16 gradients are summed in bf16 in a different order: compare relative norms (bf16 ~ 1e-2).
    error = np.linalg.norm(grad_ours - grad_reference) / np.linalg.norm(grad_reference)
    assert error < (2e-2 if dtype == "bfloat16" else 1e-6), error
