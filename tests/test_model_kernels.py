"""The model's platform-dependent kernels: which attention and embedding gradient each platform
gets, and that every alternative computes the reference's values and gradients."""
import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax.config import model_config_from_dict
from pmi_jax.errors import UserInputError
from pmi_jax.model import (BertEmbeddings, BertForMaskedLM, ModelConfig, attention_implementation,
                           cudnn_attention_applies, for_platform, pallas_attention_applies, written_attention)

CONFIG = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                     max_position_embeddings=40, attention_dropout_rate=0.0, dtype="bfloat16", vocab_multiple=1)


def _inputs(batch=3, length=12, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([length, length - 4, 5])[:batch]
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    # Frequent ids (a few repeated many times) as in text: where the scatter serialises.
    ids = rng.choice([5, 6, 7, *range(8, 97)], p=[0.2, 0.2, 0.1] + [0.5 / 89] * 89, size=(batch, length))
    return jnp.asarray(ids * mask, jnp.int32), jnp.asarray(mask)


@pytest.mark.parametrize("platform, dtype, dropout, heads, expected", [
    ("gpu", "bfloat16", 0.0, 4, "cudnn"),      # BERT without attention dropout, bf16: the fused kernel
    ("cuda", "bfloat16", 0.0, 4, "cudnn"),
    ("gpu", "float32", 0.0, 4, "xla"),         # cuDNN's flash attention takes 16-bit inputs only
    ("gpu", "bfloat16", 0.0, 1, "cudnn"),      # head dim 32: a multiple of 8, at most 128
    ("gpu", "bfloat16", 0.1, 1, "pallas-triton"),  # the paper's attention dropout: the Triton kernel
    ("cuda", "bfloat16", 0.1, 1, "pallas-triton"),
    ("gpu", "bfloat16", 0.1, 4, "xla"),        # head dim 8: under Triton's 16, written out
    ("gpu", "float32", 0.1, 1, "xla"),         # measured in bf16 only
    ("tpu", "bfloat16", 0.0, 4, "xla"),
    ("tpu", "bfloat16", 0.1, 1, "xla"),
    ("cpu", "bfloat16", 0.0, 4, "xla"),
    ("cpu", "bfloat16", 0.1, 1, "xla"),
])
def test_attention_is_settled_by_the_programs_platform(platform, dtype, dropout, heads, expected):
    config = dataclasses.replace(CONFIG, dtype=dtype, attention_dropout_rate=dropout, num_heads=heads)
    assert for_platform(config, platform).attention == expected
    assert cudnn_attention_applies(config, platform) == (expected == "cudnn")
    assert pallas_attention_applies(config, platform) == (expected == "pallas-triton")


def test_cudnn_is_not_chosen_for_head_dims_it_does_not_take():
    wide = dataclasses.replace(CONFIG, hidden_size=512, num_heads=2, intermediate_size=64)  # head dim 256
    assert for_platform(wide, "gpu").attention == "xla"
    odd = dataclasses.replace(CONFIG, hidden_size=36, num_heads=3)  # head dim 12
    assert for_platform(odd, "gpu").attention == "xla"


def test_explicit_choices_are_kept_and_impossible_ones_refused():
    for choice in ("xla", "cudnn"):
        assert for_platform(dataclasses.replace(CONFIG, attention=choice), "tpu").attention == choice
    for choice in ("scatter", "sorted"):
        assert for_platform(dataclasses.replace(CONFIG, embedding_grad=choice), "gpu").embedding_grad == choice
    assert for_platform(CONFIG, "gpu").embedding_grad == "sorted"
    assert for_platform(CONFIG, "tpu").embedding_grad == "scatter"
    assert for_platform(CONFIG, "cpu").embedding_grad == "scatter"
    assert [for_platform(CONFIG, p).decoder_grad for p in ("gpu", "tpu", "cpu")] == ["compute", "float32", "float32"]
    assert for_platform(dataclasses.replace(CONFIG, decoder_grad="float32"), "gpu").decoder_grad == "float32"
    with pytest.raises(UserInputError, match="attention_dropout_rate=0"):
        dataclasses.replace(CONFIG, attention="cudnn", attention_dropout_rate=0.1)
    with pytest.raises(UserInputError, match="dtype=bfloat16"):
        dataclasses.replace(CONFIG, attention="cudnn", dtype="float32")
    with pytest.raises(UserInputError, match="model.attention='flash'"):
        dataclasses.replace(CONFIG, attention="flash")
    with pytest.raises(UserInputError, match="model.embedding_grad='atomic'"):
        dataclasses.replace(CONFIG, embedding_grad="atomic")


def test_unsettled_auto_follows_the_default_backend():
    assert attention_implementation(CONFIG) == for_platform(CONFIG, jax.default_backend()).attention


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the route on a machine without cuDNN")
def test_the_cudnn_setting_reaches_cudnns_kernel():
    """attention=cudnn really calls cuDNN's implementation: traced here, without a GPU, JAX's cuDNN
    attention refuses for want of cuDNN, where the XLA setting computes."""
    ids, mask = _inputs()
    model = BertForMaskedLM(dataclasses.replace(CONFIG, attention="cudnn"))
    with pytest.raises(RuntimeError, match="cuDNN"):
        model.init(jax.random.key(0), ids, mask, deterministic=True)
    BertForMaskedLM(dataclasses.replace(CONFIG, attention="xla")).init(jax.random.key(0), ids, mask,
                                                                       deterministic=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_sequence_lengths_give_the_boolean_masks_outputs_and_gradients(dtype):
    """The XLA path with padding as key lengths computes what it computes with the boolean key mask,
    at every position (padding queries included), values and gradients."""
    b, length, h, k = 3, 16, 4, 8
    qkv = jax.random.normal(jax.random.key(1), (3, b, length, h, k), jnp.float32).astype(dtype)
    lengths_B = jnp.array([16, 9, 3], jnp.int32)
    keys_Bx1x1xL = (jnp.arange(length)[None, :] < lengths_B[:, None])[:, None, None, :]
    g = jax.random.normal(jax.random.key(2), (b, length, h, k), jnp.float32)

    def loss(q, kk, v, form):
        kwargs = {"key_value_seq_lengths": lengths_B} if form == "lengths" else {"mask": keys_Bx1x1xL}
        out = jax.nn.dot_product_attention(q, kk, v, implementation="xla", **kwargs)
        return jnp.sum(out.astype(jnp.float32) * g), out

    (_, out_lengths), grads_lengths = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*qkv, "lengths")
    (_, out_mask), grads_mask = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(*qkv, "mask")
    np.testing.assert_array_equal(np.asarray(out_lengths, np.float32), np.asarray(out_mask, np.float32))
    for a, r in zip(grads_lengths, grads_mask):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(r, np.float32))
    # The padding keys' gradients are zero: they take no part.
    assert not np.any(np.asarray(grads_lengths[1], np.float32)[2, 3:])


