"""`pmi-jax corpus prepare | show | informask`: WordPiece ids and masking units (docs/design.md, "Prepared
corpus"), and InforMask's token rates measured on them (docs/design.md, "InforMask")."""
from __future__ import annotations

import argparse

from pmi_jax.cli import config_flags, io_flags, text_input
from pmi_jax.cli.defaults import LibraryDefault, value_of
from pmi_jax.preprocess.beam import beam_options
from pmi_jax.preprocess.corpus.prepare_config import PrepareConfig


def add_parser(subparsers) -> None:
    corpus = subparsers.add_parser(
        "corpus", help="tokenise, segment into masking units and pack a corpus into TFRecord shards",
        description="Turn raw documents into the training input: WordPiece ids, whole-word and masking-unit "
        "indices per token, packed into [CLS] ... [SEP] sequences.")
    commands = corpus.add_subparsers(dest="corpus_command", required=True, metavar="COMMAND")
    _add_prepare(commands)
    _add_show(commands)
    _add_informask(commands)


def _add_prepare(commands) -> None:
    p = commands.add_parser(
        "prepare", help="write sharded TFRecords, vocab.txt and metadata.json",
        description="Tokenise documents with WordPiece, segment them into masking units for each masking "
        "vocabulary (longest entry wins; overlapping entries are chosen between at random, seeded), pack them "
        "into sequences and write train/validation shards. The same inputs and seed give byte-identical "
        "files; a rerun after an interruption finishes the missing shards.")
    text_input.add_input_flags(p, "data directory to write (local or gs://)")
    vocabulary = ("wordpiece", "wordpiece_size")  # the flags of PrepareConfig's fields, help included
    text_input.add_tokenizer_flags(p, config_flags.add_flags(p, PrepareConfig, only=vocabulary)["vocabulary"])
    config_flags.add_flags(p, PrepareConfig, skip=vocabulary)
    beam_options.add_pipeline_arguments(p)
    io_flags.beam_flags(p)
    p.set_defaults(func=run_prepare)


def _add_show(commands) -> None:
    p = commands.add_parser(
        "show", help="print prepared sequences with their masking units bracketed",
        description="Decode a few sequences of a prepared corpus back to words and bracket each multi-word "
        "masking unit, e.g. `[CLS] [the united states] [air force] was ... [SEP]`, to see what will be masked "
        "together. Rendering: WordPieces are joined into words; a multi-word unit is [w1 w2 ...]; a backslash "
        "precedes every [ ] or \\ that belongs to a word, so an unescaped bracket always delimits a unit or a "
        "special token ([CLS], [SEP], which hold no space). The token count includes [CLS] and [SEP].")
    io_flags.reads(p.add_argument("data_dir", metavar="DIR", help="a directory written by `pmi-jax corpus prepare`"))
    p.add_argument("--split", default="train", choices=["train", "validation"], help="default %(default)s")
    p.add_argument("--num", type=int, default=3, help="sequences to print, at least 1 (default %(default)s)")
    p.add_argument("--units", metavar="NAME",
                   help="which masking vocabulary's units to mark (default: every one, one line each)")
    p.set_defaults(func=run_show)


def _informask_option(field: str) -> LibraryDefault:
    return LibraryDefault("pmi_jax.informask", "InformaskOptions", field)


def _add_informask(commands) -> None:
    p = commands.add_parser(
        "informask", help="measure InforMask's token-specific masking rates on a prepared corpus",
        description="InforMask (Sadeq et al. 2022) offline: count which tokens co-occur within --window tokens "
        "of the train split, score --candidates random 15% masks of every sequence by their informative "
        "relevance (the PMI of each masked token with each unmasked token near it), keep the best, and write each "
        "token id's masking rate (how often it was masked over how often it occurs) to DIR/informask_rates.json, "
        "which the informask scheme masks by. The same corpus, options and --seed give identical bytes.")
    io_flags.reads(p.add_argument("data_dir", metavar="DIR", help="a directory written by `pmi-jax corpus prepare`"))
    p.add_argument("--window", type=int, default=_informask_option("window"),
                   help="a token's context: this many tokens on each side, inside its document (default %(default)s)")
    p.add_argument("--candidates", type=int, default=_informask_option("candidates"),
                   help="random masks scored per sequence; the best one counts (default %(default)s)")
    p.add_argument("--min-pair-count", type=int, default=_informask_option("min_pair_count"),
                   help="token pairs seen fewer times in a window count as PMI 0 (default %(default)s)")
    p.add_argument("--seed", type=int, default=_informask_option("seed"),
                   help="seeds the candidate masks (default %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace the rates already measured on DIR")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.set_defaults(func=run_informask)


