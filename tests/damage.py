"""Damage done to a saved checkpoint after it was complete (a disk error, a truncated copy),
for the tests of falling back to an older checkpoint."""
import os


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
