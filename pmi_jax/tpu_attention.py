"""Attention with the paper's attention dropout drawn inside the kernel, for TPUs (Pallas on Mosaic).

The TPU counterpart of `pmi_jax.fused_attention` (Triton), with the same keep rule (`entry_keep`,
`keep_probability`, `dropout_streams` are that module's), so a TPU run draws the masks a GPU run and
`keep_mask` draw from the same streams. Not a flash attention: BERT's rows (at most
`MAX_LENGTH` keys) fit a TensorCore's VMEM whole, so each grid step takes one sequence and the
heads of one 128-lane tile of the [B, L, H K] activations (two of BERT's 64-wide heads), reads
q, k, v once, and keeps the [L, L] scores in VMEM: no transposes, no per-block softmax
rescaling, one backward kernel for dq, dk and dv. Why and what was compiled: docs/tpu.md.

Shape suffixes: B batch, L length, H heads, K head dim, J heads of one block, C = J K lanes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pmi_jax.fused_attention import dropout_streams, entry_keep, keep_mask, keep_probability

__all__ = ["attention", "check_shapes", "dropout_streams", "keep_mask", "MAX_LENGTH"]

# BERT's longest. The backward kernel's [L, L] float32 blocks of two heads fill a TensorCore's 16 MiB
# of scoped VMEM: at 1024 it asked for 16.8 MiB, and Mosaic refused it (compiled for a v5p).
MAX_LENGTH = 512
_LANES = 128
_MASK = -0.7 * float(np.finfo(np.float32).max)  # finite: a row of masked scores has no NaN
_NT = (((1,), (1,)), ((), ()))  # q k^T: contract both operands' last axis


def heads_per_block(heads: int, head_dim: int) -> int:
    """Heads in one block: those of a 128-lane tile, or all heads when they span fewer lanes."""
    return min(heads, max(1, _LANES // head_dim))


def check_shapes(q_shape) -> None:
    """Raise ValueError unless [B, L, H, K] inputs fit the kernel's whole-row blocks."""
    _, length, heads, head_dim = q_shape
    per_block = heads_per_block(heads, head_dim)
    if length > MAX_LENGTH:
        raise ValueError(f"sequence length {length} is over the TPU kernel's {MAX_LENGTH} (whole rows in VMEM)")
    if heads % per_block or (per_block * head_dim % _LANES and per_block != heads):
        raise ValueError(f"{heads} heads of {head_dim} do not tile the TPU kernel's {_LANES}-lane blocks")


def _scores(q_LxK, k_LxK, length, scale):
    """Scaled scores, float32 [L, L]; keys at or past `length` masked."""
    s_LxL = jax.lax.dot_general(q_LxK, k_LxK, _NT, preferred_element_type=jnp.float32) * scale
    key_LxL = jax.lax.broadcasted_iota(jnp.int32, s_LxL.shape, 1)
    return jnp.where(key_LxL < length, s_LxL, _MASK)


def _keep(streams_ref, b, head, heads, length, rate):
    """bool [L, L]: the entries of (b, head) that dropout keeps (`fused_attention.entry_keep`, each
    entry's hash whole: the GPU kernel's join of two halves is no TPU lane layout)."""
    i = 2 * (b * heads + head)
    pos_L = jax.lax.broadcasted_iota(jnp.int32, (length,), 0).astype(jnp.uint32)
    row, col = (jax.lax.bitcast_convert_type(streams_ref[i + n], jnp.uint32) for n in (0, 1))
    return entry_keep(row, col, pos_L, pos_L, rate)