def test_model_without_attention_dropout_matches_the_written_out_attention_in_gradients():
    """The model's dot_product_attention path (lengths, XLA) and its written-out path (additive
    bias, dropout off) give the same loss gradients, in float32."""
    config = dataclasses.replace(CONFIG, dtype="float32", attention="xla", dropout_rate=0.0)
    ids, mask = _inputs()
    model = BertForMaskedLM(config)
    params = nn.unbox(model.init(jax.random.key(0), ids, mask, deterministic=True))["params"]
    explicit = BertForMaskedLM(dataclasses.replace(config, attention="auto", attention_dropout_rate=1e-30))
    real = np.asarray(mask, np.float32)

    def loss(p, m):
        logits = m.apply({"params": p}, ids, mask, deterministic=True)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1)[..., 0]
        return jnp.sum(nll * real)

    g_fused, g_explicit = jax.grad(loss)(params, model), jax.grad(loss)(params, explicit)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-6), g_fused, g_explicit)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sorted_embedding_gradient_equals_the_scatter(dtype):
    """embedding_grad=sorted: the same embeddings as the gather, and the table gradient of the
    scatter-add (float32: to summation order; bfloat16: at least as close to an exact float64 sum,
    since the sorted sum accumulates in float32)."""
    config = dataclasses.replace(CONFIG, dtype=dtype, dropout_rate=0.0)
    ids, _ = _inputs(length=40)
    types = jnp.zeros_like(ids)
    g_BxLxD = jax.random.normal(jax.random.key(2), (*ids.shape, config.hidden_size))
    module = BertEmbeddings(dataclasses.replace(config, embedding_grad="scatter"))
    params = nn.unbox(module.init(jax.random.key(0), ids, types, deterministic=True))["params"]

    def run(choice):
        m = BertEmbeddings(dataclasses.replace(config, embedding_grad=choice))

        def loss(p):
            out = m.apply({"params": p}, ids, types, deterministic=True)
            return jnp.sum(out.astype(jnp.float32) * g_BxLxD), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        return np.asarray(out, np.float32), np.asarray(grads["word"]["embedding"], np.float64)

    out_scatter, grad_scatter = run("scatter")
    out_sorted, grad_sorted = run("sorted")
    np.testing.assert_array_equal(out_sorted, out_scatter)
    assert np.any(grad_sorted != 0) and not np.any(grad_sorted[np.setdiff1d(np.arange(97), np.asarray(ids))])
    if dtype == "float32":
        np.testing.assert_allclose(grad_sorted, grad_scatter, rtol=1e-5, atol=1e-6)
    else:
        exact = _exact_word_gradient(module, params, ids, types, g_BxLxD)
        err_sorted = np.linalg.norm(grad_sorted - exact) / np.linalg.norm(exact)
        err_scatter = np.linalg.norm(grad_scatter - exact) / np.linalg.norm(exact)
        assert err_sorted <= err_scatter + 1e-6, (err_sorted, err_scatter)
        assert err_sorted < 1e-2


