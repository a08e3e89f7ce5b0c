"""benchmarks/gpu_step.py's CPU dry run: the GPU benchmark's code, variant processes, profile and JSON."""
import gzip
import json
import os
import subprocess
import sys

from tests import no_tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_dry_run_times_every_variant_profiles_and_needs_no_tensorflow(tmp_path):
    """Run as on the lent GPU machine: TensorFlow, seqio and tensorflow_text are not importable."""
    view = no_tensorflow.site_view(str(tmp_path / "site"))
    proc = subprocess.run(no_tensorflow.command(view, os.path.join(ROOT, "benchmarks", "gpu_step.py"), "--output",
                                                str(tmp_path / "out"), "--platform", "cpu", "--steps", "3",
                                                "--timed-s", "1", "--budget-s", "1500"),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(tmp_path / "out" / "gpu_step.json"))["results"]
    assert [r["variant"] for r in results] == [
        "attention-check", "attention-kernels", "layer-norm-kernels", "gelu-kernels", "launch-cost",
        "attention-tuning", "feed-forward-tuning", "tiny-64-paper", "tiny-32-attn0-sorted-tanh"], proc.stdout
    check = results.pop(0)
    assert check["compared"] == "xla lengths vs xla mask" and check["agree_within_bf16"], check
    assert max(check["max_error_relative_to_max"].values()) == 0.0  # the two XLA forms compute the same
    # Ours against the written-out attention with its mask (on a GPU the check of its inline PTX).
    assert check["ours_within_bf16"] and set(check["ours_vs_reference_same_mask"]["ours"]) == {
        "out", "dq", "dk", "dv"}, check
    assert check["stacked"]["identical"], check["stacked"]  # our kernel, interpreted: stacked = three inputs
    assert check["stacked"]["dbias_error_relative_to_max"] < 2e-2, check["stacked"]  # bf16 sums
    assert len(check["stacked"]["forms"]) == 3, check["stacked"]  # cuDNN's on GPUs only
    assert all(t["ms_fwd_bwd"] > 0 for t in check["stacked"]["forms"].values()), check["stacked"]
    # The feed-forward's kernels (interpreted) and XLA's path in bf16 against XLA's in float32.
    assert check["feed_forward"]["within_bf16"] and set(check["feed_forward"]["errors"]["ours bf16"]) == {
        "output", "dx", "dw1", "db1", "dw2"}, check["feed_forward"]
    record = results.pop(0)
    kernels = record["forms"]
    assert len(kernels) == 6 and all(f.get("ms_fwd_bwd", 0) > 0 for f in kernels.values()), kernels  # Pallas interpreted
    # Ours (interpreted) against the written-out attention with its mask, in float32: within twice the
    # written-out attention's own bf16 error (plus 1%), as tests/test_fused_attention.py checks.
    same_mask = record["ours_vs_reference_same_mask"]
    for name, error in same_mask["ours"].items():
        assert error <= 2 * same_mask["written bf16"][name] + 0.01, same_mask
    # The residual LayerNorm's forms, and ours against the XLA path with its mask, as
    # tests/test_fused_layer_norm.py checks.
    record = results.pop(0)
    assert len(record["forms"]) == 5 and all(f.get("ms_fwd_bwd", 0) > 0 for f in record["forms"].values()), record
    same_mask = record["ours_vs_reference_same_mask"]
    assert set(same_mask["ours"]) == {"y", "da", "dbias", "dx", "dscale", "doffset"}, same_mask
    for name, error in same_mask["ours"].items():
        assert error <= 2 * same_mask["xla bf16"][name] + 0.01, same_mask
    # The GELU's three formulas; erf and erfc in bf16 within 2 bf16 ulps (2^-7) of float32 erf's.
    record = results.pop(0)
    assert len(record["forms"]) == 3 and all(f.get("ms_fwd_bwd", 0) > 0 for f in record["forms"].values()), record
    errors = record["ours_vs_reference_same_mask"]
    assert all(e <= 2.0 ** -7 for form in ("erf", "erfc") for e in errors[form].values()), errors
    # After the matmul: the tanh form written for cuBLAS's epilogue has the float32 formula's
    # gradients, and on a CPU (bf16 rounding at each operation) values within 2x its error + 0.5%.
    matmul = record["with_matmul"]
    assert all(f.get("ms_fwd_bwd", 0) > 0 for f in matmul["forms"].values()) and len(matmul["forms"]) == 3, matmul
    tanh, epilogue = matmul["against_float32"]["tanh"], matmul["against_float32"]["tanh-epilogue"]
    assert all(epilogue[n] == tanh[n] for n in ("dx", "dw", "dbias")), matmul
    assert epilogue["y"] <= 2 * tanh["y"] + 0.005, matmul
    # The cost of a small kernel: two chains of dependent reductions, kernels counted in their programs.
    record = results.pop(0)
    small, large = record["points"]
    assert large["k"] > small["k"] and large["kernels"] >= large["k"] > small["kernels"] >= small["k"], record
    assert large["ms_per_call"] > 0 and small["ms_per_call"] > 0 and "us per kernel" in proc.stdout, record
    assert all(0 < p["host_ms_per_call"] <= p["ms_per_call"] for p in record["points"]), record  # a prefix of it
    # Our attention kernel per configuration (interpreted: two), the forward alone and with the backward.
    record = results.pop(0)
    assert len(record["forms"]) == 2 and all(f["ms_fwd_bwd"] > 0 and f["ms_fwd"] > 0
                                             for f in record["forms"].values()), record
    # The feed-forward kernels per configuration (interpreted: two) beside XLA's path, each within
    # the two bf16 paths' differences of XLA's (tests/test_fused_feed_forward.py: about 1e-2 at most).
    record = results.pop(0)
    xla, *ours = record["forms"].values()
    assert len(ours) == 2 and all(f["ms_fwd_bwd"] > 0 and f["ms_fwd"] > 0 for f in [xla, *ours]), record
    assert "vs_xla" not in xla and all(set(f["vs_xla"]) == {"loss", "dx", "dw1", "db1", "dw2"} for f in ours), record
    assert all(0 < e <= 2e-2 for f in ours for e in f["vs_xla"].values()), record
    for r in results:
        assert set(r["phases_s"]) >= {"init", "warm_up"}, r
        assert "error" not in r, r
        assert r["timed_steps"] >= 3 and r["ms_per_step"] > 0 and r["forbidden_modules"] == []
        assert len(r["ms_per_step_pipelined"]) == 3 and min(r["ms_per_step_pipelined"]) > 0
        assert r["tokens_per_s"] > 0
        assert r["mfu"] is None  # no known peak for a CPU
    paper, fast = results
    assert (paper["attention"], paper["embedding_grad"]) == ("written out (dropout)", "scatter")
    assert (fast["attention"], fast["embedding_grad"]) == ("xla", "sorted")
    assert (paper["residual_norm"], fast["residual_norm"]) == ("xla", "pallas-interpret")
    assert paper["grad_norm"] == fast["grad_norm"] == "optax"  # grouped in GPU programs only
    assert fast["xla_flags"] == ["--xla_cpu_enable_fast_math=false"]
    profile = paper["profile"]["ms_per_step"]
    assert set(profile) == {"matmul", "attention", "scatter", "elementwise", "optimizer", "other"}
    # The step's matmuls and AdamW's update are found in the trace through the compiled HLO.
    assert profile["matmul"] > 0 and profile["optimizer"] > 0 and profile["elementwise"] > 0
    assert paper["profile"]["top_ops"] and "kernels ms/step" in proc.stdout
    # The profiled variant's own optimized HLO is kept, and its top kernels are placed in the model.
    assert paper["hlo"] == "hlo/tiny-64-paper.hlo.txt.gz" and "hlo" not in fast
    with gzip.open(tmp_path / "out" / paper["hlo"], "rt") as f:
        assert f.read().startswith("HloModule jit_train_step")
    placed = [op for op in paper["profile"]["top_ops"] if "model_op" in op]
    assert placed and all(op["launches"] >= 1 and op["bytes"] > 0 for op in placed)
    assert any("encoder/layer_" in op["model_op"] for op in placed), paper["profile"]["top_ops"]


