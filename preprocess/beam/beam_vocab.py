"""`pmi-jax vocab build` as an Apache Beam pipeline, for corpora larger than one machine wants.

    pmi-jax vocab build --input gs://B/corpora/owt --output gs://B/vocab/pmi --runner DataflowRunner ...

Same input and options, same masking_vocab.txt/.tsv bytes as the local build (docs/design.md,
"Words and n-grams" to "Masking vocabulary"). Stages: words, counts level by level (each batch
counted by the local build's array code, given the frequent shorter n-grams as a side input,
its partial counts summed per hash partition), selection (one worker, the local `NgramCounts`
and build_vocab code), coverage, output; with --sample-words, a seeded document sample first. Each stage's local code and the full
command: docs/design.md, "Module notes", beam_vocab.py.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import operator
import time
from typing import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np

from pmi_jax.errors import DataLost, UserInputError
from pmi_jax.preprocess.beam import beam_pipeline

# ---------------------------------------------------------------------------------------------
# Counting: the local build's array code (word_stream, ngram_counts) on one batch at a time

# A batch's words: (its distinct words as UTF-8 bytes, index of each word into them, words per document).
BatchWords = tuple


def document_words(batch: Sequence[str], tokenizer: str | None = None, cased: bool = False) -> BatchWords:
    """The words of a batch as the local build reads them (`word_stream.batch_word_ids`, split as
    `vocab build --tokenizer` says; the exact string path where two words' keys collide)."""
    from pmi_jax.preprocess.text import hf_tokenizer, word_stream
    from pmi_jax.preprocess.text.word_keys import WordKeyCollision

    chosen = hf_tokenizer.select(tokenizer, cased)
    try:
        _, inverse, lengths, (buffer, starts, sizes) = word_stream.batch_word_ids(list(batch), chosen)
        data = buffer.data
        words = [bytes(data[s:s + n]) for s, n in zip(starts.tolist(), sizes.tolist())]
    except WordKeyCollision:
        unique, inverse, lengths = word_stream.batch_words_by_strings(list(batch), chosen)
        words = list(unique)
    return words, np.asarray(inverse, np.int32), np.asarray(lengths, np.int64)


def batch_totals(batch: BatchWords, max_n: int) -> list[int]:
    """[documents, N_1, ..., N_max_n] of a batch: N_k counts the k-gram positions inside documents."""
    lengths = batch[2]
    return [len(lengths)] + [int(np.maximum(lengths - k + 1, 0).sum()) for k in range(1, max_n + 1)]


def add_vectors(vectors: Iterable[list[int]], size: int) -> list[int]:
    total = [0] * size
    for vector in vectors:
        total = [a + b for a, b in zip(total, vector)]
    return total


def word_counts(batch: BatchWords) -> Iterator[tuple[bytes, int]]:
    words, inverse, _ = batch
    yield from zip(words, np.bincount(inverse, minlength=len(words)).tolist())


def is_frequent(word_count: tuple, min_count: int) -> bool:
    return word_count[1] >= min_count


def word_index(word_counts: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], np.ndarray, dict[bytes, int]]:
    """The frequent words in byte order, their counts, and each word's position (its id).

    The local build numbers words by first appearance; nothing in the output depends on the
    numbering."""
    ordered = sorted(word_counts)
    words = [w for w, _ in ordered]
    return words, np.array([c for _, c in ordered], np.int64), {w: i for i, w in enumerate(words)}


def counts_table(vocabulary, levels: Iterable[tuple[int, np.ndarray, np.ndarray, int]], min_count: int,
                 totals: Sequence[int] = (0, 0), distinct_words: int = 0):
    """The local `NgramCounts` table from `word_index`'s vocabulary and the levels counted so far,
    each (n, sorted keys, counts, distinct n-grams counted); keys as `NgramCounts` defines them."""
    from pmi_jax.preprocess.vocab.ngram_counts import NgramCounts

    word_list, counts, _ = vocabulary
    table = NgramCounts(words=word_list, keys={}, counts={1: counts}, counted={1: distinct_words},
                        num_positions=[0, *totals[1:]], documents=totals[0], num_words=totals[1],
                        min_count=min_count, spilled=False)
    for n, keys, level_counts, distinct in levels:
        table.keys[n], table.counts[n], table.counted[n] = keys, level_counts, distinct
    return table


