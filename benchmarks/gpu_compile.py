"""The GPU program of the train step without a GPU: its bytes, FLOPs and largest kernels, by model operation.

    python benchmarks/gpu_compile.py --output gpu_compile/                       # BERT-base, seq 512, batch 32, H100
    python benchmarks/gpu_compile.py --output gpu_compile/ --gpu h200 --variants base-512-attn0
    python benchmarks/gpu_compile.py --output gpu_compile/ --map-profile ../shared/results/h100-gpu-step/gpu_step.json

Each variant is `pmi_jax.compile_only.compile_train_step` for one GPU (the step
`benchmarks/gpu_step.py` times: vocabulary 30,522, bf16, batch 32 of 512), compiled here with
JAX's CUDA plugin. Per variant it writes OUTPUT/VARIANT.json (the report, and every kernel with
its bytes, matmul FLOPs, category and model operation, from `pmi_jax.hlo`) and the optimized HLO,
gzipped. --map-profile looks up each top kernel of a gpu_step.json profile in these compiles by
name (a kernel XLA reuses for identical fusions, one per layer say, counts all its launches):
exact for a profile of the same JAX version, by name only for another (gpu_step.py now records
the device's own HLO and the mapping itself). Needs the CUDA plugin.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pmi_jax import compile_only, hlo  # noqa: E402
from pmi_jax.config import apply_overrides, load_config  # noqa: E402

COMMON = ("model.vocab_size=30522", "data.seq_len=512", "train.batch_size=32", "model.dtype=bfloat16",
          "mesh.data=-1", "mesh.fsdp=1", "mesh.model=1")
VARIANTS = {  # gpu_step.py's names
    "base-512-attn0": ("base", ("model.attention_dropout_rate=0",)),
    "base-512-paper": ("base", ()),
    "base-512-attn0-pallas": ("base", ("model.attention_dropout_rate=0", "model.attention=pallas")),
    "base-512-paper-gelu-tanh": ("base", ("model.gelu=tanh",)),
    "base-512-paper-bits16": ("base", ("model.dropout_mask=bits16",)),
    "base-512-paper-decoder32": ("base", ("model.decoder_grad=float32",)),
    "base-512-attn0-xla-ln": ("base", ("model.attention_dropout_rate=0", "model.residual_norm=xla")),
    "base-512-paper-xla-ln": ("base", ("model.residual_norm=xla",)),
    "base-512-paper-written": ("base", ("model.attention=xla",)),
    "base-512-attn0-separate-qkv": ("base", ("model.attention_dropout_rate=0", "model.fused_qkv=never")),
    "base-512-paper-separate-qkv": ("base", ("model.fused_qkv=never",)),
    "base-512-attn0-stacked": ("base", ("model.attention_dropout_rate=0", "model.scan_layers=true",
                                        "model.scan_unroll=12")),
    "base-512-paper-stacked": ("base", ("model.scan_layers=true", "model.scan_unroll=12")),
    "base-512-attn0-ffn": ("base", ("model.attention_dropout_rate=0", "model.feed_forward=pallas")),
    "base-512-paper-ffn": ("base", ("model.feed_forward=pallas",)),
    "large-512-paper": ("large", ()),
    "large-512-paper-rolled": ("large", ("model.scan_unroll=1",)),  # the loop, GPUs' default before 2026-11-29
    "large-512-paper-unrolled": ("large", ("model.scan_layers=false", "model.remat=none")),
    "large-512-attn0-unrolled": ("large", ("model.attention_dropout_rate=0", "model.scan_layers=false",
                                           "model.remat=none")),
    "large-512-attn0-stacked": ("large", ("model.attention_dropout_rate=0", "model.scan_unroll=24",
                                         "model.remat=none")),
    "large-512-paper-stacked": ("large", ("model.scan_unroll=24", "model.remat=none")),
    "base-128-attn0-b128": ("base", ("model.attention_dropout_rate=0", "data.seq_len=128", "train.batch_size=128")),
    "base-128-paper-b128": ("base", ("data.seq_len=128", "train.batch_size=128")),
}


def compile_variant(name: str, gpu: str, output: str) -> dict:
    size, overrides = VARIANTS[name]
    config = apply_overrides(load_config(size), list(COMMON) + list(overrides))
    report, compiled = compile_only.compile_train_step(config, gpu)
    text = compiled.as_text()
    kernels = sorted(hlo.program_kernels(text), key=lambda k: -k.bytes)
    record = {"variant": name, "gpu": gpu, "report": report.lines(),
              "hlo_bytes": report.hlo_bytes, "hlo_flops": report.compiler_flops, "formula_flops": report.formula_flops,
              "temp_bytes": report.temp_bytes, "roofline_s": report.roofline_seconds, "bandwidth": report.bandwidth,
              "kernels": [dataclasses.asdict(k) for k in kernels]}
    _write(os.path.join(output, f"{name}-{gpu}.json"), json.dumps(record, indent=1).encode())
    _write(os.path.join(output, f"{name}-{gpu}.hlo.txt.gz"), gzip.compress(text.encode(), mtime=0))
    return record


def map_profile(profile_path: str, output: str, gpu: str) -> list[str]:
    """Each profiled top kernel of gpu_step.json against the compile of the same variant here."""
    lines = []
    for result in json.load(open(profile_path))["results"]:
        if "profile" not in result:
            continue
        name = re.sub(r"-cudnn", "", result["variant"])
        path = os.path.join(output, f"{name}-{gpu}.json")
        if not os.path.exists(path):
            lines.append(f"{result['variant']}: no compile here ({path})")
            continue
        groups = hlo.by_kernel([hlo.Kernel(**k) for k in json.load(open(path))["kernels"]])
        bandwidth = json.load(open(path))["bandwidth"]
        lines.append(f"{result['variant']} (profile: JAX {result.get('jax', '?')}; compile here: the same names "
                     "only if both JAX versions number fusions alike)")
        for op in result["profile"]["top_ops"]:
            kernel = op["op"].rsplit(" (", 1)[0]
            g = groups.get(kernel)
            found = (f"{g.launches:3d} x {g.bytes / g.launches / 2**20:7.1f} MiB, {1e3 * g.bytes / bandwidth:6.3f} ms "
                     f"at the bound  {g.op}" if g else "not in this compile")
            lines.append(f"  {kernel[:40]:<40} {op['ms']:7.3f} ms  {found}")
    return lines


def _write(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="directory for VARIANT-GPU.json and .hlo.txt.gz")
    parser.add_argument("--gpu", default="h100", choices=sorted(compile_only.GPU_SPECS))
    parser.add_argument("--variants", nargs="*", default=["base-512-attn0", "base-512-paper"],
                        choices=sorted(VARIANTS))
    parser.add_argument("--top", type=int, default=25, help="kernels listed per variant")
    parser.add_argument("--map-profile", default=None, metavar="GPU_STEP_JSON",
                        help="map this profile's top kernels onto the compiles in --output (compiles nothing)")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    if args.map_profile:
        print("\n".join(map_profile(args.map_profile, args.output, args.gpu)))
        return
    for name in args.variants:
        record = compile_variant(name, args.gpu, args.output)
        print(f"== {name} on {args.gpu}\n" + "\n".join(record["report"][:6]))  # the report without its table
        by_category = {}
        for k in record["kernels"]:
            by_category[k["category"]] = by_category.get(k["category"], 0) + k["bytes"]
        print("GiB by kind: " + ", ".join(f"{c} {b / 2**30:.2f}" for c, b in sorted(by_category.items(),
                                                                                  key=lambda kv: -kv[1])))
        groups = hlo.by_kernel([hlo.Kernel(**k) for k in record["kernels"]])
        print(f"  {'kernel':<36} {'launches':>8} {'MiB each':>9} {'ms':>6}  {'kind':<11} model operation")
        for g in list(groups.values())[:args.top]:
            print(f"  {g.kernel:<36} {g.launches:>8} {g.bytes / g.launches / 2**20:9.1f} "
                  f"{1e3 * g.bytes / record['bandwidth']:6.3f}  {g.category:<11} {g.op}", flush=True)


if __name__ == "__main__":
    main()
