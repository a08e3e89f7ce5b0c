"""Bytes per frequent n-gram in the Beam vocabulary build's selection step, before and after
issue 35's compact arrays (preprocess/beam/beam_vocab.py).

    .venv/bin/python benchmarks/beam_selection_memory.py [--grams 1000000]

Before, every frequent n-gram reached the one selecting worker as a side-input element
(n, (tuple of word bytes, count)), each word its own bytes object (side inputs are decoded
element by element); now as the local table's sorted int64 keys and int64 counts, one array
pair per length (the workers count them so: `level_counts`, `SumCounts`). tracemalloc measures
both as that worker holds them, for real words of the demo corpus drawn into random n-grams.
"""
from __future__ import annotations

import argparse
import itertools
import os
import pickle
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pmi_jax.preprocess.beam import beam_vocab  # noqa: E402
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents  # noqa: E402
from pmi_jax.preprocess.text.words import split_words_flat  # noqa: E402


def measure(build) -> tuple[int, object]:
    tracemalloc.start()
    value = build()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grams", type=int, default=1_000_000, help="frequent n-grams per length")
    args = parser.parse_args()
    flat, _ = split_words_flat(list(itertools.islice(iter_demo_documents(), 3000)))
    vocabulary = sorted(set(flat))
    rng = np.random.default_rng(0)
    print(f"{len(vocabulary):,} distinct words, {args.grams:,} n-grams per length")
    print("| n | before: tuples, bytes per n-gram | after: arrays, bytes per n-gram |")
    print("| --- | --- | --- |")
    for n in (2, 3, 4, 5):
        picks = rng.integers(0, len(vocabulary), size=(args.grams, n))
        grams = [(tuple(vocabulary[i] for i in row), 20 + k % 7) for k, row in enumerate(picks.tolist())]
        wire = [pickle.dumps((n, g)) for g in grams]  # a side input decodes element by element: fresh objects
        old, _ = measure(lambda: [pickle.loads(w) for w in wire])
        keys = rng.permutation(args.grams * 7)[:args.grams].astype(np.int64)  # one partition's keys each part
        parts = [(np.sort(keys[i:i + 100_000]), np.full(len(keys[i:i + 100_000]), 20, np.int64), 100_000)
                 for i in range(0, len(keys), 100_000)]
        new, _ = measure(lambda: beam_vocab.concatenate_level(parts, n)[1:3])
        print(f"| {n} | {old / args.grams:.0f} | {new / args.grams:.0f} |")


if __name__ == "__main__":
    main()
