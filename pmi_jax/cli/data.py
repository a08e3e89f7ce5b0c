"""`pmi-jax data dump | show`: look at the masked examples a masking scheme produces.

`dump` writes examples of the scheme's seqio task as JSON lines (`inputs`, `targets`,
`weights`, `units`, `word_ids`, and the example's `shard`, `position`, `epoch`); `show` prints a few
decoded, with each selected unit as {original|what the model sees}.
"""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags
from pmi_jax.config import MASK_RATE, SCHEMES, UNIT_SCHEMES


def _add_example_options(p: argparse.ArgumentParser, default_num: int | None) -> None:
    io_flags.reads(p.add_argument("--data", required=True, help="prepared corpus directory (from `pmi-jax corpus "
                                  "prepare`; local or gs://)"))
    p.add_argument("--scheme", required=True, metavar="SCHEME", help=f"masking scheme: {', '.join(SCHEMES)}; the "
                   f"PMI family ({', '.join(UNIT_SCHEMES)}) needs a corpus prepared with that masking vocabulary, "
                   "informask the rates of `pmi-jax corpus informask`")
    p.add_argument("--split", default="train", choices=("train", "validation"), help="split to read (default: train)")
    p.add_argument("--seed", type=int, default=0, help="run seed: masks (and the order, with --shuffle) are a "
                   "function of it, the example and the epoch (default: 0)")
    p.add_argument("--mask-rate", type=float, default=MASK_RATE, metavar="R",
                   help=f"share of each sequence's non-special tokens selected, as training's data.mask_rate: the "
                   f"budget is floor(R x tokens), at least 1, ceil for random_span as in SpanBERT (default: {MASK_RATE}, the paper's; e.g. 0.3)")
    p.add_argument("--shuffle", action="store_true", help="read in the training order for --seed instead of "
                   "file order")
    if default_num is None:
        p.add_argument("--num", type=int, required=True, help="number of examples; past the end of the split "
                       "the next epoch follows, with fresh masks")
    else:
        p.add_argument("--num", type=int, default=default_num, help=f"number of examples (default: {default_num})")


def add_parser(subparsers) -> None:
    data = subparsers.add_parser(
        "data",
        help="dump or show masked training examples",
        description="Inspect the masked examples of a masking scheme over a prepared corpus: exactly what the "
        "trainer reads (same seqio task, same seed semantics).",
    )
    commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    dump = commands.add_parser(
        "dump",
        help="write masked examples as JSON lines",
        description="Write --num masked examples as JSON lines, one object per sequence with the lists "
        "inputs (corrupted ids), targets (original ids), weights (1.0 on every selected token), units (the "
        "scheme's unit index per token, -1 on special tokens), word_ids (the word index per token, -1 on special "
        "tokens: units measured in words) and the example's shard, position and epoch.",
    )
    _add_example_options(dump, default_num=None)
    io_flags.writes(dump.add_argument("--output", required=True, help="JSON-lines file to write (local or gs://), "
                                      "written whole under a temporary name and renamed; its directory must exist"))
    dump.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    dump.set_defaults(func=run_dump)

    show = commands.add_parser(
        "show",
        help="print a few masked examples as text",
        description="Print masked examples decoded to text. A selected unit appears as {original|input}: its "
        "original tokens, then what the model sees ([MASK]s, random tokens, or the original unchanged).",
    )
    _add_example_options(show, default_num=3)
    show.set_defaults(func=run_show)


def _request(args: argparse.Namespace):
    from pmi_jax import paths
    from pmi_jax.masked_examples import ExampleRequest

    return ExampleRequest(data=paths.absolute(args.data), scheme=args.scheme, num=args.num, split=args.split,
                          seed=args.seed, mask_rate=args.mask_rate, shuffle=args.shuffle)


def run_dump(args: argparse.Namespace) -> int:
    from pmi_jax import paths
    from pmi_jax.formats import run_dir
    from pmi_jax.masked_examples import dump

    output = paths.absolute(args.output)
    run_dir.check_new_output(output, args.overwrite)
    count = dump(_request(args), output)
    print(f"wrote {count} {args.scheme} examples (mask rate {args.mask_rate:g}) to {output}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    import itertools

    from pmi_jax.masked_examples import shown

    request = _request(args)
    examples = shown(request)
    first = next(examples, None)  # the request is checked before the heading
    print(f"{args.scheme} masking of {request.data} ({args.split}, seed {args.seed}); "
          "a selected unit is shown as {original|input}; the masking budget is "
          f"{100 * args.mask_rate:g}% of the maskable tokens")
    for ex in itertools.chain([first], examples) if first else ():
        print(f"\nshard {ex.shard} position {ex.position} epoch {ex.epoch}: {ex.tokens} tokens "
              f"({ex.maskable} maskable), {ex.selected} selected in {ex.units} units (budget {ex.budget})")
        print(ex.text)
    return 0
