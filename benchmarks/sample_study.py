"""How the masking vocabulary stabilises with the size of a document sample (issue 35, item 2).

    nice -n 10 .venv/bin/python benchmarks/sample_study.py CORPUS... --words 3e5 6e5 1.25e6 2.5e6 --output study.json

Builds the vocabulary of the whole CORPUS and, for each N and seed, of `vocab build --sample-words
N --sample-seed S` (same options otherwise: --size 800000, the paper's; --min-count 11), then
compares each with the whole corpus's and the two seeds' with each other. The top-K list is the
first share_n * K entries of each length n of the 800K build (the quotas `--size K` gives, but
for a length whose candidates run out). For each K: overlap = shared entries / entries of the
reference's list; on the shared entries the Spearman correlation of the PMI scores and the
median absolute score difference. Each sample is also compared with the next smaller one of
its seed (against_smaller: does the list still move between consecutive sizes?), and each
build records its candidates per length (n-grams that clear --min-count) beside its quota.
Two samples of one corpus share documents (about N/W of them); so do a sample and the corpus:
these figures say how far a sample is from the corpus it came from, not from an independent
corpus. `--disjoint D` answers that for text files: documents i with i % D == 0 and == 1 form
two samples of W/D words that share no document, compared with each other. A sample of
fraction f sees each count times f, so its --min-count 11 is the whole corpus's 11 / f:
`--scaled-reference` compares the last seed's sample with the whole corpus's list at that count.
"""
from __future__ import annotations

import argparse
import itertools
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


def build(inputs: list[str], out: str, words: int, seed: int, min_count: int = 11) -> tuple[dict, list, float]:
    options = build_vocab.VocabOptions(size=800_000, min_count=min_count, workers=1, sample_words=words,
                                       sample_seed=seed)
    started = time.process_time()
    stats = build_vocab.build_vocabulary(inputs, out, options, overwrite=True)
    cpu = time.process_time() - started
    rows = masking_vocab.read_table(out)  # (ngram, n, count, score), by n then rank
    return stats, rows, cpu


def top_k(rows, k: int) -> dict[tuple[int, str], float]:
    shares = vocab_selection.default_shares(5)
    kept, seen = {}, {}
    for gram, n, _, score in rows:
        seen[n] = seen.get(n, 0) + 1
        if seen[n] <= int(shares[n - 2] * k):
            kept[(n, gram)] = score
    return kept


def near_threshold(rows, min_count: int = 11) -> dict[str, dict[str, float]]:
    """Per length, the median count of the list's entries and the share seen under 2 * min_count
    times: how much of the list sits where a sample's counts (times f) fall below the cut."""
    counts = {}
    for _, n, count, _ in rows:
        counts.setdefault(n, []).append(count)
    return {str(n): {"median": float(np.median(c)),
                     "under_twice_min_count": float(np.mean(np.array(c) < 2 * min_count))}
            for n, c in sorted(counts.items())}


def compare(a: dict[tuple[int, str], float], b: dict[tuple[int, str], float]) -> dict:
    """Overlap (all lengths, and per length n) relative to b's list; score agreement on the shared."""
    from scipy import stats

    shared = sorted(set(a) & set(b))
    x, y = np.array([a[g] for g in shared]), np.array([b[g] for g in shared])
    lengths = sorted({n for n, _ in b})
    by_length = {str(n): sum(m == n for m, _ in shared) / sum(m == n for m, _ in b) for n in lengths}
    return {"reference_entries": len(b), "entries": len(a), "overlap": len(shared) / max(len(b), 1),
            "overlap_by_length": by_length,
            "spearman": float(stats.spearmanr(x, y).statistic) if len(shared) > 2 else None,
            "median_abs_score_diff": float(np.median(np.abs(x - y))) if shared else None}


