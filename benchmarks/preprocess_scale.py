"""The whole preprocessing at growing corpus sizes (issue 23, item 4): `pmi-jax vocab build` and
`pmi-jax corpus prepare` run as a user runs them, to find the stages that grow faster than the corpus.

    nice -n 10 .venv/bin/python benchmarks/preprocess_scale.py --words 1e7 1e8 --output scale.jsonl

Corpus: the documents of --source (default /work/exp/text, `demo-corpus --installed`: 5.45M
whitespace words, 8.9M BERT words) repeated to N whitespace words and perturbed as in
benchmarks/wordpiece_train.py: after the first repetition one occurrence in 8 of each alphabetic word
of 4+ letters gets one of 16 suffixes, a third of the time with a number, so distinct words keep
growing. The choice is a splitmix64 hash of (repetition, position in the source), vectorised, so the
same N gives the same bytes. One document a line; files of 25M words, so readers can share them
out. Generated once per N under --work-dir (its time is not part of the figures).

Each command is a child process (`pmi-jax`, this checkout first on PYTHONPATH). os.wait4 gives CPU
seconds and ru_maxrss of the child and the descendants it reaped; ru_maxrss is the largest single
process, so a sampler (every 0.5 s, /proc) also records the peak summed RSS and anonymous RSS of
the live tree (RSS counts the mapped id stream, which the kernel can drop), the disk used under the
command's directory (output and its hidden scratch: the peak is the temporary disk), and stage
marks: files appearing (+) or leaving (-) there and log lines, each with the tree's CPU seconds and
the CPU seconds of the command's main thread, a serial part that bounds the wall time on any
number of cores.
"""
from __future__ import annotations

import argparse
import glob
import importlib.metadata
import itertools
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

_USER_ENV = dict(os.environ)  # what the commands get (wordpiece_train sets TF_CPP_MIN_LOG_LEVEL)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
from wordpiece_train import PERTURB_ONE_IN, _SUFFIXES  # noqa: E402  (the same perturbation)

WORDS_PER_FILE = 25_000_000
_BATCH_WORDS = 1 << 20  # words joined into one write
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------
# Corpus

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): a seeded hash without Python per word."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _source_words(source: str):
    """Whitespace words of every document of `source`, which of them end a document, and the
    positions of those a repetition may perturb (alphabetic, 4+ letters)."""
    from pmi_jax.preprocess.text.documents import expand_inputs, iter_documents

    words, ends = [], []
    for doc in iter_documents(expand_inputs([source])):
        split = doc.split()
        words += split
        ends.append(len(words) - 1)
    is_end = np.zeros(len(words), bool)
    is_end[ends] = True
    eligible = np.flatnonzero(np.fromiter((len(w) >= 4 and w.isalpha() for w in words), bool, len(words)))
    return words, is_end, eligible


def generate_corpus(source: str, words: int, out_dir: str) -> dict:
    """out_dir/corpus.json, after writing it and the corpus if absent; in a child process, because a
    command's ru_maxrss includes this process's RSS at fork (Linux keeps the pre-exec high-water mark)."""
    done = os.path.join(out_dir, "corpus.json")
    if not os.path.exists(done):
        child = multiprocessing.get_context("spawn").Process(target=_write_corpus, args=(source, words, out_dir))
        child.start()
        child.join()
        if child.exitcode:
            sys.exit(f"generating {out_dir} failed")
    return _read_json(done)


