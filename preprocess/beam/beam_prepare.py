"""`pmi-jax corpus prepare` as an Apache Beam pipeline: read, route and write in parallel.

    pmi-jax corpus prepare --input gs://B/corpora/owt --output gs://B/prepared/owt --units pmi=gs://B/vocab/pmi --runner DataflowRunner ...

The local pipeline's work (pmi_jax.preprocess.corpus.prepare), cut where it is already cut: the launcher
lists file names and sizes and claims the output; each worker reads whole files and routes every
document to its shard (`prepare.routed_documents`: a hash of the text); a group by shard brings
each shard's documents to one worker, which restores corpus order and writes the shard
(`prepare.ShardWriter.write`); wordpiece counts in parallel (without --wordpiece; of the same
seeded sample as the local run with --wordpiece-sample-words); metadata.json here. The same inputs
give byte-identical shards, vocab.txt and metadata.json; a rerun writes only the missing shards,
once the workers have checked the digests of those written. Stages: docs/design.md, "Module notes"."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import apache_beam as beam

from pmi_jax import storage
from pmi_jax.preprocess.beam import beam_pipeline


class RouteDocuments(beam.DoFn):
    """(file index, path) -> (task id, (file, ordinal, key, text)) for each of its documents whose
    shard is still to write; then (file, its stats) on the output "files"."""

    def __init__(self, text_field: str, assignment, todo: Iterable[int]):
        self._text_field = text_field
        self._assignment = assignment
        self._todo = frozenset(todo)

    def process(self, indexed: tuple[int, str]):
        from pmi_jax.preprocess.corpus import prepare

        f, path = indexed
        stats: dict = {}
        for task, ordinal, key, text in prepare.routed_documents(path, self._text_field, self._assignment, stats):
            if task in self._todo:
                yield task, (f, ordinal, key, text)
        yield beam.pvalue.TaggedOutput("files", (f, stats))


class WriteShards(beam.DoFn):
    """(task id, its documents in any order) -> that shard written by `prepare.ShardWriter`, from
    the documents in corpus order; yields (shard name, stats). Every unwritten shard arrives,
    with a None among its documents, so that an empty one is written too."""

    def __init__(self, context, tasks):
        self._context = context
        self._tasks = {t.id: t for t in tasks}
        self._writer = None

    def process(self, grouped: tuple[int, Iterable], vocab_ready=None) -> Iterator[tuple[str, dict]]:
        from pmi_jax.preprocess.corpus import prepare

        if self._writer is None:  # built on first use, after the vocab.txt side input exists
            self._writer = prepare.ShardWriter(self._context)
        task_id, docs = grouped
        ordered = sorted(d for d in docs if d is not None)  # by (file, ordinal): corpus order
        task = self._tasks[task_id]
        yield task.name, self._writer.write(task, ((key, text) for _, _, key, text in ordered))


def record_corpus(file_stats: Sequence[tuple[int, dict]], output: str, inputs: Sequence[str]) -> None:
    from pmi_jax.preprocess.corpus import prepare

    prepare.record_corpus(output, prepare.corpus_summary(file_stats), inputs)


def count_batch_words(batch: Sequence[str]) -> Iterator[tuple[str, int]]:
    from pmi_jax.preprocess.corpus import wordpiece

    yield from wordpiece.count_words([batch]).items()


def _documents(pcoll, name: str, count=len):
    """The sum of `count` over `pcoll`, as a side input: documents, for `train_and_write_wordpiece`."""
    return beam.pvalue.AsSingleton(pcoll | f"{name}Documents" >> beam.Map(count)
                                   | f"Sum{name}Documents" >> beam.CombineGlobally(sum))


def _file_documents(file_stats: tuple[int, dict]) -> int:
    return file_stats[1]["documents"]


def train_and_write_wordpiece(word_counts: Sequence[tuple[str, int]], size: int, vocab_txt: str, read: int,
                              corpus: int, sample_checked: int | None = None, workers: int | None = None) -> str:
    """Train the WordPiece vocabulary on the summed counts and write vocab.txt (atomically).

    It runs on one Beam worker; the learner's passes are counted in `workers` processes (default:
    that machine's cores), which gives the same vocabulary as one process. The counting read
    `read` documents, which must be the `corpus` documents that routing read; a sample checks
    its own (`sample_checked`, a side input only so that this step waits for that check).
    """
    import collections
    import os

    from pmi_jax.errors import DataLost
    from pmi_jax.formats import wordpiece_vocab
    from pmi_jax.preprocess.corpus import wordpiece

    if read != corpus:
        raise DataLost.between_stages(f"the Beam WordPiece counting read {read:,} of the corpus's {corpus:,} documents")
    tokens = wordpiece.train_vocab(collections.Counter(dict(word_counts)), size, workers=workers or os.cpu_count() or 1)
    wordpiece_vocab.write_vocab(vocab_txt, tokens)
    return vocab_txt


def prepare(config, pipeline_options=None) -> dict:
    """Prepare (or finish preparing) `config.output` with Beam; return its metadata (as `prepare.prepare`)."""
    from pmi_jax.preprocess.corpus import prepare as local

    with local.removed_unless_begun(config.output):
        plan = local.plan_prepare(config, check_written=False)
        if not isinstance(plan, local.PreparePlan):
            return plan  # already complete
        if len(plan.todo) < len(plan.tasks):
            plan = _check_written(config, plan, pipeline_options)
        return _run(config, plan, pipeline_options)


def _check_written(config, plan, pipeline_options):
    """A resumed run: the shards recorded as written are hashed on the workers, one each (on the
    launcher that would be a read of everything written, terabytes near the end of a large job);
    a damaged one loses its record, so the replanned todo list includes it."""
    from pmi_jax.preprocess.corpus import output_state, prepare as local

    todo = {t.id for t in plan.todo}
    written = [t for t in plan.tasks if t.id not in todo]
    with beam_pipeline.running(pipeline_options) as pipeline:
        _ = (pipeline
             | "Written" >> beam.Create(written)
             | "SpreadShards" >> beam.Reshuffle()
             | "CheckWritten" >> beam.Map(lambda task: output_state.forget_damaged(config.output, task)))
    return local.unrecorded(plan)


def _run(config, plan, pipeline_options) -> dict:
    from pmi_jax.preprocess.corpus import prepare as local

    given, vocab_txt = plan.given_wordpiece, plan.vocab_txt
    files, text_field = plan.corpus.files, plan.corpus.text_field
    if given is not None:
        plan.install_given()
    train = given is None and not storage.gfile.exists(vocab_txt)  # else: kept from an interrupted run
    todo = [t.id for t in plan.todo]
    if not todo and storage.gfile.exists(local.corpus_json_path(config.output)):
        return local.finish_prepare(plan)  # killed after its last shard, before metadata.json
    with beam_pipeline.running(pipeline_options) as pipeline:
        routed = (pipeline
                  | "Files" >> beam.Create(list(enumerate(files)))
                  | "SpreadFiles" >> beam.Reshuffle()
                  | "Route" >> beam.ParDo(RouteDocuments(text_field, plan.assignment, todo)).with_outputs(
                      "files", main="documents"))
        if train:
            texts = pipeline | "Read" >> beam_pipeline.ReadDocumentBatches(files, text_field=text_field)
            checks = {"read": _documents(texts, "Read"), "corpus": _documents(routed.files, "File", _file_documents)}
            if config.wordpiece_sample_words:
                sample = beam_pipeline.SampleDocuments(config.wordpiece_sample_words, config.wordpiece_sample_seed)
                texts = texts | "Sample" >> sample
                checks["sample_checked"] = sample.checked
            vocab_ready = (texts
                           | "CountWords" >> beam.FlatMap(count_batch_words)
                           | "SumWords" >> beam.CombinePerKey(sum)
                           | "AllWords" >> beam.combiners.ToList()
                           | "TrainWordPiece" >> beam.Map(train_and_write_wordpiece, config.wordpiece_size, vocab_txt,
                                                          **checks))
        else:
            vocab_ready = pipeline | "VocabExists" >> beam.Create([vocab_txt])
        every_shard = pipeline | "Shards" >> beam.Create([(task, None) for task in todo])
        _ = ((routed.documents, every_shard)
             | "WithEmptyShards" >> beam.Flatten()
             | "GroupByShard" >> beam.GroupByKey()
             | "Write" >> beam.ParDo(WriteShards(plan.worker_context(), plan.todo),
                                     vocab_ready=beam.pvalue.AsSingleton(vocab_ready)))
        _ = (routed.files
             | "AllFiles" >> beam.combiners.ToList()
             | "RecordCorpus" >> beam.Map(record_corpus, config.output, list(config.inputs)))

    return local.finish_prepare(plan)
