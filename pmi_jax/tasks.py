"""seqio Tasks for the masking schemes over a prepared corpus, and the trainer's input pipeline.

`register_corpus(name, data_dir)` registers a Task `{name}_{scheme}` per scheme the corpus
supports. `get_dataset` is what the trainer reads: the task's examples through
`MlmFeatureConverter`, batched (this host's batch), infinite unless `num_epochs` is given, and
resumed exactly at `start_step`. Masks and the reading order are functions of (seed, shard,
position, epoch) only, whatever host reads an example or batch holds it (docs/design.md,
"Masking schemes", "Determinism"; an epoch's reading order: "Module notes", tasks.py).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Mapping, Sequence

import seqio
import tensorflow as tf

from pmi_jax import masking, randomness
from pmi_jax.config import TOKEN_RATE_SCHEMES, check_scheme
from pmi_jax.errors import UserInputError
from pmi_jax.feature_converters import MlmFeatureConverter
from pmi_jax.vocabularies import WordPieceVocabulary
from pmi_jax.formats import informask_rates, prepared_corpus

SHUFFLE_BUFFER_SIZE = 10_000  # records per shuffle window: ~50 MB of 512-token records
PREFETCH_BATCHES = 2  # batches made ahead of the trainer: enough to hide a step, bounded across pauses
AUTOTUNE_RAM_BUDGET = 256 << 20  # bytes tf.data's autotuning may spend on buffers (its default: half the host)
MASK_BATCH = 128  # records parsed and masked per op call
_INTERLEAVED_FILES = 16
# Schemes whose random replacements follow the train split's unigram law (SpanBERT's): they need
# the prepared corpus's token counts.
UNIGRAM_SCHEMES = ("random_span",)
_TASK_NAME = re.compile(r"^[\w.:]+$")  # what seqio accepts in a task name
_FOREVER = 2**62


class TaskCorpus(prepared_corpus.PreparedCorpus):
    """A prepared data directory, opened and checked by its format's reader, with the seqio
    vocabulary and the masking-scheme checks that training adds."""

    def __init__(self, data_dir: str):
        super().__init__(data_dir)
        self.vocabulary = WordPieceVocabulary(prepared_corpus.vocab_path(data_dir))

    @property
    def schemes(self) -> list[str]:
        """The schemes this corpus supports: the PMI family needs its prepared units, informask
        its token rates (`pmi-jax corpus informask`), random_span the train split's token counts
        (absent from corpora prepared before they were recorded)."""
        return [s for s in masking.SCHEMES if s not in masking.PREPARED_UNIT_FEATURES or s in self.unit_names
                if s not in TOKEN_RATE_SCHEMES or informask_rates.exists(self.data_dir)
                if s not in UNIGRAM_SCHEMES or self.has_token_counts("train")]

    def check_scheme(self, scheme: str) -> None:
        """`scheme` is a scheme (config.check_scheme, the one rule, for callers that built no
        DataConfig: register_corpus, get_dataset) and the corpus holds the units or rates it reads."""
        check_scheme(scheme, "scheme")
        if scheme in masking.PREPARED_UNIT_FEATURES and scheme not in self.unit_names:
            prepared = ", ".join(self.unit_names) or "none"
            raise UserInputError(
                f"--scheme {scheme}: {self.data_dir} was prepared without a '{scheme}' masking vocabulary "
                f"(no units_{scheme} feature; prepared unit vocabularies: {prepared})"
            )
        if scheme in TOKEN_RATE_SCHEMES:
            self.token_rates  # noqa: B018 (read and checked now, not inside tf.data)
        if scheme in UNIGRAM_SCHEMES:
            self.token_counts()

    @functools.cached_property
    def token_rates(self) -> list[float]:
        """Each token id's InforMask rate (pmi_jax/formats/informask_rates.py); a one-line error
        naming the command to run where the corpus has none or they are stale."""
        return informask_rates.read_rates(self).tolist()

    @staticmethod
    def unit_names_for(scheme: str) -> list[str]:
        """The prepared unit features masking under `scheme` reads (besides ids and words)."""
        return [scheme] if scheme in masking.PREPARED_UNIT_FEATURES else []

    @functools.cached_property
    def regular_ids(self) -> list[int]:
        """Every id but the special ones: what a random replacement may draw."""
        special = set(self.special_ids.values())
        return [i for i in range(self.vocabulary.vocab_size) if i not in special]


def _count_records(paths: Sequence[str]) -> int:
    return int(tf.data.TFRecordDataset(list(paths)).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


class PreparedCorpusSource(seqio.DataSource):
    """Records of one split, epoch after epoch, each with its identity: a seqio DataSource.

    Elements: `record` (the serialized tf.train.Example) and int64 scalars `seed`, `epoch`,
    `shard`, `position` (see the module docstring); `mask_examples` parses and masks them.
    Epochs are produced here, not by seqio's `repeat`, so that each carries its number and
    gets fresh masks; `MlmTask` passes `num_epochs` through. Every per-record step is a
    built-in tf.data transformation (zip, interleave, skip, batch), never a Python function.
    """

    def __init__(
        self,
        corpus: TaskCorpus,
        unit_names: Sequence[str],
        *,
        shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE,
        num_epochs: int | None = 1,
        start_example: int = 0,
    ):
        super().__init__(splits=corpus.splits, caching_permitted=False, performs_internal_shuffling=True)
        self.corpus = corpus
        self.unit_names = tuple(unit_names)
        self.shuffle_buffer_size = shuffle_buffer_size
        self.num_epochs = num_epochs
        self.start_example = start_example

    def replace(self, **changes) -> "PreparedCorpusSource":
        kwargs = dict(shuffle_buffer_size=self.shuffle_buffer_size, num_epochs=self.num_epochs,
                      start_example=self.start_example)
        kwargs.update(changes)
        return PreparedCorpusSource(self.corpus, self.unit_names, **kwargs)

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return True  # any number of hosts: by file when there are enough files, else by record

    def list_shards(self, split: str) -> list[str]:
        return self.corpus.files(split)

    def num_input_examples(self, split: str) -> int:
        return int(self.corpus.metadata["splits"][split]["sequences"])

    def _host_files(self, split: str, shard_info: seqio.ShardInfo | None):
        """(file indices this host reads, record stride or None) under `shard_info`."""
        num_files = len(self.corpus.files(split))
        if shard_info is None or shard_info.num_shards == 1:
            return list(range(num_files)), None
        if num_files >= shard_info.num_shards:
            return list(range(shard_info.index, num_files, shard_info.num_shards)), None
        return list(range(num_files)), shard_info

    def epoch_size(self, split: str, shard_info: seqio.ShardInfo | None) -> int:
        """Records this host reads per epoch (counted by reading its files)."""
        files = self.corpus.files(split)
        file_ids, record_shard = self._host_files(split, shard_info)
        with prepared_corpus.reading(self.corpus.data_dir):
            total = _count_records([files[i] for i in file_ids])
        if record_shard is None:
            return total
        return len(range(record_shard.index, total, record_shard.num_shards))

    def _epoch_records(self, split, epoch, seed, shuffle, shard_info) -> tf.data.Dataset:
        """Serialized records of one epoch on this host, with their identity."""
        files = self.corpus.files(split)
        file_ids, record_shard = self._host_files(split, shard_info)
        ids = tf.constant(file_ids, tf.int64)
        if shuffle:
            ids = randomness.permute(ids, randomness.order_key(seed, randomness.Stream.FILE_ORDER, epoch))
        paths = tf.gather(tf.constant(files), ids)

        def read(shard, path):
            constant = lambda value: tf.data.Dataset.from_tensors(tf.cast(value, tf.int64)).repeat()
            return tf.data.Dataset.zip({
                "record": tf.data.TFRecordDataset(path), "position": tf.data.Dataset.range(_FOREVER),
                "shard": constant(shard), "epoch": constant(epoch), "seed": constant(seed),
            })

        records = tf.data.Dataset.from_tensor_slices((ids, paths)).interleave(
            read,
            cycle_length=min(len(file_ids), _INTERLEAVED_FILES) if shuffle else 1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if record_shard is not None:
            records = records.shard(record_shard.num_shards, record_shard.index)
        if shuffle:
            key = randomness.order_key(seed, randomness.Stream.WINDOW_ORDER, epoch)
            records = _window_shuffle(records, self.shuffle_buffer_size, key)
        return records

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        *,
        sequence_length=None,  # unused
        use_cached: bool = False,  # unused
        num_epochs: int | None = 1,  # unused: set with `replace(num_epochs=...)`
    ) -> tf.data.Dataset:
        seed = 0 if seed is None else int(seed)
        if seed < 0:
            raise UserInputError(f"seed {seed}: must be >= 0")
        first_epoch, skip = 0, 0
        if self.start_example:
            first_epoch, skip = divmod(self.start_example, self.epoch_size(split, shard_info))
        last_epoch = _FOREVER if self.num_epochs is None else self.num_epochs
        first_epoch = min(first_epoch, last_epoch)  # resumed past the end: nothing left

        def epoch_records(epoch):
            records = self._epoch_records(split, epoch, seed, shuffle, shard_info)
            return records.skip(tf.where(epoch == first_epoch, tf.constant(skip, tf.int64), 0))

        return tf.data.Dataset.range(first_epoch, last_epoch).flat_map(epoch_records)


def _window_shuffle(records: tf.data.Dataset, window: int, key: tf.Tensor) -> tf.data.Dataset:
    """Shuffle inside consecutive windows of `window` elements, window w by (key, w)."""

    def permute(w, batch):
        perm = randomness.permute(tf.range(tf.shape(batch["record"])[0]), randomness.window_key(key, w))
        return {k: tf.gather(v, perm) for k, v in batch.items()}

    return records.batch(window).enumerate().map(permute).unbatch()


def parse_records(records_B: tf.Tensor, unit_names: Sequence[str], seq_len: int) -> dict[str, tf.Tensor]:
    """Serialized records -> int32 [B, seq_len] features: `input_ids` padded with 0, the
    index features (`word_ids`, `units_<name>`) with -1."""
    features = tf.io.parse_example(records_B, prepared_corpus.feature_spec(unit_names))
    return {
        name: tf.cast(values.to_tensor(0 if name == prepared_corpus.INPUT_IDS else -1, shape=[None, seq_len]), tf.int32)
        for name, values in features.items()
    }


def mask_examples(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None = None,
    *,
    scheme: str,
    corpus: TaskCorpus,
    mask_rate: masking.MaskRate = masking.MaskRate(),
    first_example: int = 0,
) -> tf.data.Dataset:
    """seqio preprocessor: records -> masked examples padded to the corpus's seq_len.

    Works `MASK_BATCH` records at a time; each example is masked with its own key from
    (seed, shard, position, epoch), at the rate of its step: the i-th record of the stream
    (counted from `first_example`, where a resumed run starts reading) lands in step
    (first_example + i) // mask_rate.examples_per_step.
    """
    if sequence_length:
        corpus.training_seq_len(sequence_length.get("inputs"))
    unit_names = corpus.unit_names_for(scheme)
    mask_id = corpus.special_ids["mask"]
    regular_ids = corpus.regular_ids
    token_rates = corpus.token_rates if scheme in TOKEN_RATE_SCHEMES else None
    # Validation masks draw from the train split's counts too (one law per run).
    token_counts = corpus.token_counts("train") if scheme in UNIGRAM_SCHEMES else None

    def mask(batch, index_B):
        features = parse_records(batch["record"], unit_names, corpus.seq_len)
        keys = randomness.example_keys(batch["seed"], batch["shard"], batch["position"], batch["epoch"])
        rate_units = mask_rate.units_at(index_B // mask_rate.examples_per_step)
        masked = masking.mask_batch(features, scheme, keys, mask_id=mask_id,
                                    regular_ids_V=tf.constant(regular_ids, tf.int32), rate_units_B=rate_units,
                                    highest_rate=mask_rate.highest,
                                    token_rates_V=None if token_rates is None else tf.constant(token_rates, tf.float64),
                                    token_counts_V=None if token_counts is None else tf.constant(token_counts, tf.int64))
        # word_ids ride along (the feature converter drops them) so that `data dump` can
        # measure units in words.
        return {**masked, "word_ids": features["word_ids"], **{k: batch[k] for k in ("shard", "position", "epoch")}}

    # Each record with its place in the stream (zip stops with the records).
    indexed = tf.data.Dataset.zip(dataset, tf.data.Dataset.range(first_example, _FOREVER))
    return indexed.batch(MASK_BATCH).map(mask, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


class MlmTask(seqio.Task):
    """A seqio Task whose source counts the epochs, so that each epoch is masked afresh.

    seqio repeats a task's examples itself and would hand the masking the same example
    twice without telling it the epoch; here `num_epochs` goes to the source instead.
    """

    def get_dataset(
        self,
        sequence_length: Mapping[str, int] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        shuffle_buffer_size: int | None = None,
        seed: int | None = None,
        shard_info: seqio.ShardInfo | None = None,
        num_epochs: int | None = 1,
        trim_output_features: bool = True,
        try_in_mem_cache: bool = False,
    ) -> tf.data.Dataset:
        source = self.source.replace(num_epochs=num_epochs)
        if shuffle_buffer_size:
            source = source.replace(shuffle_buffer_size=shuffle_buffer_size)
        once = seqio.Task(self.name, source, self.output_features, self.preprocessors, shuffle_buffer_size=None)
        return once.get_dataset(
            sequence_length, split, use_cached=False, shuffle=shuffle, seed=seed, shard_info=shard_info,
            num_epochs=1, trim_output_features=trim_output_features, try_in_mem_cache=False,
        )


def output_features(corpus: TaskCorpus) -> dict[str, seqio.Feature]:
    vocab = corpus.vocabulary
    return {
        "inputs": seqio.Feature(vocab, add_eos=False),
        "targets": seqio.Feature(vocab, add_eos=False),
        "weights": seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False, dtype=tf.float32),
        "units": seqio.Feature(seqio.PassThroughVocabulary(corpus.seq_len), add_eos=False),
    }


def make_task(name: str, corpus: TaskCorpus, scheme: str, *,
              mask_rate: masking.MaskRate = masking.MaskRate(), **source_options) -> MlmTask:
    """The (unregistered) seqio Task of `scheme` over `corpus`, masking at `mask_rate`."""
    corpus.check_scheme(scheme)
    source = PreparedCorpusSource(corpus, corpus.unit_names_for(scheme), **source_options)
    mask = functools.partial(mask_examples, scheme=scheme, corpus=corpus, mask_rate=mask_rate,
                             first_example=source_options.get("start_example", 0))
    return MlmTask(name, source, output_features(corpus), preprocessors=[mask], shuffle_buffer_size=None)


def register_corpus(name: str, data_dir: str, schemes: Sequence[str] | None = None,
                    mask_rate: float = masking.MASK_RATE) -> list[str]:
    """Register one seqio Task per masking scheme, `{name}_{scheme}`; return their names.

    By default every scheme the corpus supports (random_token and whole_word always,
    random_span when metadata.json records token counts, a PMI-family scheme when its
    `units_<scheme>` feature was prepared, informask when `pmi-jax corpus informask` measured
    its token rates); asking for
    a scheme the corpus lacks is a UserInputError. Registering a name again replaces it.
    The tasks mask `mask_rate` of each sequence's non-special tokens (a constant rate: a
    schedule needs the trainer's steps, `get_dataset`).
    """
    rate = masking.MaskRate(start=mask_rate)
    if not _TASK_NAME.match(name):
        raise UserInputError(f"task name {name!r}: use letters, digits, '_', '.' and ':' only")
    corpus = TaskCorpus(data_dir)
    schemes = corpus.schemes if schemes is None else list(schemes)
    for scheme in schemes:
        corpus.check_scheme(scheme)
    names = []
    for scheme in schemes:
        task = make_task(f"{name}_{scheme}", corpus, scheme, mask_rate=rate)
        seqio.TaskRegistry.remove(task.name)
        seqio.TaskRegistry.add_provider(task.name, task)
        names.append(task.name)
    return names


def task_feature_lengths(seq_len: int) -> dict[str, int]:
    """What `MlmFeatureConverter` takes: every task feature padded to `seq_len`."""
    return {k: seq_len for k in MlmFeatureConverter.TASK_FEATURES}


def get_dataset(
    data_dir: str,
    scheme: str,
    split: str = "train",
    seq_len: int | None = None,
    batch_size: int = 32,
    seed: int = 0,
    shard_index: int = 0,
    num_shards: int = 1,
    start_step: int = 0,
    *,
    num_epochs: int | None = None,
    shuffle: bool = True,
    shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE,
    drop_remainder: bool = True,
    mask_rate: masking.MaskRate = masking.MaskRate(),
) -> tf.data.Dataset:
    """This host's batches of masked sequences: inputs, targets, input_mask int32 [B, L] and
    weights float32 [B, L], L = seq_len (default: the corpus's), padded with [PAD] = 0.

    `batch_size` is per host; `start_step` batches are skipped exactly and cheaply (see the
    module docstring). Infinite unless `num_epochs` is given. Batch s is masked at
    `mask_rate`'s rate of step s (its `examples_per_step` is set to `batch_size` here).
    """
    if batch_size < 1:
        raise UserInputError(f"batch size {batch_size}: must be at least 1")
    if not 0 <= shard_index < num_shards:
        raise UserInputError(f"shard {shard_index} of {num_shards}: need 0 <= shard_index < num_shards")
    if start_step < 0:
        raise UserInputError(f"start step {start_step}: must be >= 0")
    corpus = TaskCorpus(data_dir)
    seq_len = corpus.training_seq_len(seq_len)
    corpus.files(split)
    mask_rate = dataclasses.replace(mask_rate, examples_per_step=batch_size)
    task = make_task(f"{scheme}_input", corpus, scheme, mask_rate=mask_rate, shuffle_buffer_size=shuffle_buffer_size,
                     start_example=start_step * batch_size)
    lengths = task_feature_lengths(seq_len)
    ds = task.get_dataset(
        lengths, split, shuffle=shuffle, seed=seed, shard_info=seqio.ShardInfo(shard_index, num_shards),
        num_epochs=num_epochs, trim_output_features=False,  # lengths hold by construction
    )
    ds = MlmFeatureConverter(apply_length_check=False)(ds, lengths)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(PREFETCH_BATCHES)
    return ds.with_options(bounded_options())


def bounded_options() -> tf.data.Options:
    """tf.data options that keep an input pipeline's memory and idle work bounded.

    Training reads in bursts: it stops for checkpoints and evaluation while the iterator
    stays alive. tf.data's autotuning, whose RAM budget defaults to half the host's memory,
    grew buffers and parallelism from pause to pause, so an idle iterator kept working and
    its RSS kept rising. Autotuning stays on (it picks the parallelism of the reading and
    masking stages, which sets throughput: turning it off cost 40% of the batches per
    second on 2 cores) but under a fixed RAM budget; the last buffer is a fixed
    `PREFETCH_BATCHES` and tf.data injects no prefetch of its own. docs/reliability.md
    ("Training, evaluation and data commands") has the measurements.
    """
    options = tf.data.Options()
    options.autotune.ram_budget = AUTOTUNE_RAM_BUDGET
    options.experimental_optimization.inject_prefetch = False
    return options
