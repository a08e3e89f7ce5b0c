"""BERT's training step on one accelerator, variant by variant, in one command of under ten minutes.

    python benchmarks/gpu_step.py --output gpu_step/                  # the GPU plan, as far as 540 s reach
    python benchmarks/gpu_step.py --output /tmp/dry --platform cpu    # a tiny dry run of the same code on CPU

Each variant is the trainer's own jitted step (`pmi_jax.train.build_program`: MLM loss on the
gathered masked positions, backward, clipping, AdamW) on a synthetic batch
(`pmi_jax.batches.SyntheticBatches`: a random padded tail per sequence, 15% of the words masked),
run in a process of its own, so that XLA flags can differ between variants and an out-of-memory
variant cannot spoil the next. Per variant it records: compile time, the median step time of at
least 3 and at most `--steps` timed steps (after one warm-up step; the timed loop stops after
`--timed-s` seconds, each waited for), the same number of steps dispatched back to back as the
trainer runs them (three windows, ms per step each), tokens/s (padding included), MFU against
the device's dense bf16 peak (`pmi_jax.flops`: H100 989 TFLOP/s), peak device memory, where the
wall time went, the attention, embedding gradient, residual LayerNorm and gradient norm the
program was settled to, and for the variants marked `profile` a kernel-time profile per
category (matmul, attention, scatter, elementwise, optimizer, other) from a `jax.profiler`
trace of 3 steps dispatched back to back, with the device's idle time between kernels, each
kernel attributed through the compiled HLO (`pmi_jax.hlo`: category, model operation, bytes),
and that HLO itself, gzipped, in OUTPUT/hlo/VARIANT.hlo.txt.gz (the kernel names of a profile
are its instructions'; read it with `pmi_jax.hlo.program_kernels`). First of all it checks
cuDNN's attention against XLA's on BERT-base's shapes (outputs and gradients), and our kernel
on the stacked Q/K/V against the same on three inputs, bytes and times (`attention_check`);
micro-benchmarks time one layer's attention, forward and backward, in each
implementation at hand (`attention_kernels`), one residual LayerNorm, XLA's against ours
(`layer_norm_kernels`), the feed-forward GELU in three formulas (`gelu_kernels`), what one
more small kernel costs a program run as the trainer runs steps (`launch_cost`), our attention
kernel's blocks and Triton launch parameters (`attention_tuning`), and the feed-forward kernels'
beside XLA's path (`feed_forward_tuning`). Variants
run in priority order while `--budget-s` lasts (default 540 s: the command fits 9 minutes of a
10-minute machine call); a variant is started only with its `min_s` left, those left out are
recorded as skipped. Results go to OUTPUT/gpu_step.json, rewritten after every variant.

Needs JAX, Flax, optax and Orbax only: it runs where TensorFlow, seqio and tensorflow_text are
not installed (the test runs it with them unimportable). Where TensorFlow is installed,
`pmi_jax.storage` imports it for its file system; each record lists such modules under
`forbidden_modules`.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pmi_jax import hlo  # noqa: E402  (the HLO reader: plain Python, no JAX)

VOCAB_SIZE = 30_522
CATEGORIES = hlo.CATEGORIES
HLO_LIMIT = 16 * 2**20  # a profiled variant's compressed HLO is kept up to this size


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    size: str = "base"
    seq_len: int = 512
    batch_per_device: int = 32
    overrides: tuple = ()
    xla_flags: tuple = ()
    profile: bool = False
    # The least time a variant is started with (compile, warm-up, 3 steps, the profile): with less
    # left it is skipped, not started and killed mid-compile. On the lent H100 a BERT-base variant
    # at 512 x 32 took 90-95 s (30 s of it compiling), BERT-large's scanned layers 23-28 s
    # (benchmarks/README.md; `phases_s` in each record says where the time went).
    min_s: float = 100.0


PAPER = ()  # BERT's dropout 0.1 everywhere, attention included (configs/base.py)
NO_ATTN_DROPOUT = ("model.attention_dropout_rate=0",)

UNROLLED = ("model.scan_layers=false", "model.remat=none")  # large's config scans and rematerialises
STACKED = ("model.scan_layers=true", "model.scan_unroll=24", "model.remat=none")  # no loop, stacked parameters

CHECK = Variant("attention-check", min_s=30)  # cuDNN's attention against XLA's; ours stacked against 3 inputs
KERNELS = Variant("attention-kernels", min_s=70)  # one layer's attention, forward and backward, per implementation
NORMS = Variant("layer-norm-kernels", min_s=25)  # one residual LayerNorm, forward and backward: XLA's and ours
GELUS = Variant("gelu-kernels", min_s=40)  # the feed-forward GELU alone (erf, erfc, tanh) and after its matmul
LAUNCHES = Variant("launch-cost", min_s=20)  # what one more small kernel adds to a program, as steps run
TUNING = Variant("attention-tuning", min_s=90)  # our attention kernel's blocks and Triton launch parameters
FFN_TUNING = Variant("feed-forward-tuning", min_s=90)  # the feed-forward kernels' blocks and launch, beside XLA's
NO_GRAPHS = ("--xla_gpu_enable_command_buffer=",)  # XLA's command buffers (CUDA graphs) off

# Priority order: what is cut when the budget runs out comes last. Sequence 128 (BERT's first
# phase, 90% of its steps) at batch 128 has the tokens of 512 x 32.
GPU_PLAN = (
    CHECK,
    LAUNCHES,
    dataclasses.replace(LAUNCHES, name="launch-cost-no-graphs", xla_flags=NO_GRAPHS),
    GELUS,
    TUNING,
    FFN_TUNING,
    Variant("base-512-attn0-cudnn", overrides=NO_ATTN_DROPOUT, profile=True),
    # Our kernel without dropout, reading the fused Q/K/V output in place, where cuDNN takes slices.
    Variant("base-512-attn0-pallas", overrides=NO_ATTN_DROPOUT + ("model.attention=pallas",)),
    # The three projections apart, the GPU default before fused_qkv=auto (2026-11-28).
    Variant("base-512-attn0-separate-qkv", overrides=NO_ATTN_DROPOUT + ("model.fused_qkv=never",)),
    Variant("base-512-paper", overrides=PAPER, profile=True),  # the Pallas attention (auto, since 2026-11-28)
    Variant("base-512-paper-separate-qkv", overrides=("model.fused_qkv=never",)),
    # The hidden dropouts' 16-bit threefry masks, the GPU default before the hash (2026-11-28).
    Variant("base-512-paper-bits16", overrides=("model.dropout_mask=bits16",)),
    # Without CUDA graphs (XLA's command buffers, on by default; XLA turns them off while profiling).
    Variant("base-512-attn0-no-graphs", overrides=NO_ATTN_DROPOUT, xla_flags=NO_GRAPHS),
    # The layers scanned and unrolled: stacked parameters, one optimizer kernel per kind (2026-11-29).
    Variant("base-512-attn0-stacked", overrides=NO_ATTN_DROPOUT + STACKED, profile=True),
    Variant("base-512-paper-stacked", overrides=STACKED, profile=True),
    # The feed-forward's GELU in its matmuls' epilogues (`model.feed_forward=pallas`, 2026-11-29).
    Variant("base-512-attn0-ffn", overrides=NO_ATTN_DROPOUT + ("model.feed_forward=pallas",), profile=True),
    Variant("base-512-paper-ffn", overrides=("model.feed_forward=pallas",), profile=True),
    # XLA's LayerNorm, the GPU default before residual_norm=auto took the fused kernel (2026-11-28).
    Variant("base-512-attn0-xla-ln", overrides=NO_ATTN_DROPOUT + ("model.residual_norm=xla",), profile=True),
    Variant("base-512-paper-xla-ln", overrides=("model.residual_norm=xla",), profile=True),
    Variant("base-512-paper-written", overrides=("model.attention=xla",)),  # the default before 2026-11-28
    Variant("large-512-attn0-unrolled", size="large", overrides=NO_ATTN_DROPOUT + UNROLLED, profile=True, min_s=150),
    Variant("large-512-paper-unrolled", size="large", overrides=UNROLLED, profile=True, min_s=150),
    Variant("large-512-attn0-stacked", size="large", overrides=NO_ATTN_DROPOUT + STACKED, profile=True, min_s=150),
    Variant("large-512-paper-stacked", size="large", overrides=STACKED, profile=True, min_s=150),
    Variant("large-512-paper", size="large", profile=True, min_s=40),  # configs/large.py: scanned, remat
    # Its scan as a loop, the GPU default before scan_unroll=0 unrolled it (2026-11-29).
    Variant("large-512-paper-rolled", size="large", overrides=("model.scan_unroll=1",), min_s=40),
    Variant("large-512-attn0", size="large", overrides=NO_ATTN_DROPOUT, min_s=40),
    KERNELS,
    NORMS,
    Variant("base-128-paper-b128", seq_len=128, batch_per_device=128, profile=True, min_s=90),
    Variant("base-128-attn0-b128", seq_len=128, batch_per_device=128, overrides=NO_ATTN_DROPOUT, profile=True,
            min_s=90),
    Variant("base-512-paper-b128", batch_per_device=128, min_s=150),
    Variant("base-512-attn0-b128", batch_per_device=128, overrides=NO_ATTN_DROPOUT, min_s=150),
    Variant("base-128-paper-b256", seq_len=128, batch_per_device=256, min_s=120),
    Variant("base-512-paper-scatter", overrides=("model.embedding_grad=scatter",)),
    Variant("base-512-paper-rbg", overrides=("train.prng_impl=rbg",)),
    Variant("base-512-attn0-xla", overrides=NO_ATTN_DROPOUT + ("model.attention=xla",)),
    Variant("base-512-paper-b64", batch_per_device=64),
    # The hidden dropouts' masks as before the 16-bit ones (one threefry block per element).
    Variant("base-512-attn0-bernoulli", overrides=NO_ATTN_DROPOUT + ("model.dropout_mask=bernoulli",)),
    Variant("base-512-paper-cudnn-ln", xla_flags=("--xla_gpu_enable_cudnn_layer_norm=true",)),
    Variant("base-512-paper-gemm-fusion-2", xla_flags=("--xla_gpu_cudnn_gemm_fusion_level=2",)),
    Variant("base-512-paper-gelu-tanh", overrides=("model.gelu=tanh",)),
    # The tied decoder's backward on autodiff's float32 logit gradient, the GPU default before 2026-11-28.
    Variant("base-512-paper-decoder32", overrides=("model.decoder_grad=float32",)),
    Variant("base-512-attn0-b64", batch_per_device=64, overrides=NO_ATTN_DROPOUT),
    Variant("base-512-paper-gemm-fusion-3", xla_flags=("--xla_gpu_cudnn_gemm_fusion_level=3",)),
)

# The CPU dry run: the same code paths on a model small enough for a test.
_TINY = ("model.vocab_size=512", "model.max_position_embeddings=64")
CPU_PLAN = (
    CHECK,
    KERNELS,
    NORMS,
    GELUS,
    LAUNCHES,
    TUNING,
    FFN_TUNING,
    Variant("tiny-64-paper", size="tiny", seq_len=64, batch_per_device=4, overrides=_TINY, profile=True),
    Variant("tiny-32-attn0-sorted-tanh", size="tiny", seq_len=32, batch_per_device=4,
            overrides=_TINY + NO_ATTN_DROPOUT + ("model.embedding_grad=sorted", "model.gelu=tanh",
                                                  "model.residual_norm=pallas"),
            xla_flags=("--xla_cpu_enable_fast_math=false",)),
)


# --------------------------------------------------------------------------------------
# Kernel profile
# --------------------------------------------------------------------------------------

def profile_steps(run_steps, steps: int, hlo_text: str, module: str) -> dict:
    """Kernel milliseconds per step by category, from a jax.profiler trace of `run_steps(steps)`
    (dispatched back to back, so the idle gaps are the device's, not the host's); each kernel
    attributed through the compiled HLO (`pmi_jax.hlo`: category, model operation, bytes)."""
    import jax

    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            run_steps(steps)
        (path,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    return kernel_times(events, hlo.categories(hlo_text), module, steps, hlo.program_kernels(hlo_text))


def kernel_times(events: list, categories: dict[str, str], module: str, steps: int, kernels=()) -> dict:
    """Sum the trace's kernel events of `module` per category (ms per step), with the top kernels.

    On a GPU the device's kernel events are used (processes named /device:...); on a CPU the
    host threads that run the XLA ops. An event is attributed by its `hlo_op` argument (or its
    name) through `categories`. On a GPU, a kernel whose op is not an instruction of the module
    (a command buffer: XLA runs most of a GPU step as CUDA graphs) is attributed by its kernel
    name, through the HLO instruction of that name, else by the name. `kernels`
    (pmi_jax.hlo.Kernel) adds each top kernel's model operation, launches per step and bytes.
    """
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:" in str(e.get("args", {}).get("name", ""))}
    by_kernel = {hlo.kernel_name(op): category for op, category in categories.items()}
    groups = hlo.by_kernel(list(kernels))
    known = groups | {k.name: groups[k.kernel] for k in kernels if k.kernel in groups}
    totals = dict.fromkeys(CATEGORIES, 0.0)
    per_op: dict[str, float] = {}
    spans = []  # (start, end, kernel name) of the device's kernels, for the idle time between them
    for e in events:
        if e.get("ph") != "X" or (devices and e.get("pid") not in devices):
            continue
        args = e.get("args") or {}
        if args.get("hlo_module") and not str(args["hlo_module"]).startswith(module):
            continue
        if devices:
            start = float(e.get("ts", 0.0))
            spans.append((start, start + float(e.get("dur", 0.0)), e.get("name", "")))
        op = args.get("hlo_op") or e.get("name", "")
        if not args.get("hlo_op") and not devices:
            continue  # host-side bookkeeping on CPU
        category = categories.get(op)
        if devices and category in (None, "control"):
            # XLA:GPU runs most of a step as CUDA graphs: the trace then names the command buffer
            # as every kernel's op, and the kernel by its fusion's name (see pmi_jax.hlo.kernel_name).
            op = e.get("name", "")
            category = by_kernel.get(op) or _category_from_kernel_name(op)
        category = category or _category_from_kernel_name(e.get("name", ""))
        if category == "control":
            continue
        ms = float(e.get("dur", 0.0)) / 1e3 / steps
        totals[category] += ms
        per_op[(op, category)] = per_op.get((op, category), 0.0) + ms
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:12]

    def row(op, category, ms):
        group = known.get(op)  # a kernel XLA reuses for identical fusions runs once per launch
        return {"op": f"{op} ({category})", "ms": round(ms, 3)} | (
            {"model_op": group.op, "launches": group.launches, "bytes": group.bytes} if group else {})

    return {"ms_per_step": {k: round(v, 3) for k, v in totals.items()},
            "kernel_ms_per_step": round(sum(totals.values()), 3),
            "top_ops": [row(op, category, ms) for (op, category), ms in top]} | _idle(spans, steps)


def _idle(spans: list, steps: int, top: int = 8) -> dict:
    """The device's idle time between the first kernel and the last, per step, and the longest idle
    gaps with the kernels either side: the step time that no kernel accounts for."""
    if not spans:
        return {}
    spans.sort()
    gaps, busy_until, before = [], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > busy_until:
            gaps.append((start - busy_until, before, name))
        if end >= busy_until:
            busy_until, before = end, name
    gaps.sort(key=lambda g: -g[0])
    return {"idle_ms_per_step": round(sum(g[0] for g in gaps) / 1e3 / steps, 3),
            "idle_gaps_per_step": round(len(gaps) / steps, 1),
            "longest_gaps": [{"us": round(us, 1), "after": a[:80], "before": b[:80]} for us, a, b in gaps[:top]]}


def _category_from_kernel_name(name: str) -> str:
    """A kernel not found in the compiled HLO: cuDNN/cuBLAS/CUTLASS by their names, XLA's fusions."""
    if re.search(r"fmha|flash|attention|sdpa", name, re.I):
        return "attention"
    if re.search(r"gemm|cutlass|xmma|nvjet|cublas|matmul", name, re.I):
        return "matmul"
    if "scatter" in name.lower():
        return "scatter"
    if re.search(r"fusion|^loop_|^input_|^wrapped_|residual_layer_norm", name):
        return "elementwise"
    return "other"


