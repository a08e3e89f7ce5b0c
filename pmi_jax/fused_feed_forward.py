"""The feed-forward's GELU in its matmuls' epilogues: two Pallas kernels (Triton on GPUs).

XLA:GPU runs the GELU and its backward as kernels of their own: the forward reads h back to write
g = gelu(h), the backward writes dG = dy W2^T, then reads it and h to write dH (benchmarks/README.md,
"The bytes under the target"). Here the first matmul writes h and g together, and the one making
dG multiplies it by GELU's slope at h before writing dH, with per-block sums of dH for the bias:
288 MiB less per BERT-base layer at batch 32 x 512. h, g, dG and dH are rounded where XLA's path
rounds them; GELU is the erf form in float32 with the normal CDF from `_erfc` (Triton has no erf),
so a value may differ from XLA's path by one bf16 rounding.

Shape suffixes: T tokens, D hidden, F intermediate, M / N / K a block's rows, columns, depth.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["gelu_feed_forward", "gelu", "gelu_slope", "normal_cdf", "DEFAULT_BLOCKS", "DEFAULT_LAUNCH"]

DEFAULT_BLOCKS = (128, 128, 64)  # the largest (M, N, K); to be tuned on a GPU (gpu_step.py feed-forward-tuning)
DEFAULT_LAUNCH = (8, 3)  # (warps, pipeline stages)

# log(erfc(z) e^(z^2) / t) as a polynomial in t = 1 / (1 + z / 2): a least-squares fit of degree 7
# on z in [0, 10] (numpy, float64), our choice. In float32 erfc's relative error stays under 2e-6
# for z <= 4 and 1e-5 up to 9, past which it underflows (tests/test_fused_feed_forward.py).
_ERFC_T = (-1.26547794e+00, 9.98576941e-01, 3.94172610e-01, -4.08658680e-02, 3.52873231e-01,
           -1.00495270e+00, 7.54124250e-01, -1.88451256e-01)


def _erfc(z):
    """erfc(z) for float32 z >= 0, accurate relative to its own size (the GELU's negative tail)."""
    t = 1.0 / (1.0 + 0.5 * z)
    poly = _ERFC_T[-1]
    for coefficient in _ERFC_T[-2::-1]:
        poly = poly * t + coefficient
    return t * jnp.exp(poly - z * z)


def normal_cdf(x_f32):
    """P(N(0, 1) < x) in float32: erfc(|x| / sqrt 2) / 2 on the negative side, one minus it on the positive."""
    tail = 0.5 * _erfc(jnp.abs(x_f32) * (1.0 / math.sqrt(2.0)))
    return jnp.where(x_f32 < 0.0, tail, 1.0 - tail)


def gelu(x_f32):
    return x_f32 * normal_cdf(x_f32)


def gelu_slope(x_f32):
    """d gelu / dx: the CDF plus x times the normal density."""
    return normal_cdf(x_f32) + x_f32 * jnp.exp(-0.5 * x_f32 * x_f32) * (1.0 / math.sqrt(2.0 * math.pi))


def _fit(blocks, tokens: int, width: int, depth: int) -> tuple[int, int, int]:
    """Each block at most its preferred size and the largest power of two dividing its axis; at
    least 16, Triton's smallest matmul."""
    fitted = []
    for size, block, what in ((tokens, blocks[0], "tokens"), (width, blocks[1], "output width"),
                              (depth, blocks[2], "contraction")):
        fitted.append(min(block, size & -size))
        if fitted[-1] < 16:
            raise ValueError(f"gelu_feed_forward: the {what} ({size}) is not a multiple of 16: the kernels' "
                             "blocks need one (model.feed_forward=xla takes any size)")
    return tuple(fitted)


def _matmul_block(a_ref, b_ref, depth: int, block_k: int, transpose_b: bool):
    """float32 [M, N]: this program's block of a @ b (or a @ b^T), over the contraction in steps of K."""
    def body(i, acc_MxN):
        step = pl.ds(i * block_k, block_k)
        b = b_ref[:, step] if transpose_b else b_ref[step, :]
        return acc_MxN + plgpu.dot(a_ref[:, step], b, trans_b=transpose_b)

    m, n = a_ref.shape[0], (b_ref.shape[0] if transpose_b else b_ref.shape[1])
    return jax.lax.fori_loop(0, depth // block_k, body, jnp.zeros((m, n), jnp.float32))


def _up_kernel(x_ref, w_ref, b_ref, h_ref, g_ref, *, block_k):
    acc_MxN = _matmul_block(x_ref, w_ref, x_ref.shape[1], block_k, transpose_b=False)
    h_MxN = (acc_MxN + b_ref[...].astype(jnp.float32)[None, :]).astype(h_ref.dtype)
    h_ref[...] = h_MxN
    g_ref[...] = gelu(h_MxN.astype(jnp.float32)).astype(g_ref.dtype)


def _down_kernel(dy_ref, w_ref, h_ref, dh_ref, sums_ref, *, block_k):
    acc_MxN = _matmul_block(dy_ref, w_ref, dy_ref.shape[1], block_k, transpose_b=True)
    dg_MxN = acc_MxN.astype(dh_ref.dtype).astype(jnp.float32)
    dh_MxN = (dg_MxN * gelu_slope(h_ref[...].astype(jnp.float32))).astype(dh_ref.dtype)
    dh_ref[...] = dh_MxN
    sums_ref[...] = jnp.sum(dh_MxN.astype(jnp.float32), axis=0)[None, :]


def _params(interpret: bool, launch):
    return None if interpret else plgpu.CompilerParams(num_warps=launch[0], num_stages=launch[1])


def _up(x_TxD, w_DxF, b_F, blocks, launch, interpret):
    """(h, g), each [T, F] in x's dtype: h = x w + b and g = gelu(h), written by one kernel."""
    (tokens, depth), width = x_TxD.shape, w_DxF.shape[1]
    m, n, k = _fit(blocks, tokens, width, depth)
    out = jax.ShapeDtypeStruct((tokens, width), x_TxD.dtype)
    return pl.pallas_call(
        functools.partial(_up_kernel, block_k=k),
        grid=(tokens // m, width // n),
        in_specs=[pl.BlockSpec((m, depth), lambda i, j: (i, 0)), pl.BlockSpec((depth, n), lambda i, j: (0, j)),
                  pl.BlockSpec((n,), lambda i, j: (j,))],
        out_specs=[pl.BlockSpec((m, n), lambda i, j: (i, j))] * 2,
        out_shape=[out, out], compiler_params=_params(interpret, launch), interpret=interpret,
        name="gelu_feed_forward_up")(x_TxD, w_DxF, b_F)


def _down(dy_TxD, w_FxD, h_TxF, blocks, launch, interpret):
    """(dH [T, F], its column sums per block of M rows [T / M, F] float32): dH = (dy w^T) gelu'(h)."""
    (tokens, depth), width = dy_TxD.shape, w_FxD.shape[0]
    m, n, k = _fit(blocks, tokens, width, depth)
    return pl.pallas_call(
        functools.partial(_down_kernel, block_k=k),
        grid=(tokens // m, width // n),
        in_specs=[pl.BlockSpec((m, depth), lambda i, j: (i, 0)), pl.BlockSpec((n, depth), lambda i, j: (j, 0)),
                  pl.BlockSpec((m, n), lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec((m, n), lambda i, j: (i, j)), pl.BlockSpec((1, n), lambda i, j: (i, j))],
        out_shape=[jax.ShapeDtypeStruct((tokens, width), h_TxF.dtype),
                   jax.ShapeDtypeStruct((tokens // m, width), jnp.float32)],
        compiler_params=_params(interpret, launch), interpret=interpret,
        name="gelu_feed_forward_down")(dy_TxD, w_FxD, h_TxF)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _feed_forward(x_TxD, w1_DxF, b1_F, w2_FxD, blocks, launch, interpret):
    return _feed_forward_fwd(x_TxD, w1_DxF, b1_F, w2_FxD, blocks, launch, interpret)[0]


def _feed_forward_fwd(x_TxD, w1_DxF, b1_F, w2_FxD, blocks, launch, interpret):
    # The other matmuls are XLA's, in the compute dtype as nn.Dense's and their gradients are.
    h_TxF, g_TxF = _up(x_TxD, w1_DxF, b1_F, blocks, launch, interpret)
    y_TxD = jnp.dot(g_TxF, w2_FxD)
    return y_TxD, (x_TxD, w1_DxF, b1_F, w2_FxD, h_TxF, g_TxF)


def _feed_forward_bwd(blocks, launch, interpret, residuals, dy_TxD):
    x_TxD, w1_DxF, b1_F, w2_FxD, h_TxF, g_TxF = residuals
    dw2_FxD = jnp.dot(g_TxF.T, dy_TxD)
    dh_TxF, sums_BxF = _down(dy_TxD, w2_FxD, h_TxF, blocks, launch, interpret)
    db1_F = jnp.sum(sums_BxF, axis=0).astype(b1_F.dtype)
    dw1_DxF = jnp.dot(x_TxD.T, dh_TxF)
    dx_TxD = jnp.dot(dh_TxF, w1_DxF.T)
    return dx_TxD, dw1_DxF, db1_F, dw2_FxD


_feed_forward.defvjp(_feed_forward_fwd, _feed_forward_bwd)


def gelu_feed_forward(x_TxD, w1_DxF, b1_F, w2_FxD, *, blocks=DEFAULT_BLOCKS, launch=DEFAULT_LAUNCH,
                      interpret: bool = False) -> jax.Array:
    """gelu(x w1 + b1) w2, without the output bias, in x's dtype (the weights and bias cast to it).

    The output bias is the caller's: the fused residual LayerNorm adds it itself. `interpret` runs
    Pallas' interpreter (any platform, slow). `blocks` (M, N, K): the largest block sizes (`_fit`);
    the tokens and both widths must be multiples of 16.
    """
    dtype = x_TxD.dtype
    return _feed_forward(x_TxD, w1_DxF.astype(dtype), b1_F.astype(dtype), w2_FxD.astype(dtype), tuple(blocks),
                         tuple(launch), bool(interpret))
