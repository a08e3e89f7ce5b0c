"""Where the trainer's batches come from: the prepared corpus through its seqio task, or a
synthetic toy language; and what the trainer takes from the corpus (vocabulary size, length).

The batch of step s is a function of (seed, s) only, whatever step the iteration started at:
that is what makes a resumed run repeat an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Protocol

import numpy as np

from pmi_jax import paths
from pmi_jax.config import (  # noqa: F401 (SYNTHETIC: the data_dir of SyntheticBatches)
    MASK_RATE_UNIT, SYNTHETIC, ExperimentConfig, mask_rate_units)
from pmi_jax.errors import UserInputError

BATCH_KEYS = ("inputs", "targets", "weights", "input_mask")
VALIDATION_SPLIT = "validation"


class BatchSource(Protocol):
    """Where batches come from: this host's rows of every global batch from `start_step` on.

    Yields dicts with BATCH_KEYS: `inputs`, `targets` int32 [b, L], `weights` float32
    [b, L] (1.0 where the loss counts), `input_mask` int32 [b, L] (0 on padding), where
    b = global batch / num_shards and this host is shard `shard_index`. The batch of a
    step must not depend on where the iteration started: that is what makes resume exact.
    """

    def batches(self, start_step: int, shard_index: int, num_shards: int) -> Iterator[dict[str, np.ndarray]]:
        ...

    def validation_batches(self, count: int, batch_size: int, shard_index: int,
                           num_shards: int) -> list[dict[str, np.ndarray]]:
        """This host's rows of `count` fixed held-out batches of `batch_size` sequences (global),
        the same on every call and for every run with the same data seed and corpus (validation
        during training)."""
        ...


@dataclasses.dataclass(frozen=True)
class CorpusInfo:
    """What the trainer needs to know about a prepared corpus (docs/design.md, "Prepared corpus")."""

    data_dir: str
    seq_len: int
    vocab_size: int
    vocab_sha256: str
    units: tuple[str, ...]
    has_validation: bool = True  # a validation split to validate on during training


def read_corpus_info(data_dir: str, scheme: str, split: str) -> CorpusInfo:
    """Validate that the corpus can feed `scheme` on `split` (pmi_jax.tasks does the checks)."""
    from pmi_jax import storage, tasks  # TensorFlow: only when training on a prepared corpus

    corpus = tasks.TaskCorpus(data_dir)
    corpus.check_scheme(scheme)
    corpus.files(split)
    return CorpusInfo(data_dir=paths.absolute(data_dir), seq_len=corpus.seq_len,
                      vocab_size=corpus.vocabulary.vocab_size, vocab_sha256=storage.file_sha256(corpus.vocabulary.path),
                      units=corpus.unit_names, has_validation=VALIDATION_SPLIT in corpus.splits)


@dataclasses.dataclass(frozen=True)
class TaskBatches:
    """The prepared corpus through the seqio task of the masking scheme (pmi_jax.tasks)."""

    data_dir: str
    scheme: str
    split: str
    seq_len: int
    batch_size: int  # global
    seed: int
    # The masking rate (DataConfig's fields of the same names) and the steps it is scheduled over.
    mask_rate: float = 0.15
    mask_rate_schedule: str = "constant"
    mask_rate_end: float = 0.15
    num_steps: int = 1
    eval_mask_rate: float = 0.15

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> "TaskBatches":
        data = config.data
        return cls(data.data_dir, data.scheme, data.split, data.seq_len, config.train.batch_size, data.seed,
                   data.mask_rate, data.mask_rate_schedule, data.mask_rate_end, config.train.num_steps,
                   data.eval_mask_rate)

    def batches(self, start_step, shard_index, num_shards):
        from pmi_jax import masking, tasks
        from pmi_jax.formats import prepared_corpus

        rate = masking.MaskRate(self.mask_rate, self.mask_rate_end, self.mask_rate_schedule, self.num_steps)
        dataset = tasks.get_dataset(self.data_dir, self.scheme, self.split, self.seq_len,
                                    self.batch_size // num_shards, self.seed, shard_index, num_shards, start_step,
                                    mask_rate=rate)
        with prepared_corpus.reading(self.data_dir):  # a shard whose bytes changed is named
            for batch in dataset.as_numpy_iterator():
                yield {k: batch[k] for k in BATCH_KEYS}

    def validation_batches(self, count, batch_size, shard_index, num_shards):
        """The first `count` batches of the validation split in file order (no shuffling), masked
        at `eval_mask_rate` with the data seed; past the split's end the next epoch's masks follow."""
        from pmi_jax import masking, tasks

        dataset = tasks.get_dataset(self.data_dir, self.scheme, VALIDATION_SPLIT, self.seq_len,
                                    batch_size // num_shards, self.seed, shard_index, num_shards,
                                    shuffle=False, mask_rate=masking.MaskRate(self.eval_mask_rate))
        return [{k: batch[k] for k in BATCH_KEYS} for batch in dataset.take(count).as_numpy_iterator()]


@dataclasses.dataclass(frozen=True)
class SyntheticBatches:
    """Deterministic MLM batches of a topic-model toy language, for tests and benchmarks.

    Each sequence draws its words uniformly from one of `num_topics` random sets of
    `topic_size` words. Without context a masked word is one of all the words; a model that
    reads the rest of the sequence narrows it to the topic, so the loss has somewhere to
    fall: from log(words) towards log(topic_size). `mask_rate` of the words are selected
    (15% by default; a constant rate), 80/10/10 [MASK]/random/unchanged, and a random tail of
    each sequence is padding. The batch of a step is a function of (seed, step) only, generated
    globally, sliced per host; validation batches come from a stream of their own.
    """

    vocab_size: int
    seq_len: int
    batch_size: int  # global
    seed: int = 0
    num_topics: int = 16
    topic_size: int = 8
    pad_id: int = 0
    cls_id: int = 2
    sep_id: int = 3
    mask_id: int = 4
    first_word_id: int = 5
    mask_rate: float = 0.15

    def global_batch(self, step: int, stream: int = 1) -> dict[str, np.ndarray]:
        words = self.vocab_size - self.first_word_id
        topic_rng = np.random.default_rng([self.seed, 0])
        topics_TxS = np.stack([topic_rng.choice(words, self.topic_size, replace=False)
                               for _ in range(self.num_topics)])
        rng = np.random.default_rng([self.seed, stream, step])
        b, n = self.batch_size, self.seq_len
        topic_B = rng.integers(0, self.num_topics, size=b)
        tokens = topics_TxS[topic_B[:, None], rng.integers(0, self.topic_size, size=(b, n - 2))]
        targets = np.concatenate([np.full((b, 1), self.cls_id), tokens + self.first_word_id,
                                  np.full((b, 1), self.sep_id)], axis=1)
        lengths = rng.integers(n // 2, n + 1, size=b)
        real = np.arange(n)[None, :] < lengths[:, None]
        targets = np.where(real, targets, self.pad_id)
        targets[np.arange(b), lengths - 1] = self.sep_id
        maskable = real & (targets >= self.first_word_id)
        # Each word is selected with probability `mask_rate`, within the masking budget of real
        # pretraining (floor(rate) of the maskable tokens, pmi_jax.masking): the first
        # selected words in a random order are kept, so no row exceeds max_predictions.
        draw = rng.random((b, n))
        budget_B = np.maximum(1, (mask_rate_units(self.mask_rate) * maskable.sum(axis=1)) // MASK_RATE_UNIT)
        order = np.argsort(np.where(maskable, draw, 2.0), axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(b, 0), axis=1)
        selected = maskable & (draw < self.mask_rate) & (rank < budget_B[:, None])
        action = rng.random((b, n))
        random_ids = rng.integers(self.first_word_id, self.vocab_size, size=(b, n))
        inputs = np.where(selected & (action < 0.8), self.mask_id,
                          np.where(selected & (action < 0.9), random_ids, targets))
        return {"inputs": inputs.astype(np.int32), "targets": targets.astype(np.int32),
                "weights": selected.astype(np.float32), "input_mask": real.astype(np.int32)}

    def batches(self, start_step, shard_index, num_shards):
        rows = self.batch_size // num_shards
        step = start_step
        while True:
            batch = self.global_batch(step)
            yield {k: v[shard_index * rows:(shard_index + 1) * rows] for k, v in batch.items()}
            step += 1

    def validation_batches(self, count, batch_size, shard_index, num_shards):
        rows, held_out = batch_size // num_shards, dataclasses.replace(self, batch_size=batch_size)
        return [{k: v[shard_index * rows:(shard_index + 1) * rows] for k, v in held_out.global_batch(i, 2).items()}
                for i in range(count)]


def configure_for_corpus(config: ExperimentConfig, corpus: CorpusInfo) -> ExperimentConfig:
    """Fill the vocabulary size and sequence length left at 0 from the corpus; check the others."""
    from pmi_jax.formats import prepared_corpus  # TensorFlow: only with a prepared corpus

    model, data = config.model, config.data
    if model.vocab_size == 0:
        model = dataclasses.replace(model, vocab_size=corpus.vocab_size)
    elif model.vocab_size != corpus.vocab_size:
        raise UserInputError(f"model.vocab_size={model.vocab_size} but {corpus.data_dir}/vocab.txt has "
                             f"{corpus.vocab_size} entries (set model.vocab_size=0 to take it from the corpus)")
    data = dataclasses.replace(data, seq_len=prepared_corpus.training_seq_len(data.seq_len, corpus.seq_len,
                                                                              corpus.data_dir))
    return dataclasses.replace(config, model=model, data=data)
