"""The DirectRunner's data plane without its timed flush, which loses data between stages.

With several workers (`--direct_running_mode multi_processing` or `multi_threading`), Beam
2.77's FnApiRunner sends each stage's input over gRPC through a stream that a timer thread
flushes every second: it hands the buffer on, then clears it, without a lock against the writer,
so whatever the sending thread wrote in between is dropped, silently (whole batches of the
corpus at 100M words; benchmarks/beam_flush_race.py repeats it with no code of ours). With the
limit 0 each input goes out when it is complete. Dataflow runs none of this code.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import apache_beam
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from pmi_jax.errors import UserInputError

_LIMIT = "DATA_BUFFER_TIME_LIMIT_MS"


@contextlib.contextmanager
def without_timed_flush() -> Iterator[None]:
    """Run the pipelines started inside with the runner's timed flush off (restored afterwards)."""
    if not isinstance(getattr(worker_handlers, _LIMIT, None), int):
        raise UserInputError(f"apache-beam {apache_beam.__version__}: its FnApiRunner has no {_LIMIT}, which pmi-jax "
                             "turns off so that the DirectRunner loses no data; install apache-beam as "
                             "constraints.txt pins it")
    saved = getattr(worker_handlers, _LIMIT)
    setattr(worker_handlers, _LIMIT, 0)
    try:
        yield
    finally:
        setattr(worker_handlers, _LIMIT, saved)
