"""`pmi-jax vocab build` as a function: corpus files -> masking vocabulary directory.

The contract: docs/design.md, "Words and n-grams", "Measures" and "Masking vocabulary".

    count (preprocess/vocab/ngram_counts.py) -> score per length (preprocess/vocab/measures.py)
    -> rank and take quotas (preprocess/masking_vocab.py) -> coverage -> write atomically

The output is a function of the input text and of (measure, size, min_count, max_n, shares)
only: the same bytes whatever the number of workers and whether counts spilled to disk.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Sequence

import numpy as np

from pmi_jax.errors import OutputExists, UserInputError
from pmi_jax.formats import masking_vocab, run_dir
from pmi_jax.preprocess.text import documents
from pmi_jax.preprocess.vocab import measures
from pmi_jax.preprocess.vocab import vocab_selection
from pmi_jax.preprocess.vocab.vocab_options import VocabOptions

_SCORE_BLOCK = 1 << 20  # candidates scored at once: bounds the span-count arrays in memory
# Scores are rounded before ranking so that mathematically equal scores, which float arithmetic
# may compute a few ulps apart (sums in another order), are ties broken by count and string.
SCORE_DECIMALS = 9


def build_vocabulary(inputs: Sequence[str], output: str, options: VocabOptions = VocabOptions(),
                     overwrite: bool = False, progress: bool = False,
                     memory_budget_bytes: int | None = None, chunk_positions: int = 1 << 20) -> dict:
    """Build the masking vocabulary of the documents in `inputs` into the directory `output`.

    Returns the statistics written to stats.json. Bad options, missing or empty input and an
    existing `output` (without `overwrite`) raise UserInputError before anything is written.
    `memory_budget_bytes` and `chunk_positions` exist for tests (force spilling, many chunks).
    Run it inside `pmi_jax.preprocess.vocab.malloc_thresholds.large_array_malloc()` for full speed (the
    command does).
    """
    from pmi_jax import storage
    from pmi_jax.preprocess.vocab.coverage import covered_fraction
    from pmi_jax.preprocess.text import hf_tokenizer
    from pmi_jax.preprocess.text.documents import check_output_apart, expand_inputs, tally_replacements
    from pmi_jax.preprocess.vocab.ngram_counts import count_ngrams
    from pmi_jax.preprocess.text.word_stream import tokenise_corpus

    started = time.time()
    options = options.validated()
    run_dir.check_new_output(output, overwrite, directory=True)
    files = expand_inputs(inputs)
    check_output_apart(inputs, files, output)
    tokenizer = hf_tokenizer.select(options.tokenizer, options.cased)
    budget = memory_budget_bytes if memory_budget_bytes is not None else options.memory_mb << 20
    with storage.scratch_directory(output, options.tmp_dir) as work_dir, tally_replacements() as replaced:
        read, text_field = files, options.text_field
        if options.sample_words:
            from pmi_jax.preprocess.text import sample

            read = [sample.write_sample(files, options.sample_words, options.sample_seed,
                                        os.path.join(work_dir, "sample.jsonl"), options.text_field)]
            text_field = documents.DEFAULT_TEXT_FIELD
        stream = tokenise_corpus(read, work_dir, options.max_n, options.workers, progress,
                                 text_field=text_field, tokenizer=tokenizer)
        if stream.num_words == 0:
            raise UserInputError(
                f"--input {' '.join(inputs)}: no words in {len(files)} file(s): {', '.join(files[:3])}")
        table = count_ngrams(stream, options.max_n, options.min_count, work_dir, options.workers, budget,
                             chunk_positions, progress)
        if tokenizer is not None:
            check_tokenizer_words(table.words, options.tokenizer)
        selection = select_ngrams(table, options)
        if not any(s.texts for s in selection.values()):
            raise UserInputError(f"--input {' '.join(inputs)}: no n-gram of 2 or more words occurs "
                                 f"--min-count {options.min_count} times; give more text or lower --min-count")
        coverage = covered_fraction(stream, table, {n: s.index for n, s in selection.items()}, options.workers,
                                    chunk_positions, progress)
    stats = vocabulary_stats(files, table, selection, coverage, options, time.time() - started,
                             sum(replaced.values()), tokenizer)
    vocab_lines, tsv_rows = vocabulary_text(table, selection)
    try:
        with storage.atomic_directory(output, overwrite=overwrite) as tmp:
            masking_vocab.write_vocabulary(tmp, vocab_lines, tsv_rows, stats)
    except FileExistsError:  # created by someone else while we counted
        raise OutputExists(output) from None
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
    words: np.ndarray  # int32 [len(index), n]: frequent-word indices (table.ngram_words)


def select_ngrams(table, options: VocabOptions) -> dict[int, SelectedNgrams]:
    word_order = table.word_order()
    selection = {}
    for n, quota in vocab_selection.quotas(options.size, options.shares).items():
        words_CxN = table.ngram_words(n)
        counts = table.counts[n]
        scores = np.concatenate([
            measures.score(options.measure, table.span_counts(words_CxN[i:i + _SCORE_BLOCK]), table.num_positions, n)
            for i in range(0, len(words_CxN), _SCORE_BLOCK)] or [np.zeros([0])]).round(SCORE_DECIMALS)
        best = vocab_selection.rank(scores, counts, word_order[words_CxN])[:quota]
        if len(best) < quota:
            logging.warning("only %d %d-grams occur at least %d times, fewer than the quota of %d; "
                            "the shortfall is not given to other lengths", len(counts), n, options.min_count, quota)
        selection[n] = SelectedNgrams(quota=quota, candidates=len(counts), index=best, counts=counts[best],
                                      scores=scores[best], texts=table.text(words_CxN[best]), words=words_CxN[best])
    return selection


def vocabulary_text(table, selection: dict[int, SelectedNgrams]) -> tuple[str, str]:
    """The lines of masking_vocab.txt and the rows of masking_vocab.tsv, each ending in a newline."""
    texts = [t for s in selection.values() for t in s.texts]
    vocab_lines = "\n".join(texts) + "\n" if texts else ""
    tsv_rows = "".join(tsv_rows_text(table, s.words, n, s.counts, s.scores) for n, s in selection.items())
    return vocab_lines, tsv_rows


def tsv_rows_text(table, words_CxN: np.ndarray, n: int, counts: np.ndarray, scores: np.ndarray) -> str:
    """masking_vocab.tsv rows `{ngram}\t{n}\t{count}\t{repr(score)}`, each followed by a newline.

    The score is written as repr() writes it (the shortest string that reads back as the same
    float64), but repr alone takes about half a microsecond per score, and a Python string per
    row adds more. Here the digits of all rows are computed at once (`_score_chars`), laid out in a character matrix, one row's
    "\t{n}\t{count}\t{score}" after another, and joined to the n-gram texts by `join_pieces_as_lines`.
    """
    from pmi_jax.preprocess.vocab.byte_pieces import join_pieces_as_lines

    buffer, starts, lengths = table.text_spans(words_CxN)
    count_chars, count_digits = _decimal_chars(np.asarray(counts, np.int64))
    score_chars, score_starts, score_lengths = _score_chars(np.asarray(scores, np.float64))
    rows = len(count_chars)
    separator = np.frombuffer(f"\t{n}\t".encode(), np.uint8)
    # One row per n-gram: the separator, the count right-aligned in its columns, a tab, the score
    # within its columns; `keep` marks the characters that belong to the row's text.
    suffix = np.concatenate([np.broadcast_to(separator, (rows, len(separator))), count_chars,
                             np.full([rows, 1], ord("\t"), np.uint8), score_chars], axis=1)
    column = np.arange(suffix.shape[1])[None, :]
    tab = len(separator) + count_chars.shape[1]  # the column of the tab after the count
    score_start = tab + 1 + score_starts[:, None]
    keep = ((column < len(separator)) | ((column >= tab - count_digits[:, None]) & (column <= tab))
            | ((column >= score_start) & (column < score_start + score_lengths[:, None])))
    suffix_lengths = len(separator) + count_digits + 1 + score_lengths
    return join_pieces_as_lines(np.concatenate([buffer, suffix[keep]]),
                                np.column_stack([starts, len(buffer) + np.cumsum(suffix_lengths) - suffix_lengths]),
                                np.column_stack([lengths, suffix_lengths]))


def _decimal_chars(values: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative integers as ASCII digits: (uint8 [len, width], right-aligned with leading zeros;
    the number of digits without them)."""
    width = width or len(str(int(values.max(initial=0))))
    chars = np.empty([len(values), width], np.uint8)
    # uint32 where the values allow: numpy divides it several times faster than int64.
    dtype = np.uint32 if values.max(initial=0) < 2**32 else np.int64
    rest, ten = values.astype(dtype), dtype(10)
    for column in range(width - 1, -1, -1):
        quotient = rest // ten
        chars[:, column] = rest - quotient * ten + dtype(ord("0"))
        rest = quotient
    leading_zeros = np.argmax(chars != ord("0"), axis=1)  # 0 where all are zeros: the value 0
    return chars, np.where(values > 0, width - leading_zeros, 1)


