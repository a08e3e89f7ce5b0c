"""Input documents (docs/design.md, "Words and n-grams"): the one reader of corpus files.

`vocab build`, `corpus prepare` and both Beam pipelines read documents only through this module.
Formats by file name: JSON lines (.jsonl/.json), Parquet, Arrow (and `save_to_disk`
directories; a DatasetDict is refused: name the split), else BERT pretraining text (documents
separated by blank lines); JSON lines and text may be gzipped. Stray invalid UTF-8 becomes
U+FFFD (counted); a file that is not what its name says is a one-line UserInputError naming it.
Details: docs/design.md, "Module notes", documents.py.
"""
from __future__ import annotations

import contextlib
import contextvars
import gzip
import hashlib
import io
import json
import zlib
from typing import Iterable, Iterator, Sequence

from pmi_jax.errors import UserInputError
from pmi_jax import storage
from pmi_jax.formats import run_dir, text as plain_text
from pmi_jax.storage import gfile

_GLOB_CHARS = set("*?[")
DEFAULT_TEXT_FIELD = plain_text.DEFAULT_TEXT_FIELD
_ROWS_PER_READ = 1024  # rows of a Parquet or Arrow file decoded at a time: bounded memory on any file
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
        root = root.rstrip("/")
        if "dataset_dict.json" in names:
            splits = sorted(n for n in gfile.listdir(root) if gfile.isdir(f"{root}/{n}"))
            raise UserInputError(f"--input {root}: a Hugging Face DatasetDict (splits: "
                                 f"{', '.join(s.rstrip('/') for s in splits)}); give one split's directory, "
                                 f"e.g. {root}/{splits[0].rstrip('/') if splits else 'train'}")
        if "state.json" in names and any(n.endswith(".arrow") for n in names):
            found.extend(_saved_dataset_files(root))
        else:
            found.extend(f"{root}/{n}" for n in names if not n.startswith("."))
    return sorted(found)


def _saved_dataset_files(directory: str) -> list[str]:
    """The Arrow files of a `datasets` save_to_disk directory, as its state.json lists them."""
    path = f"{directory}/state.json"
    try:
        with gfile.GFile(path, "r") as f:
            names = [entry["filename"] for entry in json.load(f)["_data_files"]]
    except (ValueError, KeyError, TypeError) as e:
        raise UserInputError(f"--input {path}: not the state.json of a saved Hugging Face dataset ({e})") from None
    files = [f"{directory}/{name}" for name in names]
    missing = [p for p in files if not gfile.exists(p)]
    if missing:
        raise UserInputError(f"--input {directory}: state.json lists {missing[0]}, which is missing")
    return files


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
    run_dir.check_output_apart(output, [("--input", path) for path in files])


class _GFileReader(io.RawIOBase):
    """tf.io.gfile.GFile as a standard raw stream, so io/gzip/pyarrow can layer on top of any URL."""

    def __init__(self, path: str):
        self._file = gfile.GFile(path, "rb")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._file.seek(offset, whence)
        return self._file.tell()

    def tell(self) -> int:
        return self._file.tell()

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


def _is_table(path: str) -> bool:
    return path.endswith((".parquet", ".arrow"))


@contextlib.contextmanager
def _open_table_file(path: str):
    """A local path as itself (pyarrow maps it), a URL as a seekable stream over tf.io.gfile."""
    if "://" not in path:
        yield path
        return
    with io.BufferedReader(_GFileReader(path), buffer_size=1 << 20) as f:
        yield f


