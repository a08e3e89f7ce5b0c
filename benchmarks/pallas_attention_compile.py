"""`pmi_jax.fused_attention` compiled for a GPU without one: does it lower, and what does it hold?

Compiles one layer's attention, forward and backward (value_and_grad of sum(out * g)), at BERT's
shapes for the GPU a `GpuTargetConfig` text proto describes, through a compile-only device of
`jax.experimental.topologies` (no GPU needed; JAX's CUDA plugin must be importable). Prints and
writes OUTPUT/pallas_attention_compile.json: per form, compile seconds, the Triton calls in the
optimized HLO, the temporaries. Run on a CPU-only machine as

    JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 CUDA_VISIBLE_DEVICES=-1 \\
        PYTHONPATH=$PWD:/path/to/cuda12-plugin python benchmarks/pallas_attention_compile.py \\
        --target-config h100_sxm.txtpb --output DIR

Figures: benchmarks/README.md, "Pallas attention".
"""
from __future__ import annotations

import argparse
import json
import os
import time

SHAPES = {"base": (32, 512, 12, 64), "large": (32, 512, 16, 64)}


def compile_forms(target_config: str) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from pmi_jax import fused_attention

    devices = topologies.get_topology_desc(platform="cuda", target_config=target_config, topology="1x1x1").devices
    mesh = Mesh(np.array(devices), ("d",))
    replicated = NamedSharding(mesh, PartitionSpec())
    records = []
    for size, (b, length, h, k) in SHAPES.items():
        for rate in (0.1, 0.0):
            def spec(shape, dtype):
                return jax.ShapeDtypeStruct(shape, dtype, sharding=replicated)

            def step(q, kk, v, g, lengths_B, streams, rate=rate):
                def loss(q, kk, v):
                    out = fused_attention.attention(q, kk, v, lengths_B, streams, rate=rate)
                    return jnp.sum((out * g).astype(jnp.float32))
                return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, kk, v)

            qkv = spec((b, length, h, k), jnp.bfloat16)
            with jax.set_mesh(mesh):
                start = time.perf_counter()
                compiled = jax.jit(step).lower(qkv, qkv, qkv, qkv, spec((b,), jnp.int32),
                                               spec((b, h, 2), jnp.uint32)).compile()
                seconds = time.perf_counter() - start
            hlo = compiled.as_text()
            memory = compiled.memory_analysis()
            records.append({"size": size, "shape": [b, length, h, k], "rate": rate, "device": devices[0].device_kind,
                            "compile_s": round(seconds, 1), "triton_calls": hlo.count('"__gpu$xla.gpu.triton"'),
                            "temp_mib": round(memory.temp_size_in_bytes / 2**20, 2) if memory else None,
                            "jax": jax.__version__})
            print(json.dumps(records[-1]), flush=True)
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-config", required=True, help="a GpuTargetConfig text proto (XLA's GPU specs)")
    parser.add_argument("--output", required=True, help="directory for pallas_attention_compile.json")
    args = parser.parse_args(argv)
    with open(args.target_config, encoding="utf-8") as f:
        records = compile_forms(f.read())
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "pallas_attention_compile.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"results": records}, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
