"""The prepared corpus on disk (docs/design.md, "Prepared corpus"): file names, feature names, metadata, record codec.

A data directory holds vocab.txt, tokenizer.json (only with `--tokenizer`),
`{split}-{i:05d}-of-{n:05d}.tfrecord` shards and metadata.json (written last). Each record is
one unpadded packed sequence as a `tf.train.Example` of int64 lists: `input_ids`, `word_ids`
and `units_<name>` (-1 on [CLS] and [SEP]). `PreparedCorpus` opens a directory and checks it
against its metadata (shard sizes, vocab.txt's hash); every reader opens corpora through it and
reads shards inside `reading`, which names a shard whose sha256 differs from the recorded one.
The writer is preprocess/corpus/prepare.py.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator, Mapping, Sequence

import numpy as np
import tensorflow as tf

from pmi_jax import storage
from pmi_jax.errors import UserInputError

FORMAT_VERSION = 2
# The records are the same in every version; what changed is which document went where.
ASSIGNMENTS = {
    1: "validation: a seeded choice of round(fraction * documents); shards: contiguous runs in corpus order",
    2: "a seeded hash of each document's text picks its split and shard; corpus order inside a shard",
}
SPLITS = ("train", "validation")
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
METADATA_FILE = "metadata.json"

INPUT_IDS = "input_ids"
WORD_IDS = "word_ids"
UNITS_PREFIX = "units_"
TOKEN_COUNTS = "token_counts"  # metadata.json, per split: each id's count among the content tokens

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


def content_token_counts(features: Mapping[str, np.ndarray], vocab_size: int) -> np.ndarray:
    """int64 [vocab_size]: how often each id is a content token (word id >= 0, so not [CLS] or
    [SEP]) of one sequence; summed over a split, metadata.json's `token_counts`."""
    ids = np.asarray(features[INPUT_IDS])[np.asarray(features[WORD_IDS]) >= 0]
    return np.bincount(ids, minlength=vocab_size).astype(np.int64)


def shard_token_counts(path: str, vocab_size: int) -> np.ndarray:
    """int64 [vocab_size]: `content_token_counts` summed over one shard's records."""
    counts = np.zeros(vocab_size, np.int64)
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        counts += content_token_counts(decode_example(record), vocab_size)
    return counts


def metadata_path(data_dir: str) -> str:
    return storage.join(data_dir, METADATA_FILE)


def vocab_path(data_dir: str) -> str:
    return storage.join(data_dir, VOCAB_FILE)


def tokenizer_path(data_dir: str) -> str:
    return storage.join(data_dir, TOKENIZER_FILE)


def read_tokenizer(data_dir: str, metadata: dict) -> str | None:
    """The text of tokenizer.json where the corpus was prepared with `--tokenizer` (None otherwise),
    checked against the hash metadata.json records."""
    record = metadata.get("tokenizer")
    if record is None:
        return None
    path = tokenizer_path(data_dir)
    if not storage.gfile.exists(path) or storage.file_sha256(path) != record.get("sha256"):
        raise UserInputError(f"{path}: missing, or not the {TOKENIZER_FILE} metadata.json records")
    with storage.gfile.GFile(path, "rb") as f:
        return f.read().decode("utf-8")


def read_metadata(data_dir: str) -> dict:
    """The parsed metadata.json of a data directory, its structure checked; a one-line error otherwise.

    Keys: format_version, seq_len, seed, validation_fraction, wordpiece {path, source, sha256,
    size, trained}, special_ids {pad, unk, cls, sep, mask}, units {name: {source, sha256,
    entries, coverage}}, splits {split: {shards, sequences, tokens, documents, files}},
    shards {file: {bytes, sha256, sequences, tokens, content_tokens, documents, multiword_tokens}},
    corpus {files, documents, sha256, invalid_utf8_bytes}, config_fingerprint, tokens_per_word
    (content tokens over basic-tokenizer words; splits and shards then hold `words` too), and per
    split `token_counts` (each id's count among its content tokens, a list indexed by id). `shards`,
    `shards.*.sha256`, `corpus.invalid_utf8_bytes`, the word counts and `token_counts` are absent
    from corpora prepared before they were recorded (an optional key: the format version stays).
    """
    path = metadata_path(data_dir)
    if not storage.gfile.exists(path):
        raise UserInputError(f"{data_dir}: not a prepared corpus (no {METADATA_FILE}; "
                             "run `pmi-jax corpus prepare`, or let an interrupted run finish)")
    metadata = storage.read_json_object(path, "; rerun `pmi-jax corpus prepare`")
    if metadata.get("format_version") not in ASSIGNMENTS:
        raise UserInputError(f"{path}: format_version {metadata.get('format_version')!r}, "
                             f"this pmi-jax reads {', '.join(map(str, ASSIGNMENTS))}")
    check_metadata(metadata, path)
    return metadata