def _exact_word_gradient(module, params, ids, types, g_BxLxD):
    """Float64 sum, per vocabulary row, of the per-token gradients of the embeddings' output
    (the gradient with respect to each token's looked-up row, computed in the module's dtype)."""
    def per_token(rows_BxLxD):
        def body(mm):
            x = (rows_BxLxD + mm.position(jnp.arange(ids.shape[1])[None, :])
                 + jax.nn.one_hot(types, 2, dtype=rows_BxLxD.dtype) @ mm.token_type.embedding.astype(rows_BxLxD.dtype))
            return mm.layer_norm(x)
        return jnp.sum(module.apply({"params": params}, method=body).astype(jnp.float32) * g_BxLxD)

    dtype = jnp.dtype(module.config.dtype)
    rows = params["word"]["embedding"].astype(dtype)[ids]
    g_rows = np.asarray(jax.grad(per_token)(rows), np.float64).reshape(-1, rows.shape[-1])
    exact = np.zeros(params["word"]["embedding"].shape, np.float64)
    np.add.at(exact, np.asarray(ids).reshape(-1), g_rows)
    return exact


def _autodiff_attention(q, k, v, valid_BxL, keep, keep_prob):
    """The written-out attention as it was before its own backward pass: the formula, differentiated by JAX."""
    dtype = q.dtype
    q = q * jnp.asarray(q.shape[-1] ** -0.5, dtype)
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32)
    bias = jnp.where(valid_BxL[:, None, None, :].astype(bool), 0.0, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores + bias, axis=-1).astype(dtype)
    if keep is not None:
        probs = probs * keep.astype(dtype) / jnp.asarray(keep_prob, dtype)
    return jnp.einsum("bhqs,bshk->bqhk", probs, v)


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_the_written_out_attention_has_autodiffs_values_and_gradients(rate):
    """Its backward recomputes the probabilities and takes the softmax's row term from the output:
    float32, autodiff's gradients to float32 rounding (same forward values exactly); bf16, within
    twice autodiff's own bf16 error against float32 plus 0.5% of the largest gradient. A sequence
    with no real token (length 0) included: its rows stay finite and agree too."""
    batch, length, heads, head_dim = 4, 24, 2, 16
    keys = jax.random.split(jax.random.key(3), 5)
    q, k, v, g = (jax.random.normal(key, (batch, length, heads, head_dim), jnp.float32) for key in keys[:4])
    valid_BxL = (jnp.arange(length)[None, :] < jnp.array([24, 13, 5, 0])[:, None]).astype(jnp.int32)
    keep = (jax.random.bernoulli(keys[4], 1 - rate, (batch, heads, length, length)), 1 - rate) if rate else (None, 1.0)

    def run(fn, dtype):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, valid_BxL, *keep), *(x.astype(dtype) for x in (q, k, v)))
        return [np.asarray(x, np.float32) for x in (out, *vjp(g.astype(dtype)))]

    ours, autodiff = run(written_attention, jnp.float32), run(_autodiff_attention, jnp.float32)
    np.testing.assert_array_equal(ours[0], autodiff[0])
    for a, r in zip(ours[1:], autodiff[1:]):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * np.abs(r).max())
    bf16_q, bf16_k, bf16_v = (x.astype(jnp.bfloat16).astype(jnp.float32) for x in (q, k, v))
    _, exact_vjp = jax.vjp(lambda q, k, v: _autodiff_attention(q, k, v, valid_BxL, *keep), bf16_q, bf16_k, bf16_v)
    exact = exact_vjp(g.astype(jnp.bfloat16).astype(jnp.float32))
    ours, autodiff = run(written_attention, jnp.bfloat16), run(_autodiff_attention, jnp.bfloat16)
    np.testing.assert_array_equal(ours[0], autodiff[0])
    for a, r, e in zip(ours[1:], autodiff[1:], exact):
        e = np.asarray(e)
        assert np.abs(a - e).max() <= 2 * np.abs(r - e).max() + 0.005 * np.abs(e).max()


