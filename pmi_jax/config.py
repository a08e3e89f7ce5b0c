"""Experiment configuration: one frozen dataclass tree per run, overridable from the command line.

An experiment file in `configs/` is a plain Python file whose `get_config()` returns an
`ExperimentConfig`; it chooses the model size, the corpus, the masking scheme and every
training hyper-parameter. `apply_overrides` then edits any field by its dotted name
(`model.num_layers=2`, `train.batch_size=64`), parsing the value according to the field's
declared type, so that a typo in a name or a value fails before anything is compiled.

This module imports nothing heavier than the standard library: the CLI reads configs
before it pays for JAX.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import typing
from typing import Any

from pmi_jax.errors import UserInputError

# Masking schemes (docs/design.md, "Masking schemes"), defined once here for the CLI and pmi_jax.masking. The PMI
# family needs a prepared unit vocabulary of the same name; informask needs the token rates that
# `pmi-jax corpus informask` computes on the prepared corpus; the others work on any corpus.
PAPER_SCHEMES = ("random_token", "whole_word", "random_span", "frequency", "naive_pmi", "pmi")  # Levine et al.'s six
SCHEMES = PAPER_SCHEMES + ("informask",)  # and InforMask (Sadeq et al. 2022), after the paper
UNIT_SCHEMES = ("frequency", "naive_pmi", "pmi")
TOKEN_RATE_SCHEMES = ("informask",)
SYNTHETIC = "synthetic"  # data.data_dir (--data) of the built-in toy corpus, pmi_jax.batches.SyntheticBatches
REMAT_POLICIES = ("none", "full", "dots_saveable")
# How the masking rate moves over training (docs/design.md, "Masking rate"): constant, or from
# data.mask_rate to data.mask_rate_end over train.num_steps, linearly or along a half cosine.
MASK_RATE_SCHEDULES = ("constant", "linear", "cosine")
MASK_RATE = 0.15  # the paper's (and BERT's) share of the non-special tokens selected
MASK_RATE_UNIT = 10_000  # rates are whole basis points, so every budget is integer arithmetic
PRNG_IMPLS = ("threefry", "rbg", "unsafe_rbg")
XLA_CPU_VARIANTS = ("cpu", "always", "never")
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "pallas-triton", "pallas-mosaic", "pallas-interpret")
PALLAS_ATTENTION = ("pallas", "pallas-triton", "pallas-mosaic", "pallas-interpret")
EMBEDDING_GRADS = ("auto", "scatter", "sorted")
DECODER_GRADS = ("auto", "float32", "compute")
DROPOUT_MASKS = ("auto", "bernoulli", "bits16", "hash")
GELUS = ("erf", "tanh", "tanh-epilogue")
FUSED_QKV = ("auto", "always", "never")
RESIDUAL_NORMS = ("auto", "xla", "pallas", "pallas-triton", "pallas-interpret")
FEED_FORWARDS = ("xla", "pallas", "pallas-triton", "pallas-interpret")

@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """BERT encoder sizes (Devlin et al. 2019); parameters are always float32.

    `dtype` is the compute dtype of activations and matmuls ("float32" or "bfloat16");
    softmax, LayerNorm statistics, logits and the loss stay in float32.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    dtype: str = "float32"
    # Embedding and decoder rows are padded to a multiple of this (Megatron's
    # make-vocab-size-divisible-by), so that any vocabulary splits over any `model` axis; the
    # padded ids never win a softmax, are never drawn as random replacements and are cut from
    # exported checkpoints. 1 turns padding off.
    vocab_multiple: int = 128
    # MLM predictions per sequence: the head (transform + tied decoder) runs on this many
    # gathered positions instead of all of them, as google-research/bert does. 0: derived
    # from the sequence length as BERT did (20 for 128, 80 for 512; `max_predictions`);
    # -1: logits at every position (the full [batch, length, vocab] head).
    max_predictions_per_seq: int = 0
    # Layers as one `nn.scan` over stacked parameters (compile time flat in depth); the
    # parameter tree then holds `encoder/layers` with a leading layer axis instead of
    # `encoder/layer_<i>` (`pmi_jax.model.unstack_layers` converts).
    scan_layers: bool = False
    # Layers per trip of that scan's loop; num_layers (or more) unrolls it: the layers run one
    # after another as in the loop, on the stacked parameters, so a GPU program updates each kind
    # of parameter in one optimizer kernel instead of one per layer. 0 ("auto"): every layer in
    # GPU programs, 1 elsewhere (`model.for_platform`; benchmarks/README.md, "Stacked parameters,
    # unrolled layers"). The parameters are those of any scan.
    scan_unroll: int = 0
    # Rematerialisation of each layer in the backward pass: none (keep every activation),
    # full (recompute the layer), dots_saveable (keep the weight matmuls' outputs, recompute
    # the rest, attention scores included).
    remat: str = "none"
    # Where the two XLA:CPU rewrites run (dropout masks from both 32-bit words of each
    # threefry block; the output-bias gradient as a matrix-vector product): "cpu" in programs
    # compiled for CPUs only, "always", or "never" (the plain `jax.random.bernoulli` and
    # reduction everywhere). Compiled for a TPU they cost time and memory (docs/tpu.md).
    xla_cpu_variants: str = "cpu"
    # Attention kernel. Without attention dropout: "cudnn" (cuDNN's fused flash attention, GPUs
    # with bfloat16 only), "xla" (jax.nn.dot_product_attention's XLA path), or "auto": cudnn in
    # programs compiled for GPUs where cuDNN applies, xla elsewhere (`pmi_jax.model.for_platform`);
    # with dropout, "xla" writes the scores, softmax and dropout out. "pallas": the Pallas
    # flash attention whose dropout mask is drawn inside the kernel from the step's dropout key
    # (`pmi_jax.fused_attention`, with or without dropout), settled to "pallas-triton" in GPU
    # programs, "pallas-mosaic" in TPU programs (`pmi_jax.tpu_attention`, the same masks) and
    # "pallas-interpret" (Pallas' interpreter: slow, for tests) in CPU programs. With dropout,
    # "auto" takes "pallas-triton" in bf16 GPU programs (measured 2.6 times faster per layer on an
    # H100) and writes the attention out elsewhere (docs/gpu.md, docs/tpu.md).
    attention: str = "auto"
    # Gradient of the word-embedding lookup: "scatter" (XLA's scatter-add of every token's
    # gradient, atomics on GPUs), "sorted" (the token ids sorted, then a sorted segment sum),
    # or "auto": sorted on GPUs, scatter elsewhere (benchmarks/README.md, "GPU").
    embedding_grad: str = "auto"
    # Gradient of the tied decoder's float32 logits in its two backward matmuls: "float32"
    # (autodiff's; XLA:GPU then runs both on the float32 table, TF32 on an H100), "compute"
    # (rounded once to the compute dtype: `pmi_jax.model._tied_logits`), or "auto": compute in GPU
    # programs, float32 elsewhere (a TPU reads the float32 gradient into its bf16 matmuls without
    # writing it; benchmarks/README.md, "The tied decoder's gradient").
    decoder_grad: str = "auto"
    # GELU form: "erf" (exact; transformers' BertModel, so exports give the same numbers) or
    # "tanh" (the approximation of google-research/bert's modeling.py; within 4.7e-4 of erf,
    # cheaper on some accelerators, but an exported model then computes slightly differently).
    # GPU programs compute "tanh" in cuBLAS's epilogue ("tanh-epilogue", `model.for_platform`).
    gelu: str = "erf"
    # Query, key and value as one matmul against the three kernels concatenated ([D, 3 x D]);
    # the parameters stay three, so checkpoints and exports are unchanged. "always", "never", or
    # "auto": in GPU programs only, where XLA merges the three matmuls anyway but leaves their bias
    # adds apart, which the fused matmul takes into cuBLAS's epilogue; a TPU program is estimated
    # slower with it (benchmarks/README.md, "Deviceless H100 programs as the device compiles them").
    fused_qkv: str = "auto"
    # Hidden-dropout masks where the XLA:CPU variant is off: "bernoulli" (`jax.random.bernoulli`,
    # one threefry block per element), "bits16" (16 bits per element, four elements per block;
    # keep probability round(0.9 x 2^16) / 2^16 for dropout 0.1: `pmi_jax.model._keep_mask16`),
    # "hash" (the fused LayerNorm kernel's rule, computed where it is applied and again in the
    # backward pass: `pmi_jax.model._hashed_dropout`), or "auto": hash in GPU programs, bernoulli
    # elsewhere. Attention dropout stays bernoulli (benchmarks/README.md, "Dropout masks from 16
    # bits", "Hidden dropout from a hash").
    dropout_mask: str = "auto"
    # Each layer's output bias, hidden dropout, residual and LayerNorm: "xla" (written as JAX ops;
    # XLA fuses them) or "pallas": one Pallas kernel forward and one backward, the dropout mask
    # drawn inside from the layer's dropout streams (`pmi_jax.fused_layer_norm`; fewer bytes per
    # step), settled to "pallas-triton" in GPU programs and "pallas-interpret" (slow, for tests) in
    # CPU programs; TPU programs take xla. "auto": pallas in bf16 GPU programs, xla elsewhere
    # (benchmarks/README.md, "Measured on a lent H200"). The parameters are the same either way.
    residual_norm: str = "auto"
    # The feed-forward's GELU: "xla" (kernels of its own between the matmuls) or "pallas": in the
    # first matmul's epilogue forward, and in the epilogue of the matmul that makes its gradient
    # (`pmi_jax.fused_feed_forward`; 288 MiB less per BERT-base layer at batch 32 x 512), settled
    # like residual_norm's; erf GELU only. Not yet timed on a GPU, so not a default
    # (benchmarks/README.md, "The bytes under the target"). The parameters are the same either way.
    feed_forward: str = "xla"

    def __post_init__(self):
        if isinstance(self.xla_cpu_variants, bool):  # a bool in configs saved before "cpu" existed
            object.__setattr__(self, "xla_cpu_variants", "cpu" if self.xla_cpu_variants else "never")
        if self.xla_cpu_variants not in XLA_CPU_VARIANTS:
            raise UserInputError(f"model.xla_cpu_variants={self.xla_cpu_variants!r}: expected one of "
                                 f"{', '.join(XLA_CPU_VARIANTS)}")
        if isinstance(self.fused_qkv, bool):  # saved before "auto" existed, whose default false auto replaces
            object.__setattr__(self, "fused_qkv", "always" if self.fused_qkv else "auto")
        if self.fused_qkv not in FUSED_QKV:
            raise UserInputError(f"model.fused_qkv={self.fused_qkv!r}: expected one of {', '.join(FUSED_QKV)}")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserInputError(f"model.{name}={getattr(self, name)}: a dropout rate must be in [0, 1) "
                                     "(0 turns it off; the paper's is 0.1)")
        if self.hidden_size % self.num_heads:
            raise UserInputError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.num_heads={self.num_heads}")
        if self.dtype not in ("float32", "bfloat16"):
            raise UserInputError(f"model.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")
        if self.vocab_multiple < 1:
            raise UserInputError(f"model.vocab_multiple={self.vocab_multiple}: must be at least 1")
        if self.max_predictions_per_seq < -1:
            raise UserInputError(f"model.max_predictions_per_seq={self.max_predictions_per_seq}: expected a "
                                 "positive count, 0 (derived from the length) or -1 (every position)")
        if self.dropout_mask not in DROPOUT_MASKS:
            raise UserInputError(f"model.dropout_mask={self.dropout_mask!r}: expected one of "
                                 f"{', '.join(DROPOUT_MASKS)}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise UserInputError(f"model.attention={self.attention!r}: expected one of "
                                 f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
        if self.attention == "cudnn" and self.attention_dropout_rate != 0.0:
            raise UserInputError(f"model.attention=cudnn needs model.attention_dropout_rate=0 (got "
                                 f"{self.attention_dropout_rate}): the fused kernel has no dropout that follows "
                                 "the training step's key (docs/gpu.md; model.attention=pallas has one)")
        if self.attention == "cudnn" and self.dtype != "bfloat16":
            raise UserInputError(f"model.attention=cudnn needs model.dtype=bfloat16 (got {self.dtype!r}): "
                                 "cuDNN's fused attention takes 16-bit inputs only")
        if self.attention in PALLAS_ATTENTION and not self.head_dim_fits_pallas:
            raise UserInputError(f"model.attention={self.attention} needs a head dimension that is a power of two of "
                                 f"at least 16 (got {self.head_dim} = hidden_size / num_heads): Triton's blocks")
        if self.embedding_grad not in EMBEDDING_GRADS:
            raise UserInputError(f"model.embedding_grad={self.embedding_grad!r}: expected one of "
                                 f"{', '.join(EMBEDDING_GRADS)}")
        if self.decoder_grad not in DECODER_GRADS:
            raise UserInputError(f"model.decoder_grad={self.decoder_grad!r}: expected one of "
                                 f"{', '.join(DECODER_GRADS)}")
        if self.residual_norm not in RESIDUAL_NORMS:
            raise UserInputError(f"model.residual_norm={self.residual_norm!r}: expected one of "
                                 f"{', '.join(RESIDUAL_NORMS)}")
        if self.gelu not in GELUS:
            raise UserInputError(f"model.gelu={self.gelu!r}: expected one of {', '.join(GELUS)}")
        if self.feed_forward not in FEED_FORWARDS:
            raise UserInputError(f"model.feed_forward={self.feed_forward!r}: expected one of "
                                 f"{', '.join(FEED_FORWARDS)}")
        if self.feed_forward != "xla" and self.gelu != "erf":
            raise UserInputError(f"model.feed_forward={self.feed_forward} computes the erf GELU: set model.gelu=erf "
                                 f"(got {self.gelu!r}) or model.feed_forward=xla")
        if self.remat not in REMAT_POLICIES:
            raise UserInputError(f"model.remat={self.remat!r}: expected one of {', '.join(REMAT_POLICIES)}")
        if self.scan_unroll < 0:
            raise UserInputError(f"model.scan_unroll={self.scan_unroll}: expected a number of layers, or 0 (auto)")
        if self.scan_unroll > 1 and not self.scan_layers:
            raise UserInputError(f"model.scan_unroll={self.scan_unroll} unrolls the scan of model.scan_layers=true: "
                                 "set that too (the loop without it is unrolled already)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def head_dim_fits_pallas(self) -> bool:
        """The Pallas attention's blocks need a head dimension that is a power of two of at least 16."""
        return self.head_dim >= 16 and not self.head_dim & (self.head_dim - 1)

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def predictions(self, seq_len: int, mask_rate: float = MASK_RATE) -> int:
        """Positions per sequence the MLM head runs on (the whole length for the full head);
        `mask_rate`: the highest masking rate the model will see (`DataConfig.highest_mask_rate`)."""
        if self.max_predictions_per_seq == -1:
            return seq_len
        return min(seq_len, self.max_predictions_per_seq or max_predictions(seq_len, mask_rate))


def max_predictions(seq_len: int, mask_rate: float = MASK_RATE) -> int:
    """BERT's max_predictions_per_seq for a length: the rate's share rounded up to a multiple of 4
    (at 15%: 20 for 128, 80 for 512; at 30%: 40 for 128, 156 for 512).

    The masking budget is floor(rate x the non-special tokens) (`pmi_jax.masking`), so it
    never exceeds this; random_span's is SpanBERT's ceil, at most ceil(rate x (seq_len - 2)),
    which can pass BERT's rounded share (13 against 12 for 83 tokens at 15%), so the larger of
    the two is rounded up. The trainer checks every batch and stops with an error if a budget
    exceeded it.
    """
    spans = -(-mask_rate_units(mask_rate) * max(seq_len - 2, 0) // MASK_RATE_UNIT)
    return -(-max(1, round(mask_rate * seq_len), spans) // 4) * 4


def mask_rate_units(rate: float, name: str = "data.mask_rate") -> int:
    """A masking rate in basis points (0.15 -> 1500); UserInputError unless it is a whole number
    of basis points in (0, 1]."""
    if not 0 < rate <= 1 or abs(rate * MASK_RATE_UNIT - round(rate * MASK_RATE_UNIT)) > 1e-6:  # NaN: not in (0, 1]
        raise UserInputError(f"{name}={rate}: expected a share in (0, 1] with at most 4 decimals, e.g. 0.15")
    return round(rate * MASK_RATE_UNIT)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which prepared corpus and masking scheme feed the model.

    0 in `seq_len` (and in `model.vocab_size`) means: take it from the corpus.
    """

    data_dir: str = ""
    scheme: str = "pmi"  # one of SCHEMES
    split: str = "train"
    seq_len: int = 0
    seed: int = 0  # masking and shuffling; independent of train.seed
    # The share of each sequence's non-special tokens selected for the loss (the budget is
    # floor(rate x tokens), `pmi_jax.masking.masking_budget`). With a linear or cosine
    # schedule it is the rate of step 0, and the rate moves to `mask_rate_end` at
    # train.num_steps (Ankner et al. 2023: 0.3 -> 0.15); a constant rate ignores `mask_rate_end`.
    mask_rate: float = MASK_RATE
    mask_rate_schedule: str = "constant"
    mask_rate_end: float = MASK_RATE
    # The fixed rate of validation during training, whatever the training rate, so that runs
    # trained at different rates are measured on the same task.
    eval_mask_rate: float = MASK_RATE

    def __post_init__(self):
        check_scheme(self.scheme, "data.scheme")
        mask_rate_units(self.mask_rate)
        mask_rate_units(self.eval_mask_rate, "data.eval_mask_rate")
        if self.mask_rate_schedule not in MASK_RATE_SCHEDULES:
            raise UserInputError(f"data.mask_rate_schedule={self.mask_rate_schedule!r}: expected one of "
                                 f"{', '.join(MASK_RATE_SCHEDULES)}")
        mask_rate_units(self.mask_rate_end, "data.mask_rate_end")

    @property
    def highest_mask_rate(self) -> float:
        """The most any batch is masked, training or validation: what the MLM head must gather."""
        end = self.mask_rate if self.mask_rate_schedule == "constant" else self.mask_rate_end
        return max(self.mask_rate, end, self.eval_mask_rate)


# What a resumed run keeps unless `train --allow-changed SETTING` says otherwise: a run whose
# masks, data or initialisation change midway is not the run its name and metadata describe
# (the model itself is checked apart, and never changes: pmi_jax.checkpoints.plan_resume).
RESUMED_SETTINGS = ("data.scheme", "data.mask_rate", "data.mask_rate_schedule", "data.mask_rate_end",
                    "data.eval_mask_rate", "data.seed", "data.data_dir", "train.seed")


def check_resumed_settings(names, option: str = "--allow-changed") -> tuple[str, ...]:
    """The settings a resumed run may change, each one of RESUMED_SETTINGS."""
    for name in names:
        if name not in RESUMED_SETTINGS:
            raise UserInputError(f"{option} {name}: not a setting a resumed run keeps; one of "
                                 f"{', '.join(RESUMED_SETTINGS)}")
    return tuple(dict.fromkeys(names))


def check_scheme(scheme: str, source: str) -> None:
    """The one check of a scheme name; `source` names where the value came from."""
    if scheme not in SCHEMES:
        raise UserInputError(f"{source} {scheme!r}: not a masking scheme; choose one of {', '.join(SCHEMES)}")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with the paper's (Table 5) hyper-parameters; warmup then linear decay to zero."""

    peak_learning_rate: float = 1e-4
    warmup_steps: int = 10_000
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01
    grad_clip_norm: float = 1.0  # 0 disables clipping
    grad_accum_steps: int = 1  # micro-batches per optimizer step (scanned inside one jit)

    def __post_init__(self):
        for name, ok, expected in (
                ("peak_learning_rate", self.peak_learning_rate >= 0, "at least 0"),
                ("warmup_steps", self.warmup_steps >= 0, "at least 0"),
                ("b1", 0 <= self.b1 < 1, "in [0, 1)"), ("b2", 0 <= self.b2 < 1, "in [0, 1)"),
                ("eps", self.eps > 0, "above 0"), ("weight_decay", self.weight_decay >= 0, "at least 0"),
                ("grad_clip_norm", self.grad_clip_norm >= 0, "at least 0 (0: no clipping)")):
            if not ok:
                raise UserInputError(f"optimizer.{name}={getattr(self, name)}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape and the logical-axis -> mesh-axis rules.

    Axis sizes: -1 on exactly one axis means "all remaining devices". `fsdp` shards the
    parameters and optimizer state along `embed` and the batch along with `data`.
    """

    data: int = -1
    fsdp: int = 1
    model: int = 1
    # (logical axis, mesh axis or axes or None). Parameters use vocab/embed/heads/kv/mlp,
    # activations batch/length/embed/heads/kv/mlp/vocab.
    rules: tuple = (
        ("batch", ("data", "fsdp")),
        ("length", None),
        ("vocab", "model"),
        ("embed", "fsdp"),
        ("heads", "model"),
        ("kv", None),
        ("mlp", "model"),
        ("position", None),
        ("token_type", None),
        ("layers", None),  # the stacked-layer axis of scanned parameters
    )


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 10_000  # 0: only at the end (and on SIGTERM)
    keep: int = 3  # the most recent checkpoints kept; older ones are deleted


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 256  # global: sequences per optimizer step, summed over hosts
    num_steps: int = 1_000_000
    seed: int = 0  # parameter init and dropout; the data has its own seed
    log_every_steps: int = 100
    # Validation during training: every `eval_every_steps` (and at the last step) the MLM loss
    # and accuracy on `eval_batches` fixed batches of the corpus's validation split, masked
    # once at data.eval_mask_rate with data.seed. 0 turns it off.
    eval_every_steps: int = 1000
    eval_batches: int = 20
    peak_flops: float = 0.0  # per device; 0 = look up the device kind
    # JAX PRNG implementation of parameter init and dropout: threefry (the same numbers on
    # every backend and mesh), rbg (XLA's RngBitGenerator: fast on TPU, the same on every
    # mesh of one backend), unsafe_rbg (fastest; numbers may change with the mesh or XLA).
    # docs/tpu.md ("Randomness") has the details.
    prng_impl: str = "threefry"

    def __post_init__(self):
        if self.prng_impl not in PRNG_IMPLS:
            raise UserInputError(f"train.prng_impl={self.prng_impl!r}: expected one of {', '.join(PRNG_IMPLS)}")


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    model: ModelConfig
    data: DataConfig = DataConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    train: TrainConfig = TrainConfig()


# The named configs in configs/ (`--config tiny`); a corpus's --seq-len must fit one of them.
NAMED_CONFIGS = ("tiny", "small", "base", "large")


def config_path(name_or_path: str) -> str:
    """A name (`tiny`, `experiments/paper`) -> its file in the pmi_jax.configs package, found where
    that package is (a checkout, an editable install or the wheel); a `.py` path as given."""
    if name_or_path.endswith(".py") or os.path.isfile(name_or_path):
        if not os.path.exists(name_or_path):
            raise UserInputError(f"--config {name_or_path}: no such file")
        return name_or_path
    path = os.path.join(configs_dir(), *name_or_path.split("/")) + ".py"
    if not os.path.exists(path):
        raise UserInputError(f"--config {name_or_path}: no config of that name (try tiny, small, base, large, "
                             f"experiments/demo, experiments/paper or a .py path)")
    return path


def configs_dir() -> str:
    """The folder of the pmi_jax.configs package (configs/ in the repository)."""
    return importlib.util.find_spec("pmi_jax.configs").submodule_search_locations[0]


def load_config(name_or_path: str):
    """Execute the config file and return its get_config(); an invalid value names the file."""
    path = config_path(name_or_path)
    spec = importlib.util.spec_from_file_location(f"pmi_jax_config_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    with _config_errors(name_or_path, path):
        spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise UserInputError(f"--config {name_or_path}: {path} defines no get_config()")
    with _config_errors(name_or_path, path):
        return module.get_config()


@contextlib.contextmanager
def _config_errors(name: str, path: str):
    """A config file that does not run (a syntax error, a bad import, an exception or an invalid
    value in get_config()) is the user's input: one line with its file and line number."""
    import traceback

    try:
        yield
    except UserInputError as e:
        raise UserInputError(f"--config {name} ({path}): {e}") from None
    except SyntaxError as e:
        raise UserInputError(f"--config {name}: {e.filename or path}:{e.lineno}: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - any failure of the user's file
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if os.path.abspath(f.filename) == os.path.abspath(path)]
        where = f"{path}:{frames[-1].lineno}" if frames else path
        first = str(e).splitlines()[0] if str(e) else ""
        raise UserInputError(f"--config {name}: {where}: {type(e).__name__}: {first}") from None


def check_trainable_seq_len(seq_len: int, option: str = "--seq-len") -> None:
    """A sequence length no named config's model can take would be found only when training starts."""
    longest = max(load_config(name).model.max_position_embeddings for name in NAMED_CONFIGS)
    if seq_len > longest:
        raise UserInputError(f"{option} {seq_len}: no config can train on it (max_position_embeddings is at most "
                             f"{longest} in configs/{{{','.join(NAMED_CONFIGS)}}}.py)")


def to_dict(config) -> dict:
    """A JSON-ready dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def model_config_from_dict(d: dict) -> ModelConfig:
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in d.items() if k in names})


def apply_overrides(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """Apply `section.field=value` edits in order; values are parsed by the field's type."""
    for item in overrides:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise UserInputError(f"override {item!r}: expected FIELD=VALUE, e.g. model.num_layers=2")
        config = _replace_path(config, name.strip().split("."), raw.strip(), item)
    return config


def _replace_path(obj, path: list[str], raw: str, item: str):
    fields = {f.name: f for f in dataclasses.fields(obj)}
    head = path[0]
    if head not in fields:
        raise UserInputError(
            f"override {item!r}: {type(obj).__name__} has no field {head!r} (fields: {', '.join(fields)})")
    current = getattr(obj, head)
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise UserInputError(f"override {item!r}: {head!r} is not a section")
        return dataclasses.replace(obj, **{head: _replace_path(current, path[1:], raw, item)})
    if dataclasses.is_dataclass(current):
        raise UserInputError(f"override {item!r}: {head!r} is a section; name one of its fields")
    hint = typing.get_type_hints(type(obj))[head]
    value = _parse_value(raw, hint, item)
    try:
        return dataclasses.replace(obj, **{head: value})
    except UserInputError as e:  # a section's own check (e.g. data.scheme): name the override
        raise UserInputError(f"override {item!r}: {e}") from None


def _parse_value(raw: str, hint, item: str) -> Any:
    if hint is str:
        return raw
    if hint is bool:
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise UserInputError(f"override {item!r}: expected true or false")
    try:
        value = _tuples(ast.literal_eval(raw))
    except (ValueError, SyntaxError):
        raise UserInputError(f"override {item!r}: cannot parse {raw!r} as {getattr(hint, '__name__', hint)}")
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # 1e999
            raise UserInputError(f"override {item!r}: not a finite number")
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)  # 1e6 steps
    if not isinstance(hint, type) or not isinstance(value, hint) or isinstance(value, bool):
        raise UserInputError(f"override {item!r}: {raw!r} is not a valid {getattr(hint, '__name__', hint)}")
    return value


def _tuples(value):
    """Lists from the command line become tuples, so configs stay immutable and hashable."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
