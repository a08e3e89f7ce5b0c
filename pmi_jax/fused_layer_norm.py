"""A post-LN layer's bias, dropout, residual and LayerNorm as one Pallas kernel (Triton on GPUs).

y = LayerNorm(x + dropout(a + bias)). XLA:GPU runs it as two kernels forward and three backward,
after writing the dropout mask's random words, moving over twice the bytes it needs
(benchmarks/README.md, "Fused residual LayerNorm"). Here the forward reads a and x and
writes s = x + dropout(a + bias) and y; the backward reads y's gradient and s and writes the
gradients of x and a, with per-block partial sums for bias, scale and offset. Entry (b, l, d) is
kept where its hash (`fused_attention.entry_bits`) of per-sequence streams of the layer's
dropout key is below round((1 - rate) 2^32): nothing is stored and a resumed run redraws it.

Shape suffixes: B batch, L length, D hidden, R rows of a block, C columns (D up to a power of 2).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pmi_jax.fused_attention import entry_bits, keep_threshold, lowbias32, position_words

__all__ = ["residual_layer_norm", "dropout_streams", "keep_mask"]

MAX_ROWS = 16  # rows per program by default: the backward's partial sums are [B, L / R, D]


def dropout_streams(rng, batch: int) -> jax.Array:
    """uint32 [B, 2]: the row and column streams of every sequence, drawn from a dropout key."""
    return jax.random.bits(rng, (batch, 2), jnp.uint32)


def keep_mask(streams_Bx2, length: int, width: int, rate: float) -> jax.Array:
    """bool [B, L, D]: the entries the kernel keeps, in plain jnp (tests, references)."""
    pos_L, col_D = jnp.arange(length, dtype=jnp.uint32), jnp.arange(width, dtype=jnp.uint32)
    bits = jax.vmap(lambda s: entry_bits(s[0], s[1], pos_L, col_D))(streams_Bx2)
    return bits < jnp.uint32(keep_threshold(rate))


def _rows(length: int, max_rows: int) -> int:
    """The largest power of two dividing `length`, at most `max_rows`."""
    return min(length & -length, max_rows)


def _block(rows: int, d: int, width: int):
    """This program's first row, its columns up to `width` (a power of two, as Triton's arrays
    must be), which of them are real, and a float32 loader of one row (masked columns read 0)."""
    cols_C = jnp.arange(width)
    valid_C = cols_C < d

    def load(ref, *index):
        return plgpu.load(ref.at[(*index, cols_C)], mask=valid_C, other=0.0).astype(jnp.float32)

    return pl.program_id(1) * rows, cols_C, valid_C, load


def _keeper(streams_ref, cols_C, rate):
    """keep(position) -> bool [C] of one row, the columns' words computed once for the program's
    rows (in the loop they were recomputed each row: the stores to s and y keep the compiler from
    hoisting the streams' load)."""
    row_stream, col_words_C = streams_ref[0], position_words(streams_ref[1], cols_C)
    threshold = jnp.uint32(keep_threshold(rate))
    return lambda position: lowbias32(position_words(row_stream, position) + col_words_C) < threshold


def _forward_kernel(streams_ref, a_ref, bias_ref, x_ref, scale_ref, offset_ref, s_ref, y_ref, mean_ref, rstd_ref,
                    *, rate, eps, width):
    rows, d = a_ref.shape
    first, cols_C, valid_C, load = _block(rows, d, width)
    bias_C, scale_C, offset_C = load(bias_ref), load(scale_ref), load(offset_ref)

    keep = _keeper(streams_ref, cols_C, rate) if rate > 0.0 else None

    def row(i, stats):
        h_C = load(a_ref, i) + bias_C
        if keep is not None:
            h_C = jnp.where(keep(first + i), h_C * (1.0 / (1.0 - rate)), 0.0)
        s_C = (load(x_ref, i) + h_C).astype(s_ref.dtype)  # LayerNorm reads s as stored, as the backward will
        plgpu.store(s_ref.at[i, cols_C], s_C, mask=valid_C)
        s_C = s_C.astype(jnp.float32)
        mean = jnp.sum(s_C) / d
        centred_C = jnp.where(valid_C, s_C - mean, 0.0)
        rstd = jax.lax.rsqrt(jnp.sum(centred_C * centred_C) / d + eps)
        plgpu.store(y_ref.at[i, cols_C], (centred_C * rstd * scale_C + offset_C).astype(y_ref.dtype), mask=valid_C)
        at_R = jnp.arange(rows) == i
        return jnp.where(at_R, mean, stats[0]), jnp.where(at_R, rstd, stats[1])

    zeros_R = jnp.zeros((rows,), jnp.float32)
    mean_ref[...], rstd_ref[...] = jax.lax.fori_loop(0, rows, row, (zeros_R, zeros_R))


def _backward_kernel(streams_ref, g_ref, s_ref, mean_ref, rstd_ref, scale_ref, dx_ref, da_ref, dbias_ref,
                     dscale_ref, doffset_ref, *, rate, width):
    rows, d = g_ref.shape
    first, cols_C, valid_C, load = _block(rows, d, width)
    scale_C = load(scale_ref)
    mean_R, rstd_R = mean_ref[...], rstd_ref[...]
    keep = _keeper(streams_ref, cols_C, rate) if rate > 0.0 else None

    def row(i, sums):
        dbias_C, dscale_C, doffset_C = sums
        at_R = jnp.arange(rows) == i
        mean, rstd = jnp.sum(jnp.where(at_R, mean_R, 0.0)), jnp.sum(jnp.where(at_R, rstd_R, 0.0))
        g_C = load(g_ref, i)
        xhat_C = jnp.where(valid_C, (load(s_ref, i) - mean) * rstd, 0.0)
        gs_C = g_C * scale_C
        ds_C = (gs_C - jnp.sum(gs_C) / d - xhat_C * (jnp.sum(gs_C * xhat_C) / d)) * rstd
        da_C = ds_C
        if keep is not None:
            da_C = jnp.where(keep(first + i), ds_C * (1.0 / (1.0 - rate)), 0.0)
        plgpu.store(dx_ref.at[i, cols_C], ds_C.astype(dx_ref.dtype), mask=valid_C)
        plgpu.store(da_ref.at[i, cols_C], da_C.astype(da_ref.dtype), mask=valid_C)
        return dbias_C + da_C, dscale_C + g_C * xhat_C, doffset_C + g_C

    zeros_C = jnp.zeros((width,), jnp.float32)
    sums = jax.lax.fori_loop(0, rows, row, (zeros_C, zeros_C, zeros_C))
    for ref, sum_C in zip((dbias_ref, dscale_ref, doffset_ref), sums):
        plgpu.store(ref.at[cols_C], sum_C, mask=valid_C)


def _specs(rows: int, d: int):
    """BlockSpecs over the grid (b, block of rows)."""
    return {"streams": pl.BlockSpec((None, 2), lambda b, j: (b, 0)),
            "block": pl.BlockSpec((None, rows, d), lambda b, j: (b, j, 0)),
            "stats": pl.BlockSpec((None, rows), lambda b, j: (b, j)),
            "vector": pl.BlockSpec((d,), lambda b, j: (0,)),
            "partial": pl.BlockSpec((None, None, d), lambda b, j: (b, j, 0))}


def _compiler_params(interpret: bool):
    return None if interpret else plgpu.CompilerParams(num_warps=4, num_stages=1)


def _forward(a, bias, x, scale, offset, streams_Bx2, rate, eps, max_rows, interpret):
    b, length, d = x.shape
    rows = _rows(length, max_rows)
    spec = _specs(rows, d)
    kernel = functools.partial(_forward_kernel, rate=rate, eps=eps, width=pl.next_power_of_2(d))
    return pl.pallas_call(
        kernel, grid=(b, length // rows),
        in_specs=[spec["streams"], spec["block"], spec["vector"], spec["block"], spec["vector"], spec["vector"]],
        out_specs=[spec["block"], spec["block"], spec["stats"], spec["stats"]],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype),
                   jax.ShapeDtypeStruct((b, length), jnp.float32), jax.ShapeDtypeStruct((b, length), jnp.float32)],
        compiler_params=_compiler_params(interpret), interpret=interpret, name="residual_layer_norm_forward",
    )(streams_Bx2, a, bias, x, scale, offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _fused(a, bias, x, scale, offset, streams_Bx2, rate, eps, max_rows, interpret):
    return _forward(a, bias, x, scale, offset, streams_Bx2, rate, eps, max_rows, interpret)[1]


def _fused_fwd(a, bias, x, scale, offset, streams_Bx2, rate, eps, max_rows, interpret):
    s, y, mean, rstd = _forward(a, bias, x, scale, offset, streams_Bx2, rate, eps, max_rows, interpret)
    return y, (s, mean, rstd, bias, scale, offset, streams_Bx2)


def _fused_bwd(rate, eps, max_rows, interpret, residuals, g):
    s, mean, rstd, bias, scale, offset, streams_Bx2 = residuals
    b, length, d = s.shape
    rows = _rows(length, max_rows)
    spec = _specs(rows, d)
    partial = jax.ShapeDtypeStruct((b, length // rows, d), jnp.float32)
    dx, da, dbias, dscale, doffset = pl.pallas_call(
        functools.partial(_backward_kernel, rate=rate, width=pl.next_power_of_2(d)), grid=(b, length // rows),
        in_specs=[spec["streams"], spec["block"], spec["block"], spec["stats"], spec["stats"], spec["vector"]],
        out_specs=[spec["block"], spec["block"], spec["partial"], spec["partial"], spec["partial"]],
        out_shape=[jax.ShapeDtypeStruct(s.shape, s.dtype), jax.ShapeDtypeStruct(s.shape, s.dtype),
                   partial, partial, partial],
        compiler_params=_compiler_params(interpret), interpret=interpret, name="residual_layer_norm_backward",
    )(streams_Bx2, g, s, mean, rstd, scale)
    dbias, dscale, doffset = jnp.sum(jnp.stack([dbias, dscale, doffset]), axis=(1, 2))  # one kernel, not three
    return da, dbias.astype(bias.dtype), dx, dscale.astype(scale.dtype), doffset.astype(offset.dtype), None


_fused.defvjp(_fused_fwd, _fused_bwd)


def residual_layer_norm(a_BxLxD, bias_D, x_BxLxD, scale_D, offset_D, streams_Bx2=None, *, rate: float = 0.0,
                        eps: float = 1e-12, max_rows: int = MAX_ROWS, interpret: bool = False) -> jax.Array:
    """LayerNorm(x + dropout(a + bias)) * scale + offset, statistics in float32, in x's dtype: [B, L, D].

    With `rate` > 0, entry (b, l, d) of a + bias is kept where `keep_mask(streams_Bx2, L, D, rate)`
    holds it and scaled by 1 / (1 - rate). Differentiable in a, bias, x, scale and offset; the
    backward pass regenerates the mask. A program takes up to `max_rows` rows (a power of two).
    `interpret` runs Pallas' interpreter (any platform, slow).
    """
    if rate > 0.0 and streams_Bx2 is None:
        raise ValueError("dropout needs the streams of a dropout key (dropout_streams)")
    if streams_Bx2 is None:
        streams_Bx2 = jnp.zeros((x_BxLxD.shape[0], 2), jnp.uint32)
    return _fused(a_BxLxD.astype(x_BxLxD.dtype), bias_D, x_BxLxD, scale_D, offset_D, streams_Bx2.astype(jnp.uint32),
                  float(rate), float(eps), int(max_rows), bool(interpret))
