"""The flags naming a preprocessing command's text, its output and its word splitting, defined
once for `vocab build` and `corpus prepare`: both read documents through
preprocess/text/documents.py and split words alike, so they take them alike."""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags
from pmi_jax.formats.text import DEFAULT_TEXT_FIELD


def add_input_flags(parser: argparse.ArgumentParser, output_help: str) -> None:
    """--input, --text-field and --output (a directory)."""
    io_flags.reads(parser.add_argument(
        "--input", nargs="+", required=True, metavar="PATTERN",
        help="text files (documents separated by blank lines), .jsonl (optionally .gz), .parquet, .arrow, or a "
        "directory saved by Hugging Face datasets' save_to_disk; paths, globs or directories, local or gs://"))
    parser.add_argument("--text-field", default=DEFAULT_TEXT_FIELD, metavar="NAME",
                        help="the field holding each document in JSON lines, Parquet and Arrow inputs "
                        "(default %(default)s)")
    io_flags.writes(parser.add_argument("--output", required=True, metavar="DIR", help=output_help), directory=True)


def add_tokenizer_flags(parser: argparse.ArgumentParser, tokenizer_group=None) -> None:
    """--tokenizer (in `tokenizer_group`, where it excludes other choices of vocabulary) and --cased."""
    io_flags.reads((tokenizer_group or parser).add_argument(
        "--tokenizer", metavar="PATH",
        help="your own tokenizer: a Hugging Face tokenizer.json (WordPiece, BPE or Unigram; special tokens [PAD] "
        "(id 0) [UNK] [CLS] [SEP] [MASK]), or a BERT vocab.txt with --cased. Words are what its normalizer and "
        "pre-tokenizer make of the text (give `vocab build` and `corpus prepare` the same one); `corpus prepare` "
        "takes the ids it gives each document. Default: BERT's uncased words. See docs/tokenizers.md"))
    parser.add_argument("--cased", action="store_true",
                        help="with --tokenizer VOCAB_TXT: BERT's cased WordPiece (no lower-casing, accents kept)")