def _parse_units(values: list[str]) -> tuple[tuple[str, str], ...]:
    from pmi_jax.errors import UserInputError

    units = []
    for value in values:
        name, sep, source = value.partition("=")
        if not sep or not name or not source:
            raise UserInputError(f"--units {value}: expected NAME=VOCAB, e.g. pmi=out/vocab")
        units.append((name, source))
    return tuple(units)


def run_prepare(args: argparse.Namespace) -> int:
    from pmi_jax import storage
    from pmi_jax.config import check_trainable_seq_len
    from pmi_jax.preprocess.corpus.prepare import prepare

    config = PrepareConfig(**{**config_flags.values(args, PrepareConfig), "inputs": tuple(args.input),
                              "units": _parse_units(args.units)})
    check_trainable_seq_len(config.seq_len)
    with storage.write_errors(args.output):
        if args.runner:
            from pmi_jax.preprocess.beam import beam_prepare

            with beam_options.malloc_for_runner(args):
                metadata = beam_prepare.prepare(config, beam_options.pipeline_options(args))
        else:
            metadata = prepare(config)
    for split, stats in metadata["splits"].items():
        print(f"{split}: {stats['documents']} documents, {stats['sequences']} sequences, "
              f"{stats['tokens']} tokens in {stats['shards']} shards")
    per_word = (f", {metadata['tokens_per_word']:.3f} tokens per word" if "tokens_per_word" in metadata else "")
    print(f"wordpiece: {metadata['wordpiece']['size']} tokens"
          f"{' (trained)' if metadata['wordpiece']['trained'] else ''}{per_word}")
    for name, unit in metadata["units"].items():
        print(f"units {name}: {unit['entries']} entries, {unit['coverage']:.1%} of tokens inside multi-word units")
    print(f"wrote {args.output}")
    return 0


def run_informask(args: argparse.Namespace) -> int:
    from pmi_jax import storage
    from pmi_jax.informask import InformaskOptions, build_rates

    options = InformaskOptions(window=value_of(args.window), candidates=value_of(args.candidates),
                               min_pair_count=value_of(args.min_pair_count), seed=value_of(args.seed))
    with storage.write_errors(args.data_dir):
        stats = build_rates(args.data_dir, options, overwrite=args.overwrite, progress=not args.no_progress)
    print(f"{stats['sequences']} sequences, {stats['tokens']} tokens, {stats['pairs']} window pairs "
          f"({stats['distinct_pairs']} distinct); {stats['rates_of']} token ids seen")
    print(f"informative relevance: {stats['mean_relevance_chosen']:.2f} per sequence for the masks kept, "
          f"{stats['mean_relevance_candidates']:.2f} for the average candidate")
    for end in ("highest", "lowest"):
        shown = ", ".join(f"{token} {rate:.3f}" for token, rate, _ in stats[end])
        print(f"{end} rates (tokens seen {stats['shown_min_occurrences']}+ times): {shown or 'none'}")
    print(f"wrote {stats['path']}: mean rate {stats['overall_rate']:.4f} per token, {stats['elapsed_seconds']:.1f} s")
    return 0


def run_show(args: argparse.Namespace) -> int:
    import itertools

    from pmi_jax.formats.prepared_corpus import ASSIGNMENTS, read_metadata
    from pmi_jax.prepared_sequences import shown_sequences

    sequences = shown_sequences(args.data_dir, args.split, args.num, args.units)
    first = next(sequences, None)  # the corpus is checked before anything is printed
    version = read_metadata(args.data_dir)["format_version"]
    print(f"{args.data_dir}: format version {version} ({ASSIGNMENTS[version]})")
    for i, tokens, lines in itertools.chain([first], sequences) if first else ():
        print(f"--- {args.split} sequence {i}: {tokens} tokens")
        for name, text in lines:
            print(f"{name}: {text}")
    return 0