def disjoint_parts(inputs: list[str], work: str, parts: int) -> tuple[str, str]:
    """Documents i % parts == 0 and == 1 of the text files, in two files (blank-line-separated)."""
    paths = [os.path.join(work, f"part{parts}_{j}.txt") for j in (0, 1)]
    with open(paths[0], "w", encoding="utf-8") as a, open(paths[1], "w", encoding="utf-8") as b:
        index, document = 0, []
        for path in inputs:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in [*f, "\n"]:
                    if line.strip():
                        document.append(line)
                    elif document:
                        if index % parts < 2:
                            (a, b)[index % parts].write("".join(document) + "\n")
                        index, document = index + 1, []
    return paths[0], paths[1]


def save(record: dict, path: str) -> None:
    """After every comparison, atomically: a long study that is stopped keeps what it measured."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--words", type=float, nargs="+", required=True, help="sample sizes (whitespace words)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--k", type=int, nargs="+", default=[800_000, 100_000, 10_000, 1_000])
    parser.add_argument("--scaled-reference", action="store_true",
                        help="also compare each sample with the whole corpus's list at --min-count 11 / fraction")
    parser.add_argument("--disjoint", type=int, nargs="*", default=[], help="D: compare two disjoint W/D samples")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sample_study-")
    try:
        whole_stats, whole_rows, whole_cpu = build(args.corpus, os.path.join(work, "whole"), 0, 0)
        print(f"whole corpus: {whole_stats['words']:,} words, {whole_stats['vocabulary_size']:,} entries, "
              f"{whole_cpu:.1f} CPU-s", flush=True)
        record = {"corpus": args.corpus, "whole": {k: whole_stats[k] for k in ("words", "documents", "vocabulary_size",
                                                                               "selected", "candidates")},
                  "whole_cpu_s": whole_cpu, "whole_counts": near_threshold(whole_rows), "samples": []}
        smaller = {}
        for n in (int(w) for w in args.words):
            built = {}
            for seed in args.seeds:
                stats, rows, cpu = build(args.corpus, os.path.join(work, f"s{n}_{seed}"), n, seed)
                built[seed] = rows
                row = {"sample_words": n, "seed": seed, "words": stats["words"], "documents": stats["documents"],
                       "vocabulary_size": stats["vocabulary_size"], "candidates": stats["candidates"],
                       "selected": stats["selected"], "cpu_s": cpu,
                       "against_whole": {k: compare(top_k(rows, k), top_k(whole_rows, k)) for k in args.k}}
                if seed in smaller:
                    row["against_smaller"] = {k: compare(top_k(smaller[seed], k), top_k(rows, k)) for k in args.k}
                record["samples"].append(row)
                print(json.dumps(row), flush=True)
                save(record, args.output)
            smaller = built
            if args.scaled_reference:
                scaled = round(11 * whole_stats["words"] / record["samples"][-1]["words"])
                _, scaled_rows, _ = build(args.corpus, os.path.join(work, f"whole_{scaled}"), 0, 0, scaled)
                record["samples"].append({"sample_words": n, "sample_seed": args.seeds[-1], "whole_min_count": scaled,
                                          "against_scaled_whole": {k: compare(top_k(built[args.seeds[-1]], k),
                                                                              top_k(scaled_rows, k)) for k in args.k}})
                print(json.dumps(record["samples"][-1]), flush=True)
            a, b = args.seeds[:2]
            record["samples"].append({"sample_words": n, "seeds": [a, b],
                                      "between_seeds": {k: compare(top_k(built[a], k), top_k(built[b], k))
                                                        for k in args.k}})
            print(json.dumps(record["samples"][-1]), flush=True)
            save(record, args.output)
        for parts in args.disjoint:
            halves = [build([path], os.path.join(work, f"d{parts}_{j}"), 0, 0)
                      for j, path in enumerate(disjoint_parts(args.corpus, work, parts))]
            record["samples"].append({"disjoint_parts": parts, "words": [h[0]["words"] for h in halves],
                                      "candidates": [h[0]["candidates"] for h in halves],
                                      "between_parts": {k: compare(top_k(halves[0][1], k), top_k(halves[1][1], k))
                                                        for k in args.k}})
            print(json.dumps(record["samples"][-1]), flush=True)
            save(record, args.output)
        save(record, args.output)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
