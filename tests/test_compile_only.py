"""Compile-only training for TPU slices and GPUs: slice names, and real compiles of `tiny` when
libtpu or JAX's CUDA plugin is there.

libtpu is found installed, or in `.venv/libtpu` where `python3 dev.py test` puts it (a folder of
its own, so that the CPU processes of the rest of the suite never load it: with libtpu importable
every JAX process probes for a TPU first); the CUDA plugin likewise in `.venv/cuda12`. The
compiles run in subprocesses that have them on their path.
"""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pmi_jax import compile_only
from pmi_jax.errors import UserInputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-c", "import sys; from pmi_jax.cli import main; sys.exit(main())"]
TINY = ["model.vocab_size=1000", "data.seq_len=64", "train.batch_size=16"]
LIBTPU_DIR = os.path.join(ROOT, ".venv", "libtpu")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None or os.path.isdir(os.path.join(LIBTPU_DIR, "libtpu"))
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install -c constraints.txt "
                                  "-e '.[tpu]', or `python3 dev.py test`, which puts it in .venv/libtpu)")


CUDA12_DIR = os.path.join(ROOT, ".venv", "cuda12")
HAS_CUDA_PLUGIN = (importlib.util.find_spec("jax_cuda12_plugin") is not None
                   or os.path.isdir(os.path.join(CUDA12_DIR, "jax_plugins")))
needs_cuda_plugin = pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="JAX's CUDA plugin is not installed (pip install "
                                       "-c constraints.txt jax-cuda12-plugin jax-cuda12-pjrt, or `python3 dev.py "
                                       "test`, which puts it in .venv/cuda12)")


def _cuda_env() -> dict:
    # JAX_PLATFORMS=cpu: the plugin describes the GPU for the compiler without looking for one.
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, CUDA12_DIR if os.path.isdir(CUDA12_DIR) else None, os.environ.get("PYTHONPATH")) if p))


def _libtpu_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, LIBTPU_DIR if os.path.isdir(LIBTPU_DIR) else None, os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("name, topology", [
    ("v5p-8", "v5p:2x2x1"), ("v4-32", "v4:2x2x4"), ("v4-64", "v4:2x4x4"), ("v4-128", "v4:4x4x4"),
    ("v5p-256", "v5p:4x4x8"), ("v5e-16", "v5e:4x4"), ("v5e-32", "v5e:4x8"),
    ("v6e-8", "v6e:2x4"), ("v6e-1", "v6e:1x1"), ("v5p:2x2x2", "v5p:2x2x2"), ("V5E-4", "v5e:2x2")])
def test_slice_names_become_googles_topologies(name, topology):
    assert compile_only.slice_topology(name)[1] == topology


@pytest.mark.parametrize("name", ["v3-8", "v5p-12", "v4-7", "v5e:4x4x4", "v5p:2x2", "tpu", "v6e-0"])
def test_unknown_slices_are_user_errors(name):
    with pytest.raises(UserInputError, match="--topology"):
        compile_only.slice_topology(name)


def _last_json(script: str, overrides: list[str], env: dict):
    """Run a compile script in its own process (its own plugin on the path) and return the JSON of
    its last stdout line."""
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(overrides)], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _config(*overrides):
    from pmi_jax.config import load_config
    from pmi_jax.config import apply_overrides

    return apply_overrides(load_config("tiny"), TINY + list(overrides))


_COMPILE_V4 = """
import dataclasses, json, sys
from pmi_jax import compile_only
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides
config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]))
report, _ = compile_only.compile_train_step(config, "v4-32")
print(json.dumps(dataclasses.asdict(report) | {"fits": report.fits, "lines": report.lines()}))
"""