# --------------------------------------------------------------------------------------
# cuDNN against XLA
# --------------------------------------------------------------------------------------


def attention_check(platform: str | None) -> dict:
    """cuDNN's fused attention against the XLA path on BERT-base's shapes, values and gradients;
    our kernel against the written-out attention with its mask.

    bf16 q, k, v of [8, 512, 12, 64] with padded tails given as key lengths. On a GPU it
    compares implementation="cudnn" with "xla"; elsewhere (the CPU dry run) the XLA path with
    lengths against XLA with the boolean mask, so the same code runs. Errors are relative to
    the largest reference value, in float32. `ours_vs_reference_same_mask`: our kernel with
    dropout 0.1 (compiled on a GPU: the inline PTX of its exp2 and bf16 conversions runs only
    there) against the float32 written-out attention given its mask, beside that attention's own
    bf16 error, as tests/test_fused_attention.py checks it interpreted.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pmi_jax import fused_attention

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    b, length, h, k = (8, 512, 12, 64) if on_gpu else (2, 64, 2, 16)
    q, kk, v = jax.random.normal(jax.random.key(0), (3, b, length, h, k), jnp.float32).astype(jnp.bfloat16)
    lengths_B = jnp.asarray(np.linspace(length // 4, length, b).astype(np.int32))
    g = jax.random.normal(jax.random.key(1), (b, length, h, k), jnp.float32)
    keys = (jnp.arange(length)[None, :] < lengths_B[:, None])[:, None, None, :]

    def loss(q, kk, v, form):
        if form == "cudnn":
            out = jax.nn.dot_product_attention(q, kk, v, key_value_seq_lengths=lengths_B, implementation="cudnn")
        elif form == "lengths":
            out = jax.nn.dot_product_attention(q, kk, v, key_value_seq_lengths=lengths_B, implementation="xla")
        else:
            out = jax.nn.dot_product_attention(q, kk, v, mask=keys, implementation="xla")
        return jnp.sum(out.astype(jnp.float32) * g), out

    def run(form):
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                                  static_argnums=3)(q, kk, v, form)
        return [np.asarray(x, np.float32) for x in (out, *grads)]

    tested, reference = run("cudnn" if on_gpu else "lengths"), run("mask")
    errors = {}
    for name, a, r in zip(("output", "dq", "dk", "dv"), tested, reference):
        errors[name] = float(np.max(np.abs(a - r)) / max(float(np.max(np.abs(r))), 1e-30))
    streams = fused_attention.dropout_streams(jax.random.key(2), b, h)
    ours = _same_mask_errors(q, kk, v, g, keys[:, 0, 0, :], streams, lambda q, kk, v: fused_attention.attention(
        q, kk, v, lengths_B, streams, rate=0.1, interpret=not on_gpu))
    if on_gpu:  # the same without the inline PTX, to tell its errors from the kernel's
        fused_attention.INLINE_PTX = False
        try:
            plain = _same_mask_errors(q, kk, v, g, keys[:, 0, 0, :], streams, lambda q, kk, v:
                                      fused_attention.attention(q, kk, v, lengths_B, streams, rate=0.1))
            ours["ours without inline PTX"] = plain.get("ours", plain)
        finally:
            fused_attention.INLINE_PTX = True
    return {"variant": "attention-check", "compared": "cudnn vs xla" if on_gpu else "xla lengths vs xla mask",
            "shape": [b, length, h, k], "max_error_relative_to_max": errors,
            "agree_within_bf16": all(e < 2e-2 for e in errors.values()),
            "ours_vs_reference_same_mask": ours,
            "ours_within_bf16": "ours" in ours and all(ours["ours"][n] < 2 * ours["written bf16"][n] + 1e-2
                                                       for n in ours["ours"]),
            "stacked": _stacked_check(on_gpu), "feed_forward": _feed_forward_check(on_gpu)}


def _feed_forward_check(on_gpu: bool) -> dict:
    """`model.feed_forward=pallas`'s kernels (compiled on a GPU, interpreted elsewhere) and XLA's path
    in bf16, each against XLA's path in float32 ([4096, 768] x [768, 3072] on a GPU;
    `_errors_against_float32`), as tests/test_fused_feed_forward.py checks it interpreted;
    `within_bf16` where ours is within 1.5 times XLA's bf16 error or 2^-8."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_feed_forward
    from pmi_jax.model import _gelu

    t, d, f = (4096, 768, 3072) if on_gpu else (64, 48, 96)
    keys = jax.random.split(jax.random.key(4), 5)
    x, g = (jax.random.normal(k, (t, d), jnp.float32) for k in keys[:2])
    w1, w2 = jax.random.normal(keys[2], (d, f)) * d ** -0.5, jax.random.normal(keys[3], (f, d)) * f ** -0.5
    b1 = jax.random.normal(keys[4], (f,)) * 0.5

    def xla(x, w1, b1, w2):
        return jnp.dot(_gelu("erf", jnp.dot(x, w1.astype(x.dtype)) + b1.astype(x.dtype)), w2.astype(x.dtype))

    def ours(x, w1, b1, w2):
        return fused_feed_forward.gelu_feed_forward(x, w1, b1, w2, interpret=not on_gpu)

    names = ("output", "dx", "dw1", "db1", "dw2")
    errors = _errors_against_float32(xla, {"ours bf16": ours, "xla bf16": xla}, (x.astype(jnp.bfloat16), w1, b1, w2),
                                     g.astype(jnp.bfloat16), names)
    return {"shape": [t, d, f], "errors": errors, "within_bf16": "error" not in errors and all(
        errors["ours bf16"][n] <= max(1.5 * errors["xla bf16"][n], 2.0 ** -8) for n in names)}


