"""A Hugging Face transformers checkpoint directory (docs/huggingface.md): the files, not the model.

What `transformers.AutoModelForMaskedLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)`
read: `config.json`, the weights in `model.safetensors` (or sharded, with
`model.safetensors.index.json`), and a BERT WordPiece tokenizer as `vocab.txt`,
`tokenizer_config.json` and `special_tokens_map.json`, plus a `README.md` model card.

This module reads and writes those files as plain JSON and NumPy arrays; which tensor is which
parameter of our model is `pmi_jax.huggingface`'s business. Weights are read and written with
the `safetensors` library and no PyTorch: a file holding only `pytorch_model.bin` (a pickle of
torch tensors) cannot be read without PyTorch, so it is refused with a way out.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import unicodedata
from typing import Mapping, Sequence

import numpy as np

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import wordpiece_vocab

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
TORCH_WEIGHTS_FILE = "pytorch_model.bin"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
MODEL_CARD_FILE = "README.md"

# transformers' loaders check this metadata: "pt" says the names and layouts are PyTorch's.
_SAFETENSORS_METADATA = {"format": "pt"}
# BertTokenizer's argument name for each special token of a BERT vocab.txt.
_SPECIAL_TOKEN_ARGS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                       "mask_token": "[MASK]"}


def _path(directory: str, name: str) -> str:
    return storage.join(directory, name)


def _write_text(directory: str, name: str, text: str) -> None:
    with storage.gfile.GFile(_path(directory, name), "w") as f:
        f.write(text)


def _write_json(directory: str, name: str, value: dict) -> None:
    _write_text(directory, name, json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_checkpoint(directory: str, config: dict, tensors: Mapping[str, np.ndarray], tokens: Sequence[str],
                     model_max_length: int, model_card: str, corpus_tokenizer: str | None = None) -> None:
    """Write every file into `directory` (the caller makes the directory and publishes it atomically).

    `corpus_tokenizer`: the tokenizer.json a corpus was prepared with (`corpus prepare --tokenizer`),
    exported as itself with BERT's [CLS] ... [SEP] template (`own_tokenizer_json`); without it, the
    uncased BERT tokenizer of `tokens`.
    """
    from safetensors.numpy import save  # bytes, so that gs:// works through gfile

    _write_json(directory, CONFIG_FILE, config)
    contiguous = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    with storage.gfile.GFile(_path(directory, WEIGHTS_FILE), "wb") as f:
        f.write(save(contiguous, metadata=_SAFETENSORS_METADATA))
    _write_text(directory, VOCAB_FILE, wordpiece_vocab.vocab_text(tokens))
    if corpus_tokenizer is None:
        _write_json(directory, TOKENIZER_FILE, tokenizer_json(tokens))
        _write_json(directory, TOKENIZER_CONFIG_FILE, tokenizer_config(model_max_length))
    else:
        _write_json(directory, TOKENIZER_FILE, own_tokenizer_json(corpus_tokenizer, tokens))
        _write_json(directory, TOKENIZER_CONFIG_FILE, {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": False, **_SPECIAL_TOKEN_ARGS})
    _write_json(directory, SPECIAL_TOKENS_FILE, dict(_SPECIAL_TOKEN_ARGS))
    _write_text(directory, MODEL_CARD_FILE, model_card)


def own_tokenizer_json(text: str, tokens: Sequence[str]) -> dict:
    """The corpus's own tokenizer.json, its post-processor set to what the model was trained on:
    [CLS] A [SEP] (and B [SEP] with token type 1 for pairs), so that transformers adds them.
    Its vocabulary must be `tokens`, id for id (the model's rows)."""
    from tokenizers import Tokenizer

    spec = json.loads(text)
    vocab = Tokenizer.from_str(text).get_vocab(with_added_tokens=True)
    if len(vocab) != len(tokens) or any(vocab.get(t) != i for i, t in enumerate(tokens)):
        raise UserInputError(f"the corpus's {TOKENIZER_FILE} does not hold the model's vocabulary ({len(vocab)} "
                             f"tokens, the model {len(tokens)}), id for id")
    ids = wordpiece_vocab.special_ids(tokens)
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
        "special_tokens": {name: {"id": name, "ids": [ids[name.strip("[]").lower()]], "tokens": [name]}
                           for name in ("[CLS]", "[SEP]")},
    }
    return spec