def test_fused_qkv_computes_the_three_projections_with_the_same_parameters():
    config = dataclasses.replace(CONFIG, dtype="float32", dropout_rate=0.0, attention="xla", fused_qkv="never")
    ids, mask = _inputs()
    model = BertForMaskedLM(config)
    params = nn.unbox(model.init(jax.random.key(0), ids, mask, deterministic=True))["params"]
    fused = BertForMaskedLM(dataclasses.replace(config, fused_qkv="always"))
    fused_params = nn.unbox(fused.init(jax.random.key(0), ids, mask, deterministic=True))["params"]
    assert jax.tree.structure(fused_params) == jax.tree.structure(params)  # same tree, same checkpoints

    def loss(p, m):
        return jnp.sum(m.apply({"params": p}, ids, mask, deterministic=True) * np.asarray(mask)[..., None])

    np.testing.assert_allclose(fused.apply({"params": params}, ids, mask, deterministic=True),
                               model.apply({"params": params}, ids, mask, deterministic=True), rtol=1e-5, atol=1e-5)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-6),
                 jax.grad(loss)(params, fused), jax.grad(loss)(params, model))


def test_fused_qkv_is_settled_on_for_gpus_only_and_old_configs_resume():
    assert [for_platform(CONFIG, p).fused_qkv for p in ("gpu", "cuda", "tpu", "cpu")] == ["always", "always",
                                                                                         "never", "never"]
    for explicit in ("always", "never"):
        assert for_platform(dataclasses.replace(CONFIG, fused_qkv=explicit), "gpu").fused_qkv == explicit
        assert for_platform(dataclasses.replace(CONFIG, fused_qkv=explicit), "tpu").fused_qkv == explicit
    saved = dataclasses.asdict(CONFIG)
    # Run directories from before "auto": true stays fused; false, the old default, resumes under auto's
    # default (the same program on TPUs and CPUs, the fused matmul on GPUs).
    assert model_config_from_dict({**saved, "fused_qkv": True}).fused_qkv == "always"
    assert model_config_from_dict({**saved, "fused_qkv": False}) == CONFIG
    with pytest.raises(UserInputError, match="model.fused_qkv='true': expected one of auto, always, never"):
        dataclasses.replace(CONFIG, fused_qkv="true")


@pytest.mark.parametrize("platform, expected", [("gpu", "pallas-triton"), ("cuda", "pallas-triton"),
                                                ("tpu", "pallas-mosaic"), ("cpu", "pallas-interpret")])
def test_pallas_attention_is_settled_to_triton_on_gpus_mosaic_on_tpus_and_the_interpreter_on_cpus(platform, expected):
    for dropout in (0.1, 0.0):
        config = dataclasses.replace(CONFIG, attention="pallas", attention_dropout_rate=dropout, num_heads=2)
        assert for_platform(config, platform).attention == expected
        assert for_platform(for_platform(config, platform), "cpu").attention == expected  # settled once
    # "auto" never takes it (measure before adopting: docs/gpu.md).
    for platform in ("gpu", "cpu", "tpu"):
        assert "pallas" not in for_platform(dataclasses.replace(CONFIG, attention_dropout_rate=0.1), platform).attention


