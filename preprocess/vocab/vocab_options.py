"""What `vocab build` is asked to do: VocabOptions, whose fields are also the command's flags.

A field with help in its metadata is a flag (pmi_jax/cli/config_flags.py), so its name, type,
default and help are written once, here; the input, output and tokenizer flags shared with
`corpus prepare` are pmi_jax/cli/text_input.py's. This module imports nothing heavy: the parser
reads it for every `pmi-jax` command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os

from pmi_jax.errors import UserInputError
from pmi_jax.formats.text import DEFAULT_TEXT_FIELD
from pmi_jax.preprocess.command_fields import flag
from pmi_jax.preprocess.vocab.measures import MEASURES


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")


@dataclasses.dataclass(frozen=True)
class VocabOptions:
    measure: str = flag(
        "pmi", "(default %(default)s) pmi: the paper's PMI_n, log p(w) minus the best segmentation into shorter "
        "spans; pmi-p2: 2·log p(w) minus that, as in AI21's published lists; naive-pmi: log p(w) minus the word "
        "log-probabilities; frequency: the count", choices=MEASURES)
    size: int = flag(800_000, "number of n-grams to select (default %(default)s)")
    min_count: int = flag(11, "candidates occur at least this many times (default %(default)s, the paper's "
                          "'more than 10')")
    max_n: int = flag(5, "longest n-gram, 2 to 5 (default %(default)s)")
    shares: tuple[float, ...] | None = flag(  # None: vocab_selection.default_shares(max_n)
        None, "comma-separated fraction of --size for each length 2..max-n, summing to 1 (default 0.5,0.25,0.125,"
        "0.125 for max-n 5: each length half of the rest, the longest the remainder); a length with too few "
        "candidates keeps them all and leaves its quota unused", type=_floats, metavar="S2,S3,...")
    workers: int = flag(0, "threads for reading and counting (default: every core)")
    memory_mb: int = flag(2048, "n-gram counts held in memory before they spill to disk partitions (default "
                          "%(default)s)")
    tmp_dir: str | None = flag(
        None, "local directory for the word-id stream and spilled counts (default: a hidden temporary directory "
        "beside a local --output, $TMPDIR for gs://); needs about 16 bytes per corpus word, plus the counts that "
        "spill; removed at the end, and what a killed run left is removed by the next run", scratch=True)
    text_field: str = DEFAULT_TEXT_FIELD  # the documents' field in JSON lines, Parquet and Arrow
    tokenizer: str | None = None  # words as this tokenizer.json (or cased vocab.txt) splits them (hf_tokenizer)
    cased: bool = False  # a --tokenizer vocab.txt is cased BERT
    sample_words: int = flag(
        0, "build from a seeded sample of whole documents of about N whitespace-separated words (the documents of "
        "lowest hash priority; the same on every runner), not the whole corpus (default 0: the whole corpus); "
        "benchmarks/README.md says how large a sample the vocabulary needs", metavar="N")
    sample_seed: int = flag(0, "seed of --sample-words' draw (default 0)")

    def validated(self) -> "VocabOptions":
        """These options with defaults filled in; UserInputError naming the first bad option."""
        from pmi_jax.preprocess.vocab import vocab_selection

        if self.measure not in MEASURES:
            raise UserInputError(f"--measure {self.measure}: expected one of {', '.join(MEASURES)}")
        if self.size < 1:
            raise UserInputError(f"--size {self.size}: must be at least 1")
        if self.min_count < 1:
            raise UserInputError(f"--min-count {self.min_count}: must be at least 1")
        if not vocab_selection.MIN_N <= self.max_n <= vocab_selection.MAX_N:
            raise UserInputError(
                f"--max-n {self.max_n}: must be between {vocab_selection.MIN_N} and {vocab_selection.MAX_N}")
        shares = self.shares if self.shares is not None else vocab_selection.default_shares(self.max_n)
        shown = ",".join(f"{s:g}" for s in shares)
        if len(shares) != self.max_n - 1:
            raise UserInputError(f"--shares {shown}: need {self.max_n - 1} values, one per length 2..{self.max_n}")
        if any(not math.isfinite(s) or s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
            raise UserInputError(f"--shares {shown}: must be non-negative and sum to 1")
        if self.workers < 0:
            raise UserInputError(f"--workers {self.workers}: must be at least 1 (or 0: every core)")
        if self.memory_mb < 1:
            raise UserInputError(f"--memory-mb {self.memory_mb}: must be at least 1")
        if self.sample_words < 0:
            raise UserInputError(f"--sample-words {self.sample_words}: must be positive (or 0: the whole corpus)")
        if self.tmp_dir is not None and not os.path.isdir(self.tmp_dir):
            raise UserInputError(f"--tmp-dir {self.tmp_dir}: not a local directory")
        return dataclasses.replace(self, shares=tuple(float(s) for s in shares),
                                   workers=self.workers or len(os.sched_getaffinity(0)))
