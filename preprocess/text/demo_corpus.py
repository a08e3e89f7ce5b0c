"""A real-English demo corpus that exists on every machine with Python: the standard library's
own documentation (the docstrings of its modules, classes and functions, plus the language
reference topics that `pydoc` ships). No download, and the same text for the same Python.
"""
from __future__ import annotations

import ast
import os
import pathlib
import sysconfig
from typing import Iterator

# Test suites are mostly code-like strings; leave them out.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3"}


def _docstrings(source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def _one_paragraph(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def iter_demo_documents() -> Iterator[str]:
    """Each docstring (and each pydoc topic) becomes one document, in a fixed order."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield _one_paragraph(topics[name])
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                source = pathlib.Path(root, name).read_text(encoding="utf-8", errors="replace")
                for doc in _docstrings(source):
                    paragraph = _one_paragraph(doc)
                    if len(paragraph.split()) >= 5:
                        yield paragraph
