"""Our BERT <-> transformers' BERT: parameter names and layouts, the config, the model card.

`pmi-jax export hf` turns a checkpoint into the tensors of transformers' PyTorch
`BertForMaskedLM` (names like `bert.encoder.layer.0.attention.self.query.weight`, Linear
weights stored [out, in]) and `pmi-jax train --init-from` does the reverse, so a model moves
both ways without PyTorch. The table in `tensor_table` is the whole mapping; docs/huggingface.md
prints it. Our per-head attention kernels [D, H, K] are transformers' [H*K, D] matrices
transposed, head h owning rows h*K .. h*K+K-1, which is how its attention splits heads.

Vocabulary rows: the word embeddings and the output bias may have more rows than the
vocabulary (the model may pad them for the accelerator); export keeps the first
`vocab_size` rows, import pads with zeros to the model's row count.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Mapping

import jax
import numpy as np

from pmi_jax.config import ModelConfig
from pmi_jax.errors import UserInputError
from pmi_jax.formats.run_dir import CheckpointMetadata

# transformers' names for the two GELUs (its ACT2FN table): the exact erf form and the tanh
# approximation. Which one our model computes is measured, not assumed (`hidden_act`).
_GELU_NAMES = {"erf": ("gelu", "gelu_python"), "tanh": ("gelu_new", "gelu_pytorch_tanh")}
# Tensors of other BERT heads that a BertForPreTraining or BertModel checkpoint carries and an
# MLM model does not use: the next-sentence head, the pooler, and a buffer of position ids.
_UNUSED_PREFIXES = ("cls.seq_relationship.", "bert.pooler.", "bert.embeddings.position_ids")
# The decoder is tied to the word embeddings and its bias is the output bias: written for
# loaders that do not tie, checked for equality when read.
_TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
         "cls.predictions.decoder.bias": "cls.predictions.bias"}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One parameter: where it sits in our params tree, its transformers name, how it is laid out."""

    path: tuple[str, ...]
    name: str
    # copy | vocab_rows (copy, rows = vocabulary) | linear (ours [in, out], theirs [out, in])
    # | to_heads ([D, H, K] -> [H*K, D]) | heads_bias ([H, K] -> [H*K]) | from_heads ([H, K, D] -> [D, H*K])
    layout: str


def tensor_table(num_layers: int) -> list[Tensor]:
    """Every parameter of BertForMaskedLM, ours and transformers', in a fixed order."""

    def layer_norm(path, name):
        return [Tensor((*path, "scale"), f"{name}.weight", "copy"), Tensor((*path, "bias"), f"{name}.bias", "copy")]

    def dense(path, name, layout="linear", bias="copy"):
        return [Tensor((*path, "kernel"), f"{name}.weight", layout), Tensor((*path, "bias"), f"{name}.bias", bias)]

    embed = ("encoder", "embed")
    table = [Tensor((*embed, "word", "embedding"), "bert.embeddings.word_embeddings.weight", "vocab_rows"),
             Tensor((*embed, "position", "embedding"), "bert.embeddings.position_embeddings.weight", "copy"),
             Tensor((*embed, "token_type", "embedding"), "bert.embeddings.token_type_embeddings.weight", "copy"),
             *layer_norm((*embed, "layer_norm"), "bert.embeddings.LayerNorm")]
    for i in range(num_layers):
        ours, theirs = ("encoder", f"layer_{i}"), f"bert.encoder.layer.{i}"
        for projection in ("query", "key", "value"):
            table += dense((*ours, "attention", projection), f"{theirs}.attention.self.{projection}", "to_heads",
                           "heads_bias")
        table += dense((*ours, "attention", "output"), f"{theirs}.attention.output.dense", "from_heads")
        table += layer_norm((*ours, "attention_layer_norm"), f"{theirs}.attention.output.LayerNorm")
        table += dense((*ours, "feed_forward", "intermediate"), f"{theirs}.intermediate.dense")
        table += dense((*ours, "feed_forward", "output"), f"{theirs}.output.dense")
        table += layer_norm((*ours, "output_layer_norm"), f"{theirs}.output.LayerNorm")
    table += dense(("transform",), "cls.predictions.transform.dense")
    table += layer_norm(("transform_layer_norm",), "cls.predictions.transform.LayerNorm")
    table.append(Tensor(("output_bias",), "cls.predictions.bias", "vocab_rows"))
    return table


