"""What `corpus prepare` is asked to do: PrepareConfig, whose fields are also the command's flags.

Each field that is a flag of its own carries its help (and argparse's metavar, its input role,
its group) in `metadata`; pmi_jax/cli/config_flags.py turns the fields into flags, so a flag's
name, type, default and help are written once, here. The flags shared with `vocab build`
(--input, --output, --text-field, --tokenizer, --cased) are pmi_jax/cli/text_input.py's. This
module imports nothing heavy: the parser reads it for every `pmi-jax` command line.
"""
from __future__ import annotations

import dataclasses

from pmi_jax.formats.text import DEFAULT_TEXT_FIELD
from pmi_jax.preprocess.command_fields import flag

WORDPIECE_SIZE = 30_522  # BERT's vocabulary size: a trained WordPiece vocabulary's default


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    inputs: tuple[str, ...]
    output: str
    wordpiece: str | None = flag(
        None, "an existing BERT vocab.txt (uncased; [PAD] on line 1, with [UNK] [CLS] [SEP] [MASK]); without it an "
        "uncased vocabulary is trained on the corpus", metavar="VOCAB_TXT", reads=True, exclusive="vocabulary")
    wordpiece_size: int = flag(
        WORDPIECE_SIZE, "size of the trained vocabulary, special tokens included (default %(default)s; a small corpus "
        "yields fewer: pieces seen under 10 times are left out)", metavar="N", exclusive="vocabulary")
    wordpiece_sample_words: int = flag(
        0, "train the WordPiece vocabulary on a seeded sample of whole documents of about N whitespace-separated "
        "words, the sample `vocab build --sample-words` draws (default %(default)s: the whole corpus)", metavar="N")
    wordpiece_sample_seed: int = flag(0, "seed of --wordpiece-sample-words' draw (default %(default)s)", metavar="S")
    units: tuple[tuple[str, str], ...] = flag(  # (name, masking vocabulary dir or n-gram list)
        (), "a masking vocabulary: a `pmi-jax vocab build` directory or a file with one n-gram per line; writes the "
        "feature units_NAME. Repeat for several (e.g. pmi=... naive_pmi=... frequency=...)", metavar="NAME=VOCAB",
        action="append", reads="named")
    seq_len: int = flag(
        512, "tokens per sequence including [CLS] and [SEP] (default %(default)s, at least 8, at most the longest "
        "max_position_embeddings of the configs in configs/)")
    validation_fraction: float = flag(
        0.01, "fraction of documents held out as the validation split: each document with this probability, drawn "
        "from --seed and a hash of its text (default %(default)s; 0 for none)", metavar="F")
    shards: int = flag(
        0, "train shards; validation gets ceil(N * F). Default %(default)s: one train shard per 32 MiB of input "
        "files, at least 4", metavar="N")
    seed: int = flag(
        0, "seeds the validation choice and the choice between overlapping vocabulary entries (default %(default)s)")
    workers: int = flag(
        1, "processes counting words, training the WordPiece vocabulary and writing shards; does not change the "
        "output (default %(default)s)")
    overwrite: bool = flag(
        False, "replace the files of a different configuration found in --output (a rerun of the same configuration "
        "needs none: it checks the shards and rewrites what is missing)")
    progress: bool = flag(True, "no progress bars on stderr")  # the flag is --no-progress
    text_field: str = DEFAULT_TEXT_FIELD      # the documents' field in JSON lines, Parquet and Arrow
    tokenizer: str | None = None              # a tokenizer.json, or a vocab.txt (cased with `cased`)
    cased: bool = False