def test_pallas_attention_is_refused_where_it_cannot_run():
    with pytest.raises(UserInputError, match="a rocm program takes model.attention=xla"):
        for_platform(dataclasses.replace(CONFIG, attention="pallas", num_heads=2), "rocm")
    with pytest.raises(UserInputError, match="power of two of at least 16"):
        dataclasses.replace(CONFIG, attention="pallas", hidden_size=36, num_heads=3)  # head dim 12
    with pytest.raises(UserInputError, match="power of two of at least 16"):
        dataclasses.replace(CONFIG, attention="pallas", num_heads=4, hidden_size=32)  # head dim 8


def test_model_with_the_pallas_kernel_matches_the_written_out_attention_without_dropout():
    """attention=pallas (interpreted on CPU) in a whole model, dropout off: the loss gradients of the
    written-out attention (float32, hidden 64, 2 heads of 32, sequences of 16 with padding)."""
    config = dataclasses.replace(CONFIG, dtype="float32", hidden_size=64, num_heads=2, intermediate_size=64,
                                 dropout_rate=0.0, attention_dropout_rate=0.1)
    ids, mask = _inputs(length=16)
    written = BertForMaskedLM(config)
    params = nn.unbox(written.init(jax.random.key(0), ids, mask, deterministic=True))["params"]
    real = np.asarray(mask, np.float32)

    def loss(p, m):
        logits = m.apply({"params": p}, ids, mask, deterministic=True)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1)[..., 0]
        return jnp.sum(nll * real)

    g_kernel = jax.grad(loss)(params, BertForMaskedLM(dataclasses.replace(config, attention="pallas")))
    g_written = jax.grad(loss)(params, written)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=2e-4, atol=2e-6), g_kernel, g_written)


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_gelu_keeping_only_its_input_computes_jaxs_gelu_and_its_gradient(form):
    """model._gelu (float32 inside, a backward that recomputes the slope from x): in float32 the
    values are jax.nn.gelu's to 1e-6 relative + 1e-6 absolute (the tanh form exactly; the erf form
    is written with erf, jax.nn.gelu with erfc, and 1 + erf cancels in the negative tail), the
    erf form within 1e-6 relative + 1e-6 absolute of the exact GELU in float64, and the gradients
    autodiff's of jax.nn.gelu to 1e-6 relative + 5e-7 absolute; in bfloat16 the values and gradients
    are the float32 ones rounded once (at most 1 bf16 ulp, 2^-8 relative, from jax.nn.gelu
    differentiated in float32; the same absolute tolerances in the tail)."""
    from pmi_jax.model import _gelu

    x = jnp.concatenate([jnp.linspace(-9.0, 9.0, 4001), jax.random.normal(jax.random.key(3), (4000,)) * 3])
    g = jax.random.normal(jax.random.key(4), x.shape)

    def ref(x32):
        return nn.gelu(x32, approximate=form == "tanh")

    ref_y, ref_vjp = jax.vjp(ref, x)
    (ref_dx,) = ref_vjp(g)
    y, vjp = jax.vjp(lambda v: _gelu(form, v), x)
    if form == "tanh":
        np.testing.assert_array_equal(np.asarray(y), np.asarray(ref_y))
    else:
        np.testing.assert_allclose(np.asarray(y), np.asarray(ref_y), rtol=1e-6, atol=1e-6)
        x64 = np.asarray(x, np.float64)
        exact = 0.5 * x64 * (1.0 + np.vectorize(math.erf)(x64 / math.sqrt(2.0)))
        np.testing.assert_allclose(np.asarray(y, np.float64), exact, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(vjp(g)[0]), np.asarray(ref_dx), rtol=1e-6, atol=5e-7)

    x16, g16 = x.astype(jnp.bfloat16), g.astype(jnp.bfloat16)
    ref16_y, ref16_vjp = jax.vjp(ref, x16.astype(jnp.float32))
    (ref16_dx,) = ref16_vjp(g16.astype(jnp.float32))
    y16, vjp16 = jax.vjp(lambda v: _gelu(form, v), x16)
    assert y16.dtype == vjp16(g16)[0].dtype == jnp.bfloat16
    for ours, exact in ((y16, ref16_y), (vjp16(g16)[0], ref16_dx)):
        ours, exact = np.asarray(ours, np.float32), np.asarray(exact)
        np.testing.assert_allclose(ours, exact, rtol=2.0 ** -8, atol=1e-6)


