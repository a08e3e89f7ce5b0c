"""The compiler's estimate of one layer's attention on one v5p chip, per kernel, without a TPU.

    PYTHONPATH=$PWD:.venv/libtpu python benchmarks/tpu_attention_probe.py [VARIANT ...]

Compiles forward and forward + backward of BERT-base's attention at one v5p-8 chip's share of
batch 256 ([64, 512, 12, 64] bf16, some sequences padded) and prints XLA's estimated time, FLOPs,
bytes accessed and temporaries. Variants: `xla` (jax.nn.dot_product_attention's XLA path),
`written` (the model's written-out attention, no dropout), `flash` (JAX's shipped TPU flash
attention: its backward kernels declare no cost), `flash-declared` (the same with its backward
kernels' matmul FLOPs and operand bytes declared), `ours` and `ours-dropout`
(`pmi_jax.tpu_attention`), `ours-2x` (ours declaring twice its matmul FLOPs: the MXU half idle on
64-deep contractions). Every figure is the compiler's estimate; for a Mosaic kernel, of what the
kernel declares (docs/tpu.md, "The TPU attention kernel"). Results: benchmarks/README.md.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash  # noqa: E402

from pmi_jax import compile_only, fused_attention, tpu_attention  # noqa: E402
from pmi_jax.model import written_attention  # noqa: E402

B, L, H, K = 64, 512, 12, 64
VARIANTS = ("xla", "written", "flash", "flash-declared", "ours", "ours-dropout", "ours-2x")


def _lengths_mask(lengths_B):
    return (jnp.arange(L)[None] < lengths_B[:, None]).astype(jnp.int32)


def _flash(q, k, v, lengths_B):
    heads_first = functools.partial(jnp.transpose, axes=(0, 2, 1, 3))
    segments = jax_flash.SegmentIds(q=jnp.ones((B, L), jnp.int32), kv=_lengths_mask(lengths_B))
    return heads_first(jax_flash.flash_attention(heads_first(q), heads_first(k), heads_first(v), segment_ids=segments,
                                                 sm_scale=K ** -0.5))


def _declare_flash_backward_costs():
    """JAX's flash backward kernels with a cost_estimate: dK/dV 4 matmuls (S, dP, dV, dK), dQ 3 (S, dP,
    dQ), each operand and result once."""
    real = pl.pallas_call

    def pallas_call(kernel, *args, cost_estimate=None, **kwargs):
        if cost_estimate is not None:
            return real(kernel, *args, cost_estimate=cost_estimate, **kwargs)

        def call(*operands):
            results = jax.eval_shape(real(kernel, *args, **kwargs), *operands)
            matmuls = 4 if len(jax.tree.leaves(results)) == 2 else 3
            nbytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves((operands, results)))
            cost = pl.CostEstimate(flops=matmuls * 2 * B * H * L * L * K, transcendentals=B * H * L * L,
                                   bytes_accessed=nbytes)
            return real(kernel, *args, cost_estimate=cost, **kwargs)(*operands)
        return call

    jax_flash.pl = types.SimpleNamespace(**{n: getattr(pl, n) for n in dir(pl) if not n.startswith("_")})
    jax_flash.pl.pallas_call = pallas_call


def _ours(rate, flops_scale=1):
    def attention(q, k, v, lengths_B):
        streams = fused_attention.dropout_streams(jax.random.key(0), B, H)
        return tpu_attention.attention(q, k, v, lengths_B, streams, rate=rate)

    if flops_scale != 1:
        real = pl.CostEstimate
        tpu_attention.pl = types.SimpleNamespace(**{n: getattr(pl, n) for n in dir(pl) if not n.startswith("_")})
        tpu_attention.pl.CostEstimate = lambda flops, **kw: real(flops=flops_scale * flops, **kw)
    return attention


def attention_of(variant: str):
    if variant == "xla":
        return lambda q, k, v, n: jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=n, implementation="xla")
    if variant == "written":
        return lambda q, k, v, n: written_attention(q, k, v, _lengths_mask(n))
    if variant == "flash-declared":
        _declare_flash_backward_costs()
    if variant.startswith("flash"):
        return _flash
    return _ours(0.1 if variant == "ours-dropout" else 0.0, 2 if variant == "ours-2x" else 1)


def probe(variant: str) -> list[str]:
    device = compile_only.topology_devices("v5p-8")[2][0]
    on_chip = jax.sharding.SingleDeviceSharding(device)
    attention = attention_of(variant)
    qkv = jax.ShapeDtypeStruct((B, L, H, K), jnp.bfloat16, sharding=on_chip)
    lengths = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=on_chip)
    grad_out = jax.ShapeDtypeStruct((B, L, H, K), jnp.float32, sharding=on_chip)

    def loss(q, k, v, n, g):
        return jnp.sum(attention(q, k, v, n).astype(jnp.float32) * g)

    lines = []
    for name, fn, args in (("forward", jax.jit(attention), (qkv, qkv, qkv, lengths)),
                           ("forward+backward", jax.jit(jax.grad(loss, (0, 1, 2))), (qkv, qkv, qkv, lengths, grad_out))):
        compiled = fn.lower(*args).compile()
        cost = compiled.cost_analysis()
        cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
        lines.append(f"{variant:<15} {name:<17} est {1e3 * cost.get('optimal_seconds', 0):6.3f} ms  "
                     f"FLOPs {cost.get('flops', 0):.3e}  bytes {cost.get('bytes accessed', 0) / 2**30:6.3f} GiB  "
                     f"temporaries {compiled.memory_analysis().temp_size_in_bytes / 2**30:6.3f} GiB")
    return lines


if __name__ == "__main__":
    variants = sys.argv[1:] or VARIANTS
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant {unknown[0]!r}: expected one of {', '.join(VARIANTS)}")
    if len(variants) == 1:
        print("\n".join(probe(variants[0])), flush=True)
    else:  # one process per variant: the declared-cost variants patch the kernels' modules
        import subprocess
        for v in variants:
            subprocess.run([sys.executable, os.path.abspath(__file__), v], check=True)
