"""Which flags of a command name what it reads and what it writes, and the one check keeping them apart.

A command's parser marks each path flag where it declares it: `reads(...)` for an input,
`writes(...)` for an output file or directory, `run_directory(...)` for train's --workdir,
`scratch(...)` for spill space. `check_apart` runs on every parsed command line before the
command does anything: no output may be, hold or lie inside an input (whatever flag names
either), and a file output's directory must exist. So `--plot` over `--labels`, `--output`
over `--hf-model` or into a prepared corpus are one line and exit 2, not lost files
(docs/reliability.md). tests/test_cli_io_flags.py walks every parser, so a new path flag
that is not marked fails the suite. The library reports a bad path without its flag (PathError);
`worded` finds the flag that gave the path and words the line.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
from typing import Iterator

from pmi_jax import paths
from pmi_jax.errors import OutputExists, PathError, UserInputError

ROLE = "pmi_jax_role"  # the attribute a marked argparse Action carries
INPUT, INPUT_NAMED, OUTPUT_FILE, OUTPUT_DIR, RUN, SCRATCH = (
    "input", "input NAME=PATH", "output file", "output directory", "run directory", "scratch")
OUTPUTS = (OUTPUT_FILE, OUTPUT_DIR)


def _mark(action: argparse.Action, role: str) -> argparse.Action:
    setattr(action, ROLE, role)
    return action


def reads(action: argparse.Action, named: bool = False) -> argparse.Action:
    """An input path (a file, directory or glob); `named`: given as NAME=PATH (`--units`)."""
    return _mark(action, INPUT_NAMED if named else INPUT)


def writes(action: argparse.Action, directory: bool = False) -> argparse.Action:
    """An output the command creates or replaces."""
    return _mark(action, OUTPUT_DIR if directory else OUTPUT_FILE)


def run_directory(action: argparse.Action) -> argparse.Action:
    """A training run written into and resumed (not replaced): it may not be inside an input."""
    return _mark(action, RUN)


def scratch(action: argparse.Action) -> argparse.Action:
    """Where hidden temporaries go and are removed: never compared with inputs."""
    return _mark(action, SCRATCH)


def beam_flags(parser: argparse.ArgumentParser) -> None:
    """Mark the Beam flags (preprocess/beam/beam_options.py) that name files: the worker's setup
    inputs, and Dataflow's own temporary folders."""
    for action in parser._actions:
        if set(action.option_strings) & {"--setup_file", "--requirements_file"}:
            reads(action)
        elif set(action.option_strings) & {"--temp_location", "--staging_location"}:
            scratch(action)


def option_name(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.metavar or action.dest.upper()


def leaf_parsers(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command words, parser) of every command that runs, e.g. ("vocab select", parser)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield prefix.strip(), parser
        return
    for name, child in subparsers[0].choices.items():
        yield from leaf_parsers(child, f"{prefix} {name}")


def declare(parser: argparse.ArgumentParser) -> None:
    """Give every command's parsed arguments the list of its marked flags (for `check_apart`) and
    the option of each destination (for `check_finite`)."""
    for _, leaf in leaf_parsers(parser):
        marked = tuple((a.dest, option_name(a), getattr(a, ROLE)) for a in leaf._actions if hasattr(a, ROLE))
        leaf.set_defaults(io_flags=marked, io_options={a.dest: option_name(a) for a in leaf._actions})


def check_finite(args: argparse.Namespace) -> None:
    """No number a command is given is NaN or infinite, whichever flag takes it (a rate, a
    fraction, a threshold, --shares): float('nan') parses, and compares False with every bound."""
    for dest, option in getattr(args, "io_options", {}).items():
        value = getattr(args, dest, None)
        for number in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(number, float) and not math.isfinite(number):
                raise UserInputError(f"{option} {number}: not a finite number")


def _values(value) -> list[str]:
    if not value:
        return []
    return [v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, str) and v]


