"""Local paths made absolute, URLs left alone: how every command stores the paths it is given.

Orbax refuses relative checkpoint paths, and a run records its corpus directory for later
commands (`eval` reads the corpus `train` used) that may run from another directory; so each
command resolves its local paths against the directory it was started in, once, on entry.
This module imports nothing heavy, so that `train --data synthetic` never loads TensorFlow.
"""
from __future__ import annotations

import os



def is_url(path: str) -> bool:
    """gs://, ram:// and the like: paths that no working directory changes."""
    return "://" in path


def absolute(path: str) -> str:
    """`path` itself if it is a URL, else its absolute, normalised form."""
    return path if is_url(path) else os.path.abspath(os.path.expanduser(path))


def absolute_or_none(path: str | None) -> str | None:
    return None if path is None else absolute(path)


def make_absolute(args, *names: str) -> None:
    """Resolve the named path attributes of parsed arguments in place (those that are set)."""
    for name in names:
        if getattr(args, name, None):
            setattr(args, name, absolute(getattr(args, name)))
