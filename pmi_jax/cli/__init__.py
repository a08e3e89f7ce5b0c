"""`pmi-jax`: one entry point, one sub-command per pipeline stage.

Each stage lives in its own module that exposes `add_parser(subparsers)`; heavy imports
(TensorFlow, JAX) happen inside the command functions so that `--help` answers at once.
Run as the `pmi-jax` program (`main()` without arguments), the command also owns the process's
stderr: it shows the command's own output and real warnings, and hides the libraries' start-up
lines unless `--verbose` is given (pmi_jax/cli/quiet.py). Called as `main([...])` from Python, it
leaves logging and stderr as the caller set them.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from pmi_jax.cli import io_flags
from pmi_jax.errors import UserInputError

# sub-command -> module holding its parser, in pipeline order.
_STAGES = {
    "demo-corpus": "pmi_jax.cli.demo_corpus",
    "vocab": "pmi_jax.cli.vocab",
    "corpus": "pmi_jax.cli.corpus",
    "data": "pmi_jax.cli.data",
    "train": "pmi_jax.cli.train",
    "eval": "pmi_jax.cli.eval",
    "compare": "pmi_jax.cli.compare",
    "export": "pmi_jax.cli.export",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pmi-jax",
        description="PMI-Masking for BERT pretraining: build a masking vocabulary, prepare a corpus, "
        "train, evaluate. Every path accepts local files and gs:// URLs.",
    )
    parser.add_argument("--verbose", action="store_true",
                        help="also show what TensorFlow, JAX and Orbax log (start-up lines, INFO messages); "
                        "give it before COMMAND")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _STAGES.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # stage not built yet
        module.add_parser(subparsers)
    io_flags.declare(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. `argv` None: the process's own command line (see above)."""
    stderr_filter = None
    if argv is None:  # before parsing: --help may import the library to show its defaults
        from pmi_jax.cli import quiet

        verbose = quiet.verbose_requested(sys.argv[1:])
        quiet.configure_logging(verbose)
        stderr_filter = None if verbose else quiet.filter_stderr()
    try:
        return _run(build_parser().parse_args(argv))
    finally:
        if stderr_filter is not None:
            stderr_filter.close()


def _run(args: argparse.Namespace) -> int:
    try:
        io_flags.check_finite(args)  # before the command reads or writes anything
        io_flags.check_apart(args)
        status = args.func(args)
    except UserInputError as e:
        print(f"pmi-jax {args.command}: error: {io_flags.worded(e, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pmi-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