def _layer_inputs(on_gpu: bool) -> tuple:
    """One attention layer's inputs for the micro-benchmarks: (B, L, H, K), bf16 (q, k, v) and output
    gradient of BERT-base at batch 32 on a GPU (tiny on CPU), and lengths from L / 2 to L."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    shape = (32, 512, 12, 64) if on_gpu else (2, 64, 2, 16)
    b, length, _, _ = shape
    qkv = tuple(jax.random.normal(jax.random.key(0), (3, *shape), jnp.float32).astype(jnp.bfloat16))
    g = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(jnp.bfloat16)
    return shape, qkv, g, jnp.asarray(np.linspace(length // 2, length, b).astype(np.int32))


def _stacked_check(on_gpu: bool, repeats: int = 20) -> dict:
    """Our kernel on the stacked [B, L, 3, H, K] input (what `fused_qkv` feeds it; [32, 512, 3, 12,
    64] bf16 on a GPU, as `attention-kernels`, padded tails) against the same kernel on q, k and v
    sliced out of it, a bias added: identical output and input gradient expected (the same
    arithmetic, other addresses), the bias's gradient within bf16 rounding (the kernels' block
    sums against XLA's). Timed on the stack, forward + backward, the bias add, slices and the
    gradients' concatenation included where a form takes three inputs, as in the model: ours
    both ways, ours without dropout, and cuDNN's (GPU), which attention dropout 0 takes sliced."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pmi_jax import fused_attention

    (b, _, h, k), qkv, g, lengths_B = _layer_inputs(on_gpu)
    qkv_BxLx3xHxK = jnp.stack(qkv, axis=2)
    streams = fused_attention.dropout_streams(jax.random.key(2), b, h)
    bias_3xHxK = jax.random.normal(jax.random.key(3), (3, h, k), jnp.float32).astype(jnp.bfloat16)
    interpret = not on_gpu

    def sliced(x, bias):  # as the model computed them before: bias added to the matmul's output, then slices
        return tuple((x + bias)[:, :, i] for i in range(3))

    forms = {
        "ours stacked, dropout 0.1": lambda x, bias: fused_attention.attention_stacked(
            x, lengths_B, streams, bias, rate=0.1, interpret=interpret),
        "ours on slices, dropout 0.1": lambda x, bias: fused_attention.attention(
            *sliced(x, bias), lengths_B, streams, rate=0.1, interpret=interpret),
        "ours stacked, no dropout": lambda x, bias: fused_attention.attention_stacked(
            x, lengths_B, None, bias, interpret=interpret),
    }
    if on_gpu:
        forms["cudnn on slices, no dropout"] = lambda x, bias: jax.nn.dot_product_attention(
            *sliced(x, bias), key_value_seq_lengths=lengths_B, implementation="cudnn")
    try:
        results = []
        for name in ("ours stacked, dropout 0.1", "ours on slices, dropout 0.1"):
            out, vjp = jax.vjp(jax.jit(forms[name]), qkv_BxLx3xHxK, bias_3xHxK)
            results.append([np.asarray(x, np.float32) for x in (out, *vjp(g))])
        differences = [float(np.abs(x - y).max()) for x, y in zip(*results)]
        largest_bias_grad = float(np.abs(results[1][2]).max())
        return {"max_abs_difference": dict(zip(("out", "dqkv", "dbias"), differences)),
                "identical": differences[0] == differences[1] == 0.0,  # the bias's gradient: summed otherwise
                "dbias_error_relative_to_max": differences[2] / max(largest_bias_grad, 1e-30),
                "forms": _time_forms(forms, (qkv_BxLx3xHxK, bias_3xHxK), g, repeats if on_gpu else 1)}
    except Exception as e:  # noqa: BLE001 - the cuDNN check stands without it
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def attention_kernels(platform: str | None, repeats: int = 20) -> dict:
    """One attention layer's forward and backward, per implementation, at BERT-base's shapes.

    q, k, v of [32, 512, 12, 64] bf16 (batch 32, the step's), padded tails, timed as
    value_and_grad of sum(out * g): what a fused path with dropout could save at most against
    the written-out attention the paper's dropout takes now. Forms: the model's written-out
    attention with and without dropout 0.1 (threefry, flax's bernoulli), JAX's XLA and cuDNN
    paths with key lengths, cuDNN's private API with its static-seed dropout (its speed only:
    the seed makes it unusable, docs/gpu.md), and Pallas' Triton flash attention with segment
    ids (no dropout; the base a kernel with in-kernel dropout would start from), and ours,
    `pmi_jax.fused_attention` (dropout 0.1 drawn in the kernel; two block shapes on a GPU; and
    without dropout). `ours_vs_reference_same_mask` checks ours against the written-out attention
    given the same mask, values and gradients, as tests/test_fused_attention.py does interpreted.
    On CPU (the dry run) the shapes are tiny, cuDNN is left out and Pallas runs in interpret mode.
    """
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_attention
    from pmi_jax.model import Dropout, written_attention

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    (b, length, h, k), (q, kk, v), g, lengths_B = _layer_inputs(on_gpu)
    valid_BxL = jnp.arange(length)[None, :] < lengths_B[:, None]
    rng = jax.random.key(2)
    scale = k ** -0.5
    # As the model's on this platform (`model.for_platform`): the XLA:CPU mask, 16-bit masks on GPUs.
    dropout = Dropout(0.1, mask={"cpu": "cpu", "gpu": "bits16"}.get(device.platform, "bernoulli"))

    def written(q, kk, v, rate):  # the model's own written-out attention
        keep = (dropout.apply({}, (b, h, length, length), deterministic=False, rngs={"dropout": rng},
                              method=Dropout.keep_mask) if rate else (None, 1.0))
        return written_attention(q, kk, v, valid_BxL, *keep)

    def cudnn_dropout(q, kk, v):
        from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention
        return dot_product_attention(q, kk, v, q_seqlen=lengths_B, kv_seqlen=lengths_B, scale=scale,
                                     mask_type=MaskType.PADDING, dropout_rate=0.1, seed=0)

    def pallas(q, kk, v):
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention
        return pallas_attention.mha(q, kk, v, valid_BxL.astype(jnp.int32), sm_scale=scale,
                                    interpret=not on_gpu)

    forms = {
        "written, dropout 0.1 (the paper's; today's path)": lambda q, kk, v: written(q, kk, v, 0.1),
        "written, no dropout": lambda q, kk, v: written(q, kk, v, 0.0),
        "jax.nn xla, lengths": lambda q, kk, v: jax.nn.dot_product_attention(
            q, kk, v, key_value_seq_lengths=lengths_B, implementation="xla"),
    }
    if on_gpu:
        forms["jax.nn cudnn, lengths"] = lambda q, kk, v: jax.nn.dot_product_attention(
            q, kk, v, key_value_seq_lengths=lengths_B, implementation="cudnn")
        forms["cudnn private API, dropout 0.1 (static seed)"] = cudnn_dropout
    forms["pallas triton flash, segment ids"] = pallas
    streams = fused_attention.dropout_streams(rng, b, h)

    def ours(rate, blocks=fused_attention.DEFAULT_BLOCKS):
        return lambda q, kk, v: fused_attention.attention(q, kk, v, lengths_B, streams, rate=rate, blocks=blocks,
                                                          interpret=not on_gpu)

    forms[f"ours, dropout 0.1 in the kernel, blocks {fused_attention.DEFAULT_BLOCKS}"] = ours(0.1)
    if on_gpu:
        forms["ours, dropout 0.1 in the kernel, blocks (128, 64)"] = ours(0.1, (128, 64))
        forms["ours, dropout 0.1 in the kernel, blocks (32, 32)"] = ours(0.1, (32, 32))
    forms["ours, no dropout"] = ours(0.0)

    return {"variant": KERNELS.name, "what": "one layer's attention, forward + backward", "shape": [b, length, h, k],
            "per_step": 12, "forms": _time_forms(forms, (q, kk, v), g, repeats if on_gpu else 3),
            "ours_vs_reference_same_mask": _same_mask_errors(q, kk, v, g, valid_BxL, streams, ours(0.1))}


