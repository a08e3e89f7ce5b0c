"""`pmi-jax demo-corpus`: write the offline demo corpus (Python's own documentation)."""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "demo-corpus",
        help="write a small real-English corpus from the Python standard library's documentation",
        description="Write the demo corpus: the docstrings and pydoc topics of this Python's standard "
        "library, one document per docstring, in BERT pretraining text format (blank-line separated). "
        "It needs no download, so the README's demo runs offline.",
    )
    io_flags.writes(p.add_argument("--output", required=True, help="directory to create (local or gs://)"),
                    directory=True)
    p.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    p.add_argument("--installed", action="store_true",
                   help="also write installed_docs.txt: the prose of every installed package's docstrings "
                   "(about 5M words with the pinned constraints.txt; the CPU comparison's corpus)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pmi_jax import storage
    from pmi_jax.formats import run_dir
    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents, iter_installed_documents

    run_dir.check_new_output(args.output, args.overwrite, directory=True)
    count = 0
    with storage.write_errors(args.output), storage.atomic_directory(args.output, overwrite=True) as tmp:
        with storage.gfile.GFile(storage.join(tmp, "stdlib_docs.txt"), "w") as f:
            for doc in iter_demo_documents():
                f.write(doc + "\n\n")
                count += 1
        if args.installed:
            with storage.gfile.GFile(storage.join(tmp, "installed_docs.txt"), "w") as f:
                for doc in iter_installed_documents():
                    f.write(doc + "\n\n")
                    count += 1
    print(f"wrote {count} documents to {args.output}")
    return 0
