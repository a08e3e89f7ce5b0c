"""`map` over threads with results in input order: the parallelism of the vocabulary build.

The build's work is TensorFlow kernels and large numpy operations, which release the GIL, so
threads share one copy of the corpus's tables instead of pickling them to processes.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator


def ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """`map(fn, items)` on `workers` threads, results in item order, at most workers+1 in flight.

    Threads suffice: the work is TensorFlow kernels and large numpy operations, which release the
    GIL; the bounded window keeps memory independent of corpus size.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
