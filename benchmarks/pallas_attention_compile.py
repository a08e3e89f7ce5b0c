"""`pmi_jax.fused_attention` compiled for a GPU without one: does it lower, and what does it hold?

Compiles one layer's attention, forward and backward (value_and_grad of sum(out * g)), at BERT's
shapes for one GPU of `--gpu` (h100, h200: `pmi_jax.compile_only.gpu_devices`, the packaged
descriptions; no GPU needed, JAX's CUDA plugin must be importable). Prints and
writes OUTPUT/pallas_attention_compile.json: per form, compile seconds, the Triton calls in the
optimized HLO, the temporaries. `--step-attention pallas auto` adds the trainer's BERT-base step
(the paper's setting, batch 32 x 512, bf16) with each `model.attention`. `--ptx` compiles
BERT-base's attention with dropout 0.1 and one fused residual LayerNorm
(`pmi_jax.fused_layer_norm`, [32, 512, 768], dropout 0.1), has XLA write their PTX (under
OUTPUT/ptx) and counts the instructions of each kernel loop's trip, per thread (an attention
loop's block of 64 x 64, 32 entries a thread; a LayerNorm row): these loops issue more
instructions than their matmuls or bytes take, so this count judges their changes before a GPU
times them. `--sass` also assembles that PTX for sm_90a with NVIDIA's ptxas and counts the machine
instructions (nvdisasm) the SM issues, with each kernel's registers: ptxas adds and removes
instructions (exp2 without flushing takes four). `--feed-forward` instead compiles
`pmi_jax.fused_feed_forward`'s two kernels on one BERT-base layer per block size and 4 or 8 warps
and reports each kernel's registers and spilled bytes (pallas_feed_forward_compile.json): what
`gpu_step.py`'s `feed-forward-tuning` times. Run on a CPU-only machine as

    JAX_PLATFORMS=cpu PYTHONPATH=$PWD:.venv/cuda12 python benchmarks/pallas_attention_compile.py \\
        --gpu h100 --output DIR [--ptx | --sass | --feed-forward]

ptxas and nvdisasm come from a folder on PYTHONPATH holding NVIDIA's CUDA 13 wheels, else from
PATH (XLA writes PTX for the newest ptxas it finds, which an older one refuses): python3 -m pip
install --no-deps --target .venv/cuda-tools -c constraints.txt nvidia-cuda-nvcc nvidia-cuda-nvdisasm,
then PYTHONPATH=$PWD:.venv/cuda12:.venv/cuda-tools.

Figures: benchmarks/README.md, "Pallas attention", "The attention kernels' loops" and "The
attention loops' machine code".
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

SHAPES = {"base": (32, 512, 12, 64), "large": (32, 512, 16, 64)}


def _compile_replicated(gpu: str, fn, *shapes) -> tuple:
    """(compiled, seconds, device kind): `fn` jitted for one GPU of `gpu` on arguments of `shapes`
    ((shape, dtype) pairs), replicated over that one device's mesh."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from pmi_jax import compile_only

    devices = compile_only.gpu_devices(gpu)
    mesh = Mesh(np.array(devices), ("d",))
    replicated = NamedSharding(mesh, PartitionSpec())
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=replicated) for shape, dtype in shapes]
    with jax.set_mesh(mesh):
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        return compiled, time.perf_counter() - start, devices[0].device_kind