def batch_stream(batch: BatchWords, vocabulary, longest: int, table):
    """One batch as the local build's in-memory word stream, numbered by the frequent words
    (id 1 + index; infrequent words one id past them; SEPARATOR after each document), with the
    per-position n-gram indices of lengths 2..longest filled in. Returns (stream, positions)."""
    from pmi_jax.preprocess.text.word_stream import CorpusStream, with_separators
    from pmi_jax.preprocess.vocab.ngram_counts import Positions, index_positions

    words, inverse, lengths = batch
    word_list, counts, index = vocabulary
    infrequent = len(word_list)
    local = np.fromiter((index.get(w, infrequent) for w in words), np.int32, len(words)) + 1
    ids = with_separators(np.take(local, inverse), lengths)
    stream_counts = np.zeros([len(word_list) + 2], np.int64)
    stream_counts[1:-1] = counts
    stream = CorpusStream(path="", length=len(ids), words=[], word_counts=stream_counts, documents=len(lengths),
                          num_words=len(inverse), num_positions=[], in_memory=ids)
    word_ids = np.arange(-1, len(word_list) + 1, dtype=np.int32)  # stream id -> frequent-word index
    word_ids[-1] = -1
    positions = Positions(stream, word_ids)
    index_positions(stream, positions, table, longest)
    return stream, positions


def level_counts(batch: BatchWords, n: int, vocabulary, min_count: int, *shorter) -> Iterator[tuple[int, tuple]]:
    """Partial counts of one batch's n-grams whose two (n-1)-sub-grams are frequent (the local
    `LevelPass`, given the frequent shorter n-grams `shorter`), as sorted (keys, counts) arrays,
    one pair per hash partition of the local counter: the key a combine sums them by. On the
    output "read": [the batch's n-gram positions, the n-grams counted], for `check_levels`."""
    from pmi_jax.preprocess.vocab.ngram_counts import LevelPass

    counted = 0
    if len(batch[1]):
        table = counts_table(vocabulary, shorter, min_count)
        stream, positions = batch_stream(batch, vocabulary, n - 2, table)
        parts, _ = LevelPass(n, positions, table, store=lambda values, start: None, chunk=stream.length)(0)
        for partition, (keys, counts) in enumerate(parts):
            if len(keys):
                counted += int(counts.sum())
                yield partition, (keys, counts)
    yield beam.pvalue.TaggedOutput("read", [batch_totals(batch, n)[n], counted])