def _score_chars(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """repr() of each float64 as (uint8 chars [len, width], start and length of each within its row).

    Fast where |score| is in [1e-4, 2^21) and is the float nearest to a decimal q / 10^9 (scores
    are rounded to 9 decimals before ranking): there q is found exactly as rint(|score| * 10^9),
    no other decimal of at most 9 places lies within the float's half-ulp (< 10^-9 / 2), so the
    shortest round-trip string, repr's, is q / 10^9 without trailing zeros, and repr uses no
    exponent in that range. Other scores go through repr().
    """
    magnitude = np.abs(scores)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan are not fast
        scaled = np.rint(magnitude * 1e9)
        fast = (magnitude >= 1e-4) & (magnitude < 2.0**21) & (scaled / 1e9 == magnitude)
    whole, fraction = np.divmod(np.where(fast, scaled, 0).astype(np.int64), 10**9)
    whole_chars, whole_digits = _decimal_chars(whole)
    fraction_chars, _ = _decimal_chars(fraction, 9)
    # Trailing zeros go, but one digit stays ("3.0").
    fraction_digits = np.where(fraction > 0, 9 - np.argmax(fraction_chars[:, ::-1] != ord("0"), axis=1), 1)
    rows = np.arange(len(scores))
    chars = np.column_stack([np.full(len(scores), ord("-"), np.uint8), whole_chars,
                             np.full(len(scores), ord("."), np.uint8), fraction_chars])
    negative = scores < 0
    starts = 1 + whole_chars.shape[1] - whole_digits - negative
    chars[rows[negative], starts[negative]] = ord("-")
    lengths = negative + whole_digits + 1 + fraction_digits
    slow = np.flatnonzero(~fast)
    if len(slow):
        texts = [repr(float(s)).encode() for s in scores[slow]]
        width = max(chars.shape[1], max(map(len, texts)))
        chars = np.pad(chars, [(0, 0), (0, width - chars.shape[1])])
        for row, text in zip(slow.tolist(), texts):
            chars[row, :len(text)] = np.frombuffer(text, np.uint8)
        starts[slow] = 0
        lengths[slow] = np.fromiter(map(len, texts), np.int64, len(texts))
    return chars, starts, lengths


def check_tokenizer_words(words: Sequence[bytes], source: str) -> None:
    """Words go into masking_vocab.txt joined by spaces: a tokenizer whose frequent words (the
    candidates' words) hold white space (a pre-tokenizer that keeps it) cannot give a masking vocabulary."""
    import re

    text = b"\0".join(words).decode("utf-8")
    found = re.search(r"\s", text)
    if found:
        start, end = text.rfind("\0", 0, found.start()) + 1, text.find("\0", found.start())
        raise UserInputError(f"--tokenizer {source}: its pre-tokenizer yields words with white space "
                             f"({text[start:end if end >= 0 else None]!r}), which a masking vocabulary cannot list")


def vocabulary_stats(files, table, selection, coverage, options: VocabOptions, elapsed: float,
                     invalid_utf8_bytes: int, tokenizer=None) -> dict:
    lengths = range(1, options.max_n + 1)
    stats = {
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
        "invalid_utf8_bytes": invalid_utf8_bytes,  # replaced by U+FFFD while reading (preprocess/text/documents.py)
    }
    if options.sample_words:  # documents, words and coverage above are the sample's
        stats["sample"] = {"words": options.sample_words, "seed": options.sample_seed}
    if tokenizer is not None:  # absent: BERT's uncased words (preprocess/text/words.py)
        stats["tokenizer"] = tokenizer_record(tokenizer)
    return stats


def tokenizer_record(tokenizer) -> dict:
    """What stats.json says of the word splitting; `corpus prepare` matches `words_sha256`."""
    return {"source": tokenizer.source, "model": tokenizer.model, "sha256": tokenizer.sha256,
            "words_sha256": tokenizer.words_sha256}
