"""`pmi-jax vocab build|show|check|select`: make, inspect, validate masking vocabularies, and
choose their size from labelled n-grams (the paper's Appendix A).

The contract: docs/design.md, "Measures" and "Masking vocabulary".
"""
from __future__ import annotations

import argparse

from pmi_jax.cli import config_flags, io_flags, text_input
from pmi_jax.preprocess.beam import beam_options
from pmi_jax.preprocess.vocab.vocab_options import VocabOptions


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "vocab", help="build, show or check a masking vocabulary (the n-grams masked as one unit)",
        description="Masking vocabularies: the word n-grams (n = 2..5) that PMI-Masking masks as one unit.")
    commands = p.add_subparsers(dest="vocab_command", required=True, metavar="ACTION")
    _add_build(commands)
    _add_show(commands)
    _add_check(commands)
    _add_select(commands)


def _add_build(commands) -> None:
    p = commands.add_parser(
        "build", help="count the n-grams of a corpus and write its masking vocabulary",
        description="Count every word n-gram (n = 1..max-n) of the input documents exactly, score the n-grams "
        "that occur at least --min-count times, and write the best --size of them, split between lengths by "
        "--shares, to DIR: masking_vocab.txt (one n-gram per line), masking_vocab.tsv (with counts and scores) "
        "and stats.json. Words are BERT's uncased basic-tokenizer words, or --tokenizer's. The output is the same "
        "whatever --workers and --memory-mb are.")
    text_input.add_input_flags(p, "vocabulary directory to create (local or gs://)")
    text_input.add_tokenizer_flags(p)
    config_flags.add_flags(p, VocabOptions)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    beam_options.add_pipeline_arguments(p)
    io_flags.beam_flags(p)
    p.set_defaults(func=run_build)


def _add_show(commands) -> None:
    p = commands.add_parser("show", help="print the top entries of each length of a vocabulary",
                            description="Print the first --top n-grams of each length of a vocabulary directory "
                            "made by 'vocab build', with count and score.")
    io_flags.reads(p.add_argument("directory", metavar="DIR", help="vocabulary directory (local or gs://)"))
    p.add_argument("--top", type=int, default=10, help="entries per length (default 10)")
    p.set_defaults(func=run_show)


def _add_check(commands) -> None:
    p = commands.add_parser("check", help="validate a masking vocabulary list and report its size per length",
                            description="Validate a masking vocabulary given as a file with one n-gram per line "
                            "(words separated by spaces; e.g. a published list) or as a vocabulary directory: every "
                            "entry must be 2 to 5 words in this project's word normalisation (uncased BERT basic "
                            "tokenizer). Exit status 1 if any entry is not.")
    io_flags.reads(p.add_argument("path", metavar="FILE", help="list file or vocabulary directory (local or gs://)"))
    p.set_defaults(func=run_check)


def _add_select(commands) -> None:
    p = commands.add_parser(
        "select", help="choose the vocabulary size from labelled n-grams (the paper's Appendix A)",
        description="Score lists of the top-ranked n-grams of VOCAB_DIR, growing by --step, on hand-labelled "
        "n-grams, as Levine et al. 2021 chose their 800K (Appendix A, Figure 3): r is the percent of n-grams "
        "labelled 1 (collocation) that are in the list, c the percent of n-grams labelled 0 that are not, "
        "f = 2rc/(r+c). Prints r, c and f per size, writes the plot, and recommends the size with the highest "
        "f. Build VOCAB_DIR larger than the sizes to try: sizes run up to its size. docs/experiments.md, "
        "'Choosing the vocabulary size', gives the paper's labelling recipe.")
    io_flags.reads(p.add_argument("directory", metavar="VOCAB_DIR",
                                  help="vocabulary directory made by 'vocab build' (local or gs://)"))
    io_flags.reads(p.add_argument("--labels", required=True, metavar="FILE",
                   help="one labelled n-gram per line: the n-gram, a tab, then 1 (collocation) or 0 (not); "
                   "n-grams are lower-cased and split into words as the vocabulary's are"))
    p.add_argument("--step", type=int, default=50_000,
                   help="list sizes step, 2*step, ... up to the vocabulary's size (default %(default)s, the paper's)")
    p.add_argument("--order", choices=("shares", "score"), default="shares",
                   help="shares (default): the list of size M is what 'vocab build --size M' would select with "
                   "this vocabulary's --shares; score: the M best scores over all lengths together, the paper's "
                   "wording")
    io_flags.writes(p.add_argument("--plot", default=None, metavar="PNG",
                   help="where to write the plot of r, c and f against size (default: FILE with its extension "
                   "replaced by .select.png)"))
    p.set_defaults(func=run_select)