@needs_libtpu
def test_tiny_compiles_for_a_v4_slice_with_one_device_per_chip():
    """v4-32 is 16 chips on 4 hosts; in megacore mode that is 16 devices, and the figures
    are internally consistent: the replicated state is params + AdamW's two moments."""
    import jax

    from pmi_jax import flops
    from pmi_jax.model import BertForMaskedLM

    overrides = TINY + ["model.scan_layers=true", "model.remat=dots_saveable"]
    report = _last_json(_COMPILE_V4, overrides, _libtpu_env())
    config = _config("model.scan_layers=true", "model.remat=dots_saveable")
    assert (report["topology"], report["num_devices"], report["num_hosts"]) == ("v4:2x2x4", 16, 4)
    assert report["mesh"] == {"data": 16, "fsdp": 1, "model": 1}
    params = jax.eval_shape(lambda: BertForMaskedLM(config.model).init(
        jax.random.key(0), jax.numpy.zeros((1, 64), "int32"), jax.numpy.ones((1, 64), "int32"), deterministic=True))
    num_params = sum(x.size for x in jax.tree.leaves(params))
    assert 3 * 4 * num_params <= report["state_bytes"] <= 3 * 4 * num_params + 64  # + step, count, rng
    assert report["batch_bytes"] == 4 * 16 * 64 * 4 // 16  # four [16, 64] 4-byte arrays split 16 ways
    assert report["fits"] and report["hbm_bytes"] == 32 * 2**30
    assert report["total_bytes"] >= report["state_bytes"] + report["temp_bytes"]
    per_device = flops.training_flops_per_token(config.model, 64) * 16 * 64 / 16
    assert report["formula_flops"] == pytest.approx(per_device)
    assert report["compiler_flops"] > 0
    assert any("fits" in line for line in report["lines"])


