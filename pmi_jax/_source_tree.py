"""`pmi_jax.preprocess` and `pmi_jax.configs` in a checkout, where they sit beside pmi_jax/.

setup.py's package_dir puts them inside pmi_jax in the wheel; run from the repository (PYTHONPATH,
pytest) they are the top-level folders preprocess/ and configs/. This finder maps those two names,
and only them, to the folders; an installed wheel has them in place and never installs it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent
# Installed name -> the folder it lives in, in the repository and in setup.py's package_dir.
SUBPACKAGES = {"pmi_jax.preprocess": "preprocess", "pmi_jax.configs": "configs"}


class _RepositoryFolders(importlib.abc.MetaPathFinder):
    def __init__(self, folders: dict[str, pathlib.Path]):
        self.folders = folders

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def install() -> None:
    """Add the finder once, in a checkout only (an installed pmi_jax holds the subpackages)."""
    folders = {name: PACKAGE.parent / folder for name, folder in SUBPACKAGES.items()
               if not (PACKAGE / name.rsplit(".", 1)[1]).is_dir() and (PACKAGE.parent / folder / "__init__.py").is_file()}
    if folders and not any(isinstance(f, _RepositoryFolders) for f in sys.meta_path):
        sys.meta_path.insert(0, _RepositoryFolders(folders))
