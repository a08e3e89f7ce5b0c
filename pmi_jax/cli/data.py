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


def _examples(args: argparse.Namespace):
    """(vocabulary, iterator of NumPy examples) of the scheme's task over --data."""
    import seqio

    from pmi_jax import tasks
    from pmi_jax.errors import UserInputError
    from pmi_jax.formats import prepared_corpus

    from pmi_jax.config import check_scheme, mask_rate_units

    if args.num < 1:
        raise UserInputError(f"--num {args.num}: must be at least 1")
    check_scheme(args.scheme, "--scheme")
    mask_rate_units(args.mask_rate, "--mask-rate")
    tasks.TaskCorpus(args.data).files(args.split)  # a missing split is an input error, not a tf.data one
    (name,) = tasks.register_corpus("data", args.data, [args.scheme], mask_rate=args.mask_rate)
    task = seqio.get_mixture_or_task(name)
    ds = task.get_dataset(None, args.split, shuffle=args.shuffle, seed=args.seed, num_epochs=None)

    def unpadded(examples):  # task examples are padded to the corpus's seq_len with [PAD] = 0
        with prepared_corpus.reading(args.data):  # a shard whose bytes changed is named
            for ex in examples:
                length = int((ex["targets"] != 0).sum())
                yield {k: v[:length] if v.ndim else v for k, v in ex.items()}

    return task.output_features["inputs"].vocabulary, unpadded(ds.take(args.num).as_numpy_iterator())


def _absolute_paths(args: argparse.Namespace) -> None:
    from pmi_jax import paths

    paths.make_absolute(args, "data", "output")


def run_dump(args: argparse.Namespace) -> int:
    import json

    from pmi_jax import storage

    _absolute_paths(args)
    storage.check_new_output(args.output, args.overwrite, inputs=[("--data", args.data)])
    _, examples = _examples(args)
    count = 0
    # A full disk's message says how much the whole dump needs: its lines so far, scaled to --num.
    with storage.write_errors(args.output), storage.needs_space(lambda: f.written * args.num // max(count, 1)), \
            storage.atomic_file(args.output) as f:
        for ex in examples:
            record = {k: ex[k].tolist() for k in ("inputs", "targets", "weights", "units", "word_ids")}
            record.update({k: int(ex[k]) for k in ("shard", "position", "epoch")})
            count += 1
            f.write(json.dumps(record) + "\n")
    print(f"wrote {count} {args.scheme} examples (mask rate {args.mask_rate:g}) to {args.output}")
    return 0


def _join_pieces(tokens: list[str]) -> str:
    """WordPiece tokens as text: `##` pieces glue to what precedes them (except at the start)."""
    text = ""
    for token in tokens:
        if text and token.startswith("##") and len(token) > 2:
            text += token[2:]
        else:
            text += (" " if text else "") + token
    return text


def render(targets, inputs, weights, units, vocab_tokens: list[str]) -> str:
    """One example as text, each selected unit shown as {original|input}."""
    pieces, i, length = [], 0, len(targets)
    while i < length:
        if weights[i] == 0:
            pieces.append(vocab_tokens[targets[i]])
            i += 1
            continue
        j = i
        while j < length and weights[j] > 0 and units[j] == units[i]:
            j += 1
        original = _join_pieces([vocab_tokens[t] for t in targets[i:j]])
        shown = _join_pieces([vocab_tokens[t] for t in inputs[i:j]])
        pieces.append(("##{" if original.startswith("##") else "{") + original.removeprefix("##") + "|" + shown + "}")
        i = j
    return _join_pieces(pieces)


def run_show(args: argparse.Namespace) -> int:
    from pmi_jax.config import mask_rate_units
    from pmi_jax.masking import scheme_budget

    _absolute_paths(args)
    vocab, examples = _examples(args)
    print(f"{args.scheme} masking of {args.data} ({args.split}, seed {args.seed}); "
          "a selected unit is shown as {original|input}; the masking budget is "
          f"{100 * args.mask_rate:g}% of the maskable tokens")
    for ex in examples:
        # Every token of the sequence, as `corpus show` counts them; the special ones ([CLS], [SEP],
        # where units are -1) are never masked, so the budget counts the others.
        tokens = len(ex["targets"])
        maskable = int((ex["units"] >= 0).sum())
        selected = int(ex["weights"].sum())
        units = len(set(ex["units"][ex["weights"] > 0].tolist()))
        print(f"\nshard {ex['shard']} position {ex['position']} epoch {ex['epoch']}: {tokens} tokens "
              f"({maskable} maskable), {selected} selected in {units} units (budget {int(scheme_budget(args.scheme, maskable, mask_rate_units(args.mask_rate)))})")
        print(render(ex["targets"], ex["inputs"], ex["weights"], ex["units"], vocab.tokens))
    return 0
