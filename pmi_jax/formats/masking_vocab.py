"""The masking vocabulary's files (docs/design.md, "Masking vocabulary"): the one writer and reader.

A vocabulary directory holds
  masking_vocab.txt   one n-gram per line, words joined by single spaces, ordered by n, then rank
  masking_vocab.tsv   header `ngram	n	count	score`, the same rows in the same order
  stats.json          corpus sizes, counts per length, the selection, coverage, options
`load_ngrams` reads such a directory or any file with one n-gram per line (e.g. AI21's published
lists).
"""
from __future__ import annotations

import json

from pmi_jax.errors import UserInputError
from pmi_jax.storage import gfile, join

VOCAB_TXT = "masking_vocab.txt"
VOCAB_TSV = "masking_vocab.tsv"
STATS_JSON = "stats.json"
TSV_HEADER = "ngram\tn\tcount\tscore"
MIN_N, MAX_N = 2, 5


def write_vocabulary(directory: str, vocab_lines: str, tsv_rows: str, stats: dict) -> None:
    """Write the three files into `directory` (a fresh temporary directory the caller renames).

    `vocab_lines` and `tsv_rows` are the files' lines already joined, each ending in a newline
    (`preprocess.build_vocab.vocabulary_text`): a vocabulary has up to 800K of them.
    """
    with gfile.GFile(join(directory, VOCAB_TXT), "w") as f:
        f.write(vocab_lines)
    with gfile.GFile(join(directory, VOCAB_TSV), "w") as f:
        f.write(TSV_HEADER + "\n" + tsv_rows)
    with gfile.GFile(join(directory, STATS_JSON), "w") as f:
        f.write(json.dumps(stats, indent=2) + "\n")


def load_ngrams(path: str) -> list[tuple[str, ...]]:
    """The n-grams of a vocabulary directory (its masking_vocab.txt) or of a one-n-gram-per-line file.

    Words are separated by spaces; blank lines are skipped; file order is kept. Only "\\n" ends a
    line: characters such as U+2028 may be part of a word.
    """
    file = join(path, VOCAB_TXT) if gfile.isdir(path) else path
    if not gfile.exists(file):
        raise UserInputError(f"{file}: no such file")
    with gfile.GFile(file, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    ngrams = [tuple(line.split(" ")) for line in (raw.strip(" \t\r") for raw in text.split("\n")) if line]
    ngrams = [tuple(w for w in ngram if w) for ngram in ngrams]
    if not ngrams:
        raise UserInputError(f"{file}: holds no n-grams")
    return ngrams
