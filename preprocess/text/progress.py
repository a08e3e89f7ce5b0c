"""Progress bars of the vocabulary build: on stderr, gone when done, off with --no-progress."""
from __future__ import annotations

import sys

import tqdm


def progress_bar(desc: str, total: int | None, unit: str, enabled: bool) -> tqdm.tqdm:
    return tqdm.tqdm(desc=desc, total=total, unit=unit, unit_scale=True, file=sys.stderr, disable=not enabled,
                     dynamic_ncols=True, leave=False)
