"""Flash attention with the paper's attention dropout drawn inside the kernel (Pallas; Triton on GPUs).

Written out, attention dropout stores [B, H, L, L] scores, probabilities and mask; cuDNN's fused
dropout follows a static seed, so a resumed run would draw other masks. Here entries (b, h, q,
2j) and (b, h, q, 2j + 1) take the low and high 16 bits of lowbias32(row word + column word),
the words being lowbias32 of per-(b, h) streams (random bits of the layer's dropout key) plus q
or j, and are kept below `keep_threshold16(1 - rate)`: uint32 arithmetic that the forward
kernel, both backward kernels and `keep_mask` (jnp, for tests) evaluate alike, so nothing [L, L]
is stored and the same key redraws the same mask. Padding is a suffix given by each sequence's
length. Why and what is tested: docs/gpu.md, "The Pallas attention with in-kernel dropout".

Shape suffixes: B batch, L length, H heads, K head dim, Q and S query and key block.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["attention", "attention_stacked", "dropout_streams", "entry_bits", "entry_keep", "keep_mask",
           "keep_probability", "keep_threshold", "keep_threshold16", "lowbias32", "padded_length", "position_words"]

_MASK = -0.7 * float(np.finfo(np.float32).max)  # finite: a row of masked scores has no NaN
_LOG2E = math.log2(math.e)
DEFAULT_BLOCKS = (64, 64)  # (query, key) block; on GPUs to be tuned (benchmarks/gpu_step.py)
# Triton's (num_warps, num_stages) for the forward kernel, then for the two backward ones; to be
# tuned with the blocks (`gpu_step.py`'s attention-tuning).
DEFAULT_LAUNCH = ((4, 2), (4, 2))
# The kernels' inline PTX (`_exp2`, `_cast`) when compiled for a GPU; off, the same arithmetic as
# Triton writes it (slower: benchmarks/README.md). Read when a kernel is traced.
INLINE_PTX = True


def lowbias32(x):
    """A bijective uint32 finaliser (xorshift-multiply, two rounds)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def position_words(stream, pos):
    """lowbias32(stream + position): the row or column words `entry_bits` adds (kernels that keep
    a row's or a column's words across their loop compute them once)."""
    return lowbias32(stream + pos.astype(jnp.uint32))


def entry_bits(row_stream, col_stream, q_Q, k_S):
    """uint32 [Q, S]: the random bits of entries (q, k) of one (b, h) with streams (row, col)."""
    return _words_bits(position_words(row_stream, q_Q), position_words(col_stream, k_S))


def _words_bits(row_words_Q, col_words_S):
    """uint32 [Q, S]: `entry_bits` from the rows' and columns' `position_words`."""
    return lowbias32(row_words_Q[:, None] + col_words_S[None, :])


def keep_threshold(rate: float) -> int:
    """Entries whose bits are below this are kept: round((1 - rate) 2^32), at most 2^32 - 1."""
    return min(round((1.0 - rate) * 2**32), 2**32 - 1)


def keep_threshold16(keep_prob: float) -> int:
    """16 random bits below this keep their element: round(keep_prob 2^16), within [1, 2^16 - 1].

    The realised keep probability is threshold / 2^16, within 2^-17 of keep_prob (2^-16 at the
    clamped ends): for BERT's dropout 0.1, 58982 / 65536 = 0.899993896484375 (a drop rate of
    0.100006103515625).
    """
    return min(max(round(keep_prob * 2**16), 1), 2**16 - 1)


def keep_probability(rate: float) -> float:
    """The share of entries the attention keeps at dropout `rate` (kept ones are divided by it)."""
    return keep_threshold16(1.0 - rate) / 2**16 if rate > 0.0 else 1.0


def _halves_below(bits, threshold16):
    """(low 16 bits < threshold16, high 16 bits < threshold16) of uint32 `bits`."""
    shifted = jnp.uint32(threshold16 << 16)
    return (bits << 16) < shifted, bits < shifted


def entry_keep(row_stream, col_stream, q_Q, k_S, rate: float):
    """bool [Q, S]: whether attention dropout at `rate` keeps entries (q, k) of one (b, h) (uint32
    positions).

    Columns 2j and 2j + 1 take the halves of one hash (`entry_bits` of column j): half the
    kernels' integer work per entry, which bounded their loops (benchmarks/README.md).
    """
    bits_QxS = entry_bits(row_stream, col_stream, q_Q, k_S >> 1)
    to_top_1xS = (((k_S & 1) ^ 1) << 4)[None, :]  # an even column's bits are the low half: shift by 16
    return (bits_QxS << to_top_1xS) < jnp.uint32(keep_threshold16(1.0 - rate) << 16)