def test_a_spent_budget_skips_the_rest_and_still_writes_the_json(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_step.py"), "--output",
                           str(tmp_path), "--platform", "cpu", "--budget-s", "0"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(tmp_path / "gpu_step.json"))["results"]
    assert [r.get("skipped") for r in results] == ["budget spent"] * 9  # the CPU plan, none run


def test_kernels_run_as_cuda_graphs_are_attributed_by_their_kernel_names():
    """On a GPU, XLA runs most of a step as command buffers: the trace's `hlo_op` is then the
    command buffer and the kernel is named after its HLO instruction ('.' and '-' as '_')."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import gpu_step

    from pmi_jax import hlo

    def f(x, w):
        return jnp.tanh(x @ w) * 2.0 + 1.0

    x = jnp.ones((64, 32))
    text = jax.jit(f).lower(x, jnp.ones((32, 16))).compile().as_text()
    categories, kernels = hlo.categories(text), hlo.program_kernels(text)
    matmul = next(k.name for k in kernels if k.category == "matmul")
    fusion = next((k.name for k in kernels if k.category == "elementwise"), None)
    device = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}]

    clock = [0.0]

    def kernel(name, us, op="command_buffer_1", gap=10.0):  # each kernel starts `gap` us after the last ends
        clock[0] += gap
        event = {"ph": "X", "pid": 7, "ts": clock[0], "name": name, "dur": us,
                 "args": {"hlo_op": op, "hlo_module": "jit_f"}}
        clock[0] += us
        return event

    events = device + [kernel(hlo.kernel_name(matmul), 3000.0),
                       kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1000.0),
                       kernel("cudnn_generated_fort_native_sdpa_sm90", 500.0),
                       kernel("loop_add_fusion_99", 250.0),
                       kernel("some_memcpy", 100.0, gap=700.0),
                       {"ph": "X", "pid": 8, "ts": 0.0, "name": "host work", "dur": 9e6, "args": {}}]
    if fusion is not None:
        events.append(kernel(hlo.kernel_name(fusion), 2000.0))
    out = gpu_step.kernel_times(events, categories, "jit_f", steps=2, kernels=kernels)
    ms = out["ms_per_step"]
    assert ms["matmul"] == 2.0 and ms["attention"] == 0.25 and ms["other"] == 0.05
    assert ms["elementwise"] == 0.125 + (1.0 if fusion is not None else 0.0)
    assert out["kernel_ms_per_step"] == round(sum(ms.values()), 3)
    # The device's idle time between its kernels (the host's events are not the device's): gaps of
    # 10 us but one of 700 us before the memcpy, over 2 steps.
    gaps = 5 if fusion is not None else 4  # between 6 (5) kernels
    assert out["idle_ms_per_step"] == round((700 + 10 * (gaps - 1)) / 1e3 / 2, 3)
    assert out["longest_gaps"][0] == {"us": 700.0, "after": "loop_add_fusion_99", "before": "some_memcpy"}
    assert out["top_ops"][0]["op"].startswith(hlo.kernel_name(matmul))
    # A kernel found in the HLO carries its bytes by shape (x, w and the [64, 16] f32 result, each
    # once) and the operation it computes.
    assert out["top_ops"][0]["bytes"] == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert out["top_ops"][0]["model_op"] == "dot_general"


def test_a_variant_is_not_started_without_its_minimum_time(tmp_path):
    """Batch 128 needs more than a few seconds to compile: with less than its `min_s` left a
    variant is recorded as skipped with the reason, not started and killed mid-compile."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_step.py"), "--output",
                           str(tmp_path), "--platform", "cpu", "--budget-s", "60",
                           "--variants", "base-512-paper-b128", "base-128-paper-b128"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(tmp_path / "gpu_step.json"))["results"]
    assert [r["variant"] for r in results] == ["base-512-paper-b128", "base-128-paper-b128"]
    assert all(r["skipped"].startswith("needs at least") for r in results), results