def _write_corpus(source: str, words: int, out_dir: str) -> None:
    """Write about `words` words (whole documents) of repeated, perturbed `source` text to out_dir/*.txt."""
    done = os.path.join(out_dir, "corpus.json")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    started = time.perf_counter()
    base, is_end, eligible = _source_words(source)
    with_sep = [w + ("\n\n" if e else " ") for w, e in zip(base, is_end.tolist())]
    tails = [[[s + n + sep for sep in (" ", "\n\n")] for n in [""] + [str(i) for i in range(100)]] for s in _SUFFIXES]
    doc_ends, ends = np.flatnonzero(is_end), is_end.tolist()
    written, rep, files, f = 0, 0, [], None
    while written < words:
        out = with_sep[:]
        if rep:
            h = _mix((np.uint64(rep) << np.uint64(40)) | eligible.astype(np.uint64))
            pick = np.flatnonzero(h % np.uint64(PERTURB_ONE_IN) == 0)
            h = h[pick]
            suffix = ((h >> np.uint64(8)) % np.uint64(len(_SUFFIXES))).tolist()
            number = np.where((h >> np.uint64(16)) % np.uint64(3) == 0, (h >> np.uint64(20)) % np.uint64(100) + 1, 0)
            for i, s, n in zip(eligible[pick].tolist(), suffix, number.tolist()):
                out[i] = base[i] + tails[s][n][ends[i]]
        start = 0
        while start < len(out) and written < words:
            if f is None:
                files.append(os.path.join(out_dir, f"part-{len(files):05d}.txt"))
                f, in_file = open(files[-1] + ".tmp", "w", encoding="utf-8"), 0
            # up to the end of the document that reaches the file's size, or the corpus's
            need = min(WORDS_PER_FILE - in_file, words - written, _BATCH_WORDS)
            j = np.searchsorted(doc_ends, start + need - 1)
            stop = int(doc_ends[j]) + 1 if j < len(doc_ends) else len(out)
            f.write("".join(out[start:stop]))
            written, in_file, start = written + stop - start, in_file + stop - start, stop
            if in_file >= WORDS_PER_FILE or written >= words:
                f.close()
                os.replace(files[-1] + ".tmp", files[-1])
                f = None
        rep += 1
    info = {"words": written, "repetitions": rep, "files": len(files), "source": os.path.abspath(source),
            "source_words": len(base), "bytes": sum(os.path.getsize(p) for p in files),
            "generate_seconds": round(time.perf_counter() - started, 1)}
    with open(done + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(done + ".tmp", done)


# ---------------------------------------------------------------------------------------------
# Measuring one command

def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = _stat(stat)
            children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, IndexError):
            continue
    pids, todo = [], [root]
    while todo:
        pids.append(todo.pop())
        todo += children.get(pids[-1], [])
    return pids


def _stat(path: str) -> list[str]:
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def _tree_usage(root: int) -> tuple[float, float, int, int]:
    """CPU seconds of the live tree under `root` (reaped children included) and of its main thread;
    summed RSS and anonymous RSS in bytes."""
    cpu, rss, anon = 0.0, 0, 0
    try:
        main = sum(int(v) for v in _stat(f"/proc/{root}/task/{root}/stat")[11:13]) / _TICK
    except (OSError, IndexError):
        main = 0.0
    for pid in _tree(root):
        try:
            fields = _stat(f"/proc/{pid}/stat")
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
            cpu += sum(int(v) for v in fields[11:15]) / _TICK  # utime stime cutime cstime
            rss += int(fields[21]) * _PAGE
            anon += int(re.search(r"RssAnon:\s+(\d+)", status).group(1)) << 10
        except (OSError, IndexError, AttributeError):
            continue
    return cpu, main, rss, anon


def _disk(top: str) -> tuple[int, set[str]]:
    """Bytes allocated under `top`, and its entries two levels deep, random temporary suffixes
    and shard numbers normalised so that each kind of file is one stage mark."""
    used, names = 0, set()
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        for name in filenames + dirnames:
            if name in filenames:
                try:
                    used += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    pass
            if rel.count(os.sep) < 1:
                path = name if rel == "." else os.path.join(rel, name)
                names.add(re.sub(r"\d{5}", "#", re.sub(r"(tmp|spill\d)-[^/]+", r"\1", path)))
    return used, names