def _forward_kernel(lengths_ref, streams_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, head_dim, heads, rate):
    b, block = pl.program_id(0), pl.program_id(1)
    length, per_block = lengths_ref[b], q_ref.shape[1] // head_dim
    outs = []
    for j in range(per_block):
        lanes = slice(j * head_dim, (j + 1) * head_dim)
        v_LxK = v_ref[:, lanes]
        s_LxL = _scores(q_ref[:, lanes], k_ref[:, lanes], length, head_dim ** -0.5)
        m_Lx1 = jnp.max(s_LxL, axis=1, keepdims=True)
        p_LxL = jnp.exp(s_LxL - m_Lx1)
        l_Lx1 = jnp.sum(p_LxL, axis=1, keepdims=True)  # the softmax's sum: before dropout
        if rate > 0.0:
            p_LxL = jnp.where(_keep(streams_ref, b, block * per_block + j, heads, s_LxL.shape[0], rate), p_LxL, 0.0)
        o_LxK = jnp.dot(p_LxL.astype(v_LxK.dtype), v_LxK, preferred_element_type=jnp.float32)
        outs.append(o_LxK / (l_Lx1 * keep_probability(rate)))
        lse_ref[j, :] = (m_Lx1 + jnp.log(l_Lx1))[:, 0]
    o_ref[...] = jnp.concatenate(outs, axis=1).astype(o_ref.dtype)


def _backward_kernel(lengths_ref, streams_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dq_ref, dk_ref, dv_ref, *,
                     head_dim, heads, rate):
    b, block = pl.program_id(0), pl.program_id(1)
    length, per_block, scale = lengths_ref[b], q_ref.shape[1] // head_dim, head_dim ** -0.5
    grads = {"dq": [], "dk": [], "dv": []}
    keep_prob = keep_probability(rate)
    for j in range(per_block):
        lanes = slice(j * head_dim, (j + 1) * head_dim)
        q_LxK, k_LxK, v_LxK, do_LxK = (r[:, lanes] for r in (q_ref, k_ref, v_ref, do_ref))
        p_LxL = jnp.exp(_scores(q_LxK, k_LxK, length, scale) - lse_ref[j, :][:, None])
        # rowsum(dP' * P') over the dropped probabilities P' equals rowsum(dO * O): no [L, L] term.
        # The kept entries' terms are the keep probability times theirs (`fused_attention`'s
        # `_probs_and_grad`): the sums are divided by it once, not each entry.
        delta_Lx1 = jnp.sum(do_LxK.astype(jnp.float32) * o_ref[:, lanes].astype(jnp.float32), axis=1,
                            keepdims=True) * keep_prob
        dp_LxL = jax.lax.dot_general(do_LxK, v_LxK, _NT, preferred_element_type=jnp.float32)
        kept_LxL = p_LxL
        if rate > 0.0:
            keep_LxL = _keep(streams_ref, b, block * per_block + j, heads, p_LxL.shape[0], rate)
            dp_LxL = jnp.where(keep_LxL, dp_LxL, 0.0)
            kept_LxL = jnp.where(keep_LxL, p_LxL, 0.0)
        ds_LxL = (p_LxL * (dp_LxL - delta_Lx1)).astype(q_LxK.dtype)
        grads["dv"].append(jnp.dot(kept_LxL.astype(do_LxK.dtype).T, do_LxK, preferred_element_type=jnp.float32)
                           / keep_prob)
        grads["dq"].append(jnp.dot(ds_LxL, k_LxK, preferred_element_type=jnp.float32) * (scale / keep_prob))
        grads["dk"].append(jnp.dot(ds_LxL.T, q_LxK, preferred_element_type=jnp.float32) * (scale / keep_prob))
    for ref, name in ((dq_ref, "dq"), (dk_ref, "dk"), (dv_ref, "dv")):
        ref[...] = jnp.concatenate(grads[name], axis=1).astype(ref.dtype)


