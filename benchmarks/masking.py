"""Masking throughput per CPU core: every scheme in-graph, against a per-example Python masker.

    python benchmarks/masking.py DATA_DIR [--split train] [--num 2000] [--seconds 3] [--rounds 5]

DATA_DIR is a prepared corpus (`pmi-jax corpus prepare`; 512-token sequences for the
figures in benchmarks/README.md). The process pins itself to one CPU core and TensorFlow to
one thread, then reports masked sequences per second for each scheme:
  mask     `masking.mask_batch` over parsed sequences held in memory, in batches of 128;
  task     the whole seqio task as training reads it: shuffled, epoch after epoch: read
           the TFRecords (from the page cache), parse, mask, hand out single examples;
and, for `pmi`, a straightforward per-example NumPy/Python implementation of the same
masking on the same parsed sequences, written the way data collators commonly are (group
token positions into units in a dict, shuffle the unit list, greedy fill in a Python loop,
80/10/10 per unit). Target: >= 2,000 sequences/s per core for `pmi` and >= 10x Python.
The two ratios are printed twice: from the table (measurements a minute apart), and from
`--rounds` alternate timings of `pmi` mask and Python, which a drifting load on a shared
machine affects alike.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

# One core for everything: the figures are per core. Must precede the TensorFlow import.
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from pmi_jax import masking, randomness, tasks  # noqa: E402
from pmi_jax.config import TOKEN_RATE_SCHEMES  # noqa: E402


def _single_threaded(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return ds.with_options(options)


def _rate(counts, seconds: float) -> float:
    """Sequences per second of an endless stream of step sizes, timed after a warm-up.

    One long-lived iterator, as in training: no per-pass start-up cost is counted.
    """
    for _ in range(3):
        next(counts)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        count += next(counts)
    return count / (time.perf_counter() - start)


def _batch_sizes(ds: tf.data.Dataset):
    return (len(batch["inputs"]) for batch in ds.as_numpy_iterator())


def python_pmi_mask(input_ids, units, rng, mask_id, regular_ids):
    """Per-example PMI masking in plain Python/NumPy, as data collators are usually written."""
    groups: dict[int, list[int]] = {}
    for i, u in enumerate(units.tolist()):
        if u >= 0:
            groups.setdefault(u, []).append(i)
    unit_list = list(groups.values())
    num_tokens = sum(len(g) for g in unit_list)
    budget = max(1, 15 * num_tokens // 100)
    rng.shuffle(unit_list)
    inputs, weights, covered = input_ids.copy(), np.zeros(len(input_ids), np.float32), 0
    for group in unit_list:
        if covered + len(group) > budget:
            continue
        covered += len(group)
        fate = rng.random()
        for i in group:
            weights[i] = 1.0
            if fate < 0.8:
                inputs[i] = mask_id
            elif fate < 0.9:
                inputs[i] = regular_ids[rng.integers(len(regular_ids))]
        if covered == budget:
            break
    return {"inputs": inputs, "targets": input_ids, "weights": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_dir", help="prepared corpus directory")
    parser.add_argument("--split", default="train")
    parser.add_argument("--num", type=int, default=2000, help="sequences held in memory for `mask` and Python "
                        "(default: 2000)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per measurement (default: 3)")
    parser.add_argument("--rounds", type=int, default=5, help="alternate timings of pmi mask and Python "
                        "(default: 5)")
    args = parser.parse_args()

    corpus = tasks.TaskCorpus(args.data_dir)
    records = tasks.PreparedCorpusSource(corpus, corpus.unit_names).get_dataset(args.split, shuffle=False)
    records = records.take(args.num).cache()
    parsed = _single_threaded(records.batch(tasks.MASK_BATCH).map(
        lambda batch: {**tasks.parse_records(batch["record"], corpus.unit_names, corpus.seq_len),
                       "key": randomness.example_keys(batch["seed"], batch["shard"], batch["position"], batch["epoch"])}
    ).cache())
    batches = list(parsed.as_numpy_iterator())
    sequences = []  # the same sequences unpadded, as a per-example masker receives them
    for batch in batches:
        for i, length in enumerate((batch["input_ids"] != 0).sum(axis=1)):
            sequences.append({k: v[i, :length] for k, v in batch.items() if k != "key"})
    mean_len = np.mean([len(ex["input_ids"]) for ex in sequences])
    print(f"{args.data_dir} ({args.split}): {len(sequences)} sequences of {mean_len:.0f} tokens on average "
          f"(padded to {corpus.seq_len}); 1 CPU core ({os.cpu_count()} on the machine)\n")
    regular_ids = np.array(corpus.regular_ids, np.int32)
    regular_ids_tf = tf.constant(regular_ids)

    print(f"{'scheme':<14}{'mask':>10}{'task':>10}   sequences/s/core")
    results, mask_streams = {}, {}  # the `pmi` stream is timed again below
    for scheme in corpus.schemes:
        counts = tf.constant(corpus.token_counts(), tf.int64) if scheme in tasks.UNIGRAM_SCHEMES else None
        rates = tf.constant(corpus.token_rates, tf.float64) if scheme in TOKEN_RATE_SCHEMES else None
        masked = _single_threaded(parsed.repeat().map(lambda batch: masking.mask_batch(
            batch, scheme, batch["key"], mask_id=corpus.special_ids["mask"], regular_ids_V=regular_ids_tf,
            token_counts_V=counts, token_rates_V=rates)))
        task = tasks.make_task(f"bench_{scheme}", corpus, scheme)
        examples = _single_threaded(task.get_dataset(None, args.split, seed=0, num_epochs=None).batch(128))
        mask_streams[scheme] = _batch_sizes(masked)
        results[scheme] = (_rate(mask_streams[scheme], args.seconds), _rate(_batch_sizes(examples), args.seconds))
        print(f"{scheme:<14}{results[scheme][0]:>10,.0f}{results[scheme][1]:>10,.0f}", flush=True)

    if "pmi" in results:
        rng = np.random.default_rng(0)
        mask_id = corpus.special_ids["mask"]
        python_stream = (len(python_pmi_mask(ex["input_ids"], ex["units_pmi"], rng, mask_id, regular_ids)) and 1
                         for ex in itertools.cycle(sequences))
        python = _rate(python_stream, args.seconds)
        print(f"{'pmi (Python)':<14}{python:>10,.0f}")
        print(f"\npmi in-graph / Python: {results['pmi'][0] / python:.1f}x (mask), "
              f"{results['pmi'][1] / python:.1f}x (task)")
        # On a shared machine the load drifts between the measurements above, taken a minute
        # apart; timing `mask` and Python alternately, in short slices, compares them under the
        # same conditions. Same iterators, same work on both sides.
        ratios = []
        for _ in range(args.rounds):
            mask_rate = _rate(mask_streams["pmi"], args.seconds / 2)
            ratios.append(mask_rate / _rate(python_stream, args.seconds / 2))
        print(f"pmi mask / Python, timed alternately ({args.rounds} rounds of {args.seconds / 2:g} s each): "
              f"median {np.median(ratios):.1f}x (range {min(ratios):.1f}-{max(ratios):.1f}x)")

if __name__ == "__main__":
    main()