def run_command(argv: list[str], top: str) -> dict:
    env = dict(_USER_ENV, PYTHONPATH=ROOT + os.pathsep + _USER_ENV.get("PYTHONPATH", ""))
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    marks, series, lines, peak = [], [], [], {"disk": 0, "tree_rss": 0, "tree_anon": 0}
    finished, last = threading.Event(), {"main": 0.0}

    def mark(label: str) -> None:
        cpu, main, _, anon = _tree_usage(proc.pid)
        last["main"] = max(last["main"], main)
        marks.append([round(time.perf_counter() - started, 1), round(cpu, 1), round(main, 1), anon >> 20, label])

    def read_output() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            mark("log: " + line.strip()[:120])

    def sample() -> None:
        seen: set[str] = set()
        for tick in itertools.count():
            if finished.wait(0.5):
                break
            disk, names = _disk(top)
            cpu, main, rss, anon = _tree_usage(proc.pid)
            last["main"] = max(last["main"], main)
            peak["disk"], peak["tree_rss"] = max(peak["disk"], disk), max(peak["tree_rss"], rss)
            peak["tree_anon"] = max(peak["tree_anon"], anon)
            if tick % 10 == 0:  # every 5 s: wall s, CPU s, main thread's CPU s, anonymous RSS MB, disk MB
                series.append([round(time.perf_counter() - started, 1), round(cpu, 1), round(main, 1), anon >> 20,
                               disk >> 20])
            for name in sorted(names - seen):
                mark("+" + name)
            for name in sorted(seen - names):
                mark("-" + name)
            seen = names

    threads = [threading.Thread(target=read_output, daemon=True), threading.Thread(target=sample, daemon=True)]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    finished.set()
    for t in threads:
        t.join()
    return {"argv": argv, "returncode": proc.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "user_s": round(usage.ru_utime, 2),
            "main_thread_cpu_s": round(last["main"], 1),  # its last sample, up to 0.5 s before the exit
            "max_rss_mb": round(usage.ru_maxrss / 1024), "peak_tree_rss_mb": round(peak["tree_rss"] / 2**20),
            "peak_tree_anon_mb": round(peak["tree_anon"] / 2**20),
            "peak_disk_gb": round(peak["disk"] / 1e9, 3), "disk_gb": round(_disk(top)[0] / 1e9, 3),
            "marks": marks, "series": series, "output_tail": lines[-5:]}


# ---------------------------------------------------------------------------------------------