def _to_theirs(x: np.ndarray, layout: str, vocab_size: int) -> np.ndarray:
    if layout == "vocab_rows":
        return x[:vocab_size]
    if layout == "linear":
        return x.T
    if layout == "to_heads":
        return x.reshape(x.shape[0], -1).T
    if layout == "heads_bias":
        return x.reshape(-1)
    if layout == "from_heads":
        return x.reshape(-1, x.shape[-1]).T
    return x


def _their_shape(shape: tuple[int, ...], layout: str, vocab_size: int) -> tuple[int, ...]:
    """The shape transformers stores for our parameter of `shape` (`_to_theirs` on shapes alone)."""
    if layout == "vocab_rows":
        return (vocab_size, *shape[1:])
    if layout == "linear":
        return tuple(reversed(shape))
    if layout == "to_heads":
        return (math.prod(shape[1:]), shape[0])
    if layout == "heads_bias":
        return (math.prod(shape),)
    if layout == "from_heads":
        return (shape[-1], math.prod(shape[:-1]))
    return tuple(shape)


def _to_ours(y: np.ndarray, layout: str, shape: tuple[int, ...]) -> np.ndarray:
    """transformers' tensor (of `_their_shape`) in our layout and `shape` (vocabulary rows padded with zeros)."""
    if layout == "vocab_rows":
        return np.concatenate([y, np.zeros((shape[0] - y.shape[0], *shape[1:]), y.dtype)])
    if layout == "linear":
        return y.T
    if layout in ("to_heads", "from_heads"):
        return y.T.reshape(shape)
    if layout == "heads_bias":
        return y.reshape(shape)
    return y


# ----------------------------------------------------------------------------------------
# The scanned-layers layout. Names above are per layer (layer_0, layer_1, ...). A model that
# stacks its layers along a leading axis converts at this one place, with model.py's own
# functions, so the mapping above never sees stacked arrays.
# ----------------------------------------------------------------------------------------


def _per_layer(params):
    from pmi_jax import model

    return model.unstack_layers(params)  # per-layer params come back as they are


def _model_layout(params_per_layer, abstract_params):
    from pmi_jax import model

    if model.SCANNED_LAYERS in abstract_params["encoder"]:
        return model.stack_layers(params_per_layer)
    return params_per_layer


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def to_transformers(params, config: ModelConfig, vocab_size: int) -> dict[str, np.ndarray]:
    """transformers' BertForMaskedLM state dict (float32 NumPy) of our params, tied tensors included."""
    params = _per_layer(params)
    tensors = {t.name: np.asarray(_to_theirs(np.asarray(_get(params, t.path), np.float32), t.layout, vocab_size))
               for t in tensor_table(config.num_layers)}
    for tied, source in _TIED.items():
        tensors[tied] = tensors[source]
    return tensors


