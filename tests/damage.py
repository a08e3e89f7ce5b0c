"""Faults for the tests: damage done to a saved checkpoint after it was complete (a disk error,
a truncated copy), and small filesystems that are read-only or full."""
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
