"""A config dataclass field that is also a command's flag: its help and argparse settings in `metadata`.

pmi_jax/cli/config_flags.py turns such fields into flags (`corpus prepare`: PrepareConfig, `vocab build`:
VocabOptions), so a flag's name, type, default and help are written once, beside the field.
"""
from __future__ import annotations

import dataclasses


def flag(default, help: str, **argparse_settings):
    """A field that is a flag: `help` for --help, other keys for argparse (metavar, action, type) or for
    the command's marking (reads: an input path; scratch: a temporary folder; exclusive: the mutually
    exclusive group)."""
    return dataclasses.field(default=default, metadata={"help": help, **argparse_settings})