def _is_float(dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or str(dtype) == "bfloat16"


def _normalise_name(name: str) -> str:
    """Names of older checkpoints: LayerNorm gamma/beta (TensorFlow's) for weight/bias."""
    if ".LayerNorm." in name:
        return name.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(".LayerNorm.beta", ".LayerNorm.bias")
    return name


def from_transformers(tensors: Mapping[str, np.ndarray], config: ModelConfig, abstract_params, source: str):
    """Our params tree (float32 NumPy, shaped like `abstract_params`) from transformers' tensors.

    Raises UserInputError naming `source` and the tensor for a missing or unknown tensor, a
    shape other than config.json and the vocabulary (`config.vocab_size` rows) fix, a dtype
    that is not floating point, or a decoder that is not tied to the word embeddings. Every
    shape is checked exactly: a matrix of fewer vocabulary rows would otherwise be padded with
    zeros, and a square matrix stored the other way round would load transposed.
    """
    tensors = {_normalise_name(k): v for k, v in tensors.items()}
    table = tensor_table(config.num_layers)
    known = {t.name for t in table} | set(_TIED)
    missing = [t.name for t in table if t.name not in tensors]
    if missing:
        raise UserInputError(f"{source}: no tensor {missing[0]} ({len(missing)} of the {len(table)} tensors of "
                             "BertForMaskedLM missing; the MLM head cls.predictions.* is needed too)")
    unknown = sorted(k for k in tensors if k not in known and not k.startswith(_UNUSED_PREFIXES))
    if unknown:
        raise UserInputError(f"{source}: tensor {unknown[0]} is not part of BERT's MLM model "
                             f"({len(unknown)} such tensors): not a BERT checkpoint?")
    for tied, original in _TIED.items():
        if tied in tensors and not np.array_equal(tensors[tied], tensors[original]):
            raise UserInputError(f"{source}: {tied} differs from {original}; this model ties them")
    per_layer = jax.eval_shape(_per_layer, abstract_params)  # shapes only: nothing is allocated
    params: dict = {}
    for t in table:
        shape = tuple(_get(per_layer, t.path).shape)
        tensor = tensors[t.name]
        expected = _their_shape(shape, t.layout, config.vocab_size)
        if tuple(tensor.shape) != expected:
            raise UserInputError(f"{source}: tensor {t.name} has shape {list(tensor.shape)}, but config.json and "
                                 f"vocab.txt ({config.vocab_size} tokens) make it {list(expected)}")
        if not _is_float(tensor.dtype):
            raise UserInputError(f"{source}: tensor {t.name} has dtype {tensor.dtype}; BERT's weights are "
                                 "floating point (float32, float16 or bfloat16)")
        value = _to_ours(np.asarray(tensor, np.float32), t.layout, shape)
        node = params
        for key in t.path[:-1]:
            node = node.setdefault(key, {})
        node[t.path[-1]] = value
    return _model_layout(params, abstract_params)


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


def hidden_act(gelu: str = "erf") -> str:
    """transformers' name of the GELU that `pmi_jax.model` computes with `model.gelu`, measured on a few points."""
    import jax
    import jax.numpy as jnp

    from pmi_jax import model

    x = jnp.linspace(-4.0, 4.0, 33)
    y = model._gelu(gelu, x)  # the one GELU of the encoder's feed-forward blocks and the MLM head
    for form, approximate in (("erf", False), ("tanh", True)):
        if bool(jnp.allclose(y, jax.nn.gelu(x, approximate=approximate), rtol=0, atol=1e-6)):
            return _GELU_NAMES[form][0]
    raise AssertionError("pmi_jax.model's GELU is neither the erf nor the tanh form")


def transformers_config(config: ModelConfig, vocab_size: int, pad_id: int) -> dict:
    """config.json of BertForMaskedLM for our model with its `vocab_size` real vocabulary rows."""
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": vocab_size,
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
            "hidden_act": hidden_act(config.gelu), "hidden_dropout_prob": config.dropout_rate,
            "attention_probs_dropout_prob": config.attention_dropout_rate,
            "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
            "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
            "pad_token_id": pad_id, "position_embedding_type": "absolute", "tie_word_embeddings": True,
            "is_decoder": False, "add_cross_attention": False, "torch_dtype": "float32"}


# config.json key -> ModelConfig field, and BertConfig's default for keys a file leaves out.
_CONFIG_FIELDS = {"vocab_size": ("vocab_size", None), "hidden_size": ("hidden_size", None),
                  "num_hidden_layers": ("num_layers", None), "num_attention_heads": ("num_heads", None),
                  "intermediate_size": ("intermediate_size", None),
                  "max_position_embeddings": ("max_position_embeddings", 512),
                  "type_vocab_size": ("type_vocab_size", 2), "hidden_dropout_prob": ("dropout_rate", 0.1),
                  "attention_probs_dropout_prob": ("attention_dropout_rate", 0.1),
                  "layer_norm_eps": ("layer_norm_eps", 1e-12), "initializer_range": ("initializer_range", 0.02)}


