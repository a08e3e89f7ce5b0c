"""Time and peak memory of training a WordPiece vocabulary, as the corpus grows: tensorflow_text's
learner, our linear-time computation of it, and Hugging Face `tokenizers`' trainer, side by side.

    .venv/bin/pmi-jax demo-corpus --output /tmp/demo_text
    .venv/bin/python benchmarks/wordpiece_train.py /tmp/demo_text --words 1e6 2e6 4e6 8e6
    .venv/bin/python benchmarks/wordpiece_train.py /tmp/demo_text --distinct 2e5

Corpus: the demo corpus's documents, minus a held-out tenth, repeated and perturbed until it has
the requested number of words: in every repetition after the first, one occurrence in 8 of a word
of four letters or more gets one of 16 suffixes and often a number below 100, drawn by a hash of
the repetition, the position and the word, so the distinct words keep growing with the corpus, as
they do in real text (names, numbers, typos), up to about 1,600 variants of each word.
The held-out documents, unperturbed, measure coverage: WordPiece tokens per word under each
vocabulary, both tokenised by the same tensorflow_text WordpieceTokenizer on BERT's words.

Contenders, each in a child process of its own (peak RSS is its own, ru_maxrss):
  tf_text      what `corpus prepare` did before issue 23 without --wordpiece: preprocess.wordpiece.count_words
               (tensorflow_text's BasicTokenizer, one process) then tensorflow_text's learner
               (`library_train_vocab`: the binary search of the piece-count threshold)
  threaded_count  what `corpus prepare` did at 8d13a8e: pmi_jax.preprocess.text.word_stream.count_words (the
               vocabulary build's reader, every core, the same counts) then the same library learner
  linear_learner  what `corpus prepare` does now: the same threaded count, then wordpiece.train_vocab
               (pmi_jax.preprocess.corpus.wordpiece_learner: the library's result in linear time)
  tokenizers   `tokenizers`' WordPieceTrainer from raw documents: BertNormalizer (lower-case, strip
               accents), BertPreTokenizer, special tokens [PAD] [UNK] [CLS] [SEP] [MASK] first (ids
               0..4), min_frequency 10 (tensorflow_text's MIN_PIECE_COUNT), all cores (rayon)
All target 30,522 tokens. `tokenizers` is run twice on the smallest corpus to check determinism
(same corpus -> same vocab.txt bytes); its result is printed.

`--distinct 2e5 8e5` times the learners alone on synthesized word counts with that many distinct
words (`synthesized_counts`), so that the threshold search runs several passes, as at the paper's
size: one pass of the library's learner at threshold 10 and the whole search of the linear one.
`--distinct 1e5 --learner-workers 2` instead times one linear pass at threshold 10 counted here and
in 2 worker processes (`--whole-search`: the whole threshold search, over which the workers'
start-up is paid once): wall seconds and CPU seconds of this process and of its workers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SIZE = 30_522
CONTENDERS = ("tf_text", "tokenizers", "threaded_count", "linear_learner")
PERTURB_ONE_IN = 8  # after the first repetition, one occurrence in 8 of a word of 4+ letters gets a suffix
_SUFFIXES = ["s", "ed", "er", "ing", "ism", "ist", "ly", "ness", "ton", "ville", "berg", "ia", "an", "o", "x", "z"]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _split_demo(corpus_dir: str) -> tuple[list[str], list[str]]:
    from pmi_jax.preprocess.text.documents import expand_inputs, iter_documents

    docs = list(iter_documents(expand_inputs([corpus_dir])))
    return [d for i, d in enumerate(docs) if i % 10], [d for i, d in enumerate(docs) if not i % 10]


def _perturb(word: str, repetition: int, position: int) -> str:
    if repetition == 0 or len(word) < 4 or not word.isalpha():
        return word
    h = int.from_bytes(hashlib.blake2b(f"{repetition}:{position}:{word}".encode(), digest_size=8).digest(), "little")
    if h % PERTURB_ONE_IN:
        return word
    return word + _SUFFIXES[(h >> 8) % len(_SUFFIXES)] + ("" if (h >> 16) % 3 else str((h >> 20) % 100))


def write_corpus(train_docs: list[str], words: int, path: str) -> dict:
    """Repeat and perturb `train_docs` to about `words` whitespace words; one document per paragraph."""
    written, repetition, distinct = 0, 0, set()
    with open(path, "w", encoding="utf-8") as f:
        while written < words:
            for doc in train_docs:
                out = [_perturb(w, repetition, written + i) for i, w in enumerate(doc.split())]
                distinct.update(out)
                f.write(" ".join(out) + "\n\n")
                written += len(out)
                if written >= words:
                    break
            repetition += 1
    return {"words": written, "distinct_whitespace_words": len(distinct), "bytes": os.path.getsize(path)}


def library_train_vocab(counts, size: int = SIZE) -> list[str]:
    """`wordpiece.train_vocab` as it was at 8d13a8e: tensorflow_text's learner itself."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library

    from pmi_jax.formats.wordpiece_vocab import SPECIAL_TOKENS
    from pmi_jax.preprocess.corpus.wordpiece import MIN_PIECE_COUNT

    ordered, reserved = sorted(counts.items()), list(SPECIAL_TOKENS)
    tokens = library.learn(ordered, size, reserved, upper_thresh=MIN_PIECE_COUNT, lower_thresh=MIN_PIECE_COUNT)
    if len(tokens) > size:
        tokens = library.learn(ordered, size, reserved, lower_thresh=MIN_PIECE_COUNT)
    return list(tokens)[:size]


