"""Throughput and peak memory of `pmi-jax vocab build`, next to two baselines on the same text.

    .venv/bin/pmi-jax demo-corpus --output /tmp/demo_text
    .venv/bin/python benchmarks/vocab_build.py /tmp/demo_text --repeat 8

Contenders, each in a child process of its own so that its peak RSS (ru_maxrss) is its own:
  ours            pmi_jax.preprocess.vocab.build_vocab.build_vocabulary, every core, end to end: reading,
                  tokenisation, counts n = 1..5, PMI scores, ranking, coverage, writing
  ours-1-worker   the same on one worker thread
  ours-4mb        every core, --memory-mb 4: counts spill to disk partitions
  counter         plain Python: the same tokenisation, collections.Counter of n = 1..5,
                  PMI by enumerating segmentations, the same ranking and quotas
  gensim          gensim Phrases, bigrams only, default scorer, min_count as ours; given the
                  word lists ready-made (tokenisation not timed)
Timed sections exclude the interpreter, TensorFlow import and tf.function tracing (the
"start-up" column). words/s/core = words / wall seconds / threads used; words per CPU-second
counts all threads, and does not depend on other load on the machine.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CONTENDERS = ("ours", "ours-1-worker", "ours-4mb", "counter", "gensim")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _files(corpus_dir: str) -> list[str]:
    from pmi_jax.preprocess.text.documents import expand_inputs

    return expand_inputs([corpus_dir])


def run_ours(corpus_dir: str, args, workers: int, memory_mb: int) -> dict:
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary
    from pmi_jax.preprocess.vocab.malloc_thresholds import large_array_malloc

    out = tempfile.mkdtemp(prefix="bench-vocab-")
    warm = os.path.join(out, "warm.txt")
    with open(warm, "w", encoding="utf-8") as f:
        f.write("a b c a b c é")  # a non-ASCII word too: its tokenizer call is traced here, not timed
    with large_array_malloc():  # as `pmi-jax vocab build` runs it
        build_vocabulary([warm], os.path.join(out, "warm"), VocabOptions(min_count=1, size=2, workers=workers))
        start_rss = _peak_rss_mb()
        wall, cpu = time.perf_counter(), _cpu_seconds()
        options = VocabOptions(min_count=args.min_count, size=args.size, workers=workers, memory_mb=memory_mb)
        stats = build_vocabulary(_files(corpus_dir), os.path.join(out, "vocab"), options)
        wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    shutil.rmtree(out)
    return dict(words=stats["words"], wall=wall, cpu=cpu, threads=workers, rss_before=start_rss,
                selected=stats["vocabulary_size"], spilled=stats["spilled_to_disk"])


def _words_per_document(corpus_dir: str) -> list[list[str]]:
    from pmi_jax.preprocess.text.documents import iter_document_batches
    from pmi_jax.preprocess.text.words import split_words_flat

    documents = []
    for batch in iter_document_batches(_files(corpus_dir), 1_000_000):
        flat, splits = split_words_flat(batch)
        words = [w.decode("utf-8") for w in flat]
        documents.extend(words[splits[i]:splits[i + 1]] for i in range(len(splits) - 1))
    return documents


def run_counter(corpus_dir: str, args) -> dict:
    """The same vocabulary in plain Python, the way one would write it without the vectorised engine."""
    from pmi_jax.preprocess.text.words import split_words_flat

    split_words_flat(["warm up TensorFlow"])
    start_rss = _peak_rss_mb()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    documents = _words_per_document(corpus_dir)
    counts: collections.Counter = collections.Counter()
    for words in documents:
        for n in range(1, 6):
            counts.update(zip(*(words[i:] for i in range(n))))
    positions = [0] + [sum(max(0, len(d) - k + 1) for d in documents) for k in range(1, 6)]
    candidates = {g: c for g, c in counts.items() if len(g) >= 2 and c >= args.min_count}

    def log_p(span):
        return math.log(counts[span] / positions[len(span)])

    def pmi(g):
        n = len(g)
        best = -math.inf
        for cuts in itertools.product((False, True), repeat=n - 1):
            if any(cuts):
                bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
                best = max(best, sum(log_p(g[i:j]) for i, j in zip(bounds[:-1], bounds[1:])))
        return log_p(g) - best

    ranked = sorted(((round(pmi(g), 9), c, " ".join(g)) for g, c in candidates.items()),
                    key=lambda r: (-r[0], -r[1], r[2]))
    quota = {2: args.size // 2, 3: args.size // 4, 4: args.size // 8, 5: args.size // 8}
    selected = [r for n in range(2, 6) for r in [r for r in ranked if r[2].count(" ") == n - 1][:quota[n]]]
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    return dict(words=positions[1], wall=wall, cpu=cpu, threads=1, rss_before=start_rss, selected=len(selected))


def run_gensim(corpus_dir: str, args) -> dict:
    from gensim.models.phrases import Phrases

    documents = _words_per_document(corpus_dir)
    start_rss = _peak_rss_mb()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    phrases = Phrases(documents, min_count=args.min_count)  # default threshold 10, scoring "default"
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    return dict(words=sum(map(len, documents)), wall=wall, cpu=cpu, threads=1, rss_before=start_rss,
                selected=len(phrases.export_phrases()))


def child(args) -> None:
    started = time.perf_counter()
    cores = len(os.sched_getaffinity(0))
    runners = {"ours": lambda: run_ours(args.corpus_dir, args, cores, 2048),
               "ours-1-worker": lambda: run_ours(args.corpus_dir, args, 1, 2048),
               "ours-4mb": lambda: run_ours(args.corpus_dir, args, cores, 4),
               "counter": lambda: run_counter(args.corpus_dir, args),
               "gensim": lambda: run_gensim(args.corpus_dir, args)}
    result = runners[args.contender]()
    result.update(peak_rss=_peak_rss_mb(), process=time.perf_counter() - started)
    print("RESULT " + json.dumps(result))


def replicate(corpus: str, repeat: int, directory: str) -> str:
    """K copies of every file of `corpus` (a file or a local directory) in `directory`."""
    files = [corpus] if os.path.isfile(corpus) else sorted(
        os.path.join(root, name) for root, _, names in os.walk(corpus) for name in names if not name.startswith("."))
    if not files:
        sys.exit(f"{corpus}: no files")
    for k, path in itertools.product(range(repeat), files):
        shutil.copyfile(path, os.path.join(directory, f"copy{k:03d}_{os.path.basename(path)}"))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="?", help="text file or directory (e.g. the demo corpus)")
    parser.add_argument("--repeat", type=int, default=1, help="concatenate the corpus K times (default 1)")
    parser.add_argument("--min-count", type=int, default=11)
    parser.add_argument("--size", type=int, default=800_000)
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--corpus-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        return child(args)
    if not args.corpus:
        parser.error("CORPUS is required")
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as directory:
        replicate(args.corpus, args.repeat, directory)
        print(f"machine: {platform.processor() or platform.machine()}, {_cpu_model()}, "
              f"{len(os.sched_getaffinity(0))} cores, load average at start {os.getloadavg()[0]:.1f}")
        print(f"{'contender':<14} {'words':>10} {'threads':>7} {'wall s':>8} {'words/s/core':>13} "
              f"{'words/CPU-s':>12} {'RSS MB before':>13} {'peak RSS MB':>11} {'start-up s':>10}  notes")
        for name in args.only:
            command = [sys.executable, os.path.abspath(__file__), "--contender", name, "--corpus-dir", directory,
                       "--min-count", str(args.min_count), "--size", str(args.size)]
            done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                print(f"{name}: failed\n{done.stderr[-3000:]}")
                continue
            r = json.loads(lines[-1][len("RESULT "):])
            notes = f"{r['selected']} selected" + (", spilled to disk" if r.get("spilled") else "")
            if name == "gensim":
                notes += ", bigrams only, tokenisation not timed"
            print(f"{name:<14} {r['words']:>10,} {r['threads']:>7} {r['wall']:>8.2f} "
                  f"{r['words'] / r['wall'] / r['threads']:>13,.0f} {r['words'] / r['cpu']:>12,.0f} "
                  f"{r['rss_before']:>13,.0f} {r['peak_rss']:>11,.0f} {r['process'] - r['wall']:>10.1f}  {notes}",
                  flush=True)
        print(f"load average at end {os.getloadavg()[0]:.1f}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    main()