# Our attention kernel's configurations timed on a GPU: blocks (query, key), Triton's num_warps and num_stages.
TUNING_BLOCKS = ((64, 64), (128, 64), (64, 128), (128, 128))
TUNING_LAUNCH = tuple((warps, stages) for warps in (4, 8) for stages in (1, 2, 3))


def attention_tuning(platform: str | None, repeats: int = 20) -> dict:
    """Our attention kernel on one layer's stacked Q/K/V with dropout 0.1, as the model calls it
    ([32, 512, 3, 12, 64] bf16 on a GPU), per configuration: blocks (`TUNING_BLOCKS`) by one
    (num_warps, num_stages) for all three kernels (`TUNING_LAUNCH`); the forward alone and forward
    + backward, so that each pass can take its best (`fused_attention.DEFAULT_BLOCKS`,
    `DEFAULT_LAUNCH`). A configuration Triton refuses is recorded with its error. On CPU (the dry
    run) two configurations, interpreted: the launch parameters do not apply there."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_attention

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    (b, _, h, k), qkv, g, lengths_B = _layer_inputs(on_gpu)
    qkv_BxLx3xHxK = jnp.stack(qkv, axis=2)
    streams = fused_attention.dropout_streams(jax.random.key(2), b, h)
    bias_3xHxK = jnp.zeros((3, h, k), jnp.bfloat16)
    configs = ([(blocks, launch) for blocks in TUNING_BLOCKS for launch in TUNING_LAUNCH] if on_gpu else
               [(fused_attention.DEFAULT_BLOCKS, fused_attention.DEFAULT_LAUNCH[0]), ((32, 32), (8, 3))])
    forms = {f"blocks {blocks[0]}x{blocks[1]}, warps {launch[0]}, stages {launch[1]}":
             (lambda x, bias, blocks=blocks, launch=launch: fused_attention.attention_stacked(
                 x, lengths_B, streams, bias, rate=0.1, blocks=blocks, launch=(launch, launch), interpret=not on_gpu))
             for blocks, launch in configs}
    timed = _time_with_forward(forms, (qkv_BxLx3xHxK, bias_3xHxK), g, repeats if on_gpu else 1)
    return {"variant": TUNING.name, "what": "our attention kernel, stacked input, dropout 0.1, per configuration",
            "shape": [b, qkv[0].shape[1], 3, h, k], "forms": timed}


# (blocks (M, N, K), (warps, stages)) of the feed-forward kernels that ptxas assembles for the H100
# without spilling registers (deviceless, benchmarks/README.md "The feed-forward kernels' configurations").
FFN_TUNING_CONFIGS = tuple(((128, 128, 64), (8, stages)) for stages in (2, 3, 4)) + tuple(
    (blocks, (warps, 3)) for blocks in ((64, 128, 64), (128, 64, 64), (64, 64, 64)) for warps in (4, 8))


def feed_forward_tuning(platform: str | None, repeats: int = 20) -> dict:
    """`model.feed_forward=pallas`'s two kernels on one BERT-base layer ([16384, 768] x [768, 3072]
    x [3072, 768] bf16 on a GPU), forward and backward with XLA's weight gradients, per (blocks,
    launch) of `FFN_TUNING_CONFIGS`, beside XLA's path on the same inputs: the configuration for
    `fused_feed_forward.DEFAULT_BLOCKS` and `DEFAULT_LAUNCH`, and whether the best of ours beats
    cuBLAS with XLA's GELU kernels at all. On CPU (the dry run) two configurations, interpreted."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_feed_forward
    from pmi_jax.model import _gelu

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    t, d, f = (16384, 768, 3072) if on_gpu else (64, 48, 96)
    keys = jax.random.split(jax.random.key(5), 5)
    x, g = (jax.random.normal(k, (t, d), jnp.float32).astype(jnp.bfloat16) for k in keys[:2])
    w1 = (jax.random.normal(keys[2], (d, f)) * d ** -0.5).astype(jnp.bfloat16)
    w2 = (jax.random.normal(keys[3], (f, d)) * f ** -0.5).astype(jnp.bfloat16)
    b1 = (jax.random.normal(keys[4], (f,)) * 0.5).astype(jnp.bfloat16)
    configs = FFN_TUNING_CONFIGS if on_gpu else ((fused_feed_forward.DEFAULT_BLOCKS, fused_feed_forward.DEFAULT_LAUNCH),
                                                 ((16, 32, 16), (4, 1)))
    forms = {"xla (cuBLAS, GELU kernels)": lambda x, w1, b1, w2: jnp.dot(_gelu("erf", jnp.dot(x, w1) + b1), w2)}
    forms.update({f"blocks {'x'.join(map(str, blocks))}, warps {launch[0]}, stages {launch[1]}":
                  (lambda x, w1, b1, w2, blocks=blocks, launch=launch: fused_feed_forward.gelu_feed_forward(
                      x, w1, b1, w2, blocks=blocks, launch=launch, interpret=not on_gpu))
                  for blocks, launch in configs})
    results = {}
    timed = _time_with_forward(forms, (x, w1, b1, w2), g, repeats if on_gpu else 1, results_out=results)
    xla_name = next(iter(forms))
    for name, result in results.items():  # a configuration that computes something else is not a candidate
        if xla_name in results and name != xla_name:
            timed[name]["vs_xla"] = _largest_differences(result, results[xla_name], ("loss", "dx", "dw1", "db1", "dw2"))
    return {"variant": FFN_TUNING.name, "what": "one feed-forward block, forward + backward, per configuration",
            "shape": [t, d, f], "forms": timed}


