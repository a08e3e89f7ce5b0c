"""What counts as UTF-8 text: the one rule every reader of a user's text file applies.

Corpus files (`vocab build`, `corpus prepare`) and n-gram lists (`vocab check`, `--units`) are
UTF-8. A few invalid bytes in real text are replaced with U+FFFD and counted; a file whose
bytes are mostly invalid is binary (random bytes: about 43% invalid; Latin-1 text read as
UTF-8: a few percent). UTF-16 and UTF-32 are refused by their byte-order mark or their NUL
bytes: read as UTF-8 their ASCII letters survive between NULs, so the invalid share misses
them and every letter would become a word of its own. A document of JSON lines, Parquet and
Arrow is the text of DEFAULT_TEXT_FIELD unless the command is told another (--text-field).
"""
from __future__ import annotations

from pmi_jax.errors import UserInputError

DEFAULT_TEXT_FIELD = "text"
MAX_INVALID_FRACTION = 0.25
WARN_INVALID_FRACTION = 0.001  # above this share of replaced bytes a file is named in a warning
_WARNED: set[str] = set()  # files already named by that warning in this process
SNIFF_BYTES = 4096  # how much of a file's start `check_not_wide` looks at
# Byte-order marks of the encodings whose text is not UTF-8 bytes (UTF-32's first: it starts with UTF-16's).
_WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
              (b"\xfe\xff", "UTF-16"))


def check_not_wide(name: str, head: bytes) -> None:
    """Refuse UTF-16 and UTF-32 text from its first bytes `head`; `name` says which input (path, option)."""
    head = head[:SNIFF_BYTES]
    encoding = next((label for bom, label in _WIDE_BOMS if head.startswith(bom)), None)
    if encoding is None and head.count(0) > len(head) // 4:  # UTF-8 text holds no NUL bytes
        encoding = "UTF-16 or UTF-32"
    if encoding is not None:
        raise UserInputError(f"{name}: {encoding} text, not UTF-8; convert it first "
                             f"(e.g. iconv -f {encoding.split()[0]} -t UTF-8)")


def decode(raw: bytes) -> tuple[str, int]:
    """UTF-8 bytes -> (text with U+FFFD for each invalid sequence, number of invalid bytes)."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    parts, invalid, start = [], 0, 0
    while True:
        try:
            parts.append(raw[start:].decode("utf-8"))
            return "".join(parts), invalid
        except UnicodeDecodeError as e:
            parts.append(raw[start:start + e.start].decode("utf-8"))
            parts.append("\ufffd")
            invalid += e.end - e.start
            start += e.end


def check_mostly_valid(name: str, invalid: int, total: int) -> None:
    """Refuse a file whose share of invalid UTF-8 bytes says it is not text; warn once (per
    process) about one whose share says it is another encoding (Latin-1 text: a few percent)."""
    if invalid > MAX_INVALID_FRACTION * total:
        raise UserInputError(f"{name}: not UTF-8 text ({invalid} of its {total} bytes are not valid UTF-8)")
    if invalid > WARN_INVALID_FRACTION * total and name not in _WARNED:
        import logging

        _WARNED.add(name)
        logging.warning("%s: %d of its %d bytes (%.1f%%) are not valid UTF-8 and became U+FFFD; if it is Latin-1 "
                        "or another encoding, convert it first (e.g. iconv -f LATIN1 -t UTF-8)", name, invalid,
                        total, 100 * invalid / total)


def read_text(name: str, raw: bytes) -> str:
    """A whole file's bytes as text, under the rules above."""
    check_not_wide(name, raw)
    text, invalid = decode(raw)
    check_mostly_valid(name, invalid, len(raw))
    return text
