"""How much text `corpus prepare`'s shards read, from resume points against from each file's start.

    .venv/bin/python benchmarks/shard_reads.py CORPUS... [--shards N] [--repeat R]

Scans CORPUS as `corpus prepare` does (`prepare.scan_corpus`, which keeps resume points), cuts
it into the shards `corpus prepare` would write (`assign_documents`, `shard_counts`,
`shard_tasks`; --shards 0: one train shard per 32 MiB of text), then reads every shard's
documents (`prepare.shard_documents`) twice: from the resume points, and with the scan's resume
points dropped, i.e. each file from its start (the code before them). Prints the CPU seconds of
each, against one plain read of the corpus (`documents.read_documents`), and the documents each
yielded (they must agree). Reading only: no tokenising or writing. The variants alternate
--repeat times and the fastest counts.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from preprocess.corpus import prepare
from preprocess.text import documents


def _cpu(fn) -> tuple[float, int]:
    started = time.process_time()
    n = fn()
    return time.process_time() - started, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", nargs="+", help="input files, globs or directories (as `corpus prepare --input`)")
    p.add_argument("--shards", type=int, default=0, help="train shards (0: as `corpus prepare`, one per 32 MiB)")
    p.add_argument("--repeat", type=int, default=2, help="runs per variant; the fastest counts")
    args = p.parse_args()
    files = documents.expand_inputs(args.corpus)
    started = time.process_time()
    scan = prepare.scan_corpus(files, progress=False)
    scan_s = time.process_time() - started
    config = prepare.PrepareConfig(inputs=tuple(files), output="unused", shards=args.shards)
    is_validation = prepare.assign_documents(scan.documents, config.validation_fraction, config.seed)
    tasks = prepare.shard_tasks(is_validation, prepare.shard_counts(config, scan, is_validation))
    from_start = dataclasses.replace(scan, resume_points=())

    def shards(s):
        return lambda: sum(1 for t in tasks for _ in prepare.shard_documents(s, t.doc_indices))

    variants = {"one read of the corpus": lambda: sum(1 for f in files for _ in documents.read_documents(f)),
                "shards, from resume points": shards(scan),
                "shards, each file from its start": shards(from_start)}
    best = {}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            seconds, n = _cpu(fn)
            best[name] = min(best.get(name, (seconds, n)), (seconds, n))
    points = sum(len(p) for p in scan.resume_points)
    print(f"corpus: {len(files)} files, {scan.documents:,} documents, {scan.chars / 1e9:.2f}G characters; "
          f"{len(tasks)} shards; scan {scan_s:.1f} CPU-s, {points:,} resume points")
    one = best["one read of the corpus"][0]
    for name, (seconds, n) in best.items():
        print(f"{name:<34} {seconds:8.1f} CPU-s  {seconds / one:5.2f}x one read  {n:,} documents")


if __name__ == "__main__":
    main()