@needs_libtpu
def test_cli_compile_only_prints_the_report_and_reads_no_data(tmp_path):
    env = _libtpu_env()
    sets = [a for s in TINY for a in ("--set", s)]
    proc = subprocess.run([*CLI, "train", "--config", "tiny", "--compile-only",
                           "--topology", "v5e-4", *sets], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "topology v5e:2x2: 4 devices" in proc.stdout and ": fits" in proc.stdout
    assert os.listdir(tmp_path) == []  # nothing written


def test_cli_compile_only_needs_the_sizes_a_corpus_would_give():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([*CLI, "train", "--config", "base", "--compile-only",
                           "--topology", "v5p-8"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("set model.vocab_size and data.seq_len (via --set)")


def test_a_program_that_does_not_fit_is_reported_as_such():
    report = compile_only.CompileReport(
        topology="v5e:4x4", num_devices=16, num_hosts=4, mesh={}, hbm_bytes=16 * 2**30, state_bytes=2**30,
        batch_bytes=0, temp_bytes=20 * 2**30, code_bytes=0, total_bytes=21 * 2**30, compiler_flops=1.0,
        formula_flops=1.0, estimated_seconds=None, peak_flops=197e12)
    assert not report.fits and report.estimated_mfu is None
    text = "\n".join(report.lines())
    assert "DOES NOT FIT" in text and "not available" in text


_COMPILE_VARIANTS = """
import hashlib, json, re, sys
from pmi_jax import compile_only
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides
out = {}
for setting in ("cpu", "never", "always"):
    config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]) + [f"model.xla_cpu_variants={setting}"])
    _, compiled = compile_only.compile_train_step(config, "v5e-4")
    text = re.sub(r"^HloModule [^\\n]*", "", compiled.as_text())  # the module's name line
    out[setting] = hashlib.sha256(text.encode()).hexdigest()
print(json.dumps(out))
"""


@needs_libtpu
def test_a_tpu_program_gets_the_plain_kernels_by_default():
    """xla_cpu_variants=cpu (the default) compiles, for a TPU slice on this CPU machine, the very
    program that `never` compiles, and not the one `always` does: the trainer settles the
    setting by the platform it compiles for, not by the machine it runs on."""
    programs = _last_json(_COMPILE_VARIANTS, TINY, _libtpu_env())
    assert programs["cpu"] == programs["never"] != programs["always"]


_COMPILE_MOSAIC = """
import json, re, sys
from pmi_jax import compile_only
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides
config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]))
report, compiled = compile_only.compile_train_step(config, "v5p-8")
text = compiled.as_text()
calls = re.findall(r"^\\s*%[\\w.\\-]+ = (.*?) custom-call\\(.*custom_call_target=\\"tpu_custom_call\\"", text, re.M)
print(json.dumps({"calls": calls, "all_gathers": len(re.findall(r" all-gather(?:-start)?\\(", text)),
                  "fits": report.fits}))
"""


@needs_libtpu
def test_the_tpu_attention_kernel_compiles_for_a_v5p_slice_on_each_chips_rows():
    """model.attention=pallas with the paper's attention dropout, compiled for a v5p-8 (4 chips,
    batch 16 split 4 ways): Mosaic takes the kernels (a forward and a backward call per layer), each
    on one chip's 4 sequences, and the program gathers nothing (unpartitioned, XLA would all-gather
    the activations onto every chip)."""
    report = _last_json(_COMPILE_MOSAIC, TINY + ["model.attention=pallas", "model.attention_dropout_rate=0.1"],
                        _libtpu_env())
    assert len(report["calls"]) == 2 * 2  # tiny has 2 layers
    assert all(re.search(r"\[4,64,64\]", shapes) for shapes in report["calls"]), report["calls"]
    assert report["all_gathers"] == 0 and report["fits"]


@needs_libtpu
def test_cli_compile_only_refuses_a_sequence_the_tpu_kernel_cannot_hold(tmp_path):
    """Over 512 keys the TPU kernel's rows no longer fit VMEM: one line naming the setting and the fix,
    exit status 2, nothing written."""
    sets = [a for s in ["model.vocab_size=1000", "data.seq_len=1024", "model.max_position_embeddings=1024",
                        "train.batch_size=16", "model.attention=pallas"] for a in ("--set", s)]
    proc = subprocess.run([*CLI, "train", "--config", "tiny", "--compile-only", "--topology", "v5p-8", *sets],
                          env=_libtpu_env(), cwd=tmp_path, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "data.seq_len=1024 with model.attention=pallas" in last and "model.attention=auto" in last, last
    assert os.listdir(tmp_path) == []


_COMPILE_GPU = """
import dataclasses, json, sys
from pmi_jax import compile_only
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides
config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]))
report, _ = compile_only.compile_train_step(config, "h100")
kernels = [dataclasses.asdict(k) for k in report.top_kernels]
print(json.dumps(dataclasses.asdict(report) | {"fits": report.fits, "lines": report.lines(), "top_kernels": kernels}))
"""


@needs_cuda_plugin
def test_tiny_compiles_for_an_h100_and_its_kernels_are_named():
    """No GPU here: the program XLA:GPU builds for an H100 (cuDNN attention without attention
    dropout), with FLOPs and bytes from its HLO. The matmul FLOPs by shape agree with the formula
    (cuDNN's backward recomputes the scores: a few percent more at this length), the bytes are at
    least the state read and written once, and the largest kernels are placed in the model."""
    from pmi_jax import flops

    overrides = TINY + ["model.attention_dropout_rate=0", "model.dtype=bfloat16"]
    report = _last_json(_COMPILE_GPU, overrides, _cuda_env())
    config = _config("model.attention_dropout_rate=0", "model.dtype=bfloat16")
    assert report["topology"] == "h100 (NVIDIA H100 80GB HBM3)" and report["num_devices"] == 1
    assert report["hbm_bytes"] == 84978434048 and report["fits"] and report["bandwidth"] == 3.35232e12
    assert report["formula_flops"] == pytest.approx(flops.training_flops_per_token(config.model, 64) * 16 * 64)
    assert 1.0 <= report["compiler_flops"] / report["formula_flops"] < 1.05
    assert report["hlo_bytes"] >= 2 * report["state_bytes"]  # parameters and AdamW's moments in and out
    assert report["estimated_seconds"] is None and report["roofline_seconds"] > report["hlo_bytes"] / 3.35232e12 * 0.99
    top = report["top_kernels"]
    assert len(top) == compile_only.TOP_KERNELS and [k["bytes"] for k in top] == sorted(
        (k["bytes"] for k in top), reverse=True)
    assert any(k["op"].startswith(("forward encoder/layer_", "backward encoder/layer_")) for k in top), top
    # tiny's two layers run their identical fusions as one kernel each: two launches, both layers.
    assert any(k["launches"] == 2 and k["layers"] == [0, 1] and "layer_*" in k["op"] for k in top), top
    text = "\n".join(report["lines"])
    assert "kernels moving the most bytes" in text and "TB/s" in text


_COMPILE_GPU_NORM = """
import json, sys
from pmi_jax import compile_only, hlo, train
from pmi_jax.config import apply_overrides, load_config
config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]))
out = {}
for grouped in (True, False):
    if not grouped:  # what the step would be with optax's norm
        train.grouped_norm_applies = lambda mesh, param_shardings: False
    report, compiled = compile_only.compile_train_step(config, "h100")
    out[str(grouped)] = {"launches": len(hlo.program_kernels(compiled.as_text())), "bytes": report.hlo_bytes}
print(json.dumps(out))
"""


@needs_cuda_plugin
def test_an_h100_step_takes_the_gradient_norm_in_few_kernels():
    """The GPU step's default norm (`optimizer.global_norm`, grouped: all of tiny's 42 parameters
    are small leaves) launches at least 25 fewer kernels than optax's one or two per leaf, for the
    same bytes within 1% (27 fewer with the fused LayerNorm, the GPU default since 2026-11-28;
    35 with XLA's LayerNorm)."""
    report = _last_json(_COMPILE_GPU_NORM, TINY + ["model.attention_dropout_rate=0", "model.dtype=bfloat16"],
                        _cuda_env())
    grouped, optax_norm = report["True"], report["False"]
    assert grouped["launches"] <= optax_norm["launches"] - 25, report
    assert grouped["bytes"] == pytest.approx(optax_norm["bytes"], rel=0.01), report


_COMPILE_GPU_CHOICES = """
import json, math, re, sys
from pmi_jax import compile_only, hlo
from pmi_jax.config import apply_overrides, load_config
out = {}
paper = ["model.attention_dropout_rate=0.1"]
for name, change in (("default", []), ("tanh", ["model.gelu=tanh"]), ("bits16", ["model.dropout_mask=bits16"]),
                     ("paper", paper), ("paper-4-layers", paper + ["model.num_layers=4"]),
                     ("looped-12", ["model.num_layers=12"]),
                     ("stacked-12", ["model.num_layers=12", "model.scan_layers=true"])):
    config = apply_overrides(load_config("tiny"), json.loads(sys.argv[1]) + change)
    report, compiled = compile_only.compile_train_step(config, "h100")
    text = compiled.as_text()
    module, vocab = hlo.parse(text), str(config.model.padded_vocab_size)
    hidden = config.train.batch_size * config.data.seq_len * config.model.hidden_size
    masks = [i.name for _, i in hlo.kernels(module)
             for dims in re.findall(r"(?:pred|u32)\\[([0-9,]+)\\]", i.shape)
             if dims.endswith(f",{config.model.hidden_size}") and math.prod(map(int, dims.split(","))) >= hidden // 4]
    f32_vocab_gemms = [i.name for c, i in hlo.kernels(module) if hlo.category(module, i) == "matmul"
                       for shape in map(lambda o: module.shape_of(c, o), i.operands)
                       if shape.startswith("f32[") and vocab in (dims := shape[4:].split("]")[0].split(","))
                       and len(dims) > 1]  # (the forward's float32 output bias is a vector)
    random_words = [i.name for _, i in hlo.kernels(module) if set(re.findall(r"(\\w+)\\[", i.shape)) == {"u32"}]
    kernels = hlo.program_kernels(text)
    out[name] = {"bytes": report.hlo_bytes, "launches": len(kernels),
                 "optimizer_launches": sum(k.category == "optimizer" for k in kernels),
                 "loops": sum(i.opcode == "while" for c in module.computations.values() for i in c),
                 "gelu_epilogues": len(re.findall('"epilogue":"BIAS_GELU', text)), "mask_kernels": masks,
                 "f32_vocab_gemms": f32_vocab_gemms, "random_words": random_words,
                 "exp2_asm": sorted(set(re.findall(
                     r"fma\\.rn\\.f32 t, \\$1, (0f[0-9A-F]{8}), \\$2; ex2\\.approx\\.ftz", text)))}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def h100_choices():
    """tiny's H100 step without attention dropout as settled (erf GELU, hashed hidden dropout),
    with `model.gelu=tanh` and with `model.dropout_mask=bits16`, in the paper's setting (the
    Triton attention with its dropout) with two and four layers, and with twelve layers looped and
    scanned unrolled: bytes, launches (the optimizer's apart), loops, GELU epilogues,
    the kernels writing a hidden-dropout-sized bool or uint32 array, the matmuls reading a float32
    matrix over the vocabulary and the kernels writing only uint32 (random words), compiled once
    for the tests below."""
    return _last_json(_COMPILE_GPU_CHOICES, TINY + ["model.attention_dropout_rate=0", "model.dtype=bfloat16"],
                      _cuda_env())


@needs_cuda_plugin
def test_an_h100_step_computes_the_tanh_gelu_in_the_matmuls(h100_choices):
    """With `model.gelu=tanh` cuBLAS computes each GELU in the epilogue of the matmul before it
    (tiny's two feed-forward blocks and the MLM head's transform): no GELU kernel of its own, so
    fewer launches and bytes than the erf GELU, which cuBLAS has no epilogue for."""
    erf, tanh = h100_choices["default"], h100_choices["tanh"]
    assert (erf["gelu_epilogues"], tanh["gelu_epilogues"]) == (0, 3), h100_choices
    assert tanh["launches"] < erf["launches"] and tanh["bytes"] < erf["bytes"], h100_choices


@needs_cuda_plugin
def test_an_h100_step_writes_no_hidden_dropout_mask(h100_choices):
    """The GPU programs' hidden dropout (`dropout_mask=auto`: hash) is computed in the kernels that
    apply it: no kernel writes a bool or uint32 array over the hidden axis of a quarter of the
    hidden states' entries or more, where 16-bit threefry masks (`bits16`) are written ahead, and
    the step moves fewer bytes."""
    hashed, bits16 = h100_choices["default"], h100_choices["bits16"]
    assert hashed["mask_kernels"] == [] and bits16["mask_kernels"], h100_choices
    assert hashed["bytes"] < bits16["bytes"], h100_choices


@needs_cuda_plugin
def test_an_h100_step_differentiates_the_tied_decoder_in_bf16(h100_choices):
    """The MLM decoder's float32 logits are differentiated in the compute dtype (`model._tied_logits`):
    no matmul of the step reads a float32 matrix over the vocabulary, where autodiff's float32
    logit gradient made XLA:GPU run both backward products in float32 on the float32 table (two
    such matmuls with `model.decoder_grad=float32`)."""
    assert all(choice["f32_vocab_gemms"] == [] for choice in h100_choices.values()), h100_choices


@needs_cuda_plugin
def test_an_h100_step_draws_every_layers_dropout_streams_at_once(h100_choices):
    """`BertEncoder` draws all layers' hashed-dropout streams (two hidden dropouts and the attention's
    heads a layer) in one draw: two more layers add at most two kernels writing random words each
    (their row words and the attention kernel's copy of its streams), where a draw per module took
    ten to twelve a layer (key derivation, draw, slices, words)."""
    two, four = (h100_choices[name]["random_words"] for name in ("paper", "paper-4-layers"))
    assert len(four) - len(two) <= 2 * 2, h100_choices


@needs_cuda_plugin
def test_an_h100_step_on_unrolled_stacked_layers_updates_each_kind_of_parameter_once(h100_choices):
    """Twelve scanned layers, unrolled in a GPU program (`model.scan_unroll=0`, the default), run
    without a loop on stacked parameters: AdamW updates them in a third of the kernels or fewer (111 -> 25),
    the step launches fewer in all, and moves the same bytes within 3% (less here; BERT-base's
    stacked weights are sliced once more). With two or four layers XLA splits each update into
    per-layer parts and launches more (benchmarks/README.md, "Stacked parameters, unrolled layers")."""
    looped, stacked = h100_choices["looped-12"], h100_choices["stacked-12"]
    assert (looped["loops"], stacked["loops"]) == (0, 0), h100_choices
    assert stacked["optimizer_launches"] * 3 <= looped["optimizer_launches"], h100_choices
    assert stacked["launches"] < looped["launches"], h100_choices
    assert stacked["bytes"] == pytest.approx(looped["bytes"], rel=0.03), h100_choices


@needs_cuda_plugin
def test_an_h100_steps_attention_kernels_take_exp2_in_one_multiply_add_without_denormals(h100_choices):
    """In the paper's setting the Triton attention kernels compute each probability as one fused
    multiply-add (by 1/sqrt(head dim) log2 e on full key blocks, by 1 on the partial one) and a
    flush-to-zero exp2, inline PTX (`fused_attention._exp2`); programs without our kernel have none."""
    factor = np.float32(_config().model.head_dim ** -0.5 * math.log2(math.e)).view(np.uint32)
    assert h100_choices["paper"]["exp2_asm"] == sorted(["0f3F800000", f"0f{factor:08X}"]), h100_choices
    assert h100_choices["default"]["exp2_asm"] == [], h100_choices


def test_cli_gpu_compile_only_without_the_plugin_names_the_fix():
    if HAS_CUDA_PLUGIN and importlib.util.find_spec("jax_cuda12_plugin") is not None:
        pytest.skip("the CUDA plugin is importable here: the command would compile")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               JAX_PLATFORMS="cpu")
    sets = [a for s in TINY for a in ("--set", s)]
    proc = subprocess.run([*CLI, "train", "--config", "tiny", "--compile-only", "--topology", "h200", *sets],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "--topology h200" in last and "pip install -c constraints.txt jax-cuda12-plugin jax-cuda12-pjrt" in last
