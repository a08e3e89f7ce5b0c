"""How the masking vocabulary stabilises with the size of a document sample (issue 35, item 2).

    nice -n 10 .venv/bin/python benchmarks/sample_study.py CORPUS... --words 3e5 6e5 1.25e6 2.5e6 --output study.json

Builds the vocabulary of the whole CORPUS and, for each N and seed, of `vocab build --sample-words
N --sample-seed S` (same options otherwise: --size 800000, the paper's; --min-count 11), then
compares each with the whole corpus's and the two seeds' with each other. The top-K list is the
first share_n * K entries of each length n of the 800K build (the quotas `--size K` gives, but
for a length whose candidates run out). For each K: overlap = shared entries / entries of the
reference's list; on the shared entries the Spearman correlation of the PMI scores and the
median absolute score difference. Two samples of one corpus share documents (about N/W of
them); so do a sample and the corpus: the figures say how far a sample is from the corpus it
came from, not from an independent corpus.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pmi_jax.formats import masking_vocab  # noqa: E402
from pmi_jax.preprocess.vocab import build_vocab, vocab_selection  # noqa: E402


def build(inputs: list[str], out: str, words: int, seed: int) -> tuple[dict, dict[str, tuple[int, float]], float]:
    options = build_vocab.VocabOptions(size=800_000, min_count=11, workers=1, sample_words=words, sample_seed=seed)
    started = time.process_time()
    stats = build_vocab.build_vocabulary(inputs, out, options, overwrite=True)
    cpu = time.process_time() - started
    rows = masking_vocab.read_table(out)  # (ngram, n, count, score), by n then rank
    return stats, rows, cpu


def top_k(rows, k: int) -> dict[str, float]:
    shares = vocab_selection.default_shares(5)
    kept, seen = {}, {}
    for gram, n, _, score in rows:
        seen[n] = seen.get(n, 0) + 1
        if seen[n] <= int(shares[n - 2] * k):
            kept[gram] = score
    return kept


def compare(a: dict[str, float], b: dict[str, float]) -> dict:
    from scipy import stats

    shared = sorted(set(a) & set(b))
    x, y = np.array([a[g] for g in shared]), np.array([b[g] for g in shared])
    return {"reference_entries": len(b), "entries": len(a), "overlap": len(shared) / max(len(b), 1),
            "spearman": float(stats.spearmanr(x, y).statistic) if len(shared) > 2 else None,
            "median_abs_score_diff": float(np.median(np.abs(x - y))) if shared else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--words", type=float, nargs="+", required=True, help="sample sizes (whitespace words)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--k", type=int, nargs="+", default=[800_000, 100_000, 10_000, 1_000])
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sample_study-")
    try:
        whole_stats, whole_rows, whole_cpu = build(args.corpus, os.path.join(work, "whole"), 0, 0)
        print(f"whole corpus: {whole_stats['words']:,} words, {whole_stats['vocabulary_size']:,} entries, "
              f"{whole_cpu:.1f} CPU-s", flush=True)
        record = {"corpus": args.corpus, "whole": {k: whole_stats[k] for k in ("words", "documents", "vocabulary_size",
                                                                               "selected", "candidates")},
                  "whole_cpu_s": whole_cpu, "samples": []}
        for n in (int(w) for w in args.words):
            built = {}
            for seed in args.seeds:
                stats, rows, cpu = build(args.corpus, os.path.join(work, f"s{n}_{seed}"), n, seed)
                built[seed] = rows
                row = {"sample_words": n, "seed": seed, "words": stats["words"], "documents": stats["documents"],
                       "vocabulary_size": stats["vocabulary_size"], "cpu_s": cpu,
                       "against_whole": {k: compare(top_k(rows, k), top_k(whole_rows, k)) for k in args.k}}
                record["samples"].append(row)
                print(json.dumps(row), flush=True)
            a, b = args.seeds[:2]
            record["samples"].append({"sample_words": n, "seeds": [a, b],
                                      "between_seeds": {k: compare(top_k(built[a], k), top_k(built[b], k))
                                                        for k in args.k}})
            print(json.dumps(record["samples"][-1]), flush=True)
        with open(args.output, "w") as f:
            json.dump(record, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