def compile_forms(gpu: str, only_first: bool = False) -> list[dict]:
    """Each size and rate, or with `only_first` BERT-base with dropout 0.1 alone (one set of kernels to dump)."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_attention

    records = []
    for size, (b, length, h, k) in SHAPES.items():
        for rate in (0.1, 0.0):
            def step(q, kk, v, g, lengths_B, streams, rate=rate):
                def loss(q, kk, v):
                    out = fused_attention.attention(q, kk, v, lengths_B, streams, rate=rate)
                    return jnp.sum((out * g).astype(jnp.float32))
                return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, kk, v)

            qkv = ((b, length, h, k), jnp.bfloat16)
            compiled, seconds, device = _compile_replicated(gpu, step, qkv, qkv, qkv, qkv, ((b,), jnp.int32),
                                                            ((b, h, 2), jnp.uint32))
            hlo = compiled.as_text()
            memory = compiled.memory_analysis()
            records.append({"size": size, "shape": [b, length, h, k], "rate": rate, "device": device,
                            "compile_s": round(seconds, 1), "triton_calls": hlo.count('"__gpu$xla.gpu.triton"'),
                            "temp_mib": round(memory.temp_size_in_bytes / 2**20, 2) if memory else None,
                            "jax": jax.__version__})
            print(json.dumps(records[-1]), flush=True)
            if only_first:
                return records
    return records


def compile_layer_norm(gpu: str) -> dict:
    """One `fused_layer_norm.residual_layer_norm` at BERT-base's [32, 512, 768] bf16, dropout 0.1,
    forward and backward, for one GPU of `gpu` (for its PTX)."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_layer_norm

    b, length, d = 32, 512, 768

    def step(a, bias, x, scale, offset, streams, g):
        def loss(*args):
            y = fused_layer_norm.residual_layer_norm(*args, streams, rate=0.1)
            return jnp.sum((y * g).astype(jnp.float32))
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(a, bias, x, scale, offset)

    rows, vector = ((b, length, d), jnp.bfloat16), ((d,), jnp.float32)
    compiled, seconds, device = _compile_replicated(gpu, step, rows, vector, rows, vector, vector,
                                                    ((b, 2), jnp.uint32), rows)
    record = {"layer_norm": [b, length, d], "rate": 0.1, "device": device, "compile_s": round(seconds, 1),
              "triton_calls": compiled.as_text().count('"__gpu$xla.gpu.triton"'), "jax": jax.__version__}
    print(json.dumps(record), flush=True)
    return record


# Blocks (M, N, K) and warps for `--feed-forward`: around the default (128 x 128 x 64, 8 warps), 3 stages.
FEED_FORWARD_BLOCKS = ((128, 128, 64), (128, 256, 64), (256, 128, 64), (128, 128, 32), (64, 128, 64),
                       (128, 64, 64), (64, 64, 64))


