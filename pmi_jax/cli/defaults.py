"""Flag defaults that live in the library, read when they are needed and not before.

A command's defaults are the library's (a dataclass field such as `InformaskOptions.window`, or a
constant): typed once, there. Importing the library to build the parser would import TensorFlow
for every `pmi-jax ...`, so a flag's default is a `LibraryDefault` that names where the value
lives; `--help` reads it when it prints `%(default)s`, and the command reads it with `value_of`.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any


class LibraryDefault:
    """The default of `attribute` in `module`: a constant, or with `field`, a dataclass field's default."""

    def __init__(self, module: str, attribute: str, field: str | None = None):
        self.module, self.attribute, self.field = module, attribute, field

    def value(self) -> Any:
        found = getattr(importlib.import_module(self.module), self.attribute)
        if self.field is None:
            return found
        return next(f.default for f in dataclasses.fields(found) if f.name == self.field)

    def __str__(self) -> str:  # what --help shows
        return str(self.value())

    def __repr__(self) -> str:
        return f"LibraryDefault({self.module}.{self.attribute}{'.' + self.field if self.field else ''})"


def value_of(value: Any) -> Any:
    """A parsed flag's value: the library's default where the flag was not given."""
    return value.value() if isinstance(value, LibraryDefault) else value
