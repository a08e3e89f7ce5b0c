"""The prepared corpus on disk (docs/design.md, "Prepared corpus"): file names, feature names, metadata, record codec.

A data directory holds
  vocab.txt                                  the WordPiece vocabulary, id = line number
  {split}-{i:05d}-of-{n:05d}.tfrecord        split in ("train", "validation")
  metadata.json                              written last: its presence means "complete"
Each record is a `tf.train.Example` for one packed sequence of T <= seq_len tokens, unpadded,
every feature an int64 list of length T:
  input_ids      [CLS] tok ... [SEP]  (a [SEP] also separates two documents inside a sequence)
  word_ids       whole-word index within the sequence, 0, 1, ...; -1 on [CLS] and [SEP]
  units_<name>   masking-unit index within the sequence, 0, 1, ...; -1 on [CLS] and [SEP]

This module is what the training input pipeline imports, so it holds names and codecs only.
"""
from __future__ import annotations

import json
import re
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf

from pmi_jax import storage
from pmi_jax.errors import UserInputError

FORMAT_VERSION = 1
SPLITS = ("train", "validation")
VOCAB_FILE = "vocab.txt"
METADATA_FILE = "metadata.json"

INPUT_IDS = "input_ids"
WORD_IDS = "word_ids"
UNITS_PREFIX = "units_"

_UNIT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def check_unit_name(name: str) -> str:
    """Unit names become feature names and seqio task names: lower-case identifiers only."""
    if not _UNIT_NAME.match(name):
        raise UserInputError(f"masking vocabulary name {name!r}: use lower-case letters, digits and '_', "
                             "starting with a letter (e.g. pmi, naive_pmi, frequency)")
    return name


def units_feature(name: str) -> str:
    return UNITS_PREFIX + check_unit_name(name)


def feature_names(unit_names: Sequence[str]) -> list[str]:
    return [INPUT_IDS, WORD_IDS, *(units_feature(n) for n in unit_names)]


def shard_name(split: str, index: int, num_shards: int) -> str:
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


def shard_pattern(data_dir: str, split: str) -> str:
    """A glob matching every shard of `split` (tf.io.gfile.glob / tf.data.Dataset.list_files)."""
    return storage.join(data_dir, f"{split}-?????-of-?????.tfrecord")


def feature_spec(unit_names: Sequence[str]) -> dict[str, tf.io.RaggedFeature]:
    """`tf.io.parse_example` description: one variable-length int64 feature per name."""
    return {name: tf.io.RaggedFeature(dtype=tf.int64, row_splits_dtype=tf.int64)
            for name in feature_names(unit_names)}


def parse_example(serialized: tf.Tensor, unit_names: Sequence[str]) -> dict[str, tf.Tensor]:
    """One serialized record -> {feature: int64 [T]}; usable inside `tf.data.Dataset.map`."""
    return tf.io.parse_single_example(serialized, feature_spec(unit_names))


class ExampleEncoder:
    """{feature: int array [T]} -> serialized `tf.train.Example`, byte-identical for equal inputs.

    One message is refilled for every record, which halves the cost of building a fresh one;
    so every record must carry the same feature names. `deterministic=True` fixes the order of
    the feature map in the wire format.
    """

    def __init__(self, names: Sequence[str]):
        self._example = tf.train.Example()
        self._values = {name: self._example.features.feature[name].int64_list.value for name in names}

    def __call__(self, features: Mapping[str, np.ndarray]) -> bytes:
        if features.keys() != self._values.keys():
            raise ValueError(f"features {sorted(features)} != {sorted(self._values)}")
        for name, values in features.items():
            field = self._values[name]
            del field[:]
            field.extend(np.asarray(values).tolist())
        return self._example.SerializeToString(deterministic=True)


def encode_example(features: Mapping[str, np.ndarray]) -> bytes:
    """One record, for tests and tools; bulk writers keep an `ExampleEncoder`."""
    return ExampleEncoder(list(features))(features)


def decode_example(serialized: bytes) -> dict[str, np.ndarray]:
    """Inverse of `encode_example`, in plain numpy (for `corpus show` and tests)."""
    example = tf.train.Example.FromString(serialized)
    return {name: np.asarray(f.int64_list.value, dtype=np.int64) for name, f in example.features.feature.items()}


def metadata_path(data_dir: str) -> str:
    return storage.join(data_dir, METADATA_FILE)


def read_metadata(data_dir: str) -> dict:
    """The metadata of a complete data directory; a clear error for anything else.

    Keys: format_version, seq_len, seed, validation_fraction, wordpiece {path, source, sha256,
    size, trained}, special_ids {pad, unk, cls, sep, mask}, units {name: {source, sha256,
    entries, coverage}}, splits {split: {shards, sequences, tokens, documents, files}},
    corpus {files, documents, sha256}, config_fingerprint.
    """
    path = metadata_path(data_dir)
    if not storage.gfile.exists(path):
        raise UserInputError(f"{data_dir}: not a prepared corpus (no {METADATA_FILE}; "
                             "run `pmi-jax corpus prepare`, or let an interrupted run finish)")
    with storage.gfile.GFile(path, "r") as f:
        metadata = json.load(f)
    if metadata.get("format_version") != FORMAT_VERSION:
        raise UserInputError(f"{path}: format_version {metadata.get('format_version')!r}, "
                             f"this pmi-jax reads {FORMAT_VERSION}")
    return metadata


def shard_paths(data_dir: str, split: str) -> list[str]:
    """The shard files of `split` as listed in the metadata (empty for an absent split)."""
    metadata = read_metadata(data_dir)
    return [storage.join(data_dir, name) for name in metadata["splits"][split]["files"]]


def vocab_path(data_dir: str) -> str:
    return storage.join(data_dir, VOCAB_FILE)