def dropout_streams(rng, batch: int, heads: int) -> jax.Array:
    """uint32 [B, H, 2]: the row and column streams of every (b, h), drawn from a dropout key."""
    return jax.random.bits(rng, (batch, heads, 2), jnp.uint32)


def keep_mask(streams_BxHx2, length: int, rate: float) -> jax.Array:
    """bool [B, H, L, L]: the entries the kernel keeps, computed in plain jnp (tests, references)."""
    pos_L = jnp.arange(length, dtype=jnp.uint32)
    return jax.vmap(jax.vmap(lambda s: entry_keep(s[0], s[1], pos_L, pos_L, rate)))(streams_BxHx2)


def _blocks(length: int, blocks: tuple[int, int]) -> tuple[int, int]:
    return min(blocks[0], length), min(blocks[1], length)


def padded_length(length: int, blocks: tuple[int, int] = DEFAULT_BLOCKS) -> int:
    """The length `attention` runs the kernel at: `length` rounded up to a multiple of the larger
    block, or to a power of two of at least 16 when shorter (Triton's blocks are powers of two)."""
    if any(b < 16 or b & (b - 1) for b in blocks):
        raise ValueError(f"attention blocks {blocks}: each must be a power of two of at least 16")
    block = max(blocks)
    if length >= block:
        return -(-length // block) * block
    return max(16, 1 << (length - 1).bit_length())


def _key_blocks(length, block_k):
    """Key blocks holding a valid key (at least one, so a length-0 row has no empty softmax)."""
    return jnp.maximum((length + block_k - 1) // block_k, 1)


def _scores(q_QxK, k_SxK, key_start, length, scale):
    """(scores, factor), float32 [Q, S] and the factor to log2 units: a block of valid keys (`length`
    None) unscaled, for `_exp2`'s fused multiply-add; a partial one scaled (factor 1), keys at or past
    `length` masked. The row maxima are the scaled scores' either way (rounding is monotonic)."""
    s_QxS = plgpu.dot(q_QxK, k_SxK, trans_b=True)
    if length is None:
        return s_QxS, scale * _LOG2E
    key_S = key_start + jnp.arange(k_SxK.shape[0])
    return jnp.where(key_S[None, :] < length, s_QxS * (scale * _LOG2E), _MASK), 1.0


def _exp2(s_QxS, factor, offset_Q, native: bool):
    """exp2(s factor - offset) per entry. `native` (compiled for a GPU): one fused multiply-add and
    the flush-to-zero exp2, as inline PTX. XLA's Triton pipeline neither contracts the multiply and
    subtraction nor flushes, and exp2 without flushing takes three instructions besides its own to
    handle results below 2^-126 (benchmarks/README.md); such probabilities count for nothing here."""
    if not native:
        return jnp.exp2(s_QxS * factor - offset_Q[:, None])
    neg_offset_QxS = jnp.broadcast_to(-offset_Q[:, None], s_QxS.shape)
    factor_hex = np.float32(factor).view(np.uint32)
    [p_QxS] = plgpu.elementwise_inline_asm(
        f"{{ .reg .f32 t; fma.rn.f32 t, $1, 0f{factor_hex:08X}, $2; ex2.approx.ftz.f32 $0, t; }}",
        args=[s_QxS, neg_offset_QxS], constraints="=f,f,f", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(s_QxS.shape, jnp.float32)])
    return p_QxS


def _cast(x_QxS, dtype, native: bool):
    """`x` as the matmul's operand `dtype`; to bf16 when `native`, pairs of entries in one PTX
    instruction, inline: LLVM moves a select before a conversion to after it, so the dropout's
    select ran on 16-bit halves, a select and a byte permute each (benchmarks/README.md)."""
    if not native or dtype != jnp.bfloat16:
        return x_QxS.astype(dtype)
    [y_QxS] = plgpu.elementwise_inline_asm(
        "cvt.rn.bf16x2.f32 $0, $2, $1;", args=[x_QxS], constraints="=r,f,f", pack=2,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x_QxS.shape, jnp.bfloat16)])
    return y_QxS


