"""Faults for the tests: damage done to a saved checkpoint after it was complete (a disk error,
a truncated copy), small filesystems that are read-only or full, and the check of how a command
that meets one must end (exit 2, one line on stderr)."""
import contextlib
import os
import subprocess

import pytest


def truncate_files(directory, *, only=None):
    """Cut every file under `directory` (or those named `only`) to half its size; returns how many."""
    cut = 0
    for root, _, names in os.walk(directory):
        for name in names:
            if only in (None, name):
                path = os.path.join(root, name)
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
                cut += 1
    return cut


@contextlib.contextmanager
def tmpfs(path, options: str):
    """A small tmpfs at `path` (root only, as in the project's containers); skips the test elsewhere."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def one_line_error(capsys, status: int, *fragments: str) -> str:
    """Assert that a command run in-process ended as a refused input must: exit status 2 and one
    line on stderr, `pmi-jax COMMAND: error: ...`, holding every fragment; returns that line."""
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("pmi-jax "), err
    for fragment in fragments:
        assert fragment in err, err
    return err
