"""`pmi-jax vocab build` as an Apache Beam pipeline, for corpora larger than one machine wants.

    pmi-jax vocab build --input gs://B/corpora/owt --output gs://B/vocab/pmi --runner DataflowRunner ...

Same input and options, same masking_vocab.txt/.tsv bytes as the local build (docs/design.md,
"Words and n-grams" to "Masking vocabulary"). Stages: words, counts (the local Apriori rule,
level by level, the sub-gram test as a join), selection (one worker, the local `NgramCounts`
and build_vocab code, fed compact word-id arrays), coverage, output; with --sample-words, a
seeded document sample first. Each stage's local code and the full
command: docs/design.md, "Module notes", beam_vocab.py.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import time
from typing import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.preprocess.beam import beam_options, beam_pipeline

Gram = tuple  # tuple[bytes, ...]: the words of an n-gram, as pmi_jax.preprocess.text.words yields them


# ---------------------------------------------------------------------------------------------
# Counting


def document_words(batch: Sequence[str], tokenizer: str | None = None, cased: bool = False) -> list[tuple[bytes, ...]]:
    """The words of each document of a batch (one tokeniser call for the whole batch), split as
    `vocab build --tokenizer` says (pmi_jax.preprocess.text.hf_tokenizer; loaded once per worker process)."""
    from pmi_jax.preprocess.text import hf_tokenizer
    from pmi_jax.preprocess.text.words import split_words_flat

    chosen = hf_tokenizer.select(tokenizer, cased)
    flat, splits = split_words_flat(batch) if chosen is None else chosen.words_flat(batch)
    return [tuple(flat[splits[i]:splits[i + 1]]) for i in range(len(batch))]


def batch_totals(batch: Sequence[Gram], max_n: int) -> list[int]:
    """[documents, N_1, ..., N_max_n] of a batch: N_k counts the k-gram positions inside documents."""
    return [len(batch)] + [sum(max(0, len(words) - k + 1) for words in batch) for k in range(1, max_n + 1)]


def add_vectors(vectors: Iterable[list[int]], size: int) -> list[int]:
    total = [0] * size
    for vector in vectors:
        total = [a + b for a, b in zip(total, vector)]
    return total


def word_counts(batch: Sequence[Gram]) -> Iterator[tuple[bytes, int]]:
    yield from collections.Counter(w for words in batch for w in words).items()


def ngram_counts(batch: Sequence[Gram], n: int, frequent_words) -> Iterator[tuple[Gram, int]]:
    """Counts, within one batch, of the n-grams made of frequent words only (a superset of the
    n-grams whose two sub-grams are frequent; the joins below keep exactly those)."""
    counts: collections.Counter = collections.Counter()
    for words in batch:
        frequent = [w in frequent_words for w in words]
        run = 0  # frequent words ending at position i
        for i, ok in enumerate(frequent):
            run = run + 1 if ok else 0
            if run >= n:
                counts[words[i - n + 1:i + 1]] += 1
    yield from counts.items()


def key_by_part(gram_count: tuple[Gram, int], part: slice) -> tuple[Gram, tuple[Gram, int]]:
    return gram_count[0][part], gram_count


def mark_frequent(gram_count: tuple[Gram, int]) -> tuple[Gram, bool]:
    return gram_count[0], True


def keep_if_part_frequent(joined) -> Iterable[tuple[Gram, int]]:
    _, groups = joined
    return groups["grams"] if groups["frequent"] else []


def is_frequent(gram_count: tuple, min_count: int) -> bool:
    return gram_count[1] >= min_count


def keep_where_frequent(grams, frequent_shorter, part: slice, label: str):
    """The (gram, count) pairs of `grams` whose sub-gram `part` is among `frequent_shorter`."""
    keyed = grams | f"{label}Key" >> beam.Map(key_by_part, part)
    marks = frequent_shorter | f"{label}Mark" >> beam.Map(mark_frequent)
    return ({"grams": keyed, "frequent": marks}
            | f"{label}Join" >> beam.CoGroupByKey()
            | f"{label}Keep" >> beam.FlatMap(keep_if_part_frequent))


def tag(value, n: int):
    return n, value


# ---------------------------------------------------------------------------------------------
# --sample-words: pmi_jax.preprocess.text.sample, its cut combined over the workers


def sample_priorities(batch: Sequence[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    from pmi_jax.preprocess.text import sample

    return sample.priorities(batch, seed), sample.whitespace_words(batch)


def sampled(batch: Sequence[str], seed: int, cut: int) -> Iterator[list[str]]:
    from pmi_jax.preprocess.text import sample

    kept = sample.in_sample(batch, seed, cut)
    if kept:
        yield kept


class SampleCut(beam.CombineFn):
    """(priorities, words) of batches -> the sample's cut; each accumulator keeps only its lowest
    priorities (`sample.lowest`), about N words' worth of documents."""

    def __init__(self, target: int):
        self._target = target

    def create_accumulator(self):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)

    def add_input(self, accumulator, batch):
        return self.merge_accumulators([accumulator, batch])

    def merge_accumulators(self, accumulators):
        from pmi_jax.preprocess.text import sample

        accumulators = list(accumulators)
        return sample.lowest(np.concatenate([a[0] for a in accumulators]),
                             np.concatenate([a[1] for a in accumulators]), self._target)

    def extract_output(self, accumulator) -> int:
        from pmi_jax.preprocess.text import sample

        return sample.cut(*accumulator, self._target)


