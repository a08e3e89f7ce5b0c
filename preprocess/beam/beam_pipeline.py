"""What the two Beam pipelines share: running them, reading the corpus in parallel, a checked
sample (runner flags: beam_options.py).

`pmi_jax.preprocess.beam.beam_vocab` and `pmi_jax.preprocess.beam.beam_prepare` run the local pipelines' own code
(`pmi-jax vocab build`, `pmi-jax corpus prepare`) as Apache Beam transforms; those commands
run them when given `--runner`.
"""
from __future__ import annotations

import contextlib
import logging
import re
from typing import Iterator, Sequence

import apache_beam as beam
import numpy as np

from pmi_jax.errors import DataLost, UserInputError

# Documents are read and split into words in batches of about this many characters: the
# unit of parallel work, large enough that per-element overhead vanishes.
BATCH_CHARS = 1_000_000


def _read_batches(path: str, batch_chars: int, text_field: str) -> Iterator[list[str]]:
    """The batches of one file, then its count of invalid UTF-8 bytes on the output "invalid"."""
    from pmi_jax.preprocess.text.documents import iter_document_batches, tally_replacements

    with tally_replacements() as replaced:
        yield from iter_document_batches([path], batch_chars, text_field)
    yield beam.pvalue.TaggedOutput("invalid", sum(replaced.values()))


class ReadDocumentBatches(beam.PTransform):
    """Input files -> batches (lists) of their documents, spread over the workers.

    One file is read by one worker, in order; give a large corpus as many files (a few hundred
    MB each) so that reading is parallel too. The batches are then redistributed, so that the
    work done per batch is spread evenly whatever the file sizes.
    """

    def __init__(self, files: Sequence[str], batch_chars: int = BATCH_CHARS, text_field: str = "text"):
        super().__init__()
        self._files = list(files)
        self._batch_chars = batch_chars
        self._text_field = text_field

    def expand(self, pbegin):
        read = (pbegin
                | "Files" >> beam.Create(self._files)
                | "SpreadFiles" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(_read_batches, self._batch_chars, self._text_field).with_outputs("invalid", main="batches"))
        # Per file, the bytes replaced by U+FFFD (stats.json's invalid_utf8_bytes); read after applying.
        self.invalid_utf8_bytes = read.invalid
        return read.batches | "SpreadBatches" >> beam.Reshuffle()


# ---------------------------------------------------------------------------------------------
# A seeded sample of documents (--sample-words): pmi_jax.preprocess.text.sample, its cut combined over the workers


def sample_priorities(batch: Sequence[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    from pmi_jax.preprocess.text import sample

    return sample.priorities(batch, seed), sample.whitespace_words(batch)


def sampled(batch: Sequence[str], seed: int, cut: tuple[int, int]) -> Iterator[list[str]]:
    from pmi_jax.preprocess.text import sample

    kept = sample.in_sample(batch, seed, cut[0])
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

    def extract_output(self, accumulator) -> tuple[int, int]:
        """(the cut, the sample's documents): `lowest` of the whole corpus is the sample, ties included."""
        from pmi_jax.preprocess.text import sample

        priority, words = sample.lowest(*accumulator, self._target)
        return sample.cut(priority, words, self._target), len(priority)


def check_sample(kept: int, cut: tuple[int, int]) -> int:
    """The filter kept every document of the sample (a runner can drop batches between stages, as
    Beam's DirectRunner did: direct_data_plane.py); the kept count, for the step a loss must stop."""
    if kept != cut[1]:
        raise DataLost.between_stages(f"the sample's filter kept {kept:,} of the sample's {cut[1]:,} documents")
    return kept


class SampleDocuments(beam.PTransform):
    """Batches of documents -> batches of the sampled ones: the cut found in parallel, then a filter.

    `checked` (set by applying it) is the kept document count, checked against the cut's: give it
    as a side input to the step that writes, so that a sample missing a batch writes nothing."""

    def __init__(self, words: int, seed: int):
        super().__init__()
        self._words, self._seed = words, seed

    def expand(self, texts):
        cut = beam.pvalue.AsSingleton(texts
                                      | "Priorities" >> beam.Map(sample_priorities, self._seed)
                                      | "Cut" >> beam.CombineGlobally(SampleCut(self._words)))
        kept = texts | "Filter" >> beam.FlatMap(sampled, self._seed, cut)
        self.checked = beam.pvalue.AsSingleton(kept
                                               | "KeptDocuments" >> beam.Map(len)
                                               | "SumKept" >> beam.CombineGlobally(sum)
                                               | "CheckSample" >> beam.Map(check_sample, cut))
        return kept


class _DropUserInputErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], UserInputError))


@contextlib.contextmanager
def running(options=None) -> Iterator[beam.Pipeline]:
    """A pipeline to build inside the block; it runs on leaving it (in this process by default),
    with a bad input reported in one line and the DirectRunner's data plane made safe
    (`direct_data_plane`)."""
    from pmi_jax.preprocess.beam import beam_options, direct_data_plane

    with user_errors_in_one_line(), direct_data_plane.without_timed_flush(), \
            beam.Pipeline(options=options or beam_options.direct_runner()) as pipeline:
        yield pipeline


@contextlib.contextmanager
def user_errors_in_one_line() -> Iterator[None]:
    """Run a pipeline so that a bad input stops it with the one-line error the local runs give.

    A UserInputError raised in a worker (a JSON line whose "text" is not a string, say) comes
    back from the DirectRunner as itself, with " [while running 'STEP']" appended, after Beam has
    logged its traceback; here the log record is dropped and the suffix removed. (On Dataflow the
    error is reported by the service, traceback included.)
    """
    quiet = _DropUserInputErrors()
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    except UserInputError as e:
        raise UserInputError(re.sub(r"( \[while running '[^']*'\])+$", "", str(e))) from None
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
