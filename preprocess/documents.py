"""Input documents (docs/design.md, "Words and n-grams"): text files with blank-line-separated documents, or JSON lines.

Formats, chosen by file name (each optionally gzip-compressed, `.gz`):
  *.jsonl, *.json   one JSON object per line; the document is its "text" field.
  anything else     BERT pretraining text: documents separated by one or more blank lines,
                    the lines inside a document joined with a single space.
Bytes that are not valid UTF-8 are replaced with U+FFFD rather than failing the job.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
from typing import Iterable, Iterator, Sequence

from pmi_jax.errors import UserInputError
from pmi_jax.storage import gfile

_GLOB_CHARS = set("*?[")


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
def _open_text(path: str) -> Iterator[io.TextIOBase]:
    with io.BufferedReader(_GFileReader(path), buffer_size=1 << 20) as binary:
        stream = gzip.GzipFile(fileobj=binary) if path.endswith(".gz") else binary
        with io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline=None) as text:
            yield text


def read_documents(path: str) -> Iterator[str]:
    """Yield the non-empty documents of one file, in file order."""
    with _open_text(path) as f:
        if _is_json_lines(path):
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError) as e:
                    raise UserInputError(f"{path}:{line_number}: not a JSON object with a 'text' field ({e})")
                if text.strip():
                    yield text
            return
        lines: list[str] = []
        for line in f:
            line = line.strip()
            if line:
                lines.append(line)
            elif lines:
                yield " ".join(lines)
                lines = []
        if lines:
            yield " ".join(lines)


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