# ---------------------------------------------------------------------------------------------
# Selection: the local code, on a table assembled from the counts


def word_index(word_counts: Sequence[tuple[bytes, int]]) -> tuple[list[bytes], np.ndarray, dict[bytes, int]]:
    """The frequent words in byte order, their counts, and each word's position (its id).

    The local build numbers words by first appearance; nothing in the output depends on the
    numbering."""
    ordered = sorted(word_counts)
    words = [w for w, _ in ordered]
    return words, np.array([c for _, c in ordered], np.int64), {w: i for i, w in enumerate(words)}


def gram_ids(batch: Sequence[tuple[Gram, int]], words) -> tuple[np.ndarray, np.ndarray]:
    """A batch of (frequent n-gram, count) -> (word ids int32 [B, n], counts int64 [B]): from here
    on an n-gram costs 4n + 8 bytes, not a tuple of bytes objects."""
    index = words[2]
    n = len(batch[0][0])
    ids = np.fromiter((index[w] for gram, _ in batch for w in gram), np.int32, len(batch) * n).reshape(-1, n)
    return ids, np.fromiter((c for _, c in batch), np.int64, len(batch))


class ConcatenateLevel(beam.CombineFn):
    """(ids [B, n], counts [B]) batches -> one pair of arrays: every frequent n-gram of one length."""

    def __init__(self, n: int):
        self._n = n

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, batch):
        accumulator.append(batch)
        return accumulator

    def merge_accumulators(self, accumulators):
        return [self._join(sum(accumulators, []))]

    def _join(self, parts):
        if not parts:
            return np.zeros((0, self._n), np.int32), np.zeros(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def extract_output(self, accumulator):
        return self._n, *self._join(accumulator)


def counts_table(words, levels: Sequence[tuple[int, np.ndarray, np.ndarray]], counted: dict[int, int],
                 totals: Sequence[int], min_count: int, max_n: int):
    """The frequent n-grams of every length as the local `NgramCounts` table.

    `words` is `word_index`'s; `levels` holds (n, word ids [M, n], counts [M]) per length >= 2.
    n-gram keys follow `NgramCounts`: index of the (n-1)-prefix among the frequent (n-1)-grams
    * F + last word.
    """
    from pmi_jax.preprocess.vocab.ngram_counts import NgramCounts
    from pmi_jax.preprocess.vocab.sorted_keys import lookup

    word_list, word_counts, _ = words
    num_frequent = max(len(word_list), 1)
    table = NgramCounts(words=word_list, keys={}, counts={1: word_counts},
                        counted=dict(counted), num_positions=[0, *totals[1:]], documents=totals[0],
                        num_words=totals[1], min_count=min_count, spilled=False)
    by_length = {n: (ids.astype(np.int64), counts) for n, ids, counts in levels}
    for n in range(2, max_n + 1):
        word_ids, counts = by_length[n]
        prefix = word_ids[:, 0]
        for m in range(2, n):  # index of the m-word prefix among the frequent m-grams
            prefix = lookup(table.keys[m], prefix * num_frequent + word_ids[:, m - 1])
        keys = prefix * num_frequent + word_ids[:, n - 1]
        order = np.argsort(keys)
        table.keys[n] = keys[order]
        table.counts[n] = counts[order]
    return table


def select(_, options, files: Sequence[str], words, levels, counted, totals, distinct_words: int) -> dict:
    """Score, rank and cut with pmi_jax.preprocess.vocab.build_vocab; return what the later stages need."""
    from pmi_jax.preprocess.vocab import build_vocab

    if totals[1] == 0:
        raise UserInputError(f"--input {' '.join(files)}: no words in {len(files)} file(s)")
    counted = {1: distinct_words, **dict(counted)}
    table = counts_table(words, levels, counted, totals, options.min_count, options.max_n)
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
    return {
        "text": build_vocab.vocabulary_text(table, selection),
        "grams": {n: {tuple(w.encode("utf-8") for w in t.split(" ")) for t in s.texts} for n, s in selection.items()},
        "stats": stats,
    }


def covered_words(batch: Sequence[Gram], selected: dict) -> int:
    """Words of the batch inside at least one occurrence of a selected n-gram."""
    covered = 0
    for words in batch:
        inside = bytearray(len(words))
        for n, grams in selected["grams"].items():
            for i in range(len(words) - n + 1):
                if words[i:i + n] in grams:
                    inside[i:i + n] = b"\x01" * n
        covered += sum(inside)
    return covered


def write(selected: dict, output: str, started: float, covered: int, invalid_utf8_bytes: int) -> None:
    from pmi_jax import storage
    from pmi_jax.formats import masking_vocab

    stats = dict(selected["stats"])
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
    if options.sample_words:  # --sample-words: the cut found in parallel, then a filter
        cut = (texts
               | "SamplePriorities" >> beam.Map(sample_priorities, options.sample_seed)
               | "SampleCut" >> beam.CombineGlobally(SampleCut(options.sample_words)))
        texts = texts | "Sample" >> beam.FlatMap(sampled, options.sample_seed, beam.pvalue.AsSingleton(cut))
    batches = texts | "Words" >> beam.Map(document_words, options.tokenizer, options.cased)
    invalid = read.invalid_utf8_bytes | "SumInvalid" >> beam.CombineGlobally(sum)
    totals = (batches
              | "Totals" >> beam.Map(batch_totals, max_n)
              | "SumTotals" >> beam.CombineGlobally(functools.partial(add_vectors, size=max_n + 1)))
    words = batches | "CountWords" >> beam.FlatMap(word_counts) | "SumWords" >> beam.CombinePerKey(sum)
    distinct_words = words | "DistinctWords" >> beam.combiners.Count.Globally()
    frequent_words = words | "FrequentWords" >> beam.Filter(is_frequent, min_count)
    word_side_input = beam.pvalue.AsDict(frequent_words)
    frequent = {}
    counted = []
    for n in range(2, max_n + 1):
        grams = (batches
                 | f"Count{n}" >> beam.FlatMap(ngram_counts, n, word_side_input)
                 | f"Sum{n}" >> beam.CombinePerKey(sum))
        if n >= 3:  # for n = 2 "both words frequent" is the sub-gram rule already
            grams = keep_where_frequent(grams, frequent[n - 1], slice(0, n - 1), f"Prefix{n}")
            grams = keep_where_frequent(grams, frequent[n - 1], slice(1, n), f"Suffix{n}")
        counted.append(grams | f"Counted{n}" >> beam.combiners.Count.Globally() | f"TagCounted{n}" >> beam.Map(tag, n))
        frequent[n] = grams | f"Frequent{n}" >> beam.Filter(is_frequent, min_count)
    # Selection input in compact arrays: ids in the frequent words' byte order, one array pair per length.
    words_index = frequent_words | "FrequentWordList" >> beam.combiners.ToList() | "WordIndex" >> beam.Map(word_index)
    levels = [(frequent[n]
               | f"Batch{n}" >> beam.BatchElements(min_batch_size=1_000, max_batch_size=100_000)
               | f"Ids{n}" >> beam.Map(gram_ids, beam.pvalue.AsSingleton(words_index))
               | f"Level{n}" >> beam.CombineGlobally(ConcatenateLevel(n))) for n in range(2, max_n + 1)]
    all_levels = levels | "AllLevels" >> beam.Flatten()
    selected = (pipeline
                | "Start" >> beam.Create([None])
                | "Select" >> beam.Map(select, options, list(files), words=beam.pvalue.AsSingleton(words_index),
                                       levels=beam.pvalue.AsList(all_levels),
                                       counted=beam.pvalue.AsList(counted | "AllCounted" >> beam.Flatten()),
                                       totals=beam.pvalue.AsSingleton(totals),
                                       distinct_words=beam.pvalue.AsSingleton(distinct_words)))
    covered = (batches
               | "Coverage" >> beam.Map(covered_words, beam.pvalue.AsSingleton(selected))
               | "SumCoverage" >> beam.CombineGlobally(sum))
    _ = selected | "Write" >> beam.Map(write, output, started, beam.pvalue.AsSingleton(covered),
                                       beam.pvalue.AsSingleton(invalid))


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
    with beam_pipeline.user_errors_in_one_line(), \
            beam.Pipeline(options=pipeline_options or beam_options.direct_runner()) as pipeline:
        build_pipeline(pipeline, files, output, options, started)
    with storage.gfile.GFile(storage.join(output, masking_vocab.STATS_JSON)) as f:
        return json.load(f)