def run_build(args: argparse.Namespace) -> int:
    from pmi_jax import storage
    from pmi_jax.preprocess.vocab.build_vocab import build_vocabulary

    options = VocabOptions(**config_flags.values(args, VocabOptions))
    with storage.write_errors(args.output):
        if args.runner:
            from pmi_jax.preprocess.beam import beam_vocab

            with beam_options.malloc_for_runner(args):
                stats = beam_vocab.build_vocabulary(args.input, args.output, options, overwrite=args.overwrite,
                                                    pipeline_options=beam_options.pipeline_options(args))
        else:
            from pmi_jax.preprocess.vocab.malloc_thresholds import large_array_malloc

            with large_array_malloc():
                stats = build_vocabulary(args.input, args.output, options, overwrite=args.overwrite,
                                         progress=not args.no_progress)
    per_length = ", ".join(f"{n}-grams {k}" for n, k in stats["selected"].items())
    print(f"wrote {stats['vocabulary_size']} n-grams ({per_length}) to {args.output}: {stats['words']} words in "
          f"{stats['documents']} documents, coverage {stats['coverage']:.1%}, {stats['elapsed_seconds']:.1f} s")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from pmi_jax.errors import UserInputError
    from pmi_jax.formats import masking_vocab

    if args.top < 1:
        raise UserInputError(f"--top {args.top}: must be at least 1")
    rows = masking_vocab.read_table(args.directory)
    measure = masking_vocab.read_stats(args.directory).get("measure", "score")
    by_length: dict[int, list[tuple[str, int, float]]] = {}
    for ngram, n, count, score in rows:
        by_length.setdefault(n, []).append((ngram, count, score))
    for n, entries in sorted(by_length.items()):
        print(f"{n}-grams: {len(entries)}")
        width = max(len(e[0]) for e in entries[:args.top])
        for ngram, count, score in entries[:args.top]:
            print(f"  {ngram:<{width}}  {measure} {score:9.3f}  count {count}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    import collections

    from pmi_jax.formats.masking_vocab import load_ngrams
    from pmi_jax.preprocess.text.unit_lists import check_ngrams

    ngrams = load_ngrams(args.path)
    lengths = collections.Counter(len(ngram) for ngram in ngrams)
    print(f"{args.path}: {len(ngrams)} n-grams (" + ", ".join(f"{n}-grams {lengths[n]}" for n in sorted(lengths)) + ")")
    problems = check_ngrams(ngrams)
    for problem in problems:
        print(f"problem: {problem}")
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def run_select(args: argparse.Namespace) -> int:
    import os

    from pmi_jax.preprocess.vocab.vocab_size import select_size

    plot = args.plot or os.path.splitext(args.labels)[0] + ".select.png"
    selection = select_size(args.directory, args.labels, step=args.step, order=args.order, plot=plot)
    print(f"{selection.positives} n-grams labelled collocation, {selection.negatives} not; "
          f"lists of {args.directory} in {args.order} order")
    print(f"{'size':>12}  {'r %':>6}  {'c %':>6}  {'f':>6}")
    for s in selection.scores:
        mark = "  <- recommended" if s is selection.recommended else ""
        print(f"{s.size:>12,}  {s.recall:6.1f}  {s.complement_recall:6.1f}  {s.f:6.1f}{mark}")
    if selection.skipped_sizes:
        print("not readable off this vocabulary (a length's quota exceeds what it holds): "
              + ", ".join(f"{n:,}" for n in selection.skipped_sizes))
    best = selection.recommended
    print(f"recommended size: {best.size:,} (f {best.f:.1f}: r {best.recall:.1f}%, c {best.complement_recall:.1f}%)")
    print(f"plot: {plot}")
    return 0
