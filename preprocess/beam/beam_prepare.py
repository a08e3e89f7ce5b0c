"""`pmi-jax corpus prepare` as an Apache Beam pipeline: every shard written by its own worker.

    pmi-jax corpus prepare --input gs://B/corpora/owt --output gs://B/prepared/owt --units pmi=gs://B/vocab/pmi --runner DataflowRunner ...

The local pipeline's work (preprocess.corpus.prepare), cut where it is already cut: plan here,
wordpiece counts in parallel (without --wordpiece), one Beam element per unwritten shard
(`prepare.ShardWriter.write`), metadata.json here. The same inputs give byte-identical shards,
vocab.txt and metadata.json; a rerun writes only the missing shards. Stages in full:
docs/design.md, "Module notes", beam_prepare.py.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import apache_beam as beam

from pmi_jax import storage
from preprocess.beam import beam_options, beam_pipeline


class WriteShards(beam.DoFn):
    """(split, index) -> that shard written by `prepare.ShardWriter`; yields (shard name, stats).

    Workers rebuild the document assignment from the scan (it is a function of the document
    count, the validation fraction, the seed and the shard counts) instead of receiving every
    shard's document list, so the job description stays small for a corpus of any size.
    """

    def __init__(self, context, validation_fraction: float, seed: int, shard_counts: dict[str, int]):
        self._context = context
        self._assignment = (validation_fraction, seed, dict(shard_counts))
        self._writer = None
        self._tasks = None

    def _start(self) -> None:
        from preprocess.corpus import prepare

        fraction, seed, counts = self._assignment
        is_validation = prepare.assign_documents(self._context.scan.documents, fraction, seed)
        self._tasks = {(t.split, t.index): t for t in prepare.shard_tasks(is_validation, counts)}
        # Built on first use, after the vocab.txt side input exists.
        self._writer = prepare.ShardWriter(self._context)

    def process(self, shard: tuple[str, int], vocab_ready=None) -> Iterator[tuple[str, dict]]:
        if self._writer is None:
            self._start()
        task = self._tasks[shard]
        yield task.name, self._writer.write(task)


def count_batch_words(batch: Sequence[str]) -> Iterator[tuple[str, int]]:
    from preprocess.corpus import wordpiece

    yield from wordpiece.count_words([batch]).items()


def train_and_write_wordpiece(word_counts: Sequence[tuple[str, int]], size: int, vocab_txt: str,
                              workers: int | None = None) -> str:
    """Train the WordPiece vocabulary on the summed counts and write vocab.txt (atomically).

    It runs on one Beam worker; the learner's passes are counted in `workers` processes (default:
    that machine's cores), which gives the same vocabulary as one process.
    """
    import collections
    import os

    from pmi_jax.formats import wordpiece_vocab
    from preprocess.corpus import wordpiece

    tokens = wordpiece.train_vocab(collections.Counter(dict(word_counts)), size, workers=workers or os.cpu_count() or 1)
    wordpiece_vocab.write_vocab(vocab_txt, tokens)
    return vocab_txt


def prepare(config, pipeline_options=None) -> dict:
    """Prepare (or finish preparing) `config.output` with Beam; return its metadata (as `prepare.prepare`)."""
    from preprocess.corpus import prepare as local

    with local.removed_unless_begun(config.output):
        plan = local.plan_prepare(config)
        if not isinstance(plan, local.PreparePlan):
            return plan  # already complete
        return _run(config, plan, pipeline_options)


def _run(config, plan, pipeline_options) -> dict:
    from preprocess.corpus import prepare as local

    given, vocab_txt = plan.given_wordpiece, plan.vocab_txt
    files = plan.scan.files
    if given is not None:
        plan.install_given()
    train = given is None and not storage.gfile.exists(vocab_txt)  # else: kept from an interrupted run
    todo = [(t.split, t.index) for t in plan.todo]
    context = plan.worker_context()
    with beam_pipeline.user_errors_in_one_line(), \
            beam.Pipeline(options=pipeline_options or beam_options.direct_runner()) as pipeline:
        if train:
            vocab_ready = (pipeline
                           | "Read" >> beam_pipeline.ReadDocumentBatches(files, text_field=plan.scan.text_field)
                           | "CountWords" >> beam.FlatMap(count_batch_words)
                           | "SumWords" >> beam.CombinePerKey(sum)
                           | "AllWords" >> beam.combiners.ToList()
                           | "TrainWordPiece" >> beam.Map(train_and_write_wordpiece, config.wordpiece_size, vocab_txt))
        else:
            vocab_ready = pipeline | "VocabExists" >> beam.Create([vocab_txt])
        _ = (pipeline
             | "Shards" >> beam.Create(todo)
             | "Spread" >> beam.Reshuffle()
             | "Write" >> beam.ParDo(WriteShards(context, config.validation_fraction, config.seed, plan.shard_counts),
                                     vocab_ready=beam.pvalue.AsSingleton(vocab_ready)))

    return local.finish_prepare(plan)
