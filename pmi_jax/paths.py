"""Local paths made absolute, URLs left alone: how every command stores the paths it is given.

Orbax refuses relative checkpoint paths, and a run records its corpus directory for later
commands (`eval` reads the corpus `train` used) that may run from another directory; so each
command resolves its local paths against the directory it was started in, once, on entry.
This module imports nothing heavy, so that `train --data synthetic` never loads TensorFlow.
"""
from __future__ import annotations

import os

from pmi_jax.errors import UserInputError


def is_url(path: str) -> bool:
    """gs://, ram:// and the like: paths that no working directory changes."""
    return "://" in path


def absolute(path: str) -> str:
    """`path` itself if it is a URL, else its absolute, normalised form."""
    return path if is_url(path) else os.path.abspath(os.path.expanduser(path))


def absolute_or_none(path: str | None) -> str | None:
    return None if path is None else absolute(path)


def check_output_location(path: str, option: str = "--output", *, directory: bool = False) -> None:
    """Refuse, before any work, a local output that could only fail once the work is done: a
    file output that is an existing directory (or a directory output that is a file), a file
    output whose directory does not exist, a place that takes no new file (read-only
    filesystem, permissions; found by creating and removing a probe file). A directory
    output's missing parents are created when it is written, so the nearest existing one is
    probed. URLs are not checked here.
    """
    if is_url(path):
        return
    path = absolute(path)
    if not directory and os.path.isdir(path):
        raise UserInputError(f"{option} {path}: is a directory; name a file")
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise UserInputError(f"{option} {path}: is a file; name a directory")
    parent = os.path.dirname(path)
    if not directory and not os.path.isdir(parent):
        raise UserInputError(f"{option} {path}: the directory {parent} does not exist")
    while not os.path.isdir(parent):
        if os.path.exists(parent):
            raise UserInputError(f"{option} {path}: {parent} is a file")
        parent = os.path.dirname(parent)
    probe = os.path.join(parent, f".{os.path.basename(path)}.probe-{os.getpid()}")
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as e:
        raise UserInputError(f"{option} {path}: cannot write in {parent} ({e.strerror})") from None
