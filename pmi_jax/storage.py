"""File access for local paths and gs:// alike, with atomic publication of outputs.

Everything goes through tf.io.gfile so that any URL TensorFlow understands (gs://, and ram://
in tests) works wherever a path is accepted; where TensorFlow is not installed (a JAX-only
accelerator image), through a local-path stand-in with the same calls. Outputs are written under a temporary name and
renamed when complete, so a killed job never leaves a half-written file or directory behind;
the temporaries a killed job does leave (`.NAME.tmp-*` beside NAME) carry their writer's pid and
host, and the next run of the same output sweeps the work in progress of those whose writer is
gone, and puts back or keeps (never deletes) an old output set aside (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import socket
import uuid
from typing import Callable, Iterator

from pmi_jax.errors import OutputExists, PathError, UserInputError


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
        found = os.stat(path)
        return type("FileStatistics", (), {"length": found.st_size, "mtime_nsec": found.st_mtime_ns})()

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
    digest = hashlib.sha256()
    with gfile.GFile(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


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


def temporary_sibling(path: str, aside: bool = False) -> str:
    """A unique name next to `path`, so the final rename stays on one filesystem.

    `.NAME.tmp-<kind>-<12 hex>-<pid>-<host>`: the owner in the name lets `sweep_temporaries`
    tell a killed run's leftovers from a live run's work in progress, and the kind tells what a
    leftover may hold. `work-`: something being written (a file, a directory, a probe, spills),
    never anything the user had, so it may be removed. `aside-`: the complete old output that
    `replace_directory` keeps while the new one is renamed in, which is never removed unseen.
    """
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    kind = _ASIDE if aside else _WORK
    return join(parent or ".", f".{name}.tmp-{kind}{uuid.uuid4().hex[:12]}-{os.getpid()}-{socket.gethostname()}")


_ASIDE = "aside-"
_WORK = "work-"
_OWNER = re.compile(r"\.tmp-(?:aside-|work-)?[0-9a-f]{12}-(\d+)-(.+)$")


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


def _abandoned(path: str, kind: str | None = None) -> list[str]:
    """The `.NAME.tmp-*` siblings of `path` whose writer is gone (only those of `kind`, if given)."""
    path = path.rstrip("/")
    parent, name = os.path.split(path)
    parent = parent or "."
    if not gfile.isdir(parent):
        return []
    prefix = f".{name}.tmp-{kind or ''}"
    return [join(parent, e.rstrip("/")) for e in gfile.listdir(parent)
            if e.startswith(prefix) and not _owner_alive(e.rstrip("/"), is_local(path))]


def restore_aside(path: str) -> str | None:
    """Put back the old output that a killed `--overwrite` had moved aside; return where it was.

    `replace_directory` renames the old `path` aside, then the new one in: a kill between the
    two renames leaves no `path` and the complete old output under `.NAME.tmp-aside-*`. The
    next command that looks at `path` (every writer checks its output first) renames it back,
    so the user finds the output they had, and says so on stderr.
    """
    import logging

    path = path.rstrip("/")
    if gfile.exists(path):
        return None
    asides = _abandoned(path, _ASIDE)
    if not asides:
        return None
    newest = max(asides, key=lambda a: gfile.stat(a).mtime_nsec)
    gfile.rename(newest, path)
    logging.warning("%s: restored the previous output from %s, where an interrupted overwrite had moved it",
                    path, newest)
    return newest


def sweep_temporaries(path: str, name_kept: bool = True) -> list[str]:
    """Remove the `.NAME.tmp-*` siblings of `path` that killed runs left; return what was removed.

    Only work in progress (`.NAME.tmp-work-*`, and files of any older name) is removed. An old
    output moved aside by a killed `--overwrite` is put back when `path` is absent
    (`restore_aside`); one that is not put back (`path` exists, or an older aside), and a
    directory named before the kinds were (`.NAME.tmp-<hex>-...`, which may be an aside of an
    earlier version), is kept, with a warning naming it (unless not `name_kept`: a caller whose
    output's writer sweeps again): nothing the user had is deleted unseen.
    """
    import logging

    restore_aside(path)
    prefix = f".{os.path.basename(path.rstrip('/'))}.tmp-"
    removed = []
    for leftover in _abandoned(path):
        kind = os.path.basename(leftover)[len(prefix):]
        if kind.startswith(_WORK) or (not kind.startswith(_ASIDE) and not gfile.isdir(leftover)):
            remove_tree(leftover)
            removed.append(leftover)
        elif name_kept:
            logging.warning("%s: kept %s, which may hold an earlier output that an interrupted overwrite "
                            "moved aside; look inside, then move it back or delete it", path.rstrip("/"),
                            leftover)
    return removed


def remove_tree(path: str) -> None:
    """Remove a file or a directory tree, if it exists."""
    if gfile.isdir(path):
        gfile.rmtree(path)
    elif gfile.exists(path):
        gfile.remove(path)


def is_inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies under it (local paths resolved, URLs compared as text)."""
    if "://" in path or "://" in directory:
        path, directory = path.rstrip("/"), directory.rstrip("/")
    else:
        path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_writable(path: str, overwrite: bool, directory: bool = False) -> None:
    """Refuse an output that cannot be written, before any work starts (a PathError naming `path`).

    An existing output needs `overwrite` (else OutputExists); a `directory` output may not be an
    existing file. A local file output needs its directory to exist; a directory output's missing
    parents are created when it is written, so no ancestor on the way may be a file. The place
    that will take the output must accept a new file: read-only filesystems and missing
    permissions are found here, by creating and removing a probe file, not after the work. What
    an output may not hold (an input, a training run) is the caller's rule:
    pmi_jax/formats/run_dir.py, `check_new_output`.
    """
    restore_aside(path)
    if gfile.exists(path):
        if directory and not gfile.isdir(path):
            raise PathError(path, "is a file; name a directory")
        if not directory and gfile.isdir(path):
            raise PathError(path, "is a directory; name a file")
        if not overwrite:
            raise OutputExists(path)
    if not is_local(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not directory and not os.path.isdir(parent):
        raise PathError(path, f"the directory {parent} does not exist")
    while not os.path.isdir(parent):
        if os.path.exists(parent):
            raise PathError(path, f"{parent} is a file")
        parent = os.path.dirname(parent)
    _probe(path, os.path.join(parent, os.path.basename(path.rstrip("/"))), parent, None)


def _probe(path: str, beside: str, parent: str, name: str | None) -> None:
    """Create and remove a file next to `beside`: whether `parent` takes new files."""
    probe = temporary_sibling(beside)
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as e:
        raise PathError(path, f"cannot write in {parent} ({e.strerror})", name) from None


def check_writable_directory(path: str, name: str | None = None) -> None:
    """Refuse a directory a command will write into (a run's workdir, its eval/ folder) that is
    a file, lies under a file, or takes no new file, before any work; `name` names `path` in the
    message where the flag that gave it does not (PathError).

    Unlike `check_writable`, an existing directory is probed inside, where the files will go
    (a read-only mount may be the directory itself).
    """
    if not is_local(path):
        return
    directory = os.path.abspath(path)
    while not os.path.isdir(directory):
        if os.path.exists(directory):
            raise PathError(path, f"{directory} is a file; name a directory", name)
        directory = os.path.dirname(directory)
    _probe(path, os.path.join(directory, "probe"), directory, name)


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


@contextlib.contextmanager
def write_errors(output: str) -> Iterator[None]:
    """Turn a failed write (full disk, read-only filesystem, no permission) into a one-line PathError.

    The atomic writers have removed their temporaries by the time this sees the error, so
    nothing half-written is left; the message names the output, the file that failed and the
    system's reason and, where the disk is full, the space the write needs (`needs_space`) and
    the space left. TensorStore (Orbax's checkpoint writer) reports a full disk as a ValueError
    "RESOURCE_EXHAUSTED: Failed writing: "PATH" ... [os_error_code='28']", read the same way.
    """
    try:
        yield
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        raise _write_error(output, e.filename or output, e.strerror, e,
                           e.errno in (errno.ENOSPC, errno.EDQUOT)) from None
    except _TF_WRITE_ERRORS as e:
        raise _write_error(output, None, e.message, e, isinstance(e, _TF_WRITE_ERRORS[0])) from None
    except ValueError as e:
        match = _TENSORSTORE_WRITE_FAILURE.search(str(e))
        if match is None:
            raise
        code = int(match.group(2))
        raise _write_error(output, match.group(1), os.strerror(code), e, code == errno.ENOSPC) from None


_TENSORSTORE_WRITE_FAILURE = re.compile(r"Failed writing: \"([^\"]+)\".*\[os_error_code='(\d+)'\]", re.DOTALL)
_NEEDED = "pmi_jax_space_needed"  # the attribute `needs_space` sets on an error it lets through


def _write_error(output: str, filename: str | None, reason: str, error: BaseException, full: bool) -> PathError:
    what = f" {filename}" if filename else ""
    if not full:
        return PathError(output, f"cannot write{what} ({reason})")
    return PathError(output, f"cannot write{what} ({reason}{_space(output, error)}); make room and rerun the same "
                     "command")


@contextlib.contextmanager
def needs_space(estimate: int | Callable[[], int], at_least: bool = False) -> Iterator[None]:
    """Mark an error leaving this block with about how many bytes its writes need.

    A full disk's error says where it failed, not how much room the write wanted; the writer
    knows (a checkpoint from its arrays, a file from its bytes) and says so here, for
    `write_errors`' message. `estimate` may be a function, asked only when an error passes;
    `at_least`: it counts only what was written before the failure. Several blocks may mark one
    error: the largest estimate stands (the whole output, not the last file of it).
    """
    try:
        yield
    except Exception as e:
        with contextlib.suppress(Exception):  # an estimate that fails is left out; the error stands
            needed = int(estimate() if callable(estimate) else estimate)
            if needed > getattr(e, _NEEDED, (0, False))[0]:
                setattr(e, _NEEDED, (needed, at_least))
        raise


def _space(output: str, error: BaseException) -> str:
    """"; needs about X, Y free on DIR's disk" for a full-disk message (the need only, for URLs)."""
    import shutil

    needed, at_least = getattr(error, _NEEDED, (0, False))
    text = f"; needs {'at least' if at_least else 'about'} {_size(needed)}" if needed else ""
    if not is_local(output):
        return text
    directory = os.path.abspath(output)
    while not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    return f"{text}{',' if text else ';'} {_size(shutil.disk_usage(directory).free)} free on {directory}'s disk"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 / 10 else f"{nbytes / 2**10:.1f} KiB"


def tree_size(path: str) -> int:
    """Bytes of the files under `path` (a file: its own size; nothing there: 0)."""
    if not gfile.isdir(path):
        return gfile.stat(path).length if gfile.exists(path) else 0
    return sum(gfile.stat(join(directory, name)).length for directory, _, names in gfile.walk(path)
               for name in names)


class _CountingFile:
    """A file being written that counts the bytes handed to it: the size a failed write needed."""

    def __init__(self, f):
        self._f = f
        self.written = 0

    def write(self, data):
        self.written += len(data.encode("utf-8") if isinstance(data, str) else data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "w") -> Iterator:
    """Open a temporary sibling of `path` for writing; rename it over `path` on success.

    A write that fails (a full disk) carries the bytes handed to the file so far, its own
    failing one included (`needs_space`, at least): for a file written in one piece, its size.
    """
    tmp = temporary_sibling(path)
    counted = None
    try:
        with needs_space(lambda: counted.written, at_least=True), gfile.GFile(tmp, mode) as f:
            counted = _CountingFile(f)
            yield counted
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
    same output sweeps (`sweep_temporaries`). A write that fails carries what the directory
    already held plus the file being written (`needs_space`).
    """
    path = path.rstrip("/")
    sweep_temporaries(path)
    tmp = temporary_sibling(path)
    gfile.makedirs(tmp)
    try:
        try:
            yield tmp
        except Exception as e:
            with needs_space(tree_size(tmp) + getattr(e, _NEEDED, (0,))[0], at_least=True):
                raise
        replace_directory(tmp, path, overwrite)
    finally:
        remove_tree(tmp)


def replace_directory(new: str, path: str, overwrite: bool) -> None:
    """Rename the complete directory `new` to `path`; an existing `path` is moved aside first."""
    aside = None
    if gfile.exists(path):
        if not overwrite:
            raise FileExistsError(path)
        aside = temporary_sibling(path, aside=True)
        gfile.rename(path, aside)
    try:
        gfile.rename(new, path)
    except BaseException:
        if aside is not None and not gfile.exists(path):
            gfile.rename(aside, path)  # put the old output back
        raise
    if aside is not None:  # renamed to work in progress first: a kill while removing it leaves nothing to keep
        discard = temporary_sibling(path)
        gfile.rename(aside, discard)
        remove_tree(discard)


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
    sweep_temporaries(anchor, name_kept=anchor != os.path.abspath(output.rstrip("/")))  # the writer names them
    scratch = temporary_sibling(anchor)
    os.makedirs(scratch)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