def _count_then_learn(count, learn, out_vocab: str) -> dict:
    """Time `count()` (word counts) then `learn(counts)` (tokens); write vocab.txt, untimed."""
    from pmi_jax.formats import wordpiece_vocab

    wall, cpu = time.perf_counter(), _cpu_seconds()
    counts = count()
    count_wall, count_cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    tokens = learn(counts)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    wordpiece_vocab.write_vocab(out_vocab, tokens)
    return dict(wall=wall, cpu=cpu, count_wall=count_wall, count_cpu=count_cpu, distinct_words=len(counts),
                tokens=len(tokens))


def run_tf_text(path: str, out_vocab: str) -> dict:
    from pmi_jax.preprocess.corpus import wordpiece
    from pmi_jax.preprocess.text import documents

    wordpiece.count_words([["warm up the tokenizer"]])
    return _count_then_learn(lambda: wordpiece.count_words(documents.iter_document_batches([path], 1_000_000)),
                             library_train_vocab, out_vocab)


def _threaded_count(path: str):
    import collections

    from pmi_jax.preprocess.text.word_stream import count_words

    workers = len(os.sched_getaffinity(0))
    count_words([path], workers, batch_chars=1_000)  # warm up: tracing, not timed (counts discarded)
    return lambda: collections.Counter(count_words([path], workers))


def run_threaded_count(path: str, out_vocab: str) -> dict:
    """`corpus prepare` at 8d13a8e: the vocabulary build's threaded word reader, then the library's learner."""
    return _count_then_learn(_threaded_count(path), library_train_vocab, out_vocab)


def run_linear_learner(path: str, out_vocab: str) -> dict:
    """`corpus prepare` now: the same count, then the linear-time learner (wordpiece.train_vocab)."""
    from pmi_jax.preprocess.corpus import wordpiece

    return _count_then_learn(_threaded_count(path), lambda counts: wordpiece.train_vocab(counts, SIZE), out_vocab)


def run_tokenizers(path: str, out_vocab: str) -> dict:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from pmi_jax.formats import wordpiece_vocab
    from pmi_jax.preprocess.text import documents

    wall, cpu = time.perf_counter(), _cpu_seconds()
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                      strip_accents=True, lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=SIZE, min_frequency=10, show_progress=False,
                                        special_tokens=list(wordpiece_vocab.SPECIAL_TOKENS))
    tokenizer.train_from_iterator(documents.iter_document_batches([path], 1_000_000), trainer)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    wordpiece_vocab.write_vocab(out_vocab, tokens)
    return dict(wall=wall, cpu=cpu, tokens=len(tokens))


def synthesized_counts(train_docs: list[str], distinct: int, seed: int = 0):
    """Word counts with `distinct` distinct words, shaped like a large corpus's: the demo corpus's
    BERT words with their counts times 100, plus variants of its words of 4+ letters (one of the
    16 suffixes, often a number below 100; the base word drawn by its count) with Zipf(1.8) counts,
    until there are `distinct` words."""
    import numpy as np

    from pmi_jax.preprocess.corpus import wordpiece

    base = wordpiece.count_words([train_docs])
    counts = {w: 100 * c for w, c in base.items()}
    stems = [w for w in sorted(base) if len(w) >= 4 and w.isalpha()]
    weights = np.array([base[w] for w in stems], np.float64)
    rng = np.random.default_rng(seed)
    while len(counts) < distinct:
        n = distinct - len(counts)
        picks = rng.choice(len(stems), size=n, p=weights / weights.sum())
        suffixes, numbers, with_number = (rng.integers(len(_SUFFIXES), size=n), rng.integers(100, size=n),
                                          rng.random(n) < 0.6)
        zipf = np.minimum(rng.zipf(1.8, size=n), 10_000)
        for i in range(n):
            word = stems[picks[i]] + _SUFFIXES[suffixes[i]] + (str(numbers[i]) if with_number[i] else "")
            counts[word] = counts.get(word, 0) + int(zipf[i])
    return counts


