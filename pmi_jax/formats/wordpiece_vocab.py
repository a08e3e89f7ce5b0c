"""A BERT `vocab.txt` (docs/design.md, "Prepared corpus"): one token per line, id = line number.

The one reader, checker and writer of vocab.txt files: corpus preparation writes it, the seqio
vocabulary, evaluation and export read it, and all of them agree on its hash (`vocab_sha256`),
which checkpoints record so that a model is never paired with another vocabulary.
"""
from __future__ import annotations

import collections
import hashlib
from typing import Sequence

from pmi_jax import storage
from pmi_jax.errors import UserInputError

# Reserved tokens of a trained vocabulary, at ids 0..4 in this order; [PAD] must be id 0 in any.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def vocab_sha256(tokens: Sequence[str]) -> str:
    return hashlib.sha256(vocab_text(tokens).encode("utf-8")).hexdigest()


def vocab_text(tokens: Sequence[str]) -> str:
    return "".join(t + "\n" for t in tokens)


def write_vocab(path: str, tokens: Sequence[str]) -> None:
    """Write a BERT vocab.txt atomically: a reader never sees half a vocabulary."""
    with storage.atomic_file(path) as f:
        f.write(vocab_text(tokens))


def read_vocab(path: str) -> list[str]:
    """Tokens of a BERT vocab.txt, one per line; the id of a token is its line number.

    The one reader of vocab.txt files (training's seqio vocabulary uses it too). Strict UTF-8:
    a vocabulary whose bytes do not decode is a broken file, not something to guess at.
    """
    if not storage.gfile.exists(path):
        raise UserInputError(f"{path}: no such vocabulary file")
    with storage.gfile.GFile(path, "rb") as f:
        try:
            text = f.read().decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise UserInputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    tokens = [t.rstrip("\r") for t in text.split("\n")]
    while tokens and not tokens[-1]:
        tokens.pop()
    return tokens


def load_vocab(path: str) -> list[str]:
    """Read a BERT vocab.txt and check it has what BERT needs (`check_bert_vocab`)."""
    tokens = read_vocab(path)
    check_bert_vocab(tokens, path)
    return tokens


def check_bert_vocab(tokens: Sequence[str], path: str) -> None:
    """A vocab.txt BERT can use: [PAD] at id 0, every special token, no duplicate, no blank line."""
    if not tokens or tokens[0] != "[PAD]":
        raise UserInputError(f"--wordpiece {path}: the first line must be [PAD] (id 0), "
                             f"found {tokens[0] if tokens else 'an empty file'!r}")
    missing = [t for t in SPECIAL_TOKENS if t not in set(tokens)]
    if missing:
        raise UserInputError(f"--wordpiece {path}: special token(s) {' '.join(missing)} missing "
                             f"(a BERT vocab.txt needs {' '.join(SPECIAL_TOKENS)})")
    counts = collections.Counter(tokens)
    duplicated = sorted(t for t, c in counts.items() if c > 1)
    if duplicated:
        raise UserInputError(f"--wordpiece {path}: {len(duplicated)} token(s) appear twice, e.g. {duplicated[0]!r}")
    blank = [i for i, t in enumerate(tokens) if not t.strip() or t != t.strip()]
    if blank:
        raise UserInputError(f"--wordpiece {path}: line {blank[0] + 1} is blank or has surrounding spaces")


def special_ids(tokens: Sequence[str], source: str = "vocabulary") -> dict[str, int]:
    """{"pad", "unk", "cls", "sep", "mask"} -> id; `source` names the file in the error when one is missing."""
    index = {t: i for i, t in enumerate(tokens)}
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise UserInputError(f"{source}: missing special token(s) {' '.join(missing)} "
                             f"(a BERT vocab.txt needs {' '.join(SPECIAL_TOKENS)})")
    return {t.strip("[]").lower(): index[t] for t in SPECIAL_TOKENS}


def check_matches_checkpoint(source: str, *, sha256: str, size: int, expected_sha256: str | None, vocab_size: int,
                             checkpoint: str) -> None:
    """The vocabulary named by `source` is the one `checkpoint` was trained with.

    Token ids mean nothing under another vocabulary, and a vocabulary of the same size gives
    no error downstream, only wrong numbers; so every reader of a checkpoint (perplexity,
    fine-tuning, export) refuses one whose SHA-256 differs from what the run recorded, or
    whose size differs from the model's. `source` is how the user named the file
    ("--vocab v.txt", "--data DIR: its vocab.txt").
    """
    if expected_sha256 and expected_sha256 != sha256:
        raise UserInputError(f"{source} is not the vocabulary checkpoint {checkpoint} was trained with "
                             f"(sha256 {sha256[:12]}, the checkpoint recorded {expected_sha256[:12]})")
    if size != vocab_size:
        raise UserInputError(f"{source} has {size} tokens, checkpoint {checkpoint} has vocab_size {vocab_size}")