def model_fields(hf_config: dict, source: str) -> dict:
    """The ModelConfig fields a transformers BERT config.json fixes (all but the compute dtype)."""
    if hf_config.get("model_type", "bert") != "bert":
        raise UserInputError(f"{source}: model_type {hf_config['model_type']!r}; only BERT checkpoints load")
    act = hf_config.get("hidden_act", "gelu")
    forms = [form for form, names in _GELU_NAMES.items() if act in names and hidden_act(form) in names]
    if not forms:
        raise UserInputError(f"{source}: hidden_act {act!r}, but this model computes only "
                             f"{', '.join(sorted({n for names in _GELU_NAMES.values() for n in names}))}")
    for key, expected in (("position_embedding_type", "absolute"), ("is_decoder", False),
                          ("add_cross_attention", False), ("tie_word_embeddings", True)):
        if hf_config.get(key, expected) != expected:
            raise UserInputError(f"{source}: {key} {hf_config[key]!r} is not supported (this model has {expected!r})")
    fields = {}
    for key, (field, default) in _CONFIG_FIELDS.items():
        if key not in hf_config and default is None:
            raise UserInputError(f"{source}: no {key!r}")
        fields[field] = _checked_value(hf_config.get(key, default), key, default, source)
    fields["gelu"] = forms[0]
    return fields


def _checked_value(value, key: str, default, source: str):
    """A config.json number of the type its default has: a count is a positive integer, a rate a number."""
    is_count = default is None or isinstance(default, int)
    if is_count and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UserInputError(f"{source}: {key!r} is {json.dumps(value)}; expected a positive integer")
    if not is_count and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise UserInputError(f"{source}: {key!r} is {json.dumps(value)}; expected a non-negative number")
    return value


def resolve_model_config(config: ModelConfig, fields: dict, overrides: list[str], config_name: str,
                         source: str) -> ModelConfig:
    """`config` with the checkpoint's `fields`; a field the run sets otherwise is an error.

    model.vocab_size=0 means "from the data" and agrees with any checkpoint; the compute dtype
    is the run's own choice (config.json does not fix it).
    """
    for field, value in fields.items():
        ours = getattr(config, field)
        if ours == value or (field == "vocab_size" and ours == 0):
            continue
        by_set = any(o.partition("=")[0].strip() == f"model.{field}" for o in overrides)
        where = f"--set model.{field}={ours}" if by_set else f"--config {config_name} has model.{field}={ours}"
        raise UserInputError(f"{where}, but --init-from {source} has {value} (its config.json decides the model; "
                             "drop the override or pick a matching config)")
    return dataclasses.replace(config, **fields)


# ----------------------------------------------------------------------------------------
# Model card
# ----------------------------------------------------------------------------------------


