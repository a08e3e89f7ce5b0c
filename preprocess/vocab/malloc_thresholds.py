"""glibc malloc thresholds for array-heavy work, set for a `with` block and put back after it.

By default glibc serves every allocation above its mmap threshold (128 KiB at start, sliding up
to 32 MiB) with a fresh mmap, and each 4 KiB page of it faults on first touch. The vocabulary
build makes thousands of multi-megabyte numpy temporaries (per chunk of 2^20 positions, per
level), and those faults took about 12% of its CPU time. Inside `large_array_malloc()` the
mmap threshold is 64 MiB and the trim threshold 512 MiB, so those temporaries come from the
heap and freed memory stays there for the next one.

The thresholds belong to the whole process, so a library function must not change them behind
its caller's back: the command (`pmi-jax vocab build`) and the benchmark that want them say so.
glibc has no call that reads them, so the block ends by setting what the process started with:
glibc's defaults, or `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` where the environment
sets them, and hands back to the system the free heap memory the block kept. (After any mallopt
call glibc stops sliding the mmap threshold; there is no call that turns the sliding back on.)
Not glibc: the block changes nothing.
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
