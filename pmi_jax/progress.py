"""A progress line for long runs: step, steps/s, tokens/s and the time left, redrawn in place.

Written to a terminal only (stderr by default): where stderr is a file or a pipe (a batch
job's log) nothing is drawn, since carriage returns would fill the log with partial lines;
the trainer's periodic log lines carry the same figures there. The rates are means since
`start` (the first compiled step), checkpoints and validation included, so the ETA counts the
pauses that the remaining steps will also make.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

_CLEAR_LINE = "\r\x1b[K"  # back to the line's start, erase to its end (ANSI, every terminal emulator)


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s'; under an hour '2m05s'; under a minute '5s'."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Progress:
    """`update(step)` after every step; `clear()` before printing anything else; `close()` at the end."""

    def __init__(self, total_steps: int, tokens_per_step: int, *, enabled: bool, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, min_interval_s: float = 0.5):
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.clock = clock
        self.min_interval_s = min_interval_s
        self._start: tuple[int, float] | None = None
        self._drawn_at: float | None = None
        self._shown = False

    def start(self, step: int) -> None:
        """Measure from here (after the first step: its compilation is not throughput)."""
        self._start = (step, self.clock())

    def line(self, step: int, now: float) -> str:
        text = f"step {step}/{self.total_steps} ({100 * step / self.total_steps:.0f}%)"
        if self._start is None or step <= self._start[0] or now <= self._start[1]:
            return text + "  compiling..." if self._start is None else text
        steps_per_s = (step - self._start[0]) / (now - self._start[1])
        eta = (self.total_steps - step) / steps_per_s
        return (f"{text}  {steps_per_s:.2f} steps/s  {steps_per_s * self.tokens_per_step:,.0f} tokens/s  "
                f"ETA {duration(eta)}")

    def update(self, step: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self._drawn_at is not None and now - self._drawn_at < self.min_interval_s and step < self.total_steps:
            return
        self.stream.write(_CLEAR_LINE + self.line(step, now))
        self.stream.flush()
        self._drawn_at, self._shown = now, True

    def clear(self) -> None:
        """Erase the line, so that a log line printed next starts clean (redrawn by the next update)."""
        if self._shown:
            self.stream.write(_CLEAR_LINE)
            self.stream.flush()
            self._shown = False
            self._drawn_at = None

    def close(self) -> None:
        self.clear()