def model_card(*, config: ModelConfig, metadata: CheckpointMetadata, corpus: dict | None, vocab_size: int,
               perplexity: dict | None) -> str:
    """README.md of an exported model: what it was trained on and how, in a few tables."""
    run = metadata.config
    scheme = metadata.scheme
    train, optimizer = run.get("train", {}), run.get("optimizer", {})
    lines = ["---", "library_name: transformers", "pipeline_tag: fill-mask", "tags:", "- bert", "- fill-mask",
             f"- {scheme}-masking" if scheme else "- masked-lm", "---", "",
             f"# BERT pretrained with {scheme or 'an unknown'} masking (pmi-jax)", "",
             "A BERT masked language model pretrained with pmi-jax, a JAX implementation of PMI-Masking "
             "([Levine et al., ICLR 2021](https://arxiv.org/abs/2010.01825)), and exported with "
             "`pmi-jax export hf`. " + ("Its tokenizer is the one the corpus was prepared with "
                                         f"({corpus['tokenizer'].get('model')})." if corpus and "tokenizer" in corpus
                                         else "Uncased: the tokenizer case-folds and strips accents."), "",
             "```python",
             "from transformers import AutoModelForMaskedLM, AutoTokenizer",
             "path = \".\"  # this directory, or its name on the Hub",
             "tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForMaskedLM.from_pretrained(path)",
             "inputs = tokenizer(\"the capital of france is [MASK].\", return_tensors=\"pt\")",
             "mask = inputs.input_ids[0] == tokenizer.mask_token_id",
             "print(tokenizer.decode(model(**inputs).logits[0, mask].argmax(-1)))",
             "```", "", "## Training", "",
             "| | |", "|---|---|",
             f"| steps | {metadata.step} |",
             f"| masking scheme | {scheme} |",
             f"| batch size (sequences) | {train.get('batch_size')} |",
             f"| sequence length | {metadata.seq_len} |",
             f"| peak learning rate, warmup | {optimizer.get('peak_learning_rate')}, "
             f"{optimizer.get('warmup_steps')} steps |",
             f"| corpus | `{metadata.data_dir}` |"]
    if corpus:
        for split, info in sorted(corpus.get("splits", {}).items()):
            lines.append(f"| {split} split | {info.get('sequences')} sequences, {info.get('tokens')} tokens |")
        wordpiece = corpus.get("wordpiece", {})
        lines.append(f"| WordPiece vocabulary | {vocab_size} tokens, "
                     f"{'trained on the corpus' if wordpiece.get('trained') else 'given'} |")
        unit = corpus.get("units", {}).get(scheme)
        if unit:
            coverage = unit.get("coverage")
            lines.append(f"| masking vocabulary | {unit.get('entries')} n-grams from `{unit.get('source')}`"
                         + (f", {coverage:.1%} of tokens inside multi-word units" if coverage is not None else "")
                         + " |")
    else:
        lines.append(f"| WordPiece vocabulary | {vocab_size} tokens |")
    lines += ["", "## Model", "", "| | |", "|---|---|",
              f"| layers, hidden, heads, feed-forward | {config.num_layers}, {config.hidden_size}, {config.num_heads}, "
              f"{config.intermediate_size} |",
              f"| max positions, token types | {config.max_position_embeddings}, {config.type_vocab_size} |",
              f"| dropout (hidden, attention) | {config.dropout_rate}, {config.attention_dropout_rate} |",
              f"| LayerNorm eps, activation | {config.layer_norm_eps}, {hidden_act(config.gelu)} |",
              f"| training compute dtype | {config.dtype} |", "",
              "## Evaluation", ""]
    if perplexity:
        unit = perplexity.get("unit", "token")
        what = ("Single-token perplexity (each token masked alone)" if unit == "token" else
                f"Perplexity with one `{unit}` unit masked at a time")
        lines.append(f"{what} on the `{perplexity.get('split')}` split: "
                     f"**{perplexity['perplexity']:.3f}** (mean NLL {perplexity['mean_nll']:.4f} nats over "
                     f"{perplexity['num_tokens']} tokens of {perplexity['num_sequences']} sequences).")
    else:
        lines.append("Not evaluated at export (`pmi-jax eval perplexity --output FILE`, then "
                     "`export hf --perplexity FILE`, adds the single-token perplexity here).")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------