def _largest_differences(result, reference, names: tuple) -> dict:
    """max |a - b| / max |b| per named leaf of two equal pytrees (value_and_grad's (value, grads))."""
    import jax
    import numpy as np

    return {n: float(np.abs(a - b).max() / np.abs(b).max()) for n, a, b in zip(
        names, *([np.asarray(x, np.float32) for x in jax.tree.leaves(tree)] for tree in (result, reference)))}


def _time_with_forward(forms: dict, inputs: tuple, g, repeats: int, results_out=None) -> dict:
    """`_time_forms` forward + backward, each form's record with its forward alone added ("ms_fwd")."""
    timed = _time_forms(forms, inputs, g, repeats, results_out=results_out)
    for name, record in _time_forms(forms, inputs, g, repeats, backward=False).items():
        if "ms_fwd" in record and name in timed:
            timed[name]["ms_fwd"] = record["ms_fwd"]
    return timed


def _time_forms(forms: dict, inputs: tuple, g, repeats: int, backward: bool = True, results_out=None) -> dict:
    """Median and least ms of value_and_grad of sum(fn(*inputs) * g) in all inputs, per form
    ("ms_fwd_bwd"); with `backward` False, of fn(*inputs) alone ("ms_fwd"). `results_out`, a dict,
    receives each form's last result."""
    import jax
    import jax.numpy as jnp

    results = {}
    for name, fn in forms.items():
        try:
            step = jax.jit(jax.value_and_grad(lambda *p, fn=fn: jnp.sum((fn(*p) * g).astype(jnp.float32)),
                                              argnums=tuple(range(len(inputs))))) if backward else jax.jit(fn)
            jax.block_until_ready(step(*inputs))
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                result = jax.block_until_ready(step(*inputs))
                times.append(time.perf_counter() - t)
            if results_out is not None:
                results_out[name] = result
            results[name] = {"ms_fwd_bwd" if backward else "ms_fwd": round(1e3 * statistics.median(times), 3),
                             "ms_min": round(1e3 * min(times), 3)}
        except Exception as e:  # noqa: BLE001 - one form that does not lower must not cost the others
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    return results


def _errors_against_float32(reference, candidates: dict, inputs: tuple, g, names: tuple) -> dict:
    """Max |candidate - exact| / max |exact| of the value and each input's gradient, the exact one
    being `reference` on the inputs cast to float32."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def values(fn, *args):
        out, vjp = jax.vjp(fn, *args)
        return [np.asarray(x, np.float32) for x in (out, *vjp(g.astype(out.dtype)))]

    try:
        exact = values(jax.jit(reference), *(x.astype(jnp.float32) for x in inputs))
        return {label: _largest_differences(values(jax.jit(fn), *inputs), exact, names)
                for label, fn in candidates.items()}
    except Exception as e:  # noqa: BLE001 - the timings stand without it
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def _same_mask_errors(q, kk, v, g, valid_BxL, streams, ours) -> dict:
    """Ours against the written-out attention in float32 with ours' mask (out, dq, dk, dv); beside it,
    the written-out attention's own error in bf16."""
    from pmi_jax import fused_attention
    from pmi_jax.model import written_attention

    mask = fused_attention.keep_mask(streams, q.shape[1], 0.1)

    def written(q, kk, v):
        return written_attention(q, kk, v, valid_BxL, mask, fused_attention.keep_probability(0.1))

    return _errors_against_float32(written, {"ours": ours, "written bf16": written}, (q, kk, v), g,
                                   ("out", "dq", "dk", "dv"))