def test_the_tanh_gelu_is_written_for_cublas_on_gpus_and_is_the_same_function():
    """`model.gelu=tanh` settles to "tanh-epilogue" in GPU programs only: the tanh formula in the
    compute dtype, which XLA:GPU moves into the matmul's cuBLAS epilogue, computed there in float32
    (tests/test_compile_only.py). The same function: in float32 the values, and in both dtypes the
    gradients, are "tanh"'s bit for bit; in bfloat16 on a CPU, where XLA rounds every operation,
    the values stay within 2e-3 of the largest (6.9e-4 measured on [-8, 8]); exports name it gelu_new."""
    from pmi_jax.huggingface import hidden_act
    from pmi_jax.model import _gelu

    tanh = dataclasses.replace(CONFIG, gelu="tanh")
    assert [for_platform(tanh, p).gelu for p in ("gpu", "cuda", "cpu", "tpu")] == [
        "tanh-epilogue", "tanh-epilogue", "tanh", "tanh"]
    assert for_platform(CONFIG, "gpu").gelu == "erf"
    x = jnp.concatenate([jnp.linspace(-8.0, 8.0, 4001), jax.random.normal(jax.random.key(3), (4000,)) * 3])
    g = jax.random.normal(jax.random.key(4), x.shape)
    for dtype in (jnp.float32, jnp.bfloat16):
        xd, gd = x.astype(dtype), g.astype(dtype)
        (y, vjp), (y_ref, vjp_ref) = (jax.vjp(lambda v, f=form: _gelu(f, v), xd) for form in ("tanh-epilogue", "tanh"))
        assert y.dtype == dtype
        np.testing.assert_array_equal(np.asarray(vjp(gd)[0], np.float32), np.asarray(vjp_ref(gd)[0], np.float32))
        y, y_ref = np.asarray(y, np.float32), np.asarray(y_ref, np.float32)
        if dtype == jnp.float32:
            np.testing.assert_array_equal(y, y_ref)
        else:
            assert np.abs(y - y_ref).max() <= 2e-3 * np.abs(y_ref).max()
    assert hidden_act("tanh-epilogue") == hidden_act("tanh") == "gelu_new"


@pytest.mark.parametrize("overrides", [
    {"attention": "pallas", "attention_dropout_rate": 0.1},
    {"attention": "pallas", "attention_dropout_rate": 0.1, "fused_qkv": "always"},  # the stacked input
    {"residual_norm": "pallas"},
    {"feed_forward": "pallas"},
], ids=["attention", "attention-stacked", "residual_norm", "feed_forward"])
def test_pallas_kernels_split_over_a_mesh_give_the_single_device_values_and_gradients(overrides):
    """Under a mesh the kernels run in a shard_map over the batch (and heads), with the dropout
    streams of the whole batch split alongside: the masks, the loss and every parameter's gradient
    (the kernels' bias, scale and offset sums added over the shards) are those of one device."""
    from jax.sharding import NamedSharding, PartitionSpec

    from pmi_jax import partitioning
    from pmi_jax.config import MeshConfig

    config = dataclasses.replace(CONFIG, dtype="float32", num_heads=2, dropout_rate=0.1, **overrides)
    model = BertForMaskedLM(config)
    ids, mask = _inputs(batch=3, length=16)
    ids, mask = jnp.concatenate([ids, ids[:1]]), jnp.concatenate([mask, mask[:1]])  # batch 4: splits over 2 and 4
    params = model.init({"params": jax.random.key(0)}, ids, mask, deterministic=True)

    def loss(params, ids, mask):
        logits = model.apply(params, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(1)})
        return jnp.sum(jax.nn.log_softmax(logits)[..., 3] * mask)

    single = jax.jit(jax.value_and_grad(loss))(params, ids, mask)
    for devices, heads_split in ((2, 1), (4, 2)):
        mesh_config = MeshConfig(data=devices // heads_split, fsdp=1, model=heads_split)
        mesh = partitioning.make_mesh(mesh_config, jax.devices()[:devices])
        rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
        with partitioning.activate(mesh, mesh_config):
            lowered = jax.jit(jax.value_and_grad(loss)).lower(params, jax.device_put(ids, rows),
                                                                jax.device_put(mask, rows))
            text, split = lowered.as_text(), lowered.compile()(params, jax.device_put(ids, rows),
                                                               jax.device_put(mask, rows))
        assert "shard_map" in text or "sdy.manual_computation" in text, "the kernels ran unsplit"
        np.testing.assert_allclose(split[0], single[0], rtol=1e-5)
        largest = max(np.abs(b).max() for b in jax.tree.leaves(single[1]))  # the key bias's is ~0: no rtol
        for a, b in zip(jax.tree.leaves(split[1]), jax.tree.leaves(single[1])):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * largest)