def compile_feed_forward(gpu: str, blocks: tuple, launch: tuple) -> dict:
    """`fused_feed_forward.gelu_feed_forward` on one BERT-base layer ([16384, 768] x [768, 3072] x
    [3072, 768] bf16), forward and backward, with these blocks and (warps, stages), for one GPU of `gpu`."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_feed_forward

    t, d, f = 16384, 768, 3072

    def step(x, w1, b1, w2, g):
        def loss(*args):
            y = fused_feed_forward.gelu_feed_forward(*args, blocks=blocks, launch=launch)
            return jnp.sum((y * g).astype(jnp.float32))
        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, w1, b1, w2)

    rows = ((t, d), jnp.bfloat16)
    compiled, seconds, device = _compile_replicated(gpu, step, rows, ((d, f), jnp.float32), ((f,), jnp.float32),
                                                    ((f, d), jnp.float32), rows)
    return {"feed_forward": [t, d, f], "blocks": list(blocks), "launch": list(launch), "device": device,
            "compile_s": round(seconds, 1), "triton_calls": compiled.as_text().count('"__gpu$xla.gpu.triton"'),
            "jax": jax.__version__}


def feed_forward_configurations(gpu: str, output: str) -> list[dict]:
    """Each of `FEED_FORWARD_BLOCKS` by 4 and 8 warps compiled in a process of its own (XLA reads its
    dump flags once), its two kernels assembled by ptxas: registers and spilled bytes per kernel."""
    records = []
    for blocks in FEED_FORWARD_BLOCKS:
        for warps in (4, 8):
            config = json.dumps([blocks, [warps, 3]])
            directory = os.path.join(output, "feed_forward", "x".join(map(str, blocks)) + f"-w{warps}")
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--gpu", gpu, "--output", directory,
                                   "--feed-forward-one", config], capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            record = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "blocks": list(blocks), "launch": [warps, 3], "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            records.append(record)
            kernels = {k: (v["registers"], v["spill_store_bytes"]) for k, v in record.get("kernels", {}).items()}
            print("feed-forward", record["blocks"], record["launch"], record.get("error") or kernels, flush=True)
    return records


def compile_step(gpu: str, attention: str) -> dict:
    """The trainer's BERT-base step for one GPU (`pmi_jax.compile_only.compile_train_step`, the
    program `train --compile-only --topology GPU` reports), with each `model.attention`."""
    import jax

    from pmi_jax import compile_only
    from pmi_jax.config import apply_overrides, load_config

    config = apply_overrides(load_config("base"), [
        "model.vocab_size=30522", "data.seq_len=512", "train.batch_size=32", "model.dtype=bfloat16", "mesh.data=-1",
        "mesh.fsdp=1", "mesh.model=1", f"model.attention={attention}"])
    start = time.perf_counter()
    report, compiled = compile_only.compile_train_step(config, gpu)
    seconds = time.perf_counter() - start
    hlo = compiled.as_text()
    record = {"size": "base", "step": True, "attention": attention, "device": report.topology,
              "compile_s": round(seconds, 1), "triton_calls": hlo.count('"__gpu$xla.gpu.triton"'),
              "cudnn_fmha_calls": hlo.count('custom_call_target="__cudnn$fmha'),
              "temp_gib": round(report.temp_bytes / 2**30, 2), "jax": jax.__version__}
    print(json.dumps(record), flush=True)
    return record


def loop_mix(ptx: str) -> list[dict]:
    """Each loop of a PTX kernel (a label and the backward branch to it): its instructions, the
    matmul instructions among them, the special-function ones (exp2, division) and the commonest."""
    lines = ptx.split(".entry", 1)[1].splitlines()
    labels, loops = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"\s*(\$L__\w+):", line)
        if label:
            labels[label.group(1)] = i
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if branch and branch.group(1) in labels:
            loops.append((labels[branch.group(1)], i))
    out = []
    for start, end in loops:
        ops = collections.Counter()
        for line in lines[start:end + 1]:
            line = line.strip()
            # An inline-asm block, "{ .reg .f32 t; fma.rn.f32 t, ...; ex2.approx.ftz.f32 %r1, t; }", counts
            # each of its instructions.
            statements = line.strip("{} ").split(";") if line.startswith("{") and ";" in line else [line]
            for statement in statements:
                text = re.sub(r"^@!?%p\d+\s+", "", statement.strip())
                if text and not text.startswith(("//", "$", ".", "{", "}")):
                    ops[text.split()[0].rstrip(";")] += 1
        out.append(_mix(ops, mma=("wgmma.mma_async", "mma."), special=("ex2", "div", "rcp")))
    return out


def _mix(ops: collections.Counter, mma: tuple, special: tuple) -> dict:
    """A loop's instruction count by opcode -> its total, matmul and special-function ones (by
    opcode prefix) and the commonest: what `loop_mix` and `sass_mix` report per loop."""
    return {"instructions": sum(ops.values()), "mma": sum(n for op, n in ops.items() if op.startswith(mma)),
            "special": sum(n for op, n in ops.items() if op.startswith(special)), "top": dict(ops.most_common(12))}


def _our_kernels(directory: str) -> dict:
    """{kernel name: its PTX file} for the attention and LayerNorm kernels XLA wrote to `directory`."""
    kernels = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.ptx"))):
        with open(path, encoding="utf-8") as f:
            entry = re.search(r"\.entry (\w+)", f.read())
        if entry and entry.group(1).startswith(("attention", "residual_layer_norm", "gelu_feed_forward")):
            kernels[entry.group(1)] = path
    return kernels


def ptx_loops(directory: str) -> dict:
    """{kernel name: its loops' `loop_mix`} over the PTX files XLA wrote to `directory`."""
    out = {}
    for name, path in _our_kernels(directory).items():
        with open(path, encoding="utf-8") as f:
            out[name] = loop_mix(f.read())
    return out


def sass_mix(sass: str) -> list[dict]:
    """Each loop of an nvdisasm listing (a label and a backward branch to it; not the one-instruction
    loop that ends a kernel): its machine instructions, the warp-group matmuls (HGMMA) and the
    special-function ones (MUFU: exp2, reciprocal) among them, and the commonest."""
    labels, ops, branches = {}, [], []
    for line in sass.splitlines():
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ops)
        code = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if code:
            text = re.sub(r"^@!?U?P\w+\s+", "", code.group(1))
            target = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
            branches.append((len(ops), target.group(1) if target else None))
            ops.append(text.split()[0])
    out = []
    for end, target in branches:
        start = labels.get(target, end + 1)
        if start < end:
            out.append(_mix(collections.Counter(ops[start:end + 1]), mma=("HGMMA",), special=("MUFU",)))
    return out


def _cuda_tool(name: str) -> str:
    """NVIDIA's `name` (ptxas, nvdisasm) from CUDA 13's wheels in a folder on sys.path, else on PATH: the
    wheels' first, because XLA writes PTX for the newest ptxas it finds, the wheels' included."""
    wheels = (os.path.join(entry, "nvidia", "cu13", "bin", name) for entry in sys.path)
    found = next((path for path in wheels if os.path.isfile(path)), None) or shutil.which(name)
    if found is None:
        raise SystemExit(f"--sass needs NVIDIA's {name}: python3 -m pip install --no-deps --target .venv/cuda-tools "
                         "-c constraints.txt nvidia-cuda-nvcc nvidia-cuda-nvdisasm, and .venv/cuda-tools on PYTHONPATH")
    return found