def _record_batches(path: str, source, text_field: str):
    """Record batches of the column `text_field`, from a Parquet or Arrow IPC (stream or file) source."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.endswith(".parquet"):
        parquet = pq.ParquetFile(source)
        _check_text_column(path, parquet.schema_arrow, text_field)
        yield from parquet.iter_batches(batch_size=_ROWS_PER_READ, columns=[text_field])
        return
    try:
        reader = pa.ipc.open_stream(source)
    except pa.ArrowInvalid:  # not the stream format: the random-access file format (Feather v2)?
        if not isinstance(source, str):
            source.seek(0)
        reader = pa.ipc.open_file(source)
        _check_text_column(path, reader.schema, text_field)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i).select([text_field])
        return
    _check_text_column(path, reader.schema, text_field)
    for batch in reader:
        yield batch.select([text_field])


def _check_text_column(path: str, schema, text_field: str) -> None:
    import pyarrow as pa

    if text_field not in schema.names:
        raise UserInputError(f"--input {path}: no column {text_field!r} (columns: {', '.join(schema.names)}); "
                             "name the text column with --text-field")
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserInputError(f"--input {path}: column {text_field!r} holds {kind}, not strings")


def _read_table(path: str, text_field: str) -> Iterator[str]:
    """The non-empty strings of one column of a Parquet or Arrow file, in row order."""
    import pyarrow as pa

    kind = "Parquet" if path.endswith(".parquet") else "Arrow"
    try:
        with _open_table_file(path) as source:
            row = 0
            for batch in _record_batches(path, source, text_field):
                column = batch.column(0)
                if column.null_count:  # refused as a JSON-lines null is: a row the user may not know is empty
                    first = row + column.is_null().to_pylist().index(True) + 1
                    raise UserInputError(f"--input {path}: {column.null_count} rows of this batch have a null "
                                         f"{text_field!r}, the first row {first}; "
                                         "drop or fill the nulls (a JSON-lines null is refused too)")
                row += len(column)
                for text in column.to_pylist():
                    if text is not None and text.strip():
                        yield text
    except (pa.ArrowInvalid, OSError) as e:
        raise UserInputError(f"--input {path}: not a readable {kind} file ({e})") from None


def _read_json_lines(path: str, text_field: str) -> Iterator[str]:
    """The `text_field` strings of a JSON-lines file."""
    for line_number, line in enumerate(_lines(path), 1):
        if line.strip():
            try:
                text = json.loads(line)[text_field]
            except (ValueError, KeyError, TypeError) as e:
                raise UserInputError(f"{path}:{line_number}: not a JSON object with a {text_field!r} field ({e})"
                                     ) from None
            if not isinstance(text, str):
                raise UserInputError(f"{path}:{line_number}: the {text_field!r} field is {json.dumps(text)[:40]}, "
                                     "not a string")
            if text.strip():
                yield text


def _read_text(path: str) -> Iterator[str]:
    """BERT pretraining text: documents are separated by blank lines, a document's lines joined by spaces."""
    paragraph: list[str] = []
    for line in _lines(path):
        line = line.strip()
        if line:
            paragraph.append(line)
        elif paragraph:
            yield " ".join(paragraph)
            paragraph = []
    if paragraph:
        yield " ".join(paragraph)


def read_documents(path: str, text_field: str = DEFAULT_TEXT_FIELD) -> Iterator[str]:
    """Yield the non-empty documents of one file, in file order (`text_field`: JSON lines, Parquet, Arrow)."""
    if _is_table(path):
        return _read_table(path, text_field)
    if _is_json_lines(path):
        return _read_json_lines(path, text_field)
    return _read_text(path)


def document_key(encoded: bytes) -> int:
    """A document's identity, a 64-bit BLAKE2b hash of its UTF-8 text: equal texts share it. It
    routes the document to its shard in `corpus prepare` and draws its place in a sample."""
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), "little")


def iter_documents(files: Iterable[str], text_field: str = DEFAULT_TEXT_FIELD) -> Iterator[str]:
    for path in files:
        yield from read_documents(path, text_field)


def iter_document_batches(files: Iterable[str], max_chars: int = 4_000_000,
                          text_field: str = DEFAULT_TEXT_FIELD) -> Iterator[list[str]]:
    """Group documents into batches of about `max_chars` characters: the unit of parallel work."""
    batch: list[str] = []
    size = 0
    for doc in iter_documents(files, text_field):
        batch.append(doc)
        size += len(doc)
        if size >= max_chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