def layer_norm_kernels(platform: str | None, repeats: int = 20) -> dict:
    """One sub-layer's output bias, hidden dropout, residual and LayerNorm, forward and backward,
    at BERT-base's [32, 512, 768] bf16 (24 per step): the model's XLA path (flax's LayerNorm; the
    mask as the platform's programs draw it, 16-bit on GPUs) against `pmi_jax.fused_layer_norm`
    (`model.residual_norm=pallas`) at three row blocks, and each against the XLA path in float32
    given the kernel's mask. On CPU (the dry run) the shapes are tiny and Pallas is interpreted."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from pmi_jax import fused_layer_norm
    from pmi_jax.model import Dropout

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    b, length, d = (32, 512, 768) if on_gpu else (2, 64, 48)
    keys = jax.random.split(jax.random.key(0), 4)
    a, x, g = (jax.random.normal(k, (b, length, d), jnp.float32).astype(jnp.bfloat16) for k in keys[:3])
    inputs = (a, jnp.full((d,), 0.1), x, jnp.ones((d,)), jnp.zeros((d,)))  # a, bias, x, scale, offset
    dropout = Dropout(0.1, mask={"cpu": "cpu", "gpu": "hash"}.get(device.platform, "bernoulli"))
    streams = fused_layer_norm.dropout_streams(keys[3], b)
    keep = fused_layer_norm.keep_mask(streams, length, d, 0.1)

    def xla(drop):
        def fn(a, bias, x, scale, offset):
            norm = nn.LayerNorm(epsilon=1e-12, dtype=x.dtype, param_dtype=jnp.float32)
            return norm.apply({"params": {"scale": scale, "bias": offset}}, x + drop(a + bias.astype(a.dtype)))
        return fn

    def ours(rate, max_rows=fused_layer_norm.MAX_ROWS):
        return lambda *p: fused_layer_norm.residual_layer_norm(*p, streams, rate=rate, max_rows=max_rows,
                                                               interpret=not on_gpu)

    forms = {"xla, dropout 0.1 (the model's path)": xla(
                 lambda h: dropout.apply({}, h, deterministic=False, rngs={"dropout": keys[3]})),
             "xla, dropout 0.1, bits16 (GPU default before hash)": xla(
                 lambda h: Dropout(0.1, mask="bits16").apply({}, h, deterministic=False, rngs={"dropout": keys[3]})),
             "xla, no dropout": xla(lambda h: h),
             f"ours, dropout 0.1, {fused_layer_norm.MAX_ROWS} rows a program": ours(0.1)}
    if on_gpu:
        forms["ours, dropout 0.1, 4 rows a program"] = ours(0.1, 4)
        forms["ours, dropout 0.1, 1 row a program"] = ours(0.1, 1)
    forms["ours, no dropout"] = ours(0.0)
    same_mask = xla(lambda h: h * keep.astype(h.dtype) / jnp.asarray(0.9, h.dtype))
    return {"variant": NORMS.name, "what": "one residual LayerNorm, forward + backward", "shape": [b, length, d],
            "per_step": 24, "forms": _time_forms(forms, inputs, g, repeats if on_gpu else 3),
            "ours_vs_reference_same_mask": _errors_against_float32(
                same_mask, {"ours": ours(0.1), "xla bf16": same_mask}, inputs, g,
                ("y", "da", "dbias", "dx", "dscale", "doffset"))}


def gelu_kernels(platform: str | None, repeats: int = 20) -> dict:
    """The feed-forward GELU, forward and backward, at BERT-base's [32, 512, 3072] bf16 (12 per
    step; the MLM head's is smaller): `model._gelu` (erf) against the same with jax.nn.gelu's erfc
    formula in the forward, which the profile found compute-bound, and the tanh form."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import model

    device = (jax.devices(platform) if platform else jax.devices())[0]
    on_gpu = device.platform == "gpu"
    shape = (32, 512, 3072) if on_gpu else (2, 64, 96)
    kx, kg = jax.random.split(jax.random.key(0))
    x, g = (jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16) * 3 for k in (kx, kg))

    @jax.custom_vjp
    def erfc_form(x):
        return jax.nn.gelu(x.astype(jnp.float32), approximate=False).astype(x.dtype)

    erfc_form.defvjp(lambda x: (erfc_form(x), x), lambda x, dy: model._gelu_bwd("erf", x, dy))  # model._gelu's
    forms = {"erf (model._gelu)": lambda v: model._gelu("erf", v), "erfc (jax.nn.gelu's formula)": erfc_form,
             "tanh (model.gelu=tanh off GPUs)": lambda v: model._gelu("tanh", v)}
    return {"variant": GELUS.name, "what": "one feed-forward GELU, forward + backward", "shape": list(shape),
            "per_step": 12, "forms": _time_forms(forms, (x,), g, repeats if on_gpu else 3),
            "ours_vs_reference_same_mask": _errors_against_float32(
                lambda v: model._gelu_f32("erf", v), {"erf": forms["erf (model._gelu)"], "erfc": erfc_form},
                (x,), g, ("y", "dx")),
            "with_matmul": _gelu_after_matmul(shape, 768 if on_gpu else 32, repeats if on_gpu else 3)}


