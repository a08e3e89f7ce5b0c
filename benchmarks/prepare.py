"""Corpus preparation throughput: tokenise + segment + pack + write, with and without masking units.

    .venv/bin/python benchmarks/prepare.py CORPUS... [--units NAME=VOCAB ...] [--wordpiece VOCAB_TXT]

Both variants run the production code (`pmi_jax.preprocess.corpus.prepare.ShardWriter`) over every document
of CORPUS into one TFRecord file, in this one process with TensorFlow held to one thread, and
count CPU time, so the figures are per core and other load on the machine matters less.
"plain" writes input_ids and word_ids only; "units" also segments every document with each
masking vocabulary and writes its units feature. The difference is the cost of segmentation
(target: under 30% of plain). Each variant runs --repeat times, interleaved, and the fastest
run counts. Set-up is not timed: without --wordpiece a vocabulary is trained on
CORPUS, and without --units a PMI masking vocabulary (`pmi-jax vocab build`, --vocab-size
entries) is built on CORPUS.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from pmi_jax.formats import prepared_corpus, wordpiece_vocab  # noqa: E402
from pmi_jax.formats.masking_vocab import load_ngrams  # noqa: E402
from pmi_jax.preprocess.corpus import prepare, segmentation, wordpiece  # noqa: E402
from pmi_jax.preprocess.text import documents  # noqa: E402
from pmi_jax.preprocess.corpus.sequence_packing import SequencePacker  # noqa: E402
from pmi_jax.preprocess.text.words import split_words_ragged  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", nargs="+", help="input files, globs or directories (as `corpus prepare --input`)")
    p.add_argument("--units", action="append", default=[], metavar="NAME=VOCAB",
                   help="masking vocabularies to segment with (default: one built on CORPUS)")
    p.add_argument("--wordpiece", help="BERT vocab.txt (default: one trained on CORPUS)")
    p.add_argument("--vocab-size", type=int, default=20_000, help="entries of the built masking vocabulary")
    p.add_argument("--min-count", type=int, default=5, help="--min-count of the built masking vocabulary")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3, help="runs per variant; the fastest counts")
    return p.parse_args()


def set_up(args, work_dir: str) -> tuple[str, list[tuple[str, str]], list[tuple[int, str]]]:
    files = documents.expand_inputs(args.corpus)
    docs = [(documents.document_key(d.encode("utf-8")), d) for d in documents.iter_documents(files)]  # (key, text)
    vocab_txt = os.path.join(work_dir, "vocab.txt")
    if args.wordpiece:
        tokens = wordpiece_vocab.load_vocab(args.wordpiece)
    else:
        print("training a WordPiece vocabulary (not timed)", file=sys.stderr)
        tokens = wordpiece.train_vocab(wordpiece.count_words(documents.iter_document_batches(files)))
    with open(vocab_txt, "w", encoding="utf-8") as f:
        f.write(wordpiece_vocab.vocab_text(tokens))
    units = [tuple(u.split("=", 1)) for u in args.units]
    if not units:
        from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary

        print(f"building a {args.vocab_size}-entry PMI masking vocabulary (not timed)", file=sys.stderr)
        vocab_dir = os.path.join(work_dir, "pmi")
        build_vocabulary(files, vocab_dir, VocabOptions(size=args.vocab_size, min_count=args.min_count, workers=1))
        units = [("pmi", vocab_dir)]
    return vocab_txt, units, docs


def run_once(context: prepare.WorkerContext, docs: list[tuple[int, str]], path: str) -> tuple[float, int, dict, int]:
    """CPU seconds and tokens to write every document as one shard, and the packer's unit stats."""
    writer = prepare.ShardWriter(context)  # builds the tries: set-up, not timed
    special = writer.special
    packer = SequencePacker(context.seq_len, special["cls"], special["sep"], [n for n, _ in context.units])
    encode = prepared_corpus.ExampleEncoder(prepared_corpus.feature_names(packer.unit_names))
    started = time.process_time()
    tokens = 0
    with tf.io.TFRecordWriter(path) as out:
        for features in writer.sequences(docs, packer):
            out.write(encode(features))
            tokens += len(features[prepared_corpus.INPUT_IDS])
    return time.process_time() - started, tokens, dict(packer.multiword_tokens), packer.tokens


def segmentation_only(context: prepare.WorkerContext, docs: list[tuple[int, str]]) -> float:
    """CPU seconds inside `segmentation.unit_starts` alone, for all documents and vocabularies."""
    matchers = [segmentation.NgramMatcher(load_ngrams(source)) for _, source in context.units]
    batches = list(prepare._batches(docs))
    words = [split_words_ragged(tf.constant(texts)) for _, texts in batches]
    started = time.process_time()
    for (indices, _), ragged in zip(batches, words):
        for matcher in matchers:
            segmentation.unit_starts(matcher, ragged.flat_values, ragged.row_splits.numpy(), indices, context.seed)
    return time.process_time() - started


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as work_dir:
        vocab_txt, units, docs = set_up(args, work_dir)
        out = os.path.join(work_dir, "shard.tfrecord")
        contexts = {
            "plain": prepare.WorkerContext(work_dir, vocab_txt, (), args.seq_len, 0),
            "units": prepare.WorkerContext(work_dir, vocab_txt, tuple(units), args.seq_len, 0),
        }
        runs = {name: [] for name in contexts}
        for _ in range(args.repeat):  # interleaved, so that drifting machine load hits both alike
            for name, context in contexts.items():
                runs[name].append(run_once(context, docs, out))
        best = {name: min(r, key=lambda run: run[0]) for name, r in runs.items()}
        segment_seconds = min(segmentation_only(contexts["units"], docs) for _ in range(args.repeat))

    print(f"corpus: {len(docs)} documents, {sum(len(d) for _, d in docs) / 1e6:.1f}M characters; seq_len {args.seq_len}; "
          f"units: {', '.join(f'{n}={s}' for n, s in units)}")
    for name, (seconds, tokens, multiword, content) in best.items():
        coverage = ", ".join(f"{n} coverage {m / content:.1%}" for n, m in multiword.items())
        print(f"{name:6s} {tokens / seconds:>10,.0f} tokens/s per core ({tokens:,} tokens in {seconds:.2f} s)"
              + (f"; {coverage}" if coverage else ""))
    plain, with_units = best["plain"][0], best["units"][0]
    print(f"segmentation adds {with_units / plain - 1:.1%} to plain tokenise + pack + write "
          f"(unit_starts alone: {segment_seconds:.2f} s, {segment_seconds / plain:.1%} of plain)")


if __name__ == "__main__":
    main()
