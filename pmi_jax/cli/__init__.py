"""`pmi-jax`: one entry point, one sub-command per pipeline stage.

Each stage lives in its own module that exposes `add_parser(subparsers)`; heavy imports
(TensorFlow, JAX) happen inside the command functions so that `--help` answers at once.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

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
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _STAGES.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # stage not built yet
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter hides our output
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        status = args.func(args)
    except UserInputError as e:
        print(f"pmi-jax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pmi-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