def _gelu_after_matmul(shape: tuple, d: int, repeats: int) -> dict:
    """GELU(x W + b) as the feed-forward block's first half computes it, forward and backward: the
    tanh form written for cuBLAS's epilogue (`model.gelu=tanh` on GPUs) beside the erf form and
    the float32 tanh formula, each against float32."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import model

    b, length, f = shape
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (b * length, d), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(keys[1], (d, f), jnp.float32) * 0.02 * 3).astype(jnp.bfloat16)
    bias = (jax.random.normal(keys[2], (f,), jnp.float32) * 0.1).astype(jnp.bfloat16)
    g = jax.random.normal(keys[3], (b * length, f), jnp.float32).astype(jnp.bfloat16)

    def form(name):
        return lambda x, w, bias: model._gelu(name, jnp.dot(x, w) + bias)

    forms = {name: form(name) for name in ("erf", "tanh", "tanh-epilogue")}
    exact = lambda x, w, bias: model._gelu_f32("tanh", jnp.dot(x, w, precision="highest") + bias)  # noqa: E731
    return {"shape": [b * length, d, f], "forms": _time_forms(forms, (x, w, bias), g, repeats),
            "against_float32": _errors_against_float32(
                exact, {name: forms[name] for name in ("tanh", "tanh-epilogue")}, (x, w, bias), g,
                ("y", "dx", "dw", "dbias"))}


def launch_cost(platform: str | None, name: str = LAUNCHES.name, calls: int = 50) -> dict:
    """What one more small kernel adds to a program as the trainer runs it (calls dispatched back to
    back, one wait; XLA's command buffers as configured): a chain of K dependent reductions of a
    [768] vector, each kernel reading the vector and the last sum alone, so that every kernel is
    the same size (`x + s` chained would fuse each sum's whole history into the next kernel). Two
    K, each program's kernels counted in its compiled HLO (`pmi_jax.hlo`; an H100 program has
    K + 1). The slope between the two is microseconds per kernel; the host's share is the time
    until the last call returns, before the wait: near the total, the host's launching is the cost.
    """
    import jax
    import jax.numpy as jnp

    device = (jax.devices(platform) if platform else jax.devices())[0]
    x = jax.device_put(jnp.linspace(0.0, 1.0, 768, dtype=jnp.float32), device)

    def chain(x, k):
        s = jnp.zeros((), x.dtype)
        for _ in range(k):
            s = jnp.sum(x + s * 1e-6)  # a reduction each: XLA cannot fuse the next one into it
        return x + s

    points = []
    for k in (64, 1024) if device.platform == "gpu" else (8, 32):
        compiled = jax.jit(chain, static_argnums=1).lower(x, k).compile()
        jax.block_until_ready(compiled(x))
        start = time.perf_counter()
        outs = [compiled(x) for _ in range(calls)]
        host = time.perf_counter() - start
        jax.block_until_ready(outs)
        points.append({"k": k, "kernels": len(hlo.program_kernels(compiled.as_text())),
                       "ms_per_call": round(1e3 * (time.perf_counter() - start) / calls, 4),
                       "host_ms_per_call": round(1e3 * host / calls, 4)})
    (a, b) = points
    kernels = max(b["kernels"] - a["kernels"], 1)
    slope = 1e3 * (b["ms_per_call"] - a["ms_per_call"]) / kernels
    host_slope = 1e3 * (b["host_ms_per_call"] - a["host_ms_per_call"]) / kernels
    return {"variant": name, "what": "microseconds per small kernel, calls back to back",
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "points": points, "us_per_kernel": round(slope, 3),
            "host_us_per_kernel": round(host_slope, 3)}


# --------------------------------------------------------------------------------------
# One variant (in its own process)
# --------------------------------------------------------------------------------------


def _write_hlo(text: str, directory: str, name: str) -> str:
    """The device's own optimized HLO, gzipped: the profile's kernel names are its instructions'."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.hlo.txt.gz")
    data = gzip.compress(text.encode(), mtime=0)
    if len(data) > HLO_LIMIT:
        return f"not written: {len(data) / 2**20:.1f} MiB compressed, over {HLO_LIMIT / 2**20:.0f} MiB"
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return os.path.relpath(path, os.path.dirname(directory))


def run_variant(variant: Variant, steps: int, timed_s: float, platform: str, hlo_dir: str | None = None) -> dict:
    import jax

    from pmi_jax import flops, partitioning, train
    from pmi_jax.batches import SyntheticBatches
    from pmi_jax.config import apply_overrides, load_config
    from pmi_jax.model import for_platform

    devices = jax.devices(platform) if platform else jax.devices()
    n = len(devices)
    config = apply_overrides(load_config(variant.size), [
        f"model.vocab_size={VOCAB_SIZE}", f"data.seq_len={variant.seq_len}",
        f"train.batch_size={variant.batch_per_device * n}", "model.dtype=bfloat16",
        "mesh.data=-1", "mesh.fsdp=1", "mesh.model=1", *variant.overrides])
    if config.model.max_position_embeddings < variant.seq_len:
        config = apply_overrides(config, [f"model.max_position_embeddings={variant.seq_len}"])
    settled = for_platform(config.model, devices[0].platform)
    record = {"variant": variant.name, "size": variant.size, "seq_len": variant.seq_len,
              "batch_per_device": variant.batch_per_device, "devices": n, "device_kind": devices[0].device_kind,
              "overrides": list(variant.overrides), "xla_flags": list(variant.xla_flags),
              "attention": (settled.attention if settled.attention_dropout_rate == 0 or "pallas" in settled.attention
                            else "written out (dropout)"),
              "embedding_grad": settled.embedding_grad, "residual_norm": settled.residual_norm,
              "fused_qkv": settled.fused_qkv, "decoder_grad": settled.decoder_grad, "jax": jax.__version__}
    mesh = partitioning.make_mesh(config.mesh, devices)
    with partitioning.activate(mesh, config.mesh):
        program = train.build_program(config, mesh)
        record["grad_norm"] = "grouped" if train.grouped_norm_applies(mesh, program.shardings.params) else "optax"
        host_batch = SyntheticBatches(config.model.vocab_size, variant.seq_len, config.train.batch_size,
                                            ).global_batch(0)
        batch = partitioning.global_batch_from_host(host_batch, mesh, config.train.batch_size)
        phases, start = {}, time.perf_counter()  # where a variant's wall time goes, for planning budgets
        state = jax.block_until_ready(program.init())
        phases["init"] = time.perf_counter() - start
        start = time.perf_counter()
        compiled = program.step.lower(state, batch).compile()
        record["compile_s"] = round(time.perf_counter() - start, 1)
        memory = compiled.memory_analysis()
        if memory is not None:
            record["compiled_temp_gib"] = round(memory.temp_size_in_bytes / 2**30, 3)
            record["compiled_argument_gib"] = round(memory.argument_size_in_bytes / 2**30, 3)
        box = {"state": state}

        def run_steps(n: int):  # dispatched back to back as the trainer runs them, then waited for
            for _ in range(n):
                box["state"], out = compiled(box["state"], batch)
            jax.block_until_ready(out)

        start = time.perf_counter()
        run_steps(1)  # warm-up
        phases["warm_up"] = time.perf_counter() - start
        times, deadline = [], time.perf_counter() + timed_s
        while len(times) < steps and (len(times) < 3 or time.perf_counter() < deadline):
            t = time.perf_counter()
            run_steps(1)
            times.append(time.perf_counter() - t)
        # As the trainer runs steps: dispatched without waiting, so that the host prepares the next
        # step (about 600 state arrays) while the device runs this one; 3 windows of len(times) steps.
        pipelined = []
        for _ in range(3):
            t = time.perf_counter()
            run_steps(len(times))
            pipelined.append((time.perf_counter() - t) / len(times))
        if variant.profile:
            start = time.perf_counter()
            text = compiled.as_text()
            if hlo_dir:
                record["hlo"] = _write_hlo(text, hlo_dir, variant.name)
            phases["hlo"] = time.perf_counter() - start
            start = time.perf_counter()
            try:  # a profiler that does not start (no CUPTI, say) must not cost the timings
                record["profile"] = profile_steps(run_steps, 3, text, "jit_train_step")
            except Exception as e:  # noqa: BLE001
                record["profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            phases["profile"] = time.perf_counter() - start
        record["phases_s"] = {k: round(v, 1) for k, v in phases.items()}
    stats = devices[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        record["peak_memory_gib"] = round(stats["peak_bytes_in_use"] / 2**30, 3)
    step_s = statistics.median(times)
    tokens_per_s = config.train.batch_size * variant.seq_len / step_s
    flops_per_token = flops.training_flops_per_token(config.model, variant.seq_len)
    peak = flops.device_peak_flops(devices[0].device_kind)
    utilisation = flops.mfu(flops_per_token, tokens_per_s, n, peak)
    record.update(timed_steps=len(times), ms_per_step=round(1e3 * step_s, 2),
                  ms_min=round(1e3 * min(times), 2), ms_max=round(1e3 * max(times), 2),
                  ms_per_step_pipelined=[round(1e3 * p, 2) for p in pipelined],
                  tokens_per_s=round(tokens_per_s), tflops_per_device=round(flops_per_token * tokens_per_s / n / 1e12, 2),
                  peak_tflops=peak / 1e12 if peak else None,
                  mfu=round(utilisation, 4) if utilisation is not None else None,
                  forbidden_modules=sorted({m.split(".")[0] for m in sys.modules
                                            if m.split(".")[0] in ("tensorflow", "seqio", "tensorflow_text")}))
    return record


# --------------------------------------------------------------------------------------
# The plan (parent process)
# --------------------------------------------------------------------------------------


def _child(variant: Variant, args, timeout: float) -> dict:
    # The child imports what this process can: the project, then this process's own path (and,
    # started with -S, no site-packages beyond it).
    path = [ROOT] + [p for p in sys.path if p and os.path.isdir(p)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(path)))
    if variant.xla_flags:
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *variant.xla_flags]).strip()
    if args.platform:
        env["JAX_PLATFORMS"] = args.platform
    cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), os.path.abspath(__file__), "--one", json.dumps(dataclasses.asdict(variant)),
           "--steps", str(args.steps), "--timed-s", str(args.timed_s), "--platform", args.platform or "",
           "--hlo-dir", os.path.join(args.output, "hlo")]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-400:]
        return {"variant": variant.name, "error": f"timed out after {timeout:.0f} s",
                "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        reason = next((line for line in reversed(proc.stderr.splitlines())
                       if "RESOURCE_EXHAUSTED" in line or "Error" in line), "")
        return {"variant": variant.name, "error": f"exit {proc.returncode}: {reason[:300]}",
                "stderr_tail": proc.stderr[-1500:], "wall_s": round(time.perf_counter() - start, 1)}
    record = json.loads(lines[-1])
    record["wall_s"] = round(time.perf_counter() - start, 1)
    return record