def check_metadata(metadata: dict, path: str) -> None:
    """The fields readers index without looking, checked once, so damage is a one-line error."""
    def bad(what: str) -> UserInputError:
        return UserInputError(f"{path}: {what}; rerun `pmi-jax corpus prepare`")

    if not isinstance(metadata.get("seq_len"), int) or metadata["seq_len"] < 1:
        raise bad(f"seq_len {metadata.get('seq_len')!r} is not a positive integer")
    special = metadata.get("special_ids")
    if not isinstance(special, dict) or not all(isinstance(special.get(k), int) for k in SPECIAL_ID_NAMES):
        raise bad(f"special_ids {special!r} lacks an integer id for one of {', '.join(SPECIAL_ID_NAMES)}")
    if not isinstance(metadata.get("units", {}), dict):
        raise bad("units is not an object")
    splits = metadata.get("splits")
    if not isinstance(splits, dict) or not all(isinstance(s, dict) and isinstance(s.get("files", []), list)
                                               for s in splits.values()):
        raise bad("splits is not an object of {split: {files: [...]}}")
    for split in splits.values():
        for name in split.get("files", []):
            if not isinstance(name, str) or "/" in name or name.startswith("."):
                raise bad(f"shard name {name!r} is not a file of the directory")
    if not isinstance(metadata.get("shards", {}), dict):
        raise bad("shards is not an object")


SPECIAL_ID_NAMES = ("pad", "unk", "cls", "sep", "mask")


def damaged_shards(data_dir: str, metadata: dict, digests: bool = False) -> dict[str, str]:
    """{shard file: what is wrong} for the listed shards that are missing or not the size recorded.

    With `digests`, every shard's sha256 is also compared with the one recorded (bytes changed
    in place keep the size); that reads every shard, so the readers of whole shards check sizes
    only and call this again when a read fails, while `corpus show` checks every digest first.
    Corpora prepared before digests were recorded have none to check.
    """
    recorded = metadata.get("shards", {})
    damaged = {}
    for split in metadata["splits"].values():
        for name in split.get("files", []):
            path = storage.join(data_dir, name)
            if not storage.gfile.exists(path):
                damaged[name] = "missing"
                continue
            stats = recorded.get(name) if isinstance(recorded.get(name), dict) else {}
            expected = stats.get("bytes")
            if expected is not None:
                size = storage.gfile.stat(path).length
                if size != expected:
                    damaged[name] = f"{size} bytes, {expected} recorded"
                    continue
            if digests and stats.get("sha256") and storage.file_sha256(path) != stats["sha256"]:
                damaged[name] = "damaged (its sha256 is not the one recorded)"
    return damaged


def damaged_shards_error(data_dir: str, damaged: dict[str, str]) -> UserInputError:
    """One line naming the damaged shards (the first three) and the fix: prepare rewrites them."""
    named = ", ".join(f"shard {name} is {what}" for name, what in list(damaged.items())[:3])
    return UserInputError(f"{data_dir}: {named}{f' (and {len(damaged) - 3} more)' if len(damaged) > 3 else ''}; "
                          f"rerun the same `pmi-jax corpus prepare` to rewrite {'it' if len(damaged) == 1 else 'them'}")


@contextlib.contextmanager
def reading(data_dir: str) -> Iterator[None]:
    """Turn a shard that fails to read (tf.errors.DataLossError) into a one-line error naming it.

    Every reader of shards (training, `data`, `corpus show`, `eval perplexity`) reads inside
    this block. The failing read names no file, so the digests recorded in metadata.json tell
    which shard changed; an old corpus without digests gets the reader's own message.
    """
    try:
        yield
    except tf.errors.DataLossError as e:
        damaged = damaged_shards(data_dir, read_metadata(data_dir), digests=True)
        if damaged:
            raise damaged_shards_error(data_dir, damaged) from None
        raise UserInputError(f"{data_dir}: a shard does not read ({str(e).splitlines()[0][:200]}); its metadata.json "
                             "records no digests to tell which: rerun `pmi-jax corpus prepare --overwrite`") from None


def training_seq_len(requested: int | None, corpus_seq_len: int, data_dir: str) -> int:
    """The one sequence-length rule of a reader: 0 (or None) means the corpus's own length; a
    shorter one would cut its sequences, so it is an error naming both."""
    if not requested:
        return corpus_seq_len
    if requested < corpus_seq_len:
        raise UserInputError(f"data.seq_len={requested} but {data_dir} holds sequences of up to {corpus_seq_len} "
                             f"tokens (set data.seq_len=0 to take it from the corpus, or prepare the corpus with "
                             f"--seq-len {requested} to train on shorter ones)")
    return requested


