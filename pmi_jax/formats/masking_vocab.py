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
from pmi_jax.formats.text import read_text
from pmi_jax.storage import gfile, join, read_json_object

VOCAB_TXT = "masking_vocab.txt"
VOCAB_TSV = "masking_vocab.tsv"
STATS_JSON = "stats.json"
TSV_HEADER = "ngram\tn\tcount\tscore"
MIN_N, MAX_N = 2, 5


def write_vocabulary(directory: str, vocab_lines: str, tsv_rows: str, stats: dict) -> None:
    """Write the three files into `directory` (a fresh temporary directory the caller renames).

    `vocab_lines` and `tsv_rows` are the files' lines already joined, each ending in a newline
    (`pmi_jax.preprocess.vocab.build_vocab.vocabulary_text`): a vocabulary has up to 800K of them.
    """
    with gfile.GFile(join(directory, VOCAB_TXT), "w") as f:
        f.write(vocab_lines)
    with gfile.GFile(join(directory, VOCAB_TSV), "w") as f:
        f.write(TSV_HEADER + "\n" + tsv_rows)
    with gfile.GFile(join(directory, STATS_JSON), "w") as f:
        f.write(json.dumps(stats, indent=2) + "\n")


def read_table(directory: str) -> list[tuple[str, int, int, float]]:
    """The rows of a vocabulary directory's masking_vocab.tsv as (ngram, n, count, score), checked.

    A file that is not this table (wrong header, a row without four fields, a non-number, an n
    that is not the n-gram's length) is a one-line error naming the file and line.
    """
    path = join(directory, VOCAB_TSV)
    if not gfile.exists(path):
        raise UserInputError(f"{directory}: not a vocabulary directory (no {VOCAB_TSV})")
    if not gfile.exists(join(directory, VOCAB_TXT)):
        raise UserInputError(f"{directory}: not a complete vocabulary directory (no {VOCAB_TXT})")
    with gfile.GFile(path, "rb") as f:
        raw = f.read()
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise UserInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if lines[0] != TSV_HEADER:
        raise UserInputError(f"{path}: first line is not the header {TSV_HEADER!r}")
    rows = []
    for number, line in enumerate(lines[1:], 2):
        if not line:
            continue
        fields = line.split("\t")
        try:
            ngram, n, count, score = fields[0], int(fields[1]), int(fields[2]), float(fields[3])
            if len(fields) != 4 or n != len(ngram.split(" ")) or not MIN_N <= n <= MAX_N or count < 1:
                raise ValueError
        except (ValueError, IndexError):
            raise UserInputError(f"{path}:{number}: not a row `ngram<TAB>n<TAB>count<TAB>score` "
                                 f"of a {MIN_N}..{MAX_N}-gram: {line[:60]!r}") from None
        rows.append((ngram, n, count, score))
    return rows


def read_stats(directory: str) -> dict:
    """stats.json of a vocabulary directory; a one-line error if it is missing or not a JSON object."""
    path = join(directory, STATS_JSON)
    if not gfile.exists(path):
        raise UserInputError(f"{directory}: not a vocabulary directory (no {STATS_JSON})")
    return read_json_object(path)


def load_ngrams(path: str) -> list[tuple[str, ...]]:
    """The n-grams of a vocabulary directory (its masking_vocab.txt) or of a one-n-gram-per-line file.

    Words are separated by spaces; blank lines are skipped; file order is kept. Only "\\n" ends a
    line: characters such as U+2028 may be part of a word.
    """
    file = join(path, VOCAB_TXT) if gfile.isdir(path) else path
    if not gfile.exists(file):
        raise UserInputError(f"{file}: no such file")
    with gfile.GFile(file, "rb") as f:
        text = read_text(file, f.read())
    ngrams = [tuple(line.split(" ")) for line in (raw.strip(" \t\r") for raw in text.split("\n")) if line]
    ngrams = [tuple(w for w in ngram if w) for ngram in ngrams]
    if not ngrams:
        raise UserInputError(f"{file}: holds no n-grams")
    return ngrams
