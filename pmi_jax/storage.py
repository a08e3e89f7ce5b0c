"""File access for local paths and gs:// alike, with atomic publication of outputs.

Everything goes through tf.io.gfile so that any URL TensorFlow understands (gs://, and ram://
in tests) works wherever a path is accepted. Outputs are written under a temporary name and
renamed when complete, so a killed job never leaves a half-written file or directory behind.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from typing import Iterator

import tensorflow as tf

from pmi_jax.errors import UserInputError

gfile = tf.io.gfile


def join(*parts: str) -> str:
    return os.path.join(*parts) if "://" not in parts[0] else "/".join(p.rstrip("/") for p in parts)


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes: how a vocab.txt is identified across prepare, train and eval."""
    with gfile.GFile(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def temporary_sibling(path: str) -> str:
    """A unique name next to `path`, so the final rename stays on one filesystem."""
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    return join(parent or ".", f".{name}.tmp-{uuid.uuid4().hex[:12]}")


def existing_output_error(path: str) -> UserInputError:
    """The one-line error for an --output that exists and may not be replaced."""
    return UserInputError(f"--output {path}: already exists (pass --overwrite to replace it)")


def check_new_output(path: str, overwrite: bool) -> None:
    """Refuse an existing --output before any work starts, unless it may be replaced."""
    if not overwrite and gfile.exists(path):
        raise existing_output_error(path)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success."""
    tmp = temporary_sibling(path)
    try:
        with gfile.GFile(tmp, mode) as f:
            yield f
        gfile.rename(tmp, path, overwrite=True)
    finally:
        if gfile.exists(tmp):
            gfile.remove(tmp)


@contextlib.contextmanager
def atomic_directory(path: str, overwrite: bool) -> Iterator[str]:
    """Yield a temporary directory that replaces `path` only once the block succeeds."""
    path = path.rstrip("/")
    tmp = temporary_sibling(path)
    gfile.makedirs(tmp)
    try:
        yield tmp
        if gfile.exists(path):
            if not overwrite:
                raise FileExistsError(path)
            gfile.rmtree(path)
        parent = os.path.dirname(path)
        if parent:
            gfile.makedirs(parent)
        gfile.rename(tmp, path)
    finally:
        if gfile.exists(tmp):
            gfile.rmtree(tmp)
