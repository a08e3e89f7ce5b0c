"""File access for local paths and gs:// alike, with atomic publication of outputs.

Everything goes through tf.io.gfile so that any URL TensorFlow understands (gs://, and ram://
in tests) works wherever a path is accepted; where TensorFlow is not installed (a JAX-only
accelerator image), through a local-path stand-in with the same calls. Outputs are written under a temporary name and
renamed when complete, so a killed job never leaves a half-written file or directory behind;
the temporaries a killed job does leave (`.NAME.tmp-*` beside NAME) carry their writer's pid and
host, and the next run of the same output sweeps those whose writer is gone
(docs/reliability.md, "Preprocessing commands").
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import socket
import uuid
from typing import Iterator

from pmi_jax.errors import UserInputError


class _LocalGfile:
    """The part of tf.io.gfile this project uses, for local paths, where TensorFlow is not installed.

    A lent accelerator image has JAX but no TensorFlow; the trainer, evaluation and comparison
    still read and write run directories there (benchmarks/scheme_compare.py, gpu_step.py).
    """

    GFile = staticmethod(open)
    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)
    listdir = staticmethod(os.listdir)
    remove = staticmethod(os.remove)
    walk = staticmethod(os.walk)

    @staticmethod
    def makedirs(path):
        os.makedirs(path, exist_ok=True)

    @staticmethod
    def rename(src, dst, overwrite=False):
        if not overwrite and os.path.exists(dst):
            raise FileExistsError(errno.EEXIST, "destination exists", dst)
        os.replace(src, dst)

    @staticmethod
    def stat(path):
        return type("FileStatistics", (), {"length": os.stat(path).st_size})()

    @staticmethod
    def rmtree(path):
        import shutil

        shutil.rmtree(path)

    @staticmethod
    def glob(pattern):
        import glob

        return glob.glob(pattern)


try:
    import tensorflow as tf

    gfile = tf.io.gfile
    _TF_WRITE_ERRORS = (tf.errors.ResourceExhaustedError, tf.errors.PermissionDeniedError)
except ImportError:  # JAX-only images: local paths only (a gs:// path then fails where it is opened)
    gfile = _LocalGfile
    _TF_WRITE_ERRORS = ()


def join(*parts: str) -> str:
    return os.path.join(*parts) if "://" not in parts[0] else "/".join(p.rstrip("/") for p in parts)


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes: how a vocab.txt is identified across prepare, train and eval."""
    with gfile.GFile(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def is_local(path: str) -> bool:
    return "://" not in path


def read_json_object(path: str, advice: str = "") -> dict:
    """A JSON file holding an object; a one-line error naming `path` (plus `advice`) otherwise."""
    import json

    with gfile.GFile(path, "rb") as f:
        raw = f.read()
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise UserInputError(f"{path}: not valid JSON ({e or 'empty'}){advice}") from None
    if not isinstance(value, dict):
        raise UserInputError(f"{path}: not a JSON object{advice}")
    return value


def temporary_sibling(path: str) -> str:
    """A unique name next to `path`, so the final rename stays on one filesystem.

    `.NAME.tmp-<12 hex>-<pid>-<host>`: the owner in the name lets `sweep_temporaries` tell a
    killed run's leftovers from a live run's work in progress.
    """
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    return join(parent or ".", f".{name}.tmp-{uuid.uuid4().hex[:12]}-{os.getpid()}-{socket.gethostname()}")


_OWNER = re.compile(r"\.tmp-[0-9a-f]{12}-(\d+)-(.+)$")


def _owner_alive(name: str, local: bool) -> bool:
    """Whether the process that named a temporary may still be writing it.

    Only a local temporary of this host can be asked; any other (gs://, another host, a name
    from before owners were recorded) counts as abandoned: one run per output at a time.
    """
    match = _OWNER.search(name)
    if not local or match is None or match.group(2) != socket.gethostname():
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_temporaries(path: str) -> list[str]:
    """Remove the `.NAME.tmp-*` siblings of `path` that killed runs left; return what was removed."""
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    parent = parent or "."
    if not gfile.isdir(parent):
        return []
    prefix = f".{name}.tmp-"
    removed = []
    for entry in gfile.listdir(parent):
        entry = entry.rstrip("/")
        if entry.startswith(prefix) and not _owner_alive(entry, is_local(path)):
            remove_tree(join(parent, entry))
            removed.append(join(parent, entry))
    return removed


def remove_tree(path: str) -> None:
    """Remove a file or a directory tree, if it exists."""
    if gfile.isdir(path):
        gfile.rmtree(path)
    elif gfile.exists(path):
        gfile.remove(path)


def existing_output_error(path: str) -> UserInputError:
    """The one-line error for an --output that exists and may not be replaced."""
    return UserInputError(f"--output {path}: already exists (pass --overwrite to replace it)")


def check_new_output(path: str, overwrite: bool, directory: bool = False) -> None:
    """Refuse an --output that cannot be written, before any work starts.

    An existing output needs `overwrite`; a `directory` output may not be an existing file. A
    local file output needs its directory to exist; a directory output's missing parents are
    created when it is written, so no ancestor on the way may be a file. The place that will
    take the output must accept a new file: read-only filesystems and missing permissions are
    found here, by creating and removing a probe file, not after the work.
    """
    if gfile.exists(path):
        if directory and not gfile.isdir(path):
            raise UserInputError(f"--output {path}: is a file; name a directory")
        if not directory and gfile.isdir(path):
            raise UserInputError(f"--output {path}: is a directory; name a file")
        if not overwrite:
            raise existing_output_error(path)
    if not is_local(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not directory and not os.path.isdir(parent):
        raise UserInputError(f"--output {path}: the directory {parent} does not exist")
    while not os.path.isdir(parent):
        if os.path.exists(parent):
            raise UserInputError(f"--output {path}: {parent} is a file")
        parent = os.path.dirname(parent)
    probe = temporary_sibling(os.path.join(parent, os.path.basename(path.rstrip("/"))))
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as e:
        raise UserInputError(f"--output {path}: cannot write in {parent} ({e.strerror})") from None


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


@contextlib.contextmanager
def write_errors(output: str) -> Iterator[None]:
    """Turn a failed write (full disk, read-only filesystem, no permission) into a one-line error.

    The atomic writers have removed their temporaries by the time this sees the error, so
    nothing half-written is left; the message names the output and the system's reason.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        raise UserInputError(f"--output {output}: cannot write {e.filename or output} ({e.strerror})") from None
    except _TF_WRITE_ERRORS as e:
        raise UserInputError(f"--output {output}: cannot write ({e.message})") from None


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
    """Yield a temporary directory that replaces `path` only once the block succeeds.

    The old `path` is first renamed aside, then the new one renamed in, then the old one
    removed: at every instant `path` is either the complete old output, absent, or the complete
    new one, never a mix. A kill leaves at most hidden temporaries, which the next run of the
    same output sweeps (`sweep_temporaries`).
    """
    path = path.rstrip("/")
    sweep_temporaries(path)
    tmp = temporary_sibling(path)
    gfile.makedirs(tmp)
    try:
        yield tmp
        replace_directory(tmp, path, overwrite)
    finally:
        remove_tree(tmp)


def replace_directory(new: str, path: str, overwrite: bool) -> None:
    """Rename the complete directory `new` to `path`; an existing `path` is moved aside first."""
    aside = None
    if gfile.exists(path):
        if not overwrite:
            raise FileExistsError(path)
        aside = temporary_sibling(path)
        gfile.rename(path, aside)
    try:
        gfile.rename(new, path)
    except BaseException:
        if aside is not None and not gfile.exists(path):
            gfile.rename(aside, path)  # put the old output back
        raise
    if aside is not None:
        remove_tree(aside)


@contextlib.contextmanager
def scratch_directory(output: str, base: str | None = None) -> Iterator[str]:
    """A local directory for a command's intermediate files (spills), removed when the block ends.

    By default it is a temporary of a local `output` (`.NAME.tmp-*` beside it), so whatever a
    kill leaves is swept by the next run of that output. With `base` (or for a gs:// output: in
    $TMPDIR) it is `BASE/.pmi-jax-scratch.tmp-*`, swept by the next command that uses that base.
    """
    import shutil
    import tempfile

    if base is None and is_local(output):
        anchor = os.path.abspath(output.rstrip("/"))
    else:
        anchor = os.path.join(base or tempfile.gettempdir(), "pmi-jax-scratch")
    sweep_temporaries(anchor)
    scratch = temporary_sibling(anchor)
    os.makedirs(scratch)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