def learners_alone(train_docs: list[str], distinct: int) -> None:
    """One pass at threshold 10 of the library's learner and of the linear one, and the linear one's
    whole search (what train_vocab runs), on the same synthesized counts; CPU seconds of this process."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library

    from pmi_jax.formats.wordpiece_vocab import SPECIAL_TOKENS
    from pmi_jax.preprocess.corpus.wordpiece import MIN_PIECE_COUNT
    from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner

    counts = sorted(synthesized_counts(train_docs, distinct).items())
    cpu = _cpu_seconds()
    one = WordPieceLearner(counts, SIZE, SPECIAL_TOKENS)
    prepare_cpu = _cpu_seconds() - cpu
    cpu = _cpu_seconds()
    linear_pass = one.learn_with_thresh(MIN_PIECE_COUNT)
    linear_cpu = _cpu_seconds() - cpu
    cpu = _cpu_seconds()
    library_pass = library.learn_with_thresh(one.filtered, MIN_PIECE_COUNT, one.params)
    library_cpu = _cpu_seconds() - cpu
    cpu = _cpu_seconds()
    learner = WordPieceLearner(counts, SIZE, SPECIAL_TOKENS)  # train_vocab's two calls, from scratch
    tokens = learner.learn(upper_thresh=MIN_PIECE_COUNT, lower_thresh=MIN_PIECE_COUNT)
    if len(tokens) > SIZE:
        tokens = learner.learn(lower_thresh=MIN_PIECE_COUNT)
    search_cpu = _cpu_seconds() - cpu
    passes = len(learner._vocabs)
    print(f"| {len(counts):,} | {prepare_cpu:.1f} | {library_cpu:.1f} | {linear_cpu:.1f} | "
          f"{library_cpu / linear_cpu:.1f} | {linear_pass == library_pass} | {passes} | {search_cpu:.1f} | "
          f"{passes * library_cpu:.0f} | {len(tokens):,} | {_peak_rss_mb():,.0f} |", flush=True)


def learner_workers(train_docs: list[str], distinct: int, workers: int, whole_search: bool = False) -> None:
    """One linear pass at threshold 10, serial then counted in `workers` processes (fresh learners,
    so both count iteration 0): wall and CPU seconds, this process's (what stays serial: the
    greedy split, the merge, the sort) apart from its reaped workers' (what divides by N)."""
    from pmi_jax.formats.wordpiece_vocab import SPECIAL_TOKENS
    from pmi_jax.preprocess.corpus.wordpiece import MIN_PIECE_COUNT
    from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner

    counts = sorted(synthesized_counts(train_docs, distinct).items())
    results = {}
    for w in (1, workers):
        own, children, wall = _cpu_seconds(), _children_cpu_seconds(), time.perf_counter()
        with WordPieceLearner(counts, SIZE, SPECIAL_TOKENS, workers=w, min_parallel_words=0) as learner:
            vocab = learner.learn() if whole_search else learner.learn_with_thresh(MIN_PIECE_COUNT)
        wall, own, children = (time.perf_counter() - wall, _cpu_seconds() - own,
                               _children_cpu_seconds() - children)
        results[w] = vocab
        print(f"| {len(counts):,} | {w} | {wall:.1f} | {own + children:.1f} | {own:.1f} | {children:.1f} | "
              f"{vocab == results[1]} | {os.getloadavg()[0]:.1f} |", flush=True)


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def coverage(vocab_txt: str, held_out: list[str]) -> dict:
    """Tokens per word and [UNK] share on the held-out documents, under one tokenizer for all vocabularies."""
    import numpy as np

    from pmi_jax.preprocess.corpus.wordpiece import WordPieceEncoder

    encoder = WordPieceEncoder(vocab_txt)
    tokens = encoder.encode_documents(held_out)
    from pmi_jax.preprocess.text.words import split_words

    words = sum(len(w) for w in split_words(held_out))
    flat = np.concatenate([np.asarray(t, np.int64) for t in tokens])
    unk = open(vocab_txt, encoding="utf-8").read().split("\n").index("[UNK]")
    return {"tokens_per_word": len(flat) / words, "unk_share": float(np.mean(flat == unk))}


