"""A command's flags declared by the fields of the library's config dataclass (`corpus prepare`:
preprocess/corpus/prepare_config.py; `vocab build`: preprocess/vocab/vocab_options.py), so that
name, type, default and help are written once.

A field is a flag where its metadata has "help": `--field-name` (a bool that defaults to True:
`--no-field-name`), typed by its default (int, float; None: a string), the field's name as
argparse's dest. Other metadata keys go to argparse (metavar, action, type, choices), except
`reads` (an input path, io_flags.reads; "named": NAME=PATH), `scratch` (a folder for temporaries,
io_flags.scratch) and `exclusive` (the mutually exclusive group).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Collection

from pmi_jax.cli import io_flags

_OURS = ("help", "reads", "scratch", "exclusive")


def add_flags(parser: argparse.ArgumentParser, config: type, only: Collection[str] = (),
              skip: Collection[str] = ()) -> dict[str, argparse._MutuallyExclusiveGroup]:
    """Add a flag for each field of `config` that has help (those named in `only`, if given; none
    named in `skip`), in field order; return the exclusive groups by name, for the command to add
    its other members right after (argparse's usage brackets a group only when its flags are adjacent)."""
    groups = {}
    for field in dataclasses.fields(config):
        if "help" not in field.metadata or (only and field.name not in only) or field.name in skip:
            continue
        exclusive = field.metadata.get("exclusive")
        if exclusive and exclusive not in groups:
            groups[exclusive] = parser.add_mutually_exclusive_group()
        action = (groups[exclusive] if exclusive else parser).add_argument(
            *_names(field), dest=field.name, help=field.metadata["help"], **_settings(field))
        if field.metadata.get("reads"):
            io_flags.reads(action, named=field.metadata["reads"] == "named")
        if field.metadata.get("scratch"):
            io_flags.scratch(action)
    return groups


def _names(field: dataclasses.Field) -> list[str]:
    flag = field.name.replace("_", "-")
    return [f"--no-{flag}" if field.default is True else f"--{flag}"]


def _settings(field: dataclasses.Field) -> dict:
    settings = {k: v for k, v in field.metadata.items() if k not in _OURS}
    if isinstance(field.default, bool):
        settings.setdefault("action", "store_false" if field.default else "store_true")
    elif settings.get("action") == "append":
        settings["default"] = list(field.default)
    else:
        settings["default"] = field.default
        if isinstance(field.default, (int, float)):
            settings.setdefault("type", type(field.default))
    return settings


def values(args: argparse.Namespace, config: type) -> dict:
    """The parsed value of every field of `config` that the command has a flag for (by dest)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config) if hasattr(args, f.name)}
