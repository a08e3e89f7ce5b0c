"""Input documents (docs/design.md, "Words and n-grams"): text files with blank-line-separated documents, or JSON lines.

Formats, chosen by file name (each optionally gzip-compressed, `.gz`):
  *.jsonl, *.json   one JSON object per line; the document is its "text" field.
  anything else     BERT pretraining text: documents separated by one or more blank lines,
                    the lines inside a document joined with a single space.
A few bytes that are not valid UTF-8 in real text are replaced with U+FFFD rather than failing
the job (and counted: `tally_replacements`); a file whose bytes are mostly not UTF-8 (a binary
file, another encoding) is refused, as are a `.gz` that is not gzip and a JSON line whose "text"
is not a string: each a one-line UserInputError naming the file.
"""
from __future__ import annotations

import contextlib
import contextvars
import gzip
import io
import json
import zlib
from typing import Iterable, Iterator, Sequence

from pmi_jax.errors import UserInputError
from pmi_jax import storage
from pmi_jax.formats import text as plain_text
from pmi_jax.storage import gfile

_GLOB_CHARS = set("*?[")
_TALLY: contextvars.ContextVar[dict | None] = contextvars.ContextVar("replaced_bytes", default=None)


@contextlib.contextmanager
def tally_replacements() -> Iterator[dict[str, int]]:
    """Collect {file: invalid UTF-8 bytes replaced} for the files read inside the block.

    A context variable rather than a parameter, so that the readers deep inside the counting
    pipeline need not pass it along; only files with replacements appear.
    """
    tally: dict[str, int] = {}
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)


def _is_json_lines(path: str) -> bool:
    name = path[:-3] if path.endswith(".gz") else path
    return name.endswith((".jsonl", ".json"))


def _files_under(directory: str) -> list[str]:
    found = []
    for root, _, names in gfile.walk(directory):
        found.extend(f"{root.rstrip('/')}/{n}" for n in names if not n.startswith("."))
    return sorted(found)


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Resolve paths, globs and directories to a sorted, de-duplicated list of files.

    Sorting makes the document order, and so every output, independent of listing order.
    """
    if not patterns:
        raise UserInputError("no --input given")
    files: list[str] = []
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = sorted(m for m in gfile.glob(pattern) if not gfile.isdir(m))
            if not matches:
                raise UserInputError(f"--input {pattern}: no file matches")
        elif gfile.isdir(pattern):
            matches = _files_under(pattern)
            if not matches:
                raise UserInputError(f"--input {pattern}: directory holds no text files")
        elif gfile.exists(pattern):
            matches = [pattern]
        else:
            raise UserInputError(f"--input {pattern}: no such file or directory")
        files.extend(matches)
    return sorted(dict.fromkeys(files))


def check_output_apart(inputs: Sequence[str], files: Sequence[str], output: str) -> None:
    """Refuse an --output inside an --input directory (a later run would read it as input) or
    one that holds an input file (replacing the output would delete it)."""
    for pattern in inputs:
        if not _GLOB_CHARS & set(pattern) and gfile.isdir(pattern) and storage.is_inside(output, pattern):
            raise UserInputError(f"--output {output}: lies inside --input {pattern}, so a later run would read "
                                 "this output as input; write it elsewhere")
    storage.check_output_apart(output, [("--input", path) for path in files])


class _GFileReader(io.RawIOBase):
    """tf.io.gfile.GFile as a standard raw stream, so io/gzip can layer on top of any URL."""

    def __init__(self, path: str):
        self._file = gfile.GFile(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


@contextlib.contextmanager
def _open_binary(path: str) -> Iterator[io.BufferedIOBase]:
    with io.BufferedReader(_GFileReader(path), buffer_size=1 << 20) as binary:
        yield gzip.GzipFile(fileobj=binary) if path.endswith(".gz") else binary


def _lines(path: str) -> Iterator[str]:
    """The lines of a file as text, split on "\n", "\r\n" and "\r" (Python's universal newlines).

    Invalid UTF-8 is replaced and counted; a file that is mostly invalid, or a broken .gz, is
    refused once seen.
    """
    total = invalid = 0
    try:
        with _open_binary(path) as f:
            plain_text.check_not_wide(f"--input {path}", f.peek(plain_text.SNIFF_BYTES))
            for raw in f:
                decoded, bad = plain_text.decode(raw)
                total += len(raw)
                invalid += bad
                if "\r" in decoded:
                    yield from decoded.replace("\r\n", "\n").replace("\r", "\n").splitlines(keepends=True)
                else:
                    yield decoded
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise UserInputError(f"--input {path}: not a readable gzip file ({e or type(e).__name__})") from None
    plain_text.check_mostly_valid(f"--input {path}", invalid, total)
    tally = _TALLY.get()
    if invalid and tally is not None:
        tally[path] = tally.get(path, 0) + invalid


def read_documents(path: str) -> Iterator[str]:
    """Yield the non-empty documents of one file, in file order."""
    lines = _lines(path)
    if _is_json_lines(path):
        for line_number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise UserInputError(f"{path}:{line_number}: not a JSON object with a 'text' field ({e})") from None
            if not isinstance(text, str):
                raise UserInputError(f"{path}:{line_number}: the 'text' field is {json.dumps(text)[:40]}, "
                                     "not a string")
            if text.strip():
                yield text
        return
    paragraph: list[str] = []
    for line in lines:
        line = line.strip()
        if line:
            paragraph.append(line)
        elif paragraph:
            yield " ".join(paragraph)
            paragraph = []
    if paragraph:
        yield " ".join(paragraph)


def iter_documents(files: Iterable[str]) -> Iterator[str]:
    for path in files:
        yield from read_documents(path)


def iter_document_batches(files: Iterable[str], max_chars: int = 4_000_000) -> Iterator[list[str]]:
    """Group documents into batches of about `max_chars` characters: the unit of parallel work."""
    batch: list[str] = []
    size = 0
    for doc in iter_documents(files):
        batch.append(doc)
        size += len(doc)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