def test_the_encoder_draws_every_layers_dropout_streams_at_once():
    """The hashed dropouts (the GPU programs' hidden dropout, the fused LayerNorm's and the Pallas
    attention's) take their streams from one draw of the encoder's key, layer by layer
    (`model.layer_streams`), not from each module's key. So the scanned encoder, whose layers' own
    keys are not the loop's, draws the loop's masks: the same logits (float32, interpreted kernels,
    within 1e-5), where dropout noise moves them by over 1e-3 (another key). Programs without
    those dropouts (CPU and TPU defaults, no dropout) draw nothing."""
    from pmi_jax.model import layer_streams, stack_layers

    config = dataclasses.replace(CONFIG, dtype="float32", num_heads=2, dropout_rate=0.1, attention_dropout_rate=0.1,
                                 attention="pallas", residual_norm="pallas")
    assert layer_streams(for_platform(config, "cpu")) == (2, 2)
    paper = dataclasses.replace(CONFIG, num_heads=2, attention_dropout_rate=0.1)  # GPU: hash, Triton attention
    assert layer_streams(for_platform(paper, "gpu")) == (2, 2)
    assert [layer_streams(for_platform(dataclasses.replace(CONFIG, dropout_rate=0.1), p)) for p in ("cpu", "tpu")] == [
        (0, 0), (0, 0)]
    assert layer_streams(for_platform(dataclasses.replace(CONFIG, dropout_rate=0.0), "gpu")) == (0, 0)
    ids, mask = _inputs(length=16)
    looped = BertForMaskedLM(config)
    params = nn.unbox(looped.init(jax.random.key(0), ids, mask, deterministic=True))["params"]

    def logits(model, params, key=1):
        out = model.apply({"params": params}, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(key)})
        return np.asarray(out)[np.asarray(mask, bool)]

    scanned = BertForMaskedLM(dataclasses.replace(config, scan_layers=True))
    np.testing.assert_allclose(logits(scanned, stack_layers(params)), logits(looped, params), rtol=1e-5, atol=1e-5)
    assert np.abs(logits(looped, params, key=2) - logits(looped, params)).max() > 1e-3


def test_fused_qkv_feeds_the_pallas_kernel_its_stacked_output_with_the_same_losses_and_gradients():
    """With `fused_qkv` the interpreted Triton kernel reads the matmul's [B, L, 3, H, K] output itself
    and returns one gradient for it (`fused_attention.attention_stacked`); with the paper's dropout the
    loss and gradients are those of three projections and three kernel inputs (float32 rounding)."""
    config = dataclasses.replace(CONFIG, dtype="float32", num_heads=2, attention_dropout_rate=0.1, attention="pallas",
                                 fused_qkv="never")
    ids, mask = _inputs()
    model, fused = BertForMaskedLM(config), BertForMaskedLM(dataclasses.replace(config, fused_qkv="always"))
    params = nn.unbox(model.init(jax.random.key(0), ids, mask, deterministic=True))["params"]

    def loss(p, m):
        logits = m.apply({"params": p}, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(3)})
        return jnp.sum(logits * np.asarray(mask)[..., None])

    # Per layer: the forward, dK/dV and dQ kernels, each given the stack (padded to the kernel's 16 rows).
    kernel_inputs = [[v.aval.shape for v in e.invars] for e in _equations(jax.make_jaxpr(
        lambda p: jax.grad(loss)(p, fused))(params).jaxpr) if e.primitive.name == "pallas_call"]
    assert len(kernel_inputs) == 3 * config.num_layers
    assert all((3, 16, 3, 2, 16) in shapes for shapes in kernel_inputs), kernel_inputs
    np.testing.assert_allclose(loss(params, fused), loss(params, model), rtol=1e-5)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5),
                 jax.grad(loss)(params, fused), jax.grad(loss)(params, model))


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs inside its equations (jit, custom_vjp, scan...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)