def tokenizer_config(model_max_length: int) -> dict:
    """An uncased BertTokenizer: lower-case, strip accents, split CJK ideographs and punctuation.

    These are the choices of our own word splitter (`preprocess/text/words.py`), so the tokenizer
    reproduces the ids `corpus prepare` wrote (docs/huggingface.md says where the two differ).
    """
    return {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "do_basic_tokenize": True,
            "tokenize_chinese_chars": True, "strip_accents": None, "never_split": None,
            "model_max_length": model_max_length, "clean_up_tokenization_spaces": False, **_SPECIAL_TOKEN_ARGS}


# Unicode's Default_Ignorable_Code_Point ranges: NFKC_Casefold deletes them.
_DEFAULT_IGNORABLE = (r"[\x{00AD}\x{034F}\x{061C}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{180B}-\x{180F}"
                      r"\x{200B}-\x{200F}\x{202A}-\x{202E}\x{2060}-\x{206F}\x{3164}\x{FE00}-\x{FE0F}\x{FEFF}"
                      r"\x{FFA0}\x{FFF0}-\x{FFF8}\x{1BCA0}-\x{1BCA3}\x{1D173}-\x{1D17A}\x{E0000}-\x{E0FFF}]")


@functools.cache
def _casefold_replacements() -> tuple[tuple[str, str], ...]:
    """(lower-cased, case-folded) strings wherever the two differ after NFKC: ß -> ss, ς -> σ, ..."""
    pairs = {}
    for code_point in range(sys.maxunicode + 1):
        char = chr(code_point)
        if unicodedata.category(char) in ("Cs", "Cn"):
            continue
        nfkc = unicodedata.normalize("NFKC", char)
        lower, folded = nfkc.lower(), unicodedata.normalize("NFKC", nfkc.casefold())
        if lower != folded:
            pairs[lower] = folded
    return tuple(sorted(pairs.items()))


def tokenizer_json(tokens: Sequence[str]) -> dict:
    """A `tokenizers` fast tokenizer that splits words as `preprocess/text/words.py` does.

    Our words come from tensorflow_text's BasicTokenizer, which applies NFKC_Casefold; BERT's
    own normaliser only lower-cases. So the normaliser here is NFKC, lower-casing, the
    replacements where case folding differs from lower-casing, the deletion of default-ignorable
    code points and control/format characters as spaces (both as NFKC_Casefold and our
    splitter do), then BERT's accent stripping and CJK splitting; words split at whitespace and
    punctuation, then WordPiece with `##` continuations, as in `corpus prepare`.
    """
    special = {t: i for i, t in enumerate(tokens) if t in wordpiece_vocab.SPECIAL_TOKENS}
    normalizers = [{"type": "NFKC"}, {"type": "Lowercase"},
                   *({"type": "Replace", "pattern": {"String": a}, "content": b} for a, b in _casefold_replacements()),
                   {"type": "Replace", "pattern": {"Regex": _DEFAULT_IGNORABLE}, "content": ""},
                   {"type": "Replace", "pattern": {"Regex": r"[\p{Cc}\p{Cf}]"}, "content": " "},
                   {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": True, "strip_accents": True,
                    "lowercase": False}]

    def piece(kind, name, type_id):
        return {kind: {"id": name, "type_id": type_id}}

    cls, sep = "[CLS]", "[SEP]"
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for t, i in sorted(special.items(), key=lambda x: x[1])],
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [piece("SpecialToken", cls, 0), piece("Sequence", "A", 0), piece("SpecialToken", sep, 0)],
            "pair": [piece("SpecialToken", cls, 0), piece("Sequence", "A", 0), piece("SpecialToken", sep, 0),
                     piece("Sequence", "B", 1), piece("SpecialToken", sep, 1)],
            "special_tokens": {t: {"id": t, "ids": [special[t]], "tokens": [t]} for t in (cls, sep)}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(tokens)}},
    }