class PreparedCorpus:
    """A prepared data directory, opened and checked once: the one reader of its metadata and shards.

    Opening checks what a reader would otherwise trip over later, each with a one-line error:
    metadata.json (present, JSON, its structure), vocab.txt (present, a BERT vocabulary, the
    sha256, size and special ids that the metadata recorded) and every shard (present, with the
    size recorded). Training, evaluation, `data` and `corpus show` all list shards through
    `files`. With `digests`, every shard's sha256 is compared with the one recorded too (all
    shards are read once): `corpus show`, which reads only a few records, thus names damage in
    shards it never reaches; the readers of whole shards find it when a read fails (`reading`).
    """

    def __init__(self, data_dir: str, digests: bool = False):
        from pmi_jax.formats import wordpiece_vocab

        self.data_dir = data_dir
        self.metadata = read_metadata(data_dir)
        self.seq_len = int(self.metadata["seq_len"])
        self.unit_names = tuple(sorted(self.metadata.get("units", {})))
        vocab = vocab_path(data_dir)
        if not storage.gfile.exists(vocab):
            raise UserInputError(f"{data_dir}: {VOCAB_FILE} is missing; rerun `pmi-jax corpus prepare`")
        self.tokens = wordpiece_vocab.read_vocab(vocab)
        self.vocab_sha256 = storage.file_sha256(vocab)
        recorded = self.metadata.get("wordpiece", {})
        if recorded.get("sha256") not in (None, self.vocab_sha256):
            raise UserInputError(f"{vocab}: sha256 {self.vocab_sha256[:12]}..., metadata.json recorded "
                                 f"{recorded['sha256'][:12]}...: not the vocabulary the shards were written with")
        if recorded.get("size") not in (None, len(self.tokens)):
            raise UserInputError(f"{vocab}: {len(self.tokens)} tokens, metadata.json recorded {recorded['size']}")
        self.special_ids = {name: int(self.metadata["special_ids"][name]) for name in SPECIAL_ID_NAMES}
        found = wordpiece_vocab.special_ids(self.tokens, vocab)
        if found != self.special_ids:
            raise UserInputError(f"{data_dir}: metadata.json special_ids {self.special_ids} disagree with "
                                 f"{VOCAB_FILE} {found}")
        # The splits that hold data, in SPLITS order. (An attribute, not a property: `files` runs
        # inside tf.data functions, whose AutoGraph conversion mishandles property calls.)
        self.splits = [s for s in SPLITS if self.metadata["splits"].get(s, {}).get("files")]
        damaged = damaged_shards(data_dir, self.metadata, digests=digests)
        if damaged:
            raise damaged_shards_error(data_dir, damaged)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def has_token_counts(self, split: str = "train") -> bool:
        return TOKEN_COUNTS in self.metadata["splits"].get(split, {})

    def token_counts(self, split: str = "train") -> np.ndarray:
        """int64 [vocab_size]: each id's count among `split`'s content tokens (metadata.json's
        `token_counts`); a one-line error where the corpus predates them or they are damaged."""
        counts = self.metadata["splits"].get(split, {}).get(TOKEN_COUNTS)
        if counts is None:
            raise UserInputError(f"{self.data_dir}: metadata.json records no token counts of the {split} split "
                                 "(prepared by an older pmi-jax); random_span draws its random replacements from "
                                 "them: rerun `pmi-jax corpus prepare --overwrite` with the same options")
        counts = np.asarray(counts)
        if counts.shape != (self.vocab_size,) or counts.dtype.kind != "i" or (counts < 0).any() or counts.sum() < 1:
            raise UserInputError(f"{metadata_path(self.data_dir)}: {split} token_counts is not {self.vocab_size} "
                                 "non-negative integers with a positive sum; rerun `pmi-jax corpus prepare --overwrite`")
        return counts.astype(np.int64)

    def training_seq_len(self, requested: int | None) -> int:
        return training_seq_len(requested, self.seq_len, self.data_dir)

    def files(self, split: str) -> list[str]:
        """The shard paths of `split`, in order; a one-line error for a split without data."""
        if split not in self.splits:
            raise UserInputError(f"--split {split}: {self.data_dir} has no such split "
                                 f"(splits with data: {', '.join(self.splits) or 'none'})")
        return [storage.join(self.data_dir, name) for name in self.metadata["splits"][split]["files"]]