def _call(kernel, name, q_BxLxHxK, n_in, n_out, lse_out, flops, interpret):
    """pallas_call over the grid (b, head block), whole rows of [B, L, H K] per block; scalars prefetched."""
    b, length, heads, head_dim = q_BxLxHxK.shape
    per_block = heads_per_block(heads, head_dim)
    rows = pl.BlockSpec((None, length, per_block * head_dim), lambda i, j, *_: (i, 0, j))
    lse = pl.BlockSpec((None, None, per_block, length), lambda i, j, *_: (i, j, 0, 0))
    lse_shape = jax.ShapeDtypeStruct((b, heads // per_block, per_block, length), jnp.float32)
    row_shape = jax.ShapeDtypeStruct((b, length, heads * head_dim), q_BxLxHxK.dtype)
    n_lse_in = 0 if lse_out else 1  # the backward reads the forward's log-sum-exp
    out_specs = [rows] * n_out + ([lse] if lse_out else [])
    out_shape = [row_shape] * n_out + ([lse_shape] if lse_out else [])
    # What the kernel moves between HBM and VMEM (each block once) and its matmuls' FLOPs: XLA's
    # cost model takes a Mosaic kernel's figures from here and counts none of its own.
    row_bytes = row_shape.size * row_shape.dtype.itemsize
    cost = pl.CostEstimate(flops=flops, transcendentals=b * heads * length * length,
                           bytes_accessed=(n_in + n_out) * row_bytes + lse_shape.size * 4)
    return pl.pallas_call(
        functools.partial(kernel, head_dim=head_dim, heads=heads),
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=(b, heads // per_block),
                                               in_specs=[rows] * n_in + [lse] * n_lse_in, out_specs=out_specs),
        out_shape=out_shape, interpret=interpret, cost_estimate=cost, name=name,
        compiler_params=None if interpret else pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )


def _matmul_flops(q_shape, matmuls):
    b, length, heads, head_dim = q_shape
    return matmuls * 2 * b * heads * length * length * head_dim


def _flat(x_BxLxHxK):
    return x_BxLxHxK.reshape(*x_BxLxHxK.shape[:2], -1)


def _forward(q, k, v, lengths_B, streams, rate, interpret):
    kernel = functools.partial(_forward_kernel, rate=rate)
    o, lse = _call(kernel, "attention_dropout_forward_tpu", q, 3, 1, True, _matmul_flops(q.shape, 2), interpret)(
        lengths_B, streams, _flat(q), _flat(k), _flat(v))
    return o.reshape(q.shape), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, lengths_B, streams, rate, interpret):
    return _forward(q, k, v, lengths_B, streams, rate, interpret)[0]


def _attention_fwd(q, k, v, lengths_B, streams, rate, interpret):
    out, lse = _forward(q, k, v, lengths_B, streams, rate, interpret)
    return out, (q, k, v, lengths_B, streams, out, lse)


def _attention_bwd(rate, interpret, residuals, do):
    q, k, v, lengths_B, streams, out, lse = residuals
    kernel = functools.partial(_backward_kernel, rate=rate)
    # Five matmuls: the scores again, dP, dV, dQ and dK.
    dq, dk, dv = _call(kernel, "attention_dropout_backward_tpu", q, 5, 3, False, _matmul_flops(q.shape, 5),
                       interpret)(lengths_B, streams, *(_flat(x) for x in (q, k, v, out, do.astype(q.dtype))), lse)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, lengths_B, streams_BxHx2=None, *, rate: float = 0.0,
              interpret: bool = False) -> jax.Array:
    """softmax(q k^T / sqrt(K) + padding) with entries dropped at `rate`, times v: [B, L, H, K].

    The same function as `fused_attention.attention` (keys at or past each sequence's length take
    no weight; entry (b, h, q, k) kept where `keep_mask(streams_BxHx2, L, rate)` holds it, kept
    entries scaled by 1 / keep_probability(rate)); differentiable in q, k and v, the backward pass
    regenerating the mask. `interpret` runs Pallas' interpreter (any platform, slow) instead of compiling for a TPU.
    """
    check_shapes(q_BxLxHxK.shape)
    if rate > 0.0 and streams_BxHx2 is None:
        raise ValueError("attention dropout needs the streams of a dropout key (dropout_streams)")
    if streams_BxHx2 is None:
        streams_BxHx2 = jnp.zeros((q_BxLxHxK.shape[0], q_BxLxHxK.shape[2], 2), jnp.uint32)
    # Prefetched into scalar memory, which holds 32-bit integers: the streams' bits as int32.
    streams_N = jax.lax.bitcast_convert_type(streams_BxHx2.astype(jnp.uint32), jnp.int32).reshape(-1)
    return _attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, lengths_B.astype(jnp.int32), streams_N, float(rate),
                      bool(interpret))