def test_ptx_loops_are_counted_per_trip():
    """`pallas_attention_compile.loop_mix` (the `--ptx` counts): a loop is a label and the backward
    branch to it; predicated instructions count, labels, directives and comments do not."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import pallas_attention_compile

    ptx = "\n".join([
        ".visible .entry attention_dropout_forward(", ".param .u64 p0", ")", "{", "\tmov.u32 \t%r1, 0;",
        "$L__BB0_1:", "\t// a comment", "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r2}, %rd1;",
        "\txor.b32 \t%r3, %r3, %r4;", "\tshr.u32 \t%r4, %r3, 16;", "\tex2.approx.f32 \t%r5, %r6;",
        "\tdiv.full.f32 \t%r7, %r8, %r9;", "\tsetp.lt.s32 \t%p1, %r1, 8;", "@%p1 bra \t$L__BB0_1;",
        "$L__BB0_2:", "\tadd.s32 \t%r1, %r1, 1;", "\tret;", "}"])
    [loop] = pallas_attention_compile.loop_mix(ptx)
    assert (loop["instructions"], loop["mma"], loop["special"]) == (7, 1, 2)
    assert loop["top"]["xor.b32"] == 1 and loop["top"]["bra"] == 1
    # An inline-asm block counts each instruction in it (its register declaration is no instruction).
    asm = "\t{ .reg .f32 t; fma.rn.f32 t, %r1, 0f3E38AA3B, %r2; ex2.approx.ftz.f32 %r3, t; }"
    [loop] = pallas_attention_compile.loop_mix(ptx.replace("\tex2.approx.f32 \t%r5, %r6;", asm))
    assert (loop["instructions"], loop["special"]) == (8, 2) and loop["top"]["fma.rn.f32"] == 1


def test_sass_loops_are_counted_per_trip():
    """`pallas_attention_compile.sass_mix` (the `--sass` counts) on an nvdisasm listing: a loop runs
    from a label to the branch back to it, predicated instructions count under their opcode, and the
    one-instruction loop that ends every kernel is not a loop of the kernel's."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import pallas_attention_compile

    sass = "\n".join([
        "attention_dropout_forward:", "        /*0000*/                   LDC R1, c[0x0][0x28] ;",
        ".L_x_1:", "        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;",
        "        /*0020*/                   FFMA R36, R37, 0.18033687770366668701, R102 ;",
        "        /*0030*/                   MUFU.EX2 R28, R36 ;",
        "        /*0040*/              @!P4 FMUL R28, R28, R28 ;",
        "        /*0050*/                   FFMA R37, R40, 0.18033687770366668701, R102 ;",
        "        /*0060*/               @P0 BRA `(.L_x_1) ;", "        /*0070*/                   EXIT ;",
        ".L_x_2:", "        /*0080*/                   BRA `(.L_x_2);"])
    [loop] = pallas_attention_compile.sass_mix(sass)
    assert (loop["instructions"], loop["mma"], loop["special"]) == (6, 1, 1), loop
    assert loop["top"] == {"FFMA": 2, "HGMMA.64x64x16.F32.BF16": 1, "MUFU.EX2": 1, "FMUL": 1, "BRA": 1}