# Starting a run from a transformers checkpoint
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A transformers BERT directory whose config and vocabulary have been read and checked."""

    directory: str
    fields: dict  # ModelConfig fields from its config.json
    vocab_path: str
    tokens: tuple[str, ...]


def read_pretrained(directory: str, option: str = "--init-from") -> Pretrained:
    """Read config.json and vocab.txt of `directory`; the weights are read later (`initial_params`).
    Errors name the directory as `option` gave it."""
    from pmi_jax import storage
    from pmi_jax.formats import hf_checkpoint, wordpiece_vocab

    fields = model_fields(hf_checkpoint.read_config(directory, option),
                          storage.join(directory, hf_checkpoint.CONFIG_FILE))
    vocab = hf_checkpoint.vocab_path(directory)
    if not storage.gfile.exists(vocab):
        raise UserInputError(f"{option} {directory}: no {hf_checkpoint.VOCAB_FILE} (a BERT WordPiece vocabulary "
                             "is needed to prepare the corpus with the checkpoint's ids)")
    tokens = tuple(wordpiece_vocab.read_vocab(vocab))
    if len(tokens) != fields["vocab_size"]:
        raise UserInputError(f"{option} {directory}: {vocab} has {len(tokens)} tokens but config.json has "
                             f"vocab_size {fields['vocab_size']}")
    if option == "--init-from" and hf_checkpoint.read_tokenizer_config(directory).get("do_lower_case") is False:
        import logging

        logging.warning("%s %s is a cased model; pmi-jax lower-cases its inputs", option, directory)
    return Pretrained(directory, fields, vocab, tokens)


def check_corpus_vocabulary_is_pretrained(pretrained: Pretrained, corpus_vocab: str) -> None:
    """The corpus must be written in the checkpoint's token ids: the same vocab.txt, token for token."""
    from pmi_jax.formats import wordpiece_vocab

    tokens = tuple(wordpiece_vocab.read_vocab(corpus_vocab))
    if tokens == pretrained.tokens:
        return
    first = next((i for i, (a, b) in enumerate(zip(tokens, pretrained.tokens)) if a != b),
                 min(len(tokens), len(pretrained.tokens)))
    raise UserInputError(
        f"--init-from {pretrained.directory}: its vocabulary {pretrained.vocab_path} ({len(pretrained.tokens)} "
        f"tokens) is not the corpus's {corpus_vocab} ({len(tokens)} tokens; they differ from id {first}); "
        f"prepare the corpus with `pmi-jax corpus prepare --wordpiece {pretrained.vocab_path}`")


def initial_params(pretrained: Pretrained, config: ModelConfig):
    """The checkpoint's weights as our params tree (host NumPy arrays) for a model of `config`."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.formats import hf_checkpoint
    from pmi_jax.model import BertForMaskedLM

    abstract = checkpoints.abstract_model_params(BertForMaskedLM(config))
    tensors = hf_checkpoint.read_tensors(pretrained.directory)
    return from_transformers(tensors, config, abstract, storage.join(pretrained.directory, hf_checkpoint.WEIGHTS_FILE))


# ----------------------------------------------------------------------------------------
# Fine-tuning a released checkpoint (`eval finetune --hf-model`, the paper's Table 3)
# ----------------------------------------------------------------------------------------

_BARE_PREFIXES = ("embeddings.", "encoder.", "pooler.")  # BertModel.save_pretrained: no "bert." prefix


def released_encoder(directory: str):
    """(ModelConfig, {"encoder": params}, vocab.txt path) of a transformers BERT directory.

    Fine-tuning needs the encoder only: a checkpoint saved as BertModel (tensors without the
    "bert." prefix, no MLM head) loads as well as a BertForMaskedLM or BertForPreTraining one;
    an MLM head, if present, is checked like `--init-from` checks it, then dropped. Weights are
    read from model.safetensors (a PyTorch pytorch_model.bin needs converting first).
    """
    from pmi_jax import checkpoints, storage
    from pmi_jax.formats import hf_checkpoint
    from pmi_jax.model import BertForMaskedLM

    pretrained = read_pretrained(directory, "--hf-model")
    config = ModelConfig(**pretrained.fields)
    source = storage.join(directory, hf_checkpoint.WEIGHTS_FILE)
    tensors = {_normalise_name(k): v for k, v in hf_checkpoint.read_tensors(directory, "--hf-model").items()}
    if not any(k.startswith("bert.") for k in tensors):
        tensors = {(f"bert.{k}" if k.startswith(_BARE_PREFIXES) else k): v for k, v in tensors.items()}
    abstract = checkpoints.abstract_model_params(BertForMaskedLM(config))
    per_layer = jax.eval_shape(_per_layer, abstract)
    for t in tensor_table(config.num_layers):
        if t.name.startswith("cls.") and t.name not in tensors:  # no MLM head: zeros, dropped below
            shape = _to_theirs(np.zeros(_get(per_layer, t.path).shape, np.float32), t.layout,
                               config.vocab_size).shape
            tensors[t.name] = np.zeros(shape, np.float32)
    params = from_transformers(tensors, config, abstract, source)
    return config, {"encoder": params["encoder"]}, pretrained.vocab_path