def read_config(directory: str, option: str = "--init-from") -> dict:
    """config.json of a transformers checkpoint; errors name `directory` as `option` gave it."""
    path = _path(directory, CONFIG_FILE)
    if not storage.gfile.exists(path):
        raise UserInputError(f"{option} {directory}: no {CONFIG_FILE}: not a transformers checkpoint directory")
    with storage.gfile.GFile(path) as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise UserInputError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(config, dict):
        raise UserInputError(f"{path}: expected a JSON object")
    return config


def read_tensors(directory: str, option: str = "--init-from") -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint by its PyTorch name, from one safetensors file or an index of
    shards; errors name `directory` as `option` gave it."""
    from safetensors.numpy import load

    single, index = _path(directory, WEIGHTS_FILE), _path(directory, WEIGHTS_INDEX_FILE)
    if storage.gfile.exists(single):
        files = [single]
    elif storage.gfile.exists(index):
        files = [_path(directory, name) for name in _index_files(index)]
    elif storage.gfile.exists(_path(directory, TORCH_WEIGHTS_FILE)):
        raise UserInputError(
            f"{option} {directory}: holds only {TORCH_WEIGHTS_FILE}, which needs PyTorch to read; save it as "
            f"{WEIGHTS_FILE} first (with PyTorch: from_pretrained(DIR).save_pretrained(DIR2), whose default is "
            "safetensors)")
    else:
        raise UserInputError(f"{option} {directory}: no {WEIGHTS_FILE} (or {WEIGHTS_INDEX_FILE})")
    tensors = {}
    for path in files:
        with storage.gfile.GFile(path, "rb") as f:
            try:
                tensors.update(load(f.read()))
            except Exception as e:  # safetensors raises its own error type for a damaged header
                raise UserInputError(f"{path}: not a readable safetensors file ({e})") from None
    return tensors


def _index_files(index: str) -> list[str]:
    """The shard files a model.safetensors.index.json names (its "weight_map": tensor -> file)."""
    weight_map = storage.read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) and v and "/" not in v for v in weight_map.values()):
        raise UserInputError(f"{index}: no \"weight_map\" of tensor names to file names in this directory")
    names = sorted(set(weight_map.values()))
    missing = [n for n in names if not storage.gfile.exists(_path(os.path.dirname(index), n))]
    if missing:
        raise UserInputError(f"{index}: names {missing[0]}, which is not in its directory")
    return names


def vocab_path(directory: str) -> str:
    return _path(directory, VOCAB_FILE)


def own_tokenizer(directory: str, option: str = "--hf-model") -> str | None:
    """The text of `directory`'s tokenizer.json where its text is not BERT's uncased WordPiece
    (None where it is): `tokenizer_config.json` names a fast tokenizer other than BERT's (what
    `export hf` writes for a corpus prepared with `--tokenizer`) or `do_lower_case` false (a
    cased BERT). Encoding such a model's text with the uncased tokenizer would give it ids it
    was not trained on, so a missing tokenizer.json is an error."""
    config = read_tokenizer_config(directory)
    bert = config.get("tokenizer_class", "BertTokenizer") in ("BertTokenizer", "BertTokenizerFast")
    if bert and config.get("do_lower_case") is not False:
        return None
    path = _path(directory, TOKENIZER_FILE)
    if not storage.gfile.exists(path):
        raise UserInputError(f"{option} {directory}: its {TOKENIZER_CONFIG_FILE} names a "
                             f"{'cased' if bert else config.get('tokenizer_class')} tokenizer but there is no "
                             f"{TOKENIZER_FILE}; save it there (transformers: tokenizer.save_pretrained)")
    with storage.gfile.GFile(path, "rb") as f:
        return f.read().decode("utf-8")


def read_tokenizer_config(directory: str) -> dict:
    path = _path(directory, TOKENIZER_CONFIG_FILE)
    if not storage.gfile.exists(path):
        return {}
    return storage.read_json_object(path)
