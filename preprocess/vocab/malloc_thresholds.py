"""glibc malloc thresholds for array-heavy work, set for a `with` block and put back after it.

Inside `large_array_malloc()` the mmap threshold is 64 MiB and the trim threshold 512 MiB, so
the vocabulary build's multi-megabyte numpy temporaries come from the heap instead of fresh,
page-faulting mmaps (benchmarks/README.md, "Figures moved from module docstrings"). The
thresholds belong to the process, so only the command and the benchmark that want them set
them; the block ends by restoring glibc's defaults or the environment's. Not glibc: the block
changes nothing. Details: docs/design.md, "Module notes", malloc_thresholds.py.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
LARGE_ARRAY_THRESHOLDS = {M_MMAP_THRESHOLD: 64 << 20, M_TRIM_THRESHOLD: 512 << 20}
# glibc's values at start-up (malloc/malloc.c: DEFAULT_MMAP_THRESHOLD_MIN, DEFAULT_TRIM_THRESHOLD),
# and the environment variables that override them.
_START_VALUES = {M_MMAP_THRESHOLD: (128 << 10, "MALLOC_MMAP_THRESHOLD_"),
                 M_TRIM_THRESHOLD: (128 << 10, "MALLOC_TRIM_THRESHOLD_")}


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # glibc's own calls, absent elsewhere
        return libc
    except (OSError, AttributeError):
        return None


def start_values() -> dict[int, int]:
    """The thresholds this process started with: glibc's defaults unless the environment set them."""
    values = {}
    for parameter, (default, variable) in _START_VALUES.items():
        try:
            values[parameter] = int(os.environ.get(variable, default))
        except ValueError:
            values[parameter] = default
    return values


_active: list[dict[int, int]] = []  # the values each enclosing block set, innermost last


@contextlib.contextmanager
def large_array_malloc() -> Iterator[None]:
    """Raise the mmap and trim thresholds for the block; on exit, set what was in force before it."""
    libc = _glibc()
    if libc is None:
        yield
        return
    before = _active[-1] if _active else start_values()
    for parameter, value in LARGE_ARRAY_THRESHOLDS.items():
        libc.mallopt(parameter, value)
    _active.append(LARGE_ARRAY_THRESHOLDS)
    try:
        yield
    finally:
        _active.pop()
        for parameter, value in before.items():
            libc.mallopt(parameter, value)
        if not _active:
            libc.malloc_trim(0)  # hand back what the raised trim threshold kept on the heap
