"""glibc malloc thresholds for array-heavy work, set for a `with` block and put back after it.

Inside `large_array_malloc()` the mmap threshold is 64 MiB and the trim threshold 512 MiB, so
the vocabulary build's multi-megabyte numpy temporaries come from the heap instead of fresh,
page-faulting mmaps (benchmarks/README.md, "Figures moved from module docstrings"). The
thresholds belong to the process, so only the command and the benchmark that want them set
them; the block ends by restoring glibc's defaults or the environment's. Not glibc: the block
changes nothing. `direct_runner_malloc()` sets the Beam DirectRunner's thresholds the same way.
Details: docs/design.md, "Module notes", malloc_thresholds.py.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt parameters, from glibc's malloc.h
LARGE_ARRAY_THRESHOLDS = {M_MMAP_THRESHOLD: 64 << 20, M_TRIM_THRESHOLD: 512 << 20}
DIRECT_RUNNER_THRESHOLDS = {M_MMAP_THRESHOLD: 1 << 20, M_TRIM_THRESHOLD: 32 << 20}
DIRECT_RUNNER_ARENAS = 2
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


def large_array_malloc():
    """Raise the mmap and trim thresholds for the block; on exit, set what was in force before it."""
    return _thresholds(LARGE_ARRAY_THRESHOLDS)


@contextlib.contextmanager
def direct_runner_malloc() -> Iterator[None]:
    """For a Beam DirectRunner pipeline run inside the block: fixed, low thresholds and two arenas,
    here and in the worker processes it starts (they inherit the environment, restored on exit).

    The runner holds each stage's output and decodes every grouped element, the workers receive
    whole partitions: large blocks freed stage after stage. With glibc's sliding mmap threshold
    they came from the heap, which keeps its peak, and memory ratcheted up stage by stage
    (benchmarks/README.md, "Where the DirectRunner's memory went"). The arena limit stays set in
    this process: glibc takes no value that restores its default.
    """
    variables = {variable: str(DIRECT_RUNNER_THRESHOLDS[parameter])
                 for parameter, (_, variable) in _START_VALUES.items()}
    variables["MALLOC_ARENA_MAX"] = str(DIRECT_RUNNER_ARENAS)
    saved = {name: os.environ.get(name) for name in variables}
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, DIRECT_RUNNER_ARENAS)
    os.environ.update(variables)
    try:
        with _thresholds(DIRECT_RUNNER_THRESHOLDS):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _thresholds(thresholds: dict[int, int]) -> Iterator[None]:
    libc = _glibc()
    if libc is None:
        yield
        return
    before = _active[-1] if _active else start_values()
    for parameter, value in thresholds.items():
        libc.mallopt(parameter, value)
    _active.append(thresholds)
    try:
        yield
    finally:
        _active.pop()
        for parameter, value in before.items():
            libc.mallopt(parameter, value)
        if not _active:
            libc.malloc_trim(0)  # hand back what the raised trim threshold kept on the heap