def sass_loops(directory: str, ptxas: str, nvdisasm: str) -> dict:
    """{kernel name: {registers, spill bytes, its loops' `sass_mix`}}: each of our kernels' PTX in
    `directory` assembled for sm_90a (the H100's and H200's Hopper) by ptxas -O3, then disassembled."""
    out = {}
    for name, path in _our_kernels(directory).items():
        cubin = path[:-len(".ptx")] + ".cubin"
        assembled = subprocess.run([ptxas, "-arch=sm_90a", "-O3", "-v", path, "-o", cubin], capture_output=True,
                                   text=True)
        if assembled.returncode:
            raise SystemExit(f"{ptxas} refused {path}: {assembled.stderr.strip().splitlines()[-1][:300]}")
        info = assembled.stderr
        listing = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
        registers = re.search(r"Used (\d+) registers", info)
        spills = re.search(r"(\d+) bytes spill stores", info)
        out[name] = {"registers": int(registers.group(1)) if registers else None,
                     "spill_store_bytes": int(spills.group(1)) if spills else None, "loops": sass_mix(listing)}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100", choices=("h100", "h200"), help="the GPU to compile for")
    parser.add_argument("--output", required=True, help="directory for pallas_attention_compile.json")
    parser.add_argument("--step-attention", nargs="*", default=[], help="model.attention values for the whole step")
    parser.add_argument("--sass", action="store_true", help="--ptx, and ptxas's machine instructions per loop trip "
                        "with each kernel's registers (needs ptxas and nvdisasm: module docstring)")
    parser.add_argument("--ptx", action="store_true", help="count each kernel loop's PTX instructions (BERT-base's "
                        "attention and one fused LayerNorm, dropout 0.1)")
    parser.add_argument("--feed-forward", action="store_true", help="instead: the feed-forward kernels' registers "
                        "and spills per block size and warps (needs ptxas: module docstring)")
    parser.add_argument("--feed-forward-one", default=None, help=argparse.SUPPRESS)  # a child: [blocks, launch]
    args = parser.parse_args(argv)
    if args.feed_forward_one:
        blocks, launch = json.loads(args.feed_forward_one)
        _dump_kernels_to(args.output)
        record = compile_feed_forward(args.gpu, tuple(blocks), tuple(launch))
        print(json.dumps(record | {"kernels": sass_loops(args.output, _cuda_tool("ptxas"), _cuda_tool("nvdisasm"))}))
        return
    if args.feed_forward:
        _cuda_tool("ptxas"), _cuda_tool("nvdisasm")  # before minutes of compiling
        os.makedirs(args.output, exist_ok=True)
        _write_json(os.path.join(args.output, "pallas_feed_forward_compile.json"),
                    {"results": feed_forward_configurations(args.gpu, args.output)})
        return
    args.ptx = args.ptx or args.sass
    tools = (_cuda_tool("ptxas"), _cuda_tool("nvdisasm")) if args.sass else None  # before minutes of compiling
    os.makedirs(args.output, exist_ok=True)
    ptx_dir = os.path.join(args.output, "ptx")
    if args.ptx:  # before JAX starts its backend: XLA reads its flags once
        _dump_kernels_to(ptx_dir)
    records = compile_forms(args.gpu, only_first=args.ptx) + ([compile_layer_norm(args.gpu)] if args.ptx else [])
    records += [compile_step(args.gpu, a) for a in args.step_attention]
    result = {"results": records}
    if args.ptx:
        result["ptx_loops"] = ptx_loops(ptx_dir)
        for name, loops in result["ptx_loops"].items():
            print(name, json.dumps([{k: v for k, v in loop.items() if k != "top"} for loop in loops]))
    if args.sass:
        result["sass_loops"] = sass_loops(ptx_dir, *tools)
        for name, kernel in result["sass_loops"].items():
            loops = [{k: v for k, v in loop.items() if k != "top"} for loop in kernel["loops"]]
            print(name, "SASS", json.dumps({k: v for k, v in kernel.items() if k != "loops"} | {"loops": loops}))
    _write_json(os.path.join(args.output, "pallas_attention_compile.json"), result)


def _dump_kernels_to(directory: str) -> None:
    """Has XLA write each kernel's PTX to `directory`: before JAX starts its backend, which reads its flags once."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={directory}"
                               " --xla_gpu_dump_llvmir=true --xla_dump_emitter_re=.*").strip()


def _write_json(path: str, payload: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