class SumCounts(beam.CombineFn):
    """(keys, counts) arrays of one partition -> (its keys counted >= min_count, their counts,
    the number of distinct keys): `PartitionedCounts` reduction, as a combine."""

    _COMPACT_EVERY = 16  # parts held before they are summed into one

    def __init__(self, min_count: int):
        self._min_count = min_count

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, part):
        accumulator.append(part)
        return accumulator if len(accumulator) < self._COMPACT_EVERY else [self._sum(accumulator)]

    def merge_accumulators(self, accumulators):
        parts = [part for accumulator in accumulators for part in accumulator]
        return [self._sum(parts)] if parts else []

    @staticmethod
    def _sum(parts):
        from pmi_jax.preprocess.vocab.sorted_keys import sum_by_key

        return sum_by_key(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def extract_output(self, accumulator):
        """(frequent keys, their counts, distinct keys, the sum of all counts: for `check_levels`)."""
        if not accumulator:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 0
        keys, counts = self._sum(accumulator)
        keep = counts >= self._min_count
        return keys[keep], counts[keep], len(keys), int(counts.sum())


def concatenate_level(parts: list, n: int) -> tuple:
    """The partitions' (keys, counts, distinct) -> (n, sorted keys, counts, distinct): one length's
    frequent n-grams, 16 bytes each, as the local table holds them."""
    if not parts:
        return n, np.zeros(0, np.int64), np.zeros(0, np.int64), 0
    keys = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    order = np.argsort(keys)
    return n, keys[order], counts[order], sum(p[2] for p in parts)


def level_read(read: list[int], n: int, summed: int) -> tuple[int, list[int], int]:
    return n, read, summed


def words_read(total: int) -> tuple[int, list[int], int]:
    return level_read([total, total], 1, total)


def check_levels(read: Sequence[tuple[int, list[int], int]], totals: Sequence[int]) -> None:
    """Every level read every batch ([positions, counted] summed per level against the Totals
    stage's positions; level 1: the words counted) and its combine summed every count it was
    given. A runner can drop batches between stages, as Beam's DirectRunner did
    (direct_data_plane.py): a build that fails here has written nothing."""
    for n, (positions, counted), summed in sorted(read):
        if positions != totals[n] or counted != summed:
            raise _lost(f"{n}-gram stage read {positions:,} of the corpus's {totals[n]:,} {n}-gram positions and "
                        f"summed {summed:,} of the {counted:,} n-grams it counted")


def _lost(what: str) -> DataLost:
    return DataLost.between_stages(f"the Beam vocabulary build's {what}")


# ---------------------------------------------------------------------------------------------
# Selection: the local code, on the table the levels make


def select(_, options, files: Sequence[str], vocabulary, levels, totals, distinct_words: int, read) -> dict:
    """Score, rank and cut with pmi_jax.preprocess.vocab.build_vocab; return what the later stages need."""
    from pmi_jax.preprocess.vocab import build_vocab

    if totals[1] == 0:
        raise UserInputError(f"--input {' '.join(files)}: no words in {len(files)} file(s)")
    check_levels(read, totals)
    table = counts_table(vocabulary, levels, options.min_count, totals, distinct_words)
    # The local build's own selection and statistics, so that both paths rank and report alike.
    selection = build_vocab.select_ngrams(table, options)
    if not any(s.texts for s in selection.values()):
        raise UserInputError(f"--input {' '.join(files)}: no n-gram of 2 or more words occurs "
                             f"--min-count {options.min_count} times; give more text or lower --min-count")
    # Coverage and elapsed time are filled in by the last stage; the key order stays the local one.
    from pmi_jax.preprocess.text import hf_tokenizer

    tokenizer = hf_tokenizer.select(options.tokenizer, options.cased)
    if tokenizer is not None:
        build_vocab.check_tokenizer_words(table.words, options.tokenizer)
    stats = build_vocab.vocabulary_stats(files, table, selection, 0.0, options, 0.0, 0, tokenizer)
    return {"text": build_vocab.vocabulary_text(table, selection),
            "index": {n: s.index for n, s in selection.items()}, "stats": stats}


def covered_words(batch: BatchWords, vocabulary, levels, selected_index: dict, min_count: int,
                  max_n: int) -> list[int]:
    """[words of the batch inside at least one occurrence of a selected n-gram (the local coverage
    pass), the batch's words]: the second checked against the corpus's by `write`."""
    from pmi_jax.preprocess.vocab.coverage import covered_words as count_covered

    table = counts_table(vocabulary, levels, min_count)
    stream, _ = batch_stream(batch, vocabulary, max_n - 1, table)
    return [count_covered(stream, table, selected_index, workers=1, chunk_positions=max(stream.length, 1)),
            len(batch[1])]


def write(selected: dict, output: str, started: float, covered: list[int], invalid_utf8_bytes: int,
          sample_checked: int | None) -> None:
    """Write the vocabulary; `sample_checked` (`SampleDocuments.checked`) is given only so that a
    sample that lost a batch fails before this step."""
    from pmi_jax import storage
    from pmi_jax.formats import masking_vocab

    stats = dict(selected["stats"])
    covered, words = covered
    if words != stats["words"]:
        raise _lost(f"coverage stage read {words:,} of the corpus's {stats['words']:,} words")
    stats["coverage"] = covered / stats["words"]
    stats["invalid_utf8_bytes"] = invalid_utf8_bytes
    stats["elapsed_seconds"] = round(time.time() - started, 3)
    with storage.atomic_directory(output, overwrite=True) as tmp:
        masking_vocab.write_vocabulary(tmp, *selected["text"], stats)


# ---------------------------------------------------------------------------------------------
# The pipeline


def build_pipeline(pipeline: beam.Pipeline, files: Sequence[str], output: str, options, started: float) -> None:
    """Add the whole vocabulary build to `pipeline`; running it writes `output`."""
    max_n, min_count = options.max_n, options.min_count
    read = beam_pipeline.ReadDocumentBatches(files, text_field=options.text_field)
    texts = pipeline | "Read" >> read
    sample_checked = None
    if options.sample_words:
        sample = beam_pipeline.SampleDocuments(options.sample_words, options.sample_seed)
        texts = texts | "Sample" >> sample
        sample_checked = sample.checked
    batches = texts | "Words" >> beam.Map(document_words, options.tokenizer, options.cased)
    invalid = read.invalid_utf8_bytes | "SumInvalid" >> beam.CombineGlobally(sum)
    totals = (batches
              | "Totals" >> beam.Map(batch_totals, max_n)
              | "SumTotals" >> beam.CombineGlobally(functools.partial(add_vectors, size=max_n + 1)))
    words = batches | "CountWords" >> beam.FlatMap(word_counts) | "SumWords" >> beam.CombinePerKey(sum)
    distinct_words = words | "DistinctWords" >> beam.combiners.Count.Globally()
    vocabulary = beam.pvalue.AsSingleton(
        words
        | "FrequentWords" >> beam.Filter(is_frequent, min_count)
        | "FrequentWordList" >> beam.combiners.ToList()
        | "WordIndex" >> beam.Map(word_index))
    # Level by level, as the local build: counting n-grams needs the frequent (n-1)-grams.
    levels = []
    read = [words
            | "WordTotal" >> beam.Values()
            | "SumWordTotal" >> beam.CombineGlobally(sum)
            | "Read1" >> beam.Map(words_read)]
    for n in range(2, max_n + 1):
        count = beam.FlatMap(level_counts, n, vocabulary, min_count, *map(beam.pvalue.AsSingleton, levels))
        counted = batches | f"Count{n}" >> count.with_outputs("read", main="parts")
        partitions = (counted.parts
                      | f"Sum{n}" >> beam.CombinePerKey(SumCounts(min_count))
                      | f"Partitions{n}" >> beam.Values())
        levels.append(partitions
                      | f"Partitions{n}List" >> beam.combiners.ToList()
                      | f"Level{n}" >> beam.Map(concatenate_level, n))
        summed = beam.pvalue.AsSingleton(partitions
                                         | f"Summed{n}" >> beam.Map(operator.itemgetter(3))
                                         | f"SumSummed{n}" >> beam.CombineGlobally(sum))
        read.append(counted.read
                    | f"SumRead{n}" >> beam.CombineGlobally(functools.partial(add_vectors, size=2))
                    | f"Read{n}" >> beam.Map(level_read, n, summed))
    all_levels = beam.pvalue.AsList(levels | "AllLevels" >> beam.Flatten())
    selected = (pipeline
                | "Start" >> beam.Create([None])
                | "Select" >> beam.Map(select, options, list(files), vocabulary=vocabulary, levels=all_levels,
                                       totals=beam.pvalue.AsSingleton(totals),
                                       distinct_words=beam.pvalue.AsSingleton(distinct_words),
                                       read=beam.pvalue.AsList(read | "AllRead" >> beam.Flatten())))
    # Coverage needs only the selected n-grams' indices: the vocabulary's text and statistics (one
    # Python object per entry) go to the write alone, not to every worker that reads a batch.
    selected_index = beam.pvalue.AsSingleton(selected | "SelectedIndex" >> beam.Map(operator.itemgetter("index")))
    covered = (batches
               | "Coverage" >> beam.Map(covered_words, vocabulary, all_levels, selected_index, min_count, max_n)
               | "SumCoverage" >> beam.CombineGlobally(functools.partial(add_vectors, size=2)))
    _ = selected | "Write" >> beam.Map(write, output, started, beam.pvalue.AsSingleton(covered),
                                       beam.pvalue.AsSingleton(invalid), sample_checked)


def build_vocabulary(inputs: Sequence[str], output: str, options=None, overwrite: bool = False,
                     pipeline_options=None) -> dict:
    """Run the Beam vocabulary build and return the stats it wrote (as `build_vocab.build_vocabulary`)."""
    from pmi_jax import storage
    from pmi_jax.formats import masking_vocab, run_dir
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions
    from pmi_jax.preprocess.text import hf_tokenizer
    from pmi_jax.preprocess.text.documents import check_output_apart, expand_inputs

    started = time.time()
    # The selection runs in one process: stats.json records workers=1.
    options = dataclasses.replace(options or VocabOptions(), workers=1).validated()
    run_dir.check_new_output(output, overwrite, directory=True)
    files = expand_inputs(inputs)
    check_output_apart(inputs, files, output)
    hf_tokenizer.select(options.tokenizer, options.cased)  # a bad --tokenizer fails here, before the pipeline
    with beam_pipeline.running(pipeline_options) as pipeline:
        build_pipeline(pipeline, files, output, options, started)
    with storage.gfile.GFile(storage.join(output, masking_vocab.STATS_JSON)) as f:
        return json.load(f)
