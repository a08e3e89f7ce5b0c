"""`pmi-jax corpus prepare` as an Apache Beam pipeline: every shard written by its own worker.

    python -m preprocess.beam_prepare --input gs://B/corpora/owt --output gs://B/prepared/owt \\
        --units pmi=gs://B/vocab/pmi --runner DataflowRunner --project P --region us-central2 \\
        --temp_location gs://B/tmp --setup_file ./setup.py

The work is the local pipeline's (preprocess.prepare), cut where it is already cut: shards.

  plan       here, as the local run does it: check the options and vocabularies, scan the corpus
             (documents per file and the content hash: one sequential read), assign documents to
             splits and shards, claim the output directory, and find the shards not yet written.
  wordpiece  without --wordpiece: word counts over all documents in parallel (the local
             `wordpiece.count_words`, per batch, summed), then `wordpiece.train_vocab` in one
             worker, which writes vocab.txt.
  shards     one Beam element per unwritten shard: `prepare.ShardWriter.write` tokenises,
             segments into masking units, packs and writes it, exactly as a local worker does.
  finish     here: metadata.json from the shards' stats, as the local run writes it.

The same inputs and options therefore give byte-identical shards, vocab.txt and metadata.json;
a rerun after a failed job writes only the missing shards.
"""
from __future__ import annotations

import argparse
import sys
from typing import Iterator, Sequence

import apache_beam as beam

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from preprocess import beam_pipeline


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
        from preprocess import prepare

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
    from preprocess import wordpiece

    yield from wordpiece.count_words([batch]).items()


def train_and_write_wordpiece(word_counts: Sequence[tuple[str, int]], size: int, vocab_txt: str) -> str:
    """Train the WordPiece vocabulary on the summed counts and write vocab.txt (atomically)."""
    import collections

    from preprocess import wordpiece

    tokens = wordpiece.train_vocab(collections.Counter(dict(word_counts)), size)
    with storage.atomic_file(vocab_txt) as f:
        f.write(wordpiece.vocab_text(tokens))
    return vocab_txt


def prepare(config, pipeline_options=None) -> dict:
    """Prepare (or finish preparing) `config.output` with Beam; return its metadata (as `prepare.prepare`)."""
    from preprocess import prepare as local, wordpiece

    plan = local.plan_prepare(config)
    if not isinstance(plan, local.PreparePlan):
        return plan  # already complete
    given, vocab_txt = plan.given_wordpiece, plan.vocab_txt
    files = plan.scan.files
    if given is not None:
        with storage.atomic_file(vocab_txt) as f:
            f.write(wordpiece.vocab_text(given))
    train = given is None and not storage.gfile.exists(vocab_txt)  # else: kept from an interrupted run
    todo = [(t.split, t.index) for t in plan.todo]
    context = plan.worker_context()
    with beam.Pipeline(options=pipeline_options or beam_pipeline.direct_runner()) as pipeline:
        if train:
            vocab_ready = (pipeline
                           | "Read" >> beam_pipeline.ReadDocumentBatches(files)
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


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m preprocess.beam_prepare",
        description="Prepare a corpus (as `pmi-jax corpus prepare`) with Apache Beam: here with the DirectRunner, "
        "or on Dataflow, one shard per work item. The output is byte-identical to the local command's on the "
        "same inputs and options.")
    parser.add_argument("--input", nargs="+", required=True, metavar="PATTERN",
                        help="text files (blank lines between documents) or .jsonl files with a 'text' field; "
                        "globs, directories and gs:// URLs accepted, optionally .gz")
    parser.add_argument("--output", required=True, metavar="DIR", help="data directory to write (local or gs://)")
    wp = parser.add_mutually_exclusive_group()
    wp.add_argument("--wordpiece", metavar="VOCAB_TXT", help="an existing BERT vocab.txt; without it an uncased "
                    "vocabulary is trained on the corpus")
    wp.add_argument("--wordpiece-size", type=int, default=30_522, metavar="N",
                    help="size of the trained vocabulary, special tokens included (default %(default)s)")
    parser.add_argument("--units", action="append", default=[], metavar="NAME=VOCAB",
                        help="a masking vocabulary (a vocabulary directory or one n-gram per line); writes the "
                        "feature units_NAME. Repeatable")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence with [CLS] and [SEP] "
                        "(default %(default)s)")
    parser.add_argument("--validation-fraction", type=float, default=0.01, metavar="F",
                        help="fraction of documents held out for validation (default %(default)s)")
    parser.add_argument("--shards", type=int, default=0, metavar="N",
                        help="train shards (default 0: one per 32 MiB of text, at least 4); also the unit of "
                        "parallel work")
    parser.add_argument("--seed", type=int, default=0, help="seeds the validation choice and the choice between "
                        "overlapping vocabulary entries (default %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the files of a different configuration found in --output")
    beam_pipeline.add_pipeline_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from preprocess.prepare import PrepareConfig

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        units = []
        for value in args.units:
            name, sep, source = value.partition("=")
            if not sep or not name or not source:
                raise UserInputError(f"--units {value}: expected NAME=VOCAB, e.g. pmi=out/vocab")
            units.append((name, source))
        config = PrepareConfig(
            inputs=tuple(args.input), output=args.output, wordpiece=args.wordpiece,
            wordpiece_size=args.wordpiece_size, units=tuple(units), seq_len=args.seq_len,
            validation_fraction=args.validation_fraction, shards=args.shards, seed=args.seed,
            overwrite=args.overwrite)
        metadata = prepare(config, beam_pipeline.pipeline_options(args, extra))
    except UserInputError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    for split, stats in metadata["splits"].items():
        print(f"{split}: {stats['documents']} documents, {stats['sequences']} sequences, "
              f"{stats['tokens']} tokens in {stats['shards']} shards")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    # Run through the package module so that the DoFns shipped to workers are importable there.
    from preprocess import beam_prepare

    sys.exit(beam_prepare.main())