def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _results(command: str, out: str) -> dict:
    """What the command recorded about its own output."""
    if command == "vocab":
        s = _read_json(os.path.join(out, "stats.json"))
        keys = ("words", "documents", "distinct_words", "frequent_words", "counted_ngrams", "selected",
                "vocabulary_size", "coverage", "spilled_to_disk")
        return {k: s[k] for k in keys}
    m = _read_json(os.path.join(out, "metadata.json"))
    return {"wordpiece_size": m["wordpiece"]["size"], "units_coverage": m["units"]["pmi"]["coverage"],
            "tokens_per_word": m.get("tokens_per_word"), "documents": m["corpus"]["documents"],
            **{f"{split}_{k}": m["splits"][split][k]
               for split in m["splits"] for k in ("shards", "sequences", "tokens")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=float, nargs="+", default=[], help="corpus sizes, e.g. 1e7 1e8")
    parser.add_argument("--source", default="/work/exp/text", help="real text to repeat and perturb")
    parser.add_argument("--work-dir", default="/work/scale_bench", help="generated corpora and outputs")
    parser.add_argument("--output", required=True, help="JSON lines: one record per (N, command), appended")
    parser.add_argument("--table", action="store_true", help="print --output's table and stop")
    parser.add_argument("--memory-mb", type=int, default=32, help="vocab build's --memory-mb (spills from 100M)")
    parser.add_argument("--workers", type=int, default=2, help="corpus prepare's --workers")
    parser.add_argument("--commands", nargs="+", default=["vocab", "prepare"], choices=["vocab", "prepare"])
    parser.add_argument("--keep-outputs", action="store_true", help="keep the vocabulary and TFRecords")
    parser.add_argument("--runner", choices=["DirectRunner"], help="run both commands as Beam pipelines")
    parser.add_argument("--direct-workers", type=int, default=2, help="--direct_num_workers with --runner")
    parser.add_argument("--sample-words", type=float, default=0, help="vocab build's --sample-words (default 0: none)")
    args = parser.parse_args()
    if args.table:
        with open(args.output) as f:
            return print_table([json.loads(line) for line in f])

    exe = os.path.join(os.path.dirname(sys.executable), "pmi-jax")
    with open("/proc/cpuinfo") as f:
        cpu_model = re.search(r"model name\s*:\s*(.*)", f.read()).group(1)
    machine = {"cpu": cpu_model, "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
               "jax": importlib.metadata.version("jax"), "nice": os.nice(0)}
    print(f"machine: {machine}", flush=True)
    rows = []
    for n in (int(w) for w in args.words):
        corpus_dir = os.path.join(args.work_dir, f"corpus_{n}")
        corpus = generate_corpus(args.source, n, corpus_dir)
        print(f"corpus {n:,}: {corpus}", flush=True)
        run_dir = os.path.join(args.work_dir, f"run_{n}" + (f"_{args.runner}" if args.runner else ""))
        shutil.rmtree(run_dir, ignore_errors=True)
        inputs = os.path.join(corpus_dir, "*.txt")
        vocab = os.path.join(run_dir, "vocab", "vocab_pmi")
        prepared = os.path.join(run_dir, "prepare", "prepared")
        commands = {
            "vocab": [exe, "vocab", "build", "--input", inputs, "--output", vocab, "--memory-mb", str(args.memory_mb),
                      "--no-progress"],
            "prepare": [exe, "corpus", "prepare", "--input", inputs, "--output", prepared, "--units", f"pmi={vocab}",
                        "--seq-len", "128", "--workers", str(args.workers), "--no-progress"],
        }
        if args.sample_words:
            commands["vocab"] += ["--sample-words", str(int(args.sample_words))]
        if args.runner:  # both as Beam pipelines, worker processes as the multi-core local path's
            beam = ["--runner", args.runner, "--direct_num_workers", str(args.direct_workers),
                    "--beam-option=--direct_running_mode=multi_processing"]
            commands["vocab"] = [exe, "vocab", "build", "--input", inputs, "--output", vocab, "--no-progress", *beam,
                                 *commands["vocab"][commands["vocab"].index("--no-progress") + 1:]]
            commands["prepare"] += beam
        for command in args.commands:
            out = vocab if command == "vocab" else prepared
            os.makedirs(os.path.dirname(out), exist_ok=True)
            load_before = os.getloadavg()
            record = {"words": corpus["words"], "command": command, "corpus": corpus, "machine": machine,
                      "runner": args.runner or "local",
                      **run_command(commands[command], os.path.dirname(out)),
                      "load_before": load_before, "load_after": os.getloadavg()}
            if record["returncode"] == 0:
                record["results"] = _results(command, out)
            with open(args.output, "a") as f:
                f.write(json.dumps(record) + "\n")
            rows.append(record)
            print(f"{command} {n:,}: wall {record['wall_s']} s, CPU {record['cpu_s']} s, "
                  f"rc {record['returncode']}", flush=True)
        if not args.keep_outputs:
            shutil.rmtree(run_dir, ignore_errors=True)

    print_table(rows)


def print_table(rows: list[dict]) -> None:
    """Markdown: per record, CPU seconds (in brackets: at the first stage mark, i.e. start-up), per
    whitespace word, of the main thread; peak RSS of one process / the tree / the tree's anonymous memory."""
    print("\n| words | BERT words | distinct words | command | wall s | CPU s (first mark) | CPU-µs/word "
          "| main thread CPU s | peak RSS MB (one / tree / anon.) | disk GB (peak) | load before / after |")
    print("| --- " * 11 + "|")
    for r in rows:
        vocab = next((x["results"] for x in rows if x["words"] == r["words"] and x["command"] == "vocab"
                      and "results" in x), None)
        bert, distinct = (f"{vocab['words']:,}", f"{vocab['distinct_words']:,}") if vocab else ("", "")
        first = f" ({r['marks'][0][1]})" if r["marks"] else ""
        cells = [f"{r['words']:,}", bert, distinct, r["command"], f"{r['wall_s']:,.1f}", f"{r['cpu_s']:,.1f}{first}",
                 f"{1e6 * r['cpu_s'] / r['words']:.2f}", f"{r['main_thread_cpu_s']:,.1f}",
                 f"{r['max_rss_mb']:,} / {r['peak_tree_rss_mb']:,} / {r['peak_tree_anon_mb']:,}",
                 f"{r['disk_gb']:.2f} ({r['peak_disk_gb']:.2f})",
                 f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