def _input_paths(role: str, value: str) -> list[str]:
    """The local paths an input value names: a glob's matches, NAME=PATH's PATH; URLs compared as text."""
    if role == INPUT_NAMED:
        value = value.partition("=")[2]
    if not value:
        return []
    if paths.is_url(value):
        return [value]
    value = paths.absolute(value)
    if glob.has_magic(value):
        return glob.glob(value)
    return [value] if os.path.exists(value) else []  # a name (--config tiny, --data synthetic) or a missing input


def flags_of(args: argparse.Namespace, roles: tuple[str, ...]) -> list[tuple[str, str]]:
    """(option, value) of the marked flags of `args` with one of `roles`, each value separately."""
    return [(option, value) for dest, option, role in getattr(args, "io_flags", ())
            if role in roles for value in _values(getattr(args, dest, None))]


def check_apart(args: argparse.Namespace) -> None:
    """The rule for every command, before it reads or writes anything: no output is, holds or lies
    inside an input, a training run or a run's records (`pmi_jax.formats.run_dir.check_output_apart`,
    which also keeps what a command derives apart); a file output's directory exists; a run
    directory is not inside an input other than a run."""
    inputs = [(option, path) for dest, option, role in getattr(args, "io_flags", ()) if role in (INPUT, INPUT_NAMED)
              for value in _values(getattr(args, dest, None)) for path in _input_paths(role, value)]
    for option, output in flags_of(args, (OUTPUT_FILE,)):
        parent = os.path.dirname(paths.absolute(output))
        if not paths.is_url(output) and not os.path.isdir(parent):
            raise UserInputError(f"{option} {output}: the directory {parent} does not exist; create it or name "
                                 "another")
    outputs = flags_of(args, OUTPUTS)
    if outputs:
        from pmi_jax.formats import run_dir

        for option, output in outputs:
            try:
                run_dir.check_output_apart(paths.absolute(output), inputs)
            except PathError as e:
                raise e.named(option) from None
    for option, workdir in flags_of(args, (RUN,)):
        _check_run_directory(option, workdir, inputs)


def _check_run_directory(option: str, workdir: str, inputs: list[tuple[str, str]]) -> None:
    if not inputs:
        return
    from pmi_jax import storage  # only with inputs to compare: `train --data synthetic` loads no TensorFlow
    from pmi_jax.formats import run_dir

    for source_option, source in inputs:
        if storage.is_inside(workdir if paths.is_url(workdir) else paths.absolute(workdir), source) and \
                not run_dir.is_run(source):
            raise UserInputError(f"{option} {workdir}: lies inside the input {source_option} {source}, which is not "
                                 "this command's to change; name another run directory")


def worded(error: UserInputError, args: argparse.Namespace) -> str:
    """The one line a command prints for `error`: a PathError's path named by the flag that gave
    it (an output, or a path written under an output, by the output's flag), and an existing
    output's fix in this command's words."""
    if not isinstance(error, PathError):
        return str(error)
    fix = " (pass --overwrite to replace it)" if isinstance(error, OutputExists) and hasattr(args, "overwrite") else ""
    return error.line(error.name or _flag_of(error.path, args), fix)


def _flag_of(path: str, args: argparse.Namespace) -> str | None:
    """The flag whose value is `path` (outputs and run directories first), else the output flag
    under whose value `path` lies (eval finetune's OUTPUT/step<N>), else None."""
    def same(value: str) -> bool:
        return paths.absolute(value).rstrip("/") == paths.absolute(path).rstrip("/")

    marked = getattr(args, "io_flags", ())
    written = [(option, value) for dest, option, role in marked if role in (*OUTPUTS, RUN)
               for value in _values(getattr(args, dest, None))]
    every = [(option, value) for dest, option in getattr(args, "io_options", {}).items()
             for value in _values(getattr(args, dest, None))]
    for option, value in [*written, *every]:
        if same(value):
            return option
    below = paths.absolute(path).rstrip("/")
    for option, value in written:
        if below.startswith(paths.absolute(value).rstrip("/") + "/"):
            return option
    return None
