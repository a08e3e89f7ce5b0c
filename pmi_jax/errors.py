"""The exception types that mean "the user gave us something we cannot use", and `DataLost`.

The CLI prints a user's error as a single line and exits with status 2, so every message
must name the offending input (a path, an option and its value) and say what is wrong.
"""
from __future__ import annotations


class UserInputError(Exception):
    pass


class PathError(UserInputError):
    """A path that cannot be used and what is wrong with it, without the flag that named it.

    The bottom layer (pmi_jax/storage.py, formats/) knows paths, not command lines: the command
    that took the path words the line with its flag (pmi_jax/cli/io_flags.py, `worded`). `name`
    stands in for the flag where the caller knows better (a run's results folder).
    """

    def __init__(self, path: str, problem: str, name: str | None = None):
        super().__init__(path, problem, name)  # all three, so that the error pickles (worker processes)
        self.path, self.problem, self.name = path, problem, name

    def named(self, name: str) -> "PathError":
        """The same error, naming the path by `name` (the flag that gave it)."""
        return type(self)(self.path, self.problem, name)

    def line(self, name: str | None = None, fix: str = "") -> str:
        """`NAME PATH: PROBLEM FIX`, naming the path by `name` (else by its own `name`, if any)."""
        name = name or self.name
        return f"{name + ' ' if name else ''}{self.path}: {self.problem}{fix}"

    def __str__(self) -> str:
        return self.line()


class DataLost(RuntimeError):
    """A pipeline's totals disagree between two of its stages: a runner lost or repeated data.
    Raised before the output is written or marked complete (the Beam builds, `corpus prepare`)."""

    @classmethod
    def between_stages(cls, what: str) -> "DataLost":
        """`what` disagreed inside a Beam pipeline, which therefore wrote nothing."""
        return cls(f"{what}: the runner lost or repeated data between stages; nothing was written: run it again")


class OutputExists(PathError):
    """An output that exists where replacing it was not asked for; the command says how to ask."""

    def __init__(self, path: str, problem: str = "already exists", name: str | None = None):
        super().__init__(path, problem, name)