def child(args) -> None:
    run = {"tf_text": run_tf_text, "tokenizers": run_tokenizers, "threaded_count": run_threaded_count,
           "linear_learner": run_linear_learner}[args.child]
    result = run(args.corpus, args.vocab_out)
    result["peak_rss_mb"] = _peak_rss_mb()
    with open(args.vocab_out, "rb") as f:
        result["vocab_sha256"] = hashlib.sha256(f.read()).hexdigest()
        f.seek(0)
        result["first_tokens"] = f.read().decode("utf-8").split("\n")[:5]
    print("RESULT " + json.dumps(result))


def _run_child(contender: str, corpus: str, vocab_out: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", contender, "--corpus", corpus,
               "--vocab-out", vocab_out]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{contender} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_dir", nargs="?")
    parser.add_argument("--words", type=float, nargs="+", default=[1e6, 2e6, 4e6, 8e6])
    parser.add_argument("--work-dir", default="/tmp/wordpiece_bench")
    parser.add_argument("--child", choices=CONTENDERS)
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--corpus")
    parser.add_argument("--vocab-out")
    parser.add_argument("--distinct", type=float, nargs="+", help="time the learners alone on synthesized counts")
    parser.add_argument("--whole-search", action="store_true",
                        help="with --learner-workers: time the whole threshold search, not one pass")
    parser.add_argument("--learner-workers", type=int, default=0,
                        help="with --distinct: one linear pass serial and in this many worker processes")
    args = parser.parse_args()
    if args.child:
        return child(args)
    import tokenizers
    import tensorflow_text

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; python {platform.python_version()}, "
          f"tensorflow_text {tensorflow_text.__version__}, tokenizers {tokenizers.__version__}")
    os.makedirs(args.work_dir, exist_ok=True)
    train_docs, held_out = _split_demo(args.demo_dir)
    if args.distinct and args.learner_workers:
        print("| distinct words | workers | wall s | CPU s (all) | this process | workers | same tokens | load average |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for distinct in args.distinct:
            learner_workers(train_docs, int(distinct), args.learner_workers, args.whole_search)
        return
    if args.distinct:
        print("| distinct words | learner setup CPU s | library pass CPU s | linear pass CPU s | ratio | same tokens "
              "| passes of the search | linear search CPU s | library search CPU s (passes x pass) | tokens "
              "| peak RSS MB |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for distinct in args.distinct:
            learners_alone(train_docs, int(distinct))
        return
    print("| words | distinct words | contender | wall s | CPU s | of which counting CPU s | peak RSS MB | tokens "
          "| tokens/word held out | [UNK] share |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for i, words in enumerate(int(w) for w in args.words):
        corpus = os.path.join(args.work_dir, f"corpus_{words}.txt")
        info = write_corpus(train_docs, words, corpus)
        results = {}
        for contender in args.contenders:
            vocab_out = os.path.join(args.work_dir, f"{contender}_{words}.txt")
            r = results[contender] = _run_child(contender, corpus, vocab_out)
            r.update(coverage(vocab_out, held_out))
            counting = f"{r['count_cpu']:.1f}" if "count_cpu" in r else "(inside)"
            distinct = next((v["distinct_words"] for v in results.values() if "distinct_words" in v), 0)
            print(f"| {info['words']:,} | {distinct:,} | {contender} | "
                  f"{r['wall']:.1f} | {r['cpu']:.1f} | {counting} | {r['peak_rss_mb']:,.0f} | {r['tokens']:,} "
                  f"| {r['tokens_per_word']:.4f} | {r['unk_share']:.5f} |", flush=True)
        ours = [c for c in ("tf_text", "threaded_count", "linear_learner") if c in results]
        if len(ours) > 1:
            print(f"{', '.join(ours)} give the same vocab.txt: "
                  f"{len({results[c]['vocab_sha256'] for c in ours}) == 1}", flush=True)
        if "tokenizers" not in results:
            continue
        assert results["tokenizers"]["first_tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        if i == 0:
            again = _run_child("tokenizers", corpus, os.path.join(args.work_dir, f"tokenizers_{words}_again.txt"))
            print(f"determinism: tokenizers twice on {info['words']:,} words -> same vocab.txt bytes: "
                  f"{again['vocab_sha256'] == results['tokenizers']['vocab_sha256']}", flush=True)
        os.remove(corpus)


if __name__ == "__main__":
    main()
