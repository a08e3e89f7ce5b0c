"""A real-English demo corpus that exists on every machine with Python: the standard library's
own documentation (the docstrings of its modules, classes and functions, plus the language
reference topics that `pydoc` ships). No download, and the same text for the same Python.

`iter_installed_documents` adds the prose of every installed package's docstrings: with the
versions pinned in constraints.txt, about 5M words that any machine can rebuild offline, the
corpus of the CPU scheme comparison (docs/experiments.md).
"""
from __future__ import annotations

import ast
import hashlib
import os
import pathlib
import re
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


_WORD = re.compile(r"[(\"'`]*[A-Za-z][A-Za-z'-]*[)\"'`,.;:!?]*")


def _prose(paragraph: str) -> bool:
    """Mostly words (60% of its tokens), so that code samples and tables are left out; a
    threshold of ours (docs/experiments.md, "The comparison on CPU")."""
    tokens = paragraph.split()
    if len(tokens) < 8 or paragraph.startswith((">>>", "...", "$ ", "%")):
        return False
    return sum(bool(_WORD.fullmatch(t)) for t in tokens) >= 0.6 * len(tokens)


def iter_installed_documents(site_packages: str | None = None) -> Iterator[str]:
    """The prose paragraphs of each installed module's docstrings, one document per docstring,
    in a fixed order; a document seen before (vendored copies, API aliases) is skipped."""
    root = pathlib.Path(site_packages or sysconfig.get_paths()["purelib"])
    seen: set[bytes] = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            source = pathlib.Path(folder, name).read_text(encoding="utf-8", errors="replace")
            for doc in _docstrings(source):
                paragraphs = [_one_paragraph(p) for p in re.split(r"\n\s*\n", doc)]
                text = " ".join(p for p in paragraphs if _prose(p))
                key = hashlib.sha1(text.encode()).digest()
                if len(text.split()) >= 10 and key not in seen:
                    seen.add(key)
                    yield text