def _write(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def _errors_text(errors: dict) -> str:
    """`_errors_against_float32`'s record in one line: each candidate's errors, or why there are none."""
    return "; ".join(f"{who} " + (", ".join(f"{n} {e:.1e}" for n, e in errs.items()) if isinstance(errs, dict)
                                  else errs) for who, errs in errors.items())


def _form_time(form: dict, width: int = 0) -> str:
    """A timed form's milliseconds forward and backward, or why it has none."""
    return f"{form['ms_fwd_bwd']:{width}.3f} ms" if "ms_fwd_bwd" in form else form["error"]


def _matmul_lines(record: dict | None) -> list[str]:
    if not record:
        return []
    return [f"{'':<32}after the matmul {record['shape']}: " + "; ".join(
        f"{name} {_form_time(f)}" for name, f in record["forms"].items()),
        f"{'':<32}against float32 (max error / max): " + _errors_text(record["against_float32"])]


def _line(r: dict) -> str:
    if "error" in r or "skipped" in r:
        return f"{r['variant']:<30} {r.get('error') or r.get('skipped')}"
    if r["variant"] in (KERNELS.name, NORMS.name, GELUS.name):
        return "\n".join([f"{r['variant']:<30} {r['what']}, {r['shape']}"] + [
            f"{'':<32}{name:<52} {_form_time(f, 8)}" for name, f in r["forms"].items()] + [
            f"{'':<32}against float32, same mask (max error / max): " + _errors_text(r["ours_vs_reference_same_mask"])]
            + _matmul_lines(r.get("with_matmul")))
    if r["variant"] in (TUNING.name, FFN_TUNING.name):
        return "\n".join([f"{r['variant']:<30} {r['what']}, {r['shape']}"] + [
            f"{'':<32}{name:<44} {_form_time(f, 8)}" + (f", forward {f['ms_fwd']:.3f} ms" if "ms_fwd" in f else "")
            + (f", from XLA's by {max(f['vs_xla'].values()):.1e} at most" if "vs_xla" in f else "")
            for name, f in r["forms"].items()])
    if r["variant"].startswith(LAUNCHES.name):
        kernels = " and ".join(str(p["kernels"]) for p in r["points"])
        return (f"{r['variant']:<30} {r['us_per_kernel']:.2f} us per kernel, {r['host_us_per_kernel']:.2f} of them "
                f"until the host returns (programs of {kernels} kernels)")
    if r["variant"] == CHECK.name:
        errors = ", ".join(f"{k} {v:.2e}" for k, v in r["max_error_relative_to_max"].items())
        ours = "ours vs written, same mask: " + ("agree" if r.get("ours_within_bf16") else "DISAGREE")
        ffn = "; feed-forward kernels vs XLA: " + ("agree" if r["feed_forward"]["within_bf16"] else "DISAGREE")
        return (f"{r['variant']:<30} {r['compared']}: {errors} ({'agree' if r['agree_within_bf16'] else 'DISAGREE'}); "
                f"{ours}{ffn}")
    mfu = f"{100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "  n/a"
    memory = r.get("peak_memory_gib", r.get("compiled_temp_gib"))
    text = (f"{r['variant']:<30} {r['ms_per_step']:>9.1f} {r['tokens_per_s']:>10} {mfu:>6} {memory:>8.2f} "
            f"{r['compile_s']:>7.1f}  {r['attention']}, embedding {r['embedding_grad']}; pipelined ms/step "
            + ", ".join(f"{p:.1f}" for p in r.get("ms_per_step_pipelined", ())))
    if "profile" in r:
        p = r["profile"]["ms_per_step"]
        text += "\n" + " " * 32 + "kernels ms/step: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items())
        if "idle_ms_per_step" in r["profile"]:
            text += f"; device idle {r['profile']['idle_ms_per_step']:.1f}"
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", help="directory for gpu_step.json")
    parser.add_argument("--platform", default=None, help="JAX platform (cpu for the dry run; default: the default)")
    parser.add_argument("--variants", nargs="*", default=None, help="names from the plan (default: all, in order)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall-clock budget for all variants")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant (at least 3 are run)")
    parser.add_argument("--timed-s", type=float, default=15.0, help="stop timing a variant after this long")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: run this variant, print JSON
    parser.add_argument("--hlo-dir", default=None, help=argparse.SUPPRESS)  # a child: where its HLO goes
    args = parser.parse_args(argv)
    if args.one:
        variant = Variant(**json.loads(args.one))
        if variant.name == CHECK.name:
            print(json.dumps(attention_check(args.platform or None)))
        elif variant.name == KERNELS.name:
            print(json.dumps(attention_kernels(args.platform or None)))
        elif variant.name == NORMS.name:
            print(json.dumps(layer_norm_kernels(args.platform or None)))
        elif variant.name == GELUS.name:
            print(json.dumps(gelu_kernels(args.platform or None)))
        elif variant.name == TUNING.name:
            print(json.dumps(attention_tuning(args.platform or None)))
        elif variant.name == FFN_TUNING.name:
            print(json.dumps(feed_forward_tuning(args.platform or None)))
        elif variant.name.startswith(LAUNCHES.name):
            print(json.dumps(launch_cost(args.platform or None, variant.name)))
        else:
            print(json.dumps(run_variant(variant, args.steps, args.timed_s, args.platform or None, args.hlo_dir)))
        return
    if not args.output:
        parser.error("--output is required")
    plan = CPU_PLAN if args.platform == "cpu" else GPU_PLAN
    if args.variants:
        known = {v.name: v for v in CPU_PLAN + GPU_PLAN}
        unknown = [n for n in args.variants if n not in known]
        if unknown:
            parser.error(f"unknown variants {unknown}; the plan: {', '.join(v.name for v in plan)}")
        plan = tuple(known[n] for n in args.variants)
    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "gpu_step.json")
    deadline = time.perf_counter() + args.budget_s
    results = []
    print(f"{'variant':<30} {'ms/step':>9} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>8} {'compile':>7}", flush=True)
    for variant in plan:
        left = deadline - time.perf_counter()
        if left < variant.min_s:
            record = {"variant": variant.name, "skipped": "budget spent" if left < 20 else
                      f"needs at least {variant.min_s:.0f} s, {left:.0f} s left"}
        else:
            record = _child(variant, args, left)
        results.append(record)
        print(_line(record), flush=True)
        _write(path, {"budget_s": args.budget_s, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