def _over_key_blocks(length, block_k, body, init):
    """fori_loop of `body(j, carry, length)` over the key blocks holding a valid key: the full ones
    given None (no padding mask to compute), then the partial last one, if any, given `length`."""
    full = length // block_k
    carry = jax.lax.fori_loop(0, full, lambda j, carry: body(j, carry, None), init)
    return jax.lax.fori_loop(full, _key_blocks(length, block_k), lambda j, carry: body(j, carry, length), carry)


def _column_words(streams_BxHx2, length: int):
    """uint32 [B, H, length / 2]: `position_words` of every key pair, for the kernels whose loop runs
    over key blocks (forward, dQ): computed once a layer by XLA, where each of those kernels' trips
    spent about a tenth of its instructions on its block's words (benchmarks/README.md)."""
    return position_words(streams_BxHx2[..., 1:], jnp.arange(length // 2, dtype=jnp.uint32))


def _keep(streams_ref, q_start, block_q, k_start, block_k, rate, words_ref=None):
    """`entry_keep` of one block: each pair's hash once, its halves joined along the columns (in
    registers: Triton's join keeps both in the thread that holds the adjacent columns). The key
    pairs' words from `words_ref` (`_column_words`) where given, else computed here."""
    words_P = (position_words(streams_ref[1], k_start // 2 + jnp.arange(block_k // 2)) if words_ref is None
               else words_ref[pl.ds(k_start // 2, block_k // 2)])
    bits_QxP = _words_bits(position_words(streams_ref[0], q_start + jnp.arange(block_q)), words_P)
    halves = _halves_below(bits_QxP, keep_threshold16(1.0 - rate))
    return jnp.stack(halves, axis=-1).reshape(block_q, block_k)


def _forward_kernel(lengths_ref, streams_ref, words_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, rate,
                    block_k, native):
    length = lengths_ref[pl.program_id(0)]
    block_q, head_dim = q_ref.shape
    q_start = pl.program_id(2) * block_q
    q_QxK = q_ref[...]

    def body(j, carry, mask_length):
        o_QxK, m_Q, l_Q = carry
        k_start = j * block_k
        s_QxS, factor = _scores(q_QxK, k_ref[pl.ds(k_start, block_k), :], k_start, mask_length, scale)
        m_next_Q = jnp.maximum(m_Q, jnp.max(s_QxS, axis=1) * factor)
        correction_Q = jnp.exp2(m_Q - m_next_Q)
        p_QxS = _exp2(s_QxS, factor, m_next_Q, native)
        l_Q = correction_Q * l_Q + jnp.sum(p_QxS, axis=1)  # the softmax's sum: before dropout
        if rate > 0.0:
            p_QxS = jnp.where(_keep(streams_ref, q_start, block_q, k_start, block_k, rate, words_ref),
                              p_QxS, 0.0)
        v_SxK = v_ref[pl.ds(k_start, block_k), :]
        o_QxK = correction_Q[:, None] * o_QxK + plgpu.dot(_cast(p_QxS, v_SxK.dtype, native), v_SxK)
        return o_QxK, m_next_Q, l_Q

    init = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    o_QxK, m_Q, l_Q = _over_key_blocks(length, block_k, body, init)
    o_ref[...] = (o_QxK / (l_Q * keep_probability(rate))[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m_Q + jnp.log2(l_Q)


def _probs_and_grad(q_QxK, k_SxK, v_SxK, do_QxK, lse_Q, kept_delta_Q, keep_QxS, k_start, mask_length, scale,
                    native):
    """The kept probabilities and the scores' gradient of one block, each the keep probability times
    its value (`kept_delta_Q` is the row term times it): the kernels divide their sums by it once,
    not every entry (a division per entry is a special-function instruction, as exp2 is)."""
    p_QxS = _exp2(*_scores(q_QxK, k_SxK, k_start, mask_length, scale), lse_Q, native)
    dp_QxS = plgpu.dot(do_QxK, v_SxK, trans_b=True)
    if keep_QxS is not None:
        dp_QxS = jnp.where(keep_QxS, dp_QxS, 0.0)
        kept_QxS = jnp.where(keep_QxS, p_QxS, 0.0)
    else:
        kept_QxS = p_QxS
    return kept_QxS, p_QxS * (dp_QxS - kept_delta_Q[:, None])


def _dkv_kernel(lengths_ref, streams_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, scale, rate,
                block_q, stacked, native):
    length = lengths_ref[pl.program_id(0)]
    block_k, head_dim = k_ref.shape
    k_start = pl.program_id(2) * block_k
    k_SxK, v_SxK = k_ref[...], v_ref[...]

    def body(i, carry, mask_length):
        dk_SxK, dv_SxK = carry
        q_start = i * block_q
        rows = pl.ds(q_start, block_q)
        q_QxK, do_QxK = q_ref[rows, :], do_ref[rows, :]
        keep_QxS = (_keep(streams_ref, q_start, block_q, k_start, block_k, rate)
                    if rate > 0.0 else None)
        kept_QxS, ds_QxS = _probs_and_grad(q_QxK, k_SxK, v_SxK, do_QxK, lse_ref[rows], delta_ref[rows], keep_QxS,
                                           k_start, mask_length, scale, native)
        dv_SxK = dv_SxK + plgpu.dot(_cast(kept_QxS, do_QxK.dtype, native), do_QxK, trans_a=True)
        dk_SxK = dk_SxK + plgpu.dot(ds_QxS.astype(q_QxK.dtype), q_QxK, trans_a=True)
        return dk_SxK, dv_SxK

    # Key blocks wholly past the length get no weight: zero gradients, no loop. A block of valid
    # keys takes the loop without the padding mask, a partial one the loop with it.
    in_range = (k_start < _key_blocks(length, block_k) * block_k).astype(jnp.int32)
    partial = (k_start + block_k > length).astype(jnp.int32)
    query_blocks = in_range * (q_ref.shape[0] // block_q)
    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    carry = jax.lax.fori_loop(0, query_blocks * (1 - partial), lambda i, c: body(i, c, None), (zeros, zeros))
    dk_SxK, dv_SxK = jax.lax.fori_loop(0, query_blocks * partial, lambda i, c: body(i, c, length), carry)
    dk_SxK, dv_SxK = dk_SxK * (scale / keep_probability(rate)), dv_SxK / keep_probability(rate)
    if stacked:
        # refs: the dQ kernel's [B, L, 3, H, K] output (unread); a [block, 3, K] block of it, aliased,
        # whose slots 1 and 2 this kernel writes (slot 0 holds dQ); this block's sums of dK and dV.
        _, dqkv_ref, dbias_ref = refs
        dqkv_ref[:, 1, :] = dk_SxK.astype(dqkv_ref.dtype)
        dqkv_ref[:, 2, :] = dv_SxK.astype(dqkv_ref.dtype)
        dbias_ref[0, :] = jnp.sum(dk_SxK, axis=0)
        dbias_ref[1, :] = jnp.sum(dv_SxK, axis=0)
    else:
        dk_ref, dv_ref = refs
        dk_ref[...] = dk_SxK.astype(dk_ref.dtype)
        dv_ref[...] = dv_SxK.astype(dv_ref.dtype)


def _dq_kernel(lengths_ref, streams_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, o_ref, words_ref, dq_ref,
               delta_ref, dbias_ref=None, *, scale, rate, block_k, native):
    length = lengths_ref[pl.program_id(0)]
    block_q, head_dim = q_ref.shape
    q_start = pl.program_id(2) * block_q
    q_QxK, do_QxK, lse_Q = q_ref[...], do_ref[...], lse_ref[...]
    # The softmax's row term: rowsum(dP' * P') over the dropped probabilities P' is rowsum(dO * O),
    # no [L, L] term; times the keep probability (`_probs_and_grad`), written out for the dK/dV
    # kernel, which runs after this one.
    delta_Q = jnp.sum(do_QxK.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1)
    delta_Q = delta_Q * keep_probability(rate)
    delta_ref[...] = delta_Q

    def body(j, dq_QxK, mask_length):
        k_start = j * block_k
        cols = pl.ds(k_start, block_k)
        k_SxK = k_ref[cols, :]
        keep_QxS = (_keep(streams_ref, q_start, block_q, k_start, block_k, rate, words_ref)
                    if rate > 0.0 else None)
        _, ds_QxS = _probs_and_grad(q_QxK, k_SxK, v_ref[cols, :], do_QxK, lse_Q, delta_Q, keep_QxS, k_start,
                                    mask_length, scale, native)
        return dq_QxK + plgpu.dot(ds_QxS.astype(k_SxK.dtype), k_SxK)

    dq_QxK = _over_key_blocks(length, block_k, body, jnp.zeros((block_q, head_dim), jnp.float32))
    dq_QxK = dq_QxK * (scale / keep_probability(rate))
    dq_ref[...] = dq_QxK.astype(dq_ref.dtype)
    if dbias_ref is not None:  # this block's part of the query bias's gradient
        dbias_ref[...] = jnp.sum(dq_QxK, axis=0)


def _rows_spec(rows, head_dim, whole, slot):
    """One (b, h)'s rows over the grid (b, h, i): block i of `rows` rows, or rows from 0 when `whole`; of
    [B, L, H, K] (slot None), of slot `slot` of the stacked [B, L, 3, H, K], or of all three ("all")."""
    start = (lambda i: 0) if whole else (lambda i: i)
    if slot is None:
        return pl.BlockSpec((None, rows, None, head_dim), lambda b, h, i: (b, start(i), h, 0))
    if slot == "all":
        return pl.BlockSpec((None, rows, 3, None, head_dim), lambda b, h, i: (b, start(i), 0, h, 0))
    return pl.BlockSpec((None, rows, None, None, head_dim), lambda b, h, i: (b, start(i), slot, h, 0))


def _lengths_spec(batch):
    return pl.BlockSpec((batch,), lambda b, h, i: (0,))


def _streams_spec():
    return pl.BlockSpec((None, None, 2), lambda b, h, i: (b, h, 0))


def _words_spec(length):
    """One (b, h)'s key-pair words (`_column_words`), whole, for every block of its rows."""
    return pl.BlockSpec((None, None, length // 2), lambda b, h, i: (b, h, 0))


def _stats_spec(rows, whole):
    """Rows of the [B, H, L] statistics (log-sum-exp, rowsum(dO O)): block i, or all."""
    return pl.BlockSpec((None, None, rows), (lambda b, h, i: (b, h, 0)) if whole else (lambda b, h, i: (b, h, i)))


def _compiler_params(interpret: bool, launch: tuple[int, int]):
    return None if interpret else plgpu.CompilerParams(num_warps=launch[0], num_stages=launch[1])


def _check_launch(launch) -> tuple[tuple[int, int], tuple[int, int]]:
    try:
        pairs = tuple((int(warps), int(stages)) for warps, stages in launch)
    except (TypeError, ValueError):
        pairs = ()
    if len(pairs) != 2 or any(w < 1 or w & (w - 1) or stages < 1 for w, stages in pairs):
        raise ValueError(f"attention launch {launch}: expected ((num_warps, num_stages) forward, (...) backward), "
                         "num_warps a power of two, num_stages at least 1")
    return pairs


def _layout(inputs):
    """(q, k, v) and the slot of each: three [B, L, H, K] arrays, or, for (stack, bias), the stack three times."""
    return (inputs[:1] * 3, (0, 1, 2)) if len(inputs) == 2 else (inputs, (None, None, None))


def _biased(inputs):
    """(q, k, v) as the kernels take them: the stack plus its bias (XLA adds it in the matmul's epilogue)."""
    if len(inputs) == 3:
        return inputs
    qkv_BxLx3xHxK, bias_3xHxK = inputs
    b, length = qkv_BxLx3xHxK.shape[:2]
    flat_BxLxN = qkv_BxLx3xHxK.reshape(b, length, -1) + bias_3xHxK.reshape(-1).astype(qkv_BxLx3xHxK.dtype)
    return (flat_BxLxN.reshape(qkv_BxLx3xHxK.shape), bias_3xHxK)


def _forward(inputs, lengths_B, streams_BxHx2, rate, blocks, launch, interpret):
    (q, k, v), slots = _layout(inputs)
    b, length = q.shape[:2]
    h, head_dim = q.shape[-2:]
    block_q, block_k = _blocks(length, blocks)
    kernel = functools.partial(_forward_kernel, scale=head_dim ** -0.5, rate=rate, block_k=block_k,
                               native=INLINE_PTX and not interpret)
    return pl.pallas_call(
        kernel, grid=(b, h, length // block_q),
        in_specs=[_lengths_spec(b), _streams_spec(), _words_spec(length),
                  _rows_spec(block_q, head_dim, False, slots[0]), _rows_spec(length, head_dim, True, slots[1]),
                  _rows_spec(length, head_dim, True, slots[2])],
        out_specs=[_rows_spec(block_q, head_dim, False, None), _stats_spec(block_q, False)],
        out_shape=[jax.ShapeDtypeStruct((b, length, h, head_dim), q.dtype),
                   jax.ShapeDtypeStruct((b, h, length), jnp.float32)],
        compiler_params=_compiler_params(interpret, launch[0]), interpret=interpret, name="attention_dropout_forward",
    )(lengths_B, streams_BxHx2, _column_words(streams_BxHx2, length), q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _attention(inputs, lengths_B, streams_BxHx2, rate, blocks, launch, interpret):
    return _forward(_biased(inputs), lengths_B, streams_BxHx2, rate, blocks, launch, interpret)[0]


def _attention_fwd(inputs, lengths_B, streams_BxHx2, rate, blocks, launch, interpret):
    inputs = _biased(inputs)
    out, lse_BxHxL = _forward(inputs, lengths_B, streams_BxHx2, rate, blocks, launch, interpret)
    return out, (inputs, lengths_B, streams_BxHx2, out, lse_BxHxL)


def _attention_bwd(rate, blocks, launch, interpret, residuals, do):
    inputs, lengths_B, streams_BxHx2, out, lse_BxHxL = residuals
    (q, k, v), slots = _layout(inputs)
    b, length = q.shape[:2]
    h, head_dim = q.shape[-2:]
    block_q, block_k = _blocks(length, blocks)
    common = dict(scale=head_dim ** -0.5, rate=rate, native=INLINE_PTX and not interpret)
    stacked = len(inputs) == 2
    operands = (lengths_B, streams_BxHx2, q, k, v, do, lse_BxHxL)
    # dQ and the row term: a query block each program, every key; stacked, into slot 0 of dQKV, with
    # each block's sum of dQ (the query bias's gradient, summed below).
    dq_spec = _rows_spec(block_q, head_dim, False, slots[0])
    partial_specs = [pl.BlockSpec((None, None, None, head_dim), lambda b, h, i: (b, h, i, 0))] if stacked else []
    partial_shapes = [jax.ShapeDtypeStruct((b, h, length // block_q, head_dim), jnp.float32)] if stacked else []
    dq, delta_BxHxL, *dbias_q = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=block_k, **common), grid=(b, h, length // block_q),
        in_specs=[_lengths_spec(b), _streams_spec(), dq_spec, _rows_spec(length, head_dim, True, slots[1]),
                  _rows_spec(length, head_dim, True, slots[2]), _rows_spec(block_q, head_dim, False, None),
                  _stats_spec(block_q, False), _rows_spec(block_q, head_dim, False, None), _words_spec(length)],
        out_specs=[dq_spec, _stats_spec(block_q, False), *partial_specs],
        out_shape=[jax.ShapeDtypeStruct(inputs[0].shape, q.dtype),
                   jax.ShapeDtypeStruct((b, h, length), jnp.float32), *partial_shapes],
        compiler_params=_compiler_params(interpret, launch[1]), interpret=interpret, name="attention_dropout_dq",
    )(*operands, out, _column_words(streams_BxHx2, length))
    # dK and dV: a key block each program, every query; stacked, into slots 1 and 2 of the same array
    # (aliased: a [block, 3, K] block of which the kernel stores two slots), with each block's sums.
    dkv_specs = [_lengths_spec(b), _streams_spec(), _rows_spec(length, head_dim, True, slots[0]),
                 _rows_spec(block_k, head_dim, False, slots[1]), _rows_spec(block_k, head_dim, False, slots[2]),
                 _rows_spec(length, head_dim, True, None), _stats_spec(length, True), _stats_spec(length, True)]
    if stacked:
        dqkv_spec = _rows_spec(block_k, head_dim, False, "all")
        dkv_out = dict(in_specs=dkv_specs + [dqkv_spec], input_output_aliases={len(dkv_specs): 0},
                       out_specs=[dqkv_spec, pl.BlockSpec((None, None, None, 2, head_dim),
                                                          lambda b, h, i: (b, h, i, 0, 0))],
                       out_shape=[jax.ShapeDtypeStruct(inputs[0].shape, inputs[0].dtype),
                                  jax.ShapeDtypeStruct((b, h, length // block_k, 2, head_dim), jnp.float32)])
    else:
        dkv_out = dict(in_specs=dkv_specs, out_specs=[_rows_spec(block_k, head_dim, False, None)] * 2,
                       out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)])
    dkv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=block_q, stacked=stacked, **common), grid=(b, h, length // block_k),
        **dkv_out, compiler_params=_compiler_params(interpret, launch[1]), interpret=interpret,
        name="attention_dropout_dkv",
    )(*operands, delta_BxHxL, *([dq] if stacked else []))
    if not stacked:
        return (dq, *dkv), None, None
    dqkv, dbias_kv = dkv
    dbias_3xHxK = jnp.concatenate([jnp.sum(dbias_q[0], axis=(0, 2))[None],
                                   jnp.sum(dbias_kv, axis=(0, 2)).transpose(1, 0, 2)])
    return (dqkv, dbias_3xHxK.astype(inputs[1].dtype)), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, lengths_B, streams_BxHx2=None, *, rate: float = 0.0,
              blocks: tuple[int, int] = DEFAULT_BLOCKS, launch=DEFAULT_LAUNCH, interpret: bool = False) -> jax.Array:
    """softmax(q k^T / sqrt(K) + padding) with entries dropped at `rate`, times v: [B, L, H, K].

    Keys at or past each sequence's length take no weight. With `rate` > 0, entry (b, h, q, k)
    is kept where `keep_mask(streams_BxHx2, L, rate)` holds it, and kept entries are scaled by
    1 / `keep_probability(rate)` (1 / (1 - rate) to within 7e-6). Differentiable in q, k and v;
    the backward pass regenerates the mask.
    `interpret` runs Pallas' interpreter (any platform, slow) instead of compiling for a GPU;
    `launch` is Triton's (num_warps, num_stages) forward and backward (`DEFAULT_LAUNCH`).
    Any L: the kernel runs on inputs padded to `padded_length(L)`; the padding keys lie past
    every length and the padding queries' outputs are cut off, so values, gradients and the
    mask of each (q, k) are those at L.
    """
    return _padded_call((q_BxLxHxK, k_BxLxHxK, v_BxLxHxK), lengths_B, streams_BxHx2, rate, blocks, launch,
                        interpret)


def attention_stacked(qkv_BxLx3xHxK, lengths_B, streams_BxHx2=None, bias_3xHxK=None, *, rate: float = 0.0,
                      blocks: tuple[int, int] = DEFAULT_BLOCKS, launch=DEFAULT_LAUNCH,
                      interpret: bool = False) -> jax.Array:
    """`attention` of queries, keys and values stacked on axis 2, as one [D, 3 H K] matmul writes them,
    plus `bias_3xHxK` (zero when None).

    The kernels read q, k and v where the matmul wrote them and the backward pass writes their
    gradients into one array for the matmul's backward: no copy splits the stack or joins the
    gradients (each a 144 MiB pass per layer of BERT-base at 32 x 512 in bf16). The bias's
    gradient comes from sums the backward kernels take of their blocks, not from another pass
    over that array; XLA still adds the bias in the matmul's epilogue. Values and the stack's
    gradient are those of `attention` on the three slots plus the bias, bit for bit; the bias's
    gradient is the same sum in another order.
    """
    if qkv_BxLx3xHxK.ndim != 5 or qkv_BxLx3xHxK.shape[2] != 3:
        raise ValueError(f"attention_stacked takes [B, L, 3, H, K]; got shape {qkv_BxLx3xHxK.shape}")
    if bias_3xHxK is None:
        bias_3xHxK = jnp.zeros(qkv_BxLx3xHxK.shape[2:], qkv_BxLx3xHxK.dtype)
    return _padded_call((qkv_BxLx3xHxK, bias_3xHxK), lengths_B, streams_BxHx2, rate, blocks, launch, interpret)


def _padded_call(inputs, lengths_B, streams_BxHx2, rate, blocks, launch, interpret):
    if rate > 0.0 and streams_BxHx2 is None:
        raise ValueError("attention dropout needs the streams of a dropout key (dropout_streams)")
    batch, length = inputs[0].shape[:2]
    heads = inputs[0].shape[-2]
    if streams_BxHx2 is None:
        streams_BxHx2 = jnp.zeros((batch, heads, 2), jnp.uint32)
    pad = padded_length(length, blocks) - length
    if pad:  # the sequences' axis of q, k, v or the stack (not the bias)
        inputs = tuple(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if x.ndim >= 4 else x
                       for x in inputs)
    out_BxLxHxK = _attention(inputs, jnp.minimum(lengths_B.astype(jnp.int32), length),
                             streams_BxHx2.astype(jnp.uint32), float(rate), tuple(blocks), _check_launch(launch),
                             bool(interpret))
    return out_BxLxHxK[:, :length] if pad else out_BxLxHxK
