"""`pmi-jax vocab build` as a function: corpus files -> masking vocabulary directory (DESIGN §1-3).

    count (preprocess/ngram_counts.py) -> score per length (preprocess/measures.py)
    -> rank and take quotas (preprocess/masking_vocab.py) -> coverage -> write atomically

The output is a function of the input text and of (measure, size, min_count, max_n, shares)
only: the same bytes whatever the number of workers and whether counts spilled to disk.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from typing import Sequence

import numpy as np

from pmi_jax.errors import UserInputError
from preprocess import masking_vocab, measures

_SCORE_BLOCK = 1 << 20  # candidates scored at once: bounds the span-count arrays in memory
# Scores are rounded before ranking so that mathematically equal scores, which float arithmetic
# may compute a few ulps apart (sums in another order), are ties broken by count and string.
SCORE_DECIMALS = 9


@dataclasses.dataclass(frozen=True)
class VocabOptions:
    measure: str = "pmi"
    size: int = 800_000
    min_count: int = 11
    max_n: int = 5
    shares: tuple[float, ...] | None = None  # None: masking_vocab.default_shares(max_n)
    workers: int = 0  # 0: every core
    memory_mb: int = 2048  # budget for the n-gram counts held in memory before they spill to disk
    tmp_dir: str | None = None  # local scratch space for the id stream and spills (default: $TMPDIR)

    def validated(self) -> "VocabOptions":
        """These options with defaults filled in; UserInputError naming the first bad option."""
        if self.measure not in measures.MEASURES:
            raise UserInputError(f"--measure {self.measure}: expected one of {', '.join(measures.MEASURES)}")
        if self.size < 1:
            raise UserInputError(f"--size {self.size}: must be at least 1")
        if self.min_count < 1:
            raise UserInputError(f"--min-count {self.min_count}: must be at least 1")
        if not masking_vocab.MIN_N <= self.max_n <= masking_vocab.MAX_N:
            raise UserInputError(
                f"--max-n {self.max_n}: must be between {masking_vocab.MIN_N} and {masking_vocab.MAX_N}")
        shares = self.shares if self.shares is not None else masking_vocab.default_shares(self.max_n)
        shown = ",".join(f"{s:g}" for s in shares)
        if len(shares) != self.max_n - 1:
            raise UserInputError(f"--shares {shown}: need {self.max_n - 1} values, one per length 2..{self.max_n}")
        if any(not math.isfinite(s) or s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
            raise UserInputError(f"--shares {shown}: must be non-negative and sum to 1")
        if self.workers < 0:
            raise UserInputError(f"--workers {self.workers}: must be at least 1 (or 0: every core)")
        if self.memory_mb < 1:
            raise UserInputError(f"--memory-mb {self.memory_mb}: must be at least 1")
        if self.tmp_dir is not None and not os.path.isdir(self.tmp_dir):
            raise UserInputError(f"--tmp-dir {self.tmp_dir}: not a local directory")
        return dataclasses.replace(self, shares=tuple(float(s) for s in shares),
                                   workers=self.workers or len(os.sched_getaffinity(0)))


def build_vocabulary(inputs: Sequence[str], output: str, options: VocabOptions = VocabOptions(),
                     overwrite: bool = False, progress: bool = False,
                     memory_budget_bytes: int | None = None, chunk_positions: int = 1 << 20) -> dict:
    """Build the masking vocabulary of the documents in `inputs` into the directory `output`.

    Returns the statistics written to stats.json. Bad options, missing or empty input and an
    existing `output` (without `overwrite`) raise UserInputError before anything is written.
    `memory_budget_bytes` and `chunk_positions` exist for tests (force spilling, many chunks).
    """
    from pmi_jax import storage
    from preprocess.documents import expand_inputs
    from preprocess.ngram_counts import count_ngrams, covered_fraction, tokenise_corpus

    started = time.time()
    options = options.validated()
    if storage.gfile.exists(output) and not overwrite:
        raise UserInputError(f"--output {output}: already exists (pass --overwrite to replace it)")
    files = expand_inputs(inputs)
    budget = memory_budget_bytes if memory_budget_bytes is not None else options.memory_mb << 20
    with tempfile.TemporaryDirectory(prefix="pmi-jax-vocab-", dir=options.tmp_dir) as work_dir:
        stream = tokenise_corpus(files, work_dir, options.max_n, options.workers, progress)
        if stream.num_words == 0:
            raise UserInputError(
                f"--input {' '.join(inputs)}: no words in {len(files)} file(s): {', '.join(files[:3])}")
        table = count_ngrams(stream, options.max_n, options.min_count, work_dir, options.workers, budget,
                             chunk_positions, progress)
        selection = select_ngrams(table, options)
        if not any(s.texts for s in selection.values()):
            raise UserInputError(f"--input {' '.join(inputs)}: no n-gram of 2 or more words occurs "
                                 f"--min-count {options.min_count} times; give more text or lower --min-count")
        coverage = covered_fraction(stream, table, {n: s.index for n, s in selection.items()}, options.workers,
                                    chunk_positions, progress)
    stats = vocabulary_stats(files, table, selection, coverage, options, time.time() - started)
    texts = [t for s in selection.values() for t in s.texts]
    rows = [r for n, s in selection.items() for r in masking_vocab.format_rows(s.texts, n, s.counts, s.scores)]
    try:
        with storage.atomic_directory(output, overwrite=overwrite) as tmp:
            masking_vocab.write_vocabulary(tmp, texts, rows, stats)
    except FileExistsError:  # created by someone else while we counted
        raise UserInputError(f"--output {output}: already exists (pass --overwrite to replace it)")
    return stats


@dataclasses.dataclass
class SelectedNgrams:
    """The chosen n-grams of one length, best first."""

    quota: int
    candidates: int
    index: np.ndarray  # into table.keys[n]
    counts: np.ndarray
    scores: np.ndarray
    texts: list[str]


def select_ngrams(table, options: VocabOptions) -> dict[int, SelectedNgrams]:
    word_order = table.word_order()
    selection = {}
    for n, quota in masking_vocab.quotas(options.size, options.shares).items():
        words_CxN = table.ngram_words(n)
        counts = table.counts[n]
        scores = np.concatenate([
            measures.score(options.measure, table.span_counts(words_CxN[i:i + _SCORE_BLOCK]), table.num_positions, n)
            for i in range(0, len(words_CxN), _SCORE_BLOCK)] or [np.zeros([0])]).round(SCORE_DECIMALS)
        best = masking_vocab.rank(scores, counts, word_order[words_CxN])[:quota]
        if len(best) < quota:
            logging.warning("only %d %d-grams occur at least %d times, fewer than the quota of %d; "
                            "the shortfall is not given to other lengths", len(counts), n, options.min_count, quota)
        selection[n] = SelectedNgrams(quota=quota, candidates=len(counts), index=best, counts=counts[best],
                                 scores=scores[best], texts=table.text(words_CxN[best]))
    return selection


def vocabulary_stats(files, table, selection, coverage, options: VocabOptions, elapsed: float) -> dict:
    lengths = range(1, options.max_n + 1)
    return {
        "documents": table.documents,
        "words": table.num_words,
        "distinct_words": table.counted[1],
        "frequent_words": table.num_frequent_words,
        "positions": {str(k): table.num_positions[k] for k in lengths},
        # n >= 2: only n-grams whose two (n-1)-word sub-grams are frequent are counted (Apriori),
        # so this is the number of distinct n-grams of that kind, not of all n-grams.
        "counted_ngrams": {str(k): table.counted[k] for k in lengths},
        "candidates": {str(n): s.candidates for n, s in selection.items()},
        "quota": {str(n): s.quota for n, s in selection.items()},
        "selected": {str(n): len(s.texts) for n, s in selection.items()},
        "vocabulary_size": sum(len(s.texts) for s in selection.values()),
        "coverage": coverage,
        "measure": options.measure,
        "options": {"measure": options.measure, "size": options.size, "min_count": options.min_count,
                    "max_n": options.max_n, "shares": list(options.shares), "workers": options.workers,
                    "memory_mb": options.memory_mb},
        "inputs": list(files),
        "spilled_to_disk": table.spilled,
        "elapsed_seconds": round(elapsed, 3),
    }
