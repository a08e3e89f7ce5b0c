"""`pmi-jax corpus prepare`: documents -> WordPiece ids, masking units, packed shards.

The contract: docs/design.md, "Prepared corpus". Which shard a document goes to is a seeded hash
of its text (`Assignment`), so whoever reads a document can route it: files are read in
parallel, each document sent to its shard's list, and each shard then tokenised, segmented,
packed and written as an independent job (under a temporary name, renamed when complete); a
rerun writes only the missing shards; metadata.json is written last. Nothing reads the whole
corpus before the shards' work starts, so Beam workers need only the file names and sizes.
Details: docs/design.md, "Module notes", prepare.py.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pickle
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import tensorflow as tf
import tqdm

from pmi_jax import storage
from pmi_jax.errors import DataLost, UserInputError
from pmi_jax.formats import prepared_corpus, wordpiece_vocab
from pmi_jax.preprocess.corpus import segmentation, wordpiece
from pmi_jax.preprocess.corpus.prepare_config import PrepareConfig
from pmi_jax.preprocess.corpus.output_state import (PROGRESS_DIR, check_output_apart, claim_output,  # noqa: F401
                                            close_run, is_done, progress_path, read_json, removed_unless_begun,
                                            write_json)
from pmi_jax.preprocess.text import documents, hf_tokenizer
from pmi_jax.preprocess.text.mix64 import GOLDEN, mix64
from pmi_jax.preprocess.corpus.sequence_packing import SequencePacker
from pmi_jax.preprocess.text.words import split_words_ragged

log = logging.getLogger(__name__)

MIN_SEQ_LEN = 8
_BATCH_CHARS = 1_000_000         # documents are tokenised in batches of about this many characters
_AUTO_SHARD_BYTES = 32 * 2**20   # --shards 0: one train shard per this many bytes of input files
_AUTO_MIN_SHARDS = 4
_SPILL_CHARS = 32 * 2**20        # local routing: a file's documents are spilled in chunks of this much text
_ROUTE_BATCH = 1024              # documents hashed and assigned at a time
CORPUS_JSON = "corpus.json"      # in .progress/: what reading the corpus found (metadata.json's "corpus")


@dataclasses.dataclass(frozen=True)
class CorpusFiles:
    """What the launcher knows of the corpus: file names and sizes, nothing read."""
    files: tuple[str, ...]
    sizes: tuple[int, ...]
    text_field: str = documents.DEFAULT_TEXT_FIELD

    @property
    def bytes(self) -> int:
        return sum(self.sizes)


@dataclasses.dataclass(frozen=True)
class ShardTask:
    split: str
    index: int
    num_shards: int
    id: int  # position in Assignment.tasks(): train shards first, then validation

    @property
    def name(self) -> str:
        return prepared_corpus.shard_name(self.split, self.index, self.num_shards)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Which shard each document goes to: a function of its text, --seed, --validation-fraction
    and the shard counts alone, so any worker that reads a document can route it.

    A document's key is a 64-bit hash of its text (`documents.document_key`); from the key and the seed,
    one splitmix64 draw puts it in `validation` with probability `validation_fraction`, a second
    picks one of that split's shards uniformly. Equal documents share a key, so a duplicated
    document never sits in both splits. Inside a shard, documents keep corpus order.
    """
    seed: int
    validation_fraction: float
    train_shards: int
    validation_shards: int

    def tasks(self) -> list[ShardTask]:
        t, v = self.train_shards, self.validation_shards
        return ([ShardTask("train", i, t, i) for i in range(t)]
                + [ShardTask("validation", i, v, t + i) for i in range(v)])

    def task_of(self, keys: np.ndarray) -> np.ndarray:
        """int64 [D]: the `tasks()` index of each document key (uint64 [D])."""
        mix, golden = mix64, GOLDEN
        with np.errstate(over="ignore"):
            h = mix((np.asarray(keys, np.uint64) ^ mix(np.uint64(self.seed % 2**64) + golden)) + golden)
            split_draw = mix((h ^ np.uint64(0x5A11D)) + golden)
            shard_draw = mix((h ^ np.uint64(0x54A2D)) + golden)
            is_validation = ((split_draw >> np.uint64(11)).astype(np.float64) * 2.0**-53 < self.validation_fraction
                             if self.validation_shards else np.zeros(len(h), bool))
            n = np.where(is_validation, self.validation_shards, self.train_shards).astype(np.uint64)
            shard = ((shard_draw >> np.uint64(32)) * n) >> np.uint64(32)  # uniform in [0, n): n < 2^32
        return np.where(is_validation, self.train_shards, 0) + shard.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """Everything a worker process needs to write any shard."""
    output: str
    vocab_txt: str
    units: tuple[tuple[str, str], ...]
    seq_len: int
    seed: int
    tokenizer_json: str | None = None  # DIR/tokenizer.json where the ids come from `tokenizers`


# ---------------------------------------------------------------------------------------------
# Inputs: corpus, vocabularies, document assignment.

def list_corpus(files: Sequence[str], text_field: str = documents.DEFAULT_TEXT_FIELD) -> CorpusFiles:
    """File names and sizes (statted in parallel threads: one request each on gs://)."""
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        sizes = list(pool.map(lambda path: storage.gfile.stat(path).length, files))
    return CorpusFiles(tuple(files), tuple(int(s) for s in sizes), text_field)


def routed_documents(path: str, text_field: str, assignment: Assignment,
                     stats: dict) -> Iterator[tuple[int, int, int, str]]:
    """(task id, ordinal in the file, key, text) of every document of one file, in file order;
    once the file is read, `stats` holds its documents, characters, sha256 and invalid UTF-8 bytes.

    The one place a document is read for `corpus prepare`, on either runner.
    """
    digest = hashlib.sha256()
    ordinal = chars = 0
    with documents.tally_replacements() as replaced:
        batch: list[str] = []
        keys: list[int] = []
        docs = documents.read_documents(path, text_field)
        while True:
            for doc in docs:
                encoded = doc.encode("utf-8")
                digest.update(encoded + b"\0")
                batch.append(doc)
                keys.append(documents.document_key(encoded))
                chars += len(doc)
                if len(batch) == _ROUTE_BATCH:
                    break
            if not batch:
                break
            tasks = assignment.task_of(np.array(keys, np.uint64)).tolist()
            for task, key, doc in zip(tasks, keys, batch):
                yield task, ordinal, key, doc
                ordinal += 1
            batch, keys = [], []
    stats.update(documents=ordinal, chars=chars, sha256=digest.hexdigest(),
                 invalid_utf8_bytes=sum(replaced.values()))


def corpus_summary(file_stats: Iterable[tuple[int, dict]]) -> dict:
    """metadata.json's "corpus" from each file's stats (`routed_documents`), in any order: the
    sha256 is that of the files' sha256s (each of its documents, UTF-8, NUL-terminated) in file order."""
    ordered = [stats for _, stats in sorted(file_stats, key=lambda fs: fs[0])]
    digest = hashlib.sha256("".join(s["sha256"] for s in ordered).encode())
    return {"files": len(ordered), "documents": sum(s["documents"] for s in ordered),
            "sha256": digest.hexdigest(), "invalid_utf8_bytes": sum(s["invalid_utf8_bytes"] for s in ordered)}


def in_shard_order(docs: Sequence[str], assignment: Assignment) -> dict[str, list[str]]:
    """Each split's documents (given in corpus order) as its shards hold them, shard after shard:
    what reading the split's files in order yields."""
    task_of = assignment.task_of(np.array([documents.document_key(d.encode("utf-8")) for d in docs], np.uint64))
    ordered: dict[str, list[str]] = {split: [] for split in prepared_corpus.SPLITS}
    for task in assignment.tasks():
        ordered[task.split] += [d for d, t in zip(docs, task_of.tolist()) if t == task.id]
    return ordered


def corpus_json_path(output: str) -> str:
    return storage.join(output, PROGRESS_DIR, CORPUS_JSON)


def record_corpus(output: str, summary: dict, inputs: Sequence[str]) -> dict:
    """Keep what reading found in .progress/corpus.json; refuse a corpus that holds no documents,
    and one whose text changed since an interrupted run of the same files wrote its shards."""
    if summary["documents"] == 0:
        raise UserInputError(f"--input {' '.join(inputs)}: the corpus holds no documents")
    path = corpus_json_path(output)
    before = read_json(path)
    if before is not None and before.get("sha256") != summary["sha256"]:
        raise UserInputError(f"--input {' '.join(inputs)}: the text changed since an interrupted run wrote shards "
                             f"to {output} (same file sizes, other content); delete {output} and run again")
    write_json(path, summary)
    return summary


def load_unit_vocabularies(units: Sequence[tuple[str, str]],
                           tokenizer: hf_tokenizer.HFTokenizer | None = None) -> dict[str, dict]:
    """Load and check every --units vocabulary: {name: {"source", "sha256", "entries"}}.

    A vocabulary directory records the word splitting it was built with (stats.json's
    "tokenizer", absent for BERT's uncased words); it must be this corpus's, or no unit would
    ever match. A plain list is checked against BERT's uncased words on the default path only.
    """
    from pmi_jax.formats.masking_vocab import load_ngrams, read_stats
    from pmi_jax.preprocess.text.unit_lists import check_ngrams

    loaded = {}
    for name, source in units:
        try:
            prepared_corpus.check_unit_name(name)
        except UserInputError as e:
            raise UserInputError(f"--units {name}={source}: {e}") from None
        if name in loaded:
            raise UserInputError(f"--units {name}=...: the name {name} is given twice")
        try:
            ngrams = [tuple(g) for g in load_ngrams(source)]
        except UserInputError as e:
            raise UserInputError(f"--units {name}={source}: {e}") from None
        if storage.gfile.isdir(source):
            built = read_stats(source).get("tokenizer", {}).get("words_sha256")
            ours = tokenizer.words_sha256 if tokenizer is not None else None
            if built != ours:
                words = lambda s: "the words of --tokenizer" if s else "BERT's uncased words"  # noqa: E731
                raise UserInputError(f"--units {name}={source}: built on {words(built)}, but this corpus is split "
                                     f"into {words(ours)}; build it with the same --tokenizer")
        problems = check_ngrams(ngrams, normalisation=tokenizer is None)  # lengths outside 2..5, duplicates
        if problems:
            raise UserInputError(f"--units {name}={source}: " + "; ".join(problems))
        loaded[name] = {"source": source, "sha256": segmentation.ngrams_sha256(ngrams), "entries": len(ngrams)}
    return loaded


def assignment_of(config: PrepareConfig, corpus: CorpusFiles) -> Assignment:
    """Train shards: --shards, or one per 32 MiB of input files (at least 4); validation shards:
    ceil(train shards * fraction). From file sizes only, so a shard may be empty on a tiny corpus."""
    train = config.shards or max(_AUTO_MIN_SHARDS, math.ceil(corpus.bytes / _AUTO_SHARD_BYTES))
    validation = math.ceil(train * config.validation_fraction)
    return Assignment(config.seed, config.validation_fraction, train, validation)


def config_fingerprint(config: PrepareConfig, corpus: CorpusFiles, wordpiece_id: dict, units: dict,
                       assignment: Assignment) -> str:
    """sha256 of everything that determines the output bytes (not paths, not --workers) that is
    known before reading: the files' sizes stand for their text (record_corpus checks the text)."""
    determinants = {
        "format_version": prepared_corpus.FORMAT_VERSION,
        "file_sizes": list(corpus.sizes),
        "wordpiece": wordpiece_id,
        "units": {name: u["sha256"] for name, u in units.items()},
        "seq_len": config.seq_len,
        "seed": config.seed,
        "validation_fraction": config.validation_fraction,
        "shards": {"train": assignment.train_shards, "validation": assignment.validation_shards},
    }
    return hashlib.sha256(json.dumps(determinants, sort_keys=True).encode()).hexdigest()


def check_config(config: PrepareConfig) -> None:
    if config.seq_len < MIN_SEQ_LEN:
        raise UserInputError(f"--seq-len {config.seq_len}: must be at least {MIN_SEQ_LEN}")
    if not 0 <= config.validation_fraction < 1:
        raise UserInputError(f"--validation-fraction {config.validation_fraction}: must be in [0, 1)")
    if config.shards < 0:
        raise UserInputError(f"--shards {config.shards}: must be positive (or 0 for automatic)")
    if config.workers < 1:
        raise UserInputError(f"--workers {config.workers}: must be at least 1")
    if config.wordpiece is not None and config.tokenizer is not None:
        raise UserInputError("--wordpiece and --tokenizer: give one")
    if config.wordpiece is None and config.wordpiece_size <= len(wordpiece_vocab.SPECIAL_TOKENS):
        raise UserInputError(f"--wordpiece-size {config.wordpiece_size}: must exceed the special tokens")
    if config.wordpiece_sample_words < 0:
        raise UserInputError(f"--wordpiece-sample-words {config.wordpiece_sample_words}: must be positive "
                             "(or 0: train on the whole corpus)")
    if config.wordpiece_sample_words and (config.wordpiece is not None or config.tokenizer is not None):
        raise UserInputError(f"--wordpiece-sample-words {config.wordpiece_sample_words}: samples the text a "
                             "WordPiece vocabulary is trained on; drop it, or --wordpiece/--tokenizer")


# ---------------------------------------------------------------------------------------------
# One shard.

def _encode(encoder, texts: list[str]):
    """(flat words, doc_word_splits, ids, word_token_splits) of documents, by `tokenizers` or WordPiece."""
    if isinstance(encoder, hf_tokenizer.HFTokenizer):
        words, doc_word_splits, ids, word_token_splits = encoder.encode(texts)
        return tf.constant(words, tf.string), doc_word_splits, ids, word_token_splits
    words = split_words_ragged(tf.constant(texts))
    ids, word_token_splits = encoder.encode_words(words.flat_values)
    return words.flat_values, words.row_splits.numpy(), ids, word_token_splits


_SAMPLE_CHARS = 1 << 22  # text of the corpus's first documents that `check_tokens_known` encodes
MAX_UNKNOWN_SHARE = 0.5  # more [UNK] than this among the sample's tokens: the tokenizer does not fit the text


def check_tokens_known(corpus: CorpusFiles, encoder, tokens: Sequence[str], source: str) -> None:
    """Refuse, before any shard is written, a tokenizer that makes (almost) only [UNK] of this
    corpus: a pre-tokenizer whose words are whole lines, text without spaces, another script.
    The corpus's first documents (up to 4M characters) are encoded as the shards would be."""
    texts, size = [], 0
    for text in documents.iter_documents(corpus.files, corpus.text_field):
        texts.append(text)
        size += len(text)
        if size >= _SAMPLE_CHARS:
            break
    ids = _encode(encoder, texts)[2]
    unknown = int(np.sum(ids == wordpiece_vocab.special_ids(tokens)["unk"]))
    if not len(ids) or unknown > MAX_UNKNOWN_SHARE * len(ids):
        raise UserInputError(f"{source}: {unknown} of the {len(ids)} tokens of the corpus's first {len(texts)} "
                             f"documents are [UNK]; this vocabulary does not fit the text (check --input and "
                             "the tokenizer)")


def _batches(docs: Iterable[tuple[int, str]]) -> Iterator[tuple[np.ndarray, list[str]]]:
    keys, texts, size = [], [], 0
    for key, text in docs:
        keys.append(key)
        texts.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            yield np.array(keys, np.uint64), texts
            keys, texts, size = [], [], 0
    if texts:
        yield np.array(keys, np.uint64), texts


class ShardWriter:
    """Tokenise, segment and pack documents; the per-process state of a worker."""

    def __init__(self, context: WorkerContext):
        self.context = context
        self.tokens = wordpiece_vocab.load_vocab(context.vocab_txt)
        self.special = wordpiece_vocab.special_ids(self.tokens)
        if context.tokenizer_json is not None:
            self.encoder = hf_tokenizer.load(context.tokenizer_json)
        else:
            self.encoder = wordpiece.WordPieceEncoder(context.vocab_txt)
        self.matchers = {name: segmentation.NgramMatcher(_load_ngrams(source)) for name, source in context.units}
        self.words = self.documents = 0  # split off by `sequences` since the last `write` began

    def sequences(self, docs: Iterable[tuple[int, str]], packer: SequencePacker) -> Iterator[dict[str, np.ndarray]]:
        """Packed sequences of the (key, text) documents, in order; a key seeds its document's units."""
        for doc_keys, texts in _batches(docs):
            flat_words, doc_word_splits, ids, word_token_splits = _encode(self.encoder, texts)
            pieces_per_word = np.diff(word_token_splits)
            self.words += len(pieces_per_word)
            self.documents += len(texts)
            word_start = np.zeros(len(ids), dtype=bool)
            word_start[word_token_splits[:-1][pieces_per_word > 0]] = True
            unit_start = {}
            for name, matcher in self.matchers.items():
                starts_w = segmentation.unit_starts(matcher, flat_words, doc_word_splits, doc_keys,
                                                    self.context.seed)
                unit_start[name] = np.repeat(starts_w, pieces_per_word) & word_start
            yield from packer.add(ids, word_start, unit_start, word_token_splits[doc_word_splits])
        yield from packer.finish()

    def write(self, task: ShardTask, docs: Iterable[tuple[int, str]]) -> dict:
        """Write one shard of the (key, text) documents (atomically, stats first); return its stats."""
        ctx = self.context
        packer = SequencePacker(ctx.seq_len, self.special["cls"], self.special["sep"], [n for n, _ in ctx.units])
        path = storage.join(ctx.output, task.name)
        tmp = storage.temporary_sibling(path)
        encode = prepared_corpus.ExampleEncoder(prepared_corpus.feature_names(packer.unit_names))
        stats = {"sequences": 0, "tokens": 0}
        self.words = self.documents = 0
        token_counts = np.zeros(len(self.tokens), np.int64)
        try:
            with tf.io.TFRecordWriter(tmp) as writer:
                for features in self.sequences(docs, packer):
                    writer.write(encode(features))
                    stats["sequences"] += 1
                    stats["tokens"] += len(features[prepared_corpus.INPUT_IDS])
                    token_counts += prepared_corpus.content_token_counts(features, len(self.tokens))
            stats["documents"] = self.documents
            stats["content_tokens"] = packer.tokens
            stats[prepared_corpus.TOKEN_COUNTS] = token_counts.tolist()
            stats["words"] = self.words
            stats["multiword_tokens"] = dict(packer.multiword_tokens)
            stats["bytes"] = storage.gfile.stat(tmp).length
            stats["sha256"] = storage.file_sha256(tmp)
            write_json(progress_path(ctx.output, task), stats)
            storage.gfile.rename(tmp, path, overwrite=True)
        finally:
            if storage.gfile.exists(tmp):
                storage.gfile.remove(tmp)
        return stats


def _load_ngrams(source: str) -> list[tuple[str, ...]]:
    from pmi_jax.formats.masking_vocab import load_ngrams

    return [tuple(g) for g in load_ngrams(source)]


# ---------------------------------------------------------------------------------------------
# The local runner: route every file's documents to spill chunks, then write the shards.

@dataclasses.dataclass(frozen=True)
class _RouteJob:
    index: int  # of the file
    path: str
    text_field: str
    assignment: Assignment
    todo: frozenset[int]  # task ids still to write
    scratch: str


def _route_file(job: _RouteJob) -> tuple[int, dict, list[tuple[str, dict[int, tuple[int, int]]]]]:
    """Spill one file's documents of unwritten shards as chunks of about _SPILL_CHARS characters,
    each a data file of one pickled [(key, text), ...] per task, and return (file, stats,
    [(chunk, {task: (offset, length)})])."""
    stats: dict = {}
    chunks: list[tuple[str, dict[int, tuple[int, int]]]] = []
    held: dict[int, list[tuple[int, str]]] = collections.defaultdict(list)
    size = 0

    def spill() -> None:
        path = os.path.join(job.scratch, f"{job.index:06d}-{len(chunks):05d}.spill")
        ranges, offset = {}, 0
        with open(path, "wb") as f:
            for task in sorted(held):
                data = pickle.dumps(held[task], protocol=pickle.HIGHEST_PROTOCOL)
                f.write(data)
                ranges[task] = (offset, len(data))
                offset += len(data)
        chunks.append((path, ranges))
        held.clear()

    for task, _, key, text in routed_documents(job.path, job.text_field, job.assignment, stats):
        if task in job.todo:
            held[task].append((key, text))
            size += len(text)
            if size >= _SPILL_CHARS:
                spill()
                size = 0
    if held:
        spill()
    return job.index, stats, chunks


def _spilled(pieces: Sequence[tuple[str, int, int]]) -> Iterator[tuple[int, str]]:
    for path, offset, length in pieces:
        with open(path, "rb") as f:
            f.seek(offset)
            yield from pickle.loads(f.read(length))


_WORKER: ShardWriter | None = None


def _init_worker(context: WorkerContext) -> None:
    global _WORKER
    _WORKER = ShardWriter(context)


def _write_in_worker(job: tuple[ShardTask, list]) -> tuple[ShardTask, dict]:
    task, pieces = job
    return task, _WORKER.write(task, _spilled(pieces))


def _pool(workers: int, jobs: int, initializer=None, args=()):
    if workers == 1 or jobs <= 1:
        return None
    return multiprocessing.get_context("spawn").Pool(min(workers, jobs), initializer, args)


def _imap(pool, fn: Callable, jobs: list, ordered: bool = True) -> Iterator:
    if pool is None:
        return map(fn, jobs)
    return pool.imap(fn, jobs) if ordered else pool.imap_unordered(fn, jobs)


def _closing(pool):
    """Close a pool after its work, or stop its workers after an error."""
    @contextlib.contextmanager
    def managed():
        try:
            yield pool
            if pool is not None:
                pool.close()
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    return managed()


def _route(plan: "PreparePlan", scratch: str) -> dict[int, list[tuple[str, int, int]]]:
    """Read every file (in `--workers` processes), record the corpus's stats, and return each
    unwritten shard's spilled pieces in corpus order."""
    c, todo = plan.config, frozenset(t.id for t in plan.todo)
    if not todo and read_json(corpus_json_path(c.output)) is not None:
        return {}  # killed after its last shard, before metadata.json
    jobs = [_RouteJob(f, path, plan.corpus.text_field, plan.assignment, todo, scratch)
            for f, path in enumerate(plan.corpus.files)]
    pieces: dict[int, list[tuple[str, int, int]]] = {t.id: [] for t in plan.todo}
    file_stats = []
    bar = tqdm.tqdm(total=len(jobs), desc="read", unit="file", disable=not c.progress or len(jobs) < 2)
    with bar, _closing(_pool(c.workers, len(jobs))) as pool:
        for f, stats, chunks in _imap(pool, _route_file, jobs):  # in file order: pieces stay in corpus order
            file_stats.append((f, stats))
            for path, ranges in chunks:
                for task, (offset, length) in ranges.items():
                    pieces[task].append((path, offset, length))
            bar.update(1)
    record_corpus(c.output, corpus_summary(file_stats), c.inputs)
    return pieces


def _write_shards(plan: "PreparePlan", pieces: dict[int, list], on_shard_done: Callable[[ShardTask], None] | None
                  ) -> None:
    c = plan.config
    jobs = [(task, pieces[task.id]) for task in plan.todo]
    context = plan.worker_context()
    bar = tqdm.tqdm(total=len(jobs), desc="shards", unit="shard", disable=not c.progress)
    with bar, _closing(_pool(c.workers, len(jobs), _init_worker, (context,))) as pool:
        if pool is None and jobs:
            _init_worker(context)
        for task, _ in _imap(pool, _write_in_worker, jobs, ordered=False):
            bar.update(1)
            if on_shard_done is not None:
                on_shard_done(task)


# ---------------------------------------------------------------------------------------------
# The whole run.

def wordpiece_sample(config: PrepareConfig) -> dict:
    """--wordpiece-sample-words as metadata.json's wordpiece record and the fingerprint name it; {} without."""
    if not config.wordpiece_sample_words:
        return {}
    return {"sample": {"words": config.wordpiece_sample_words, "seed": config.wordpiece_sample_seed}}


def _install_wordpiece(config: PrepareConfig, corpus: CorpusFiles, given: list[str] | None,
                       scratch: str | None = None) -> list[str]:
    """Write DIR/vocab.txt (the given vocabulary, or one trained on the corpus or on its sample,
    written to `scratch`) and return its tokens.

    Called on a claimed directory, so a vocab.txt found there was trained by an interrupted run
    of this same configuration, and training is deterministic: it is kept.
    """
    target = prepared_corpus.vocab_path(config.output)
    if given is None and storage.gfile.exists(target):
        return wordpiece_vocab.load_vocab(target)
    tokens = given
    if tokens is None:
        log.info("training a WordPiece vocabulary of at most %d tokens", config.wordpiece_size)
        from pmi_jax.preprocess.text.word_stream import count_words  # the vocabulary build's threaded reader: same counts

        files, text_field = corpus.files, corpus.text_field
        if config.wordpiece_sample_words:
            from pmi_jax.preprocess.text import sample

            files = [sample.write_sample(corpus.files, config.wordpiece_sample_words, config.wordpiece_sample_seed,
                                         os.path.join(scratch, "wordpiece_sample.jsonl"), corpus.text_field)]
            text_field = documents.DEFAULT_TEXT_FIELD
        counts = collections.Counter(count_words(files, config.workers, text_field, config.progress, _BATCH_CHARS))
        tokens = wordpiece.train_vocab(counts, config.wordpiece_size, config.workers)
        if len(tokens) <= len(wordpiece_vocab.SPECIAL_TOKENS):
            raise UserInputError(f"--input {' '.join(config.inputs)}: the corpus yields no WordPiece token besides "
                                 f"the special ones ({sum(counts.values())} words, {len(counts)} distinct; pieces "
                                 "seen under 10 times are left out): too little text, or text without spaces")
    wordpiece_vocab.write_vocab(target, tokens)
    return tokens


@dataclasses.dataclass(frozen=True)
class PreparePlan:
    """What a run must do, decided before any shard is written; shared by the local and Beam runners."""
    config: PrepareConfig
    corpus: CorpusFiles
    given_wordpiece: list[str] | None  # None: train one on the corpus
    units: dict
    fingerprint: str
    assignment: Assignment
    tasks: list[ShardTask]  # every shard of the output
    todo: list[ShardTask]   # those not yet written (all of them, unless resuming)
    tokenizer: hf_tokenizer.HFTokenizer | None = None  # --tokenizer (not an uncased vocab.txt)

    @property
    def vocab_txt(self) -> str:
        return prepared_corpus.vocab_path(self.config.output)

    def worker_context(self) -> WorkerContext:
        c = self.config
        tokenizer_json = prepared_corpus.tokenizer_path(c.output) if self.tokenizer is not None else None
        return WorkerContext(c.output, self.vocab_txt, c.units, c.seq_len, c.seed, tokenizer_json)

    def check_tokens_known(self) -> None:
        """`check_tokens_known` with the given --tokenizer or --wordpiece."""
        if self.tokenizer is not None:
            check_tokens_known(self.corpus, self.tokenizer, self.given_wordpiece,
                               f"--tokenizer {self.tokenizer.source}")
        else:
            check_tokens_known(self.corpus, wordpiece.WordPieceEncoder(self.config.wordpiece), self.given_wordpiece,
                               f"--wordpiece {self.config.wordpiece}")

    def install_given(self) -> None:
        """Write the given vocabulary as vocab.txt, and the tokenizer that goes with it (first)."""
        if len(self.todo) == len(self.tasks):  # a fresh start: the tokens are checked before anything is written
            self.check_tokens_known()
        if self.tokenizer is not None:
            with storage.atomic_file(prepared_corpus.tokenizer_path(self.config.output)) as f:
                f.write(self.tokenizer.json_text)
        if self.given_wordpiece is not None:
            wordpiece_vocab.write_vocab(self.vocab_txt, self.given_wordpiece)


def plan_prepare(config: PrepareConfig, check_written: bool = True) -> PreparePlan | dict:
    """Check the inputs, claim the output and list the shards still to write.

    Returns the finished metadata instead when `config.output` is already prepared with this
    exact configuration, so a rerun of a complete job does nothing. Without `check_written`, shards
    recorded as written count as written unread (sizes only for a finished directory): the caller
    checks them (beam_prepare, on its workers) and replans with `unrecorded`.
    """
    check_config(config)
    files = documents.expand_inputs(config.inputs)
    check_output_apart(config, files)
    tokenizer = hf_tokenizer.select(config.tokenizer, config.cased)
    given_path = config.wordpiece if config.tokenizer is None else config.tokenizer
    if tokenizer is not None:
        given = tokenizer.tokens
    else:
        given = wordpiece_vocab.load_vocab(given_path) if given_path is not None else None
    units = load_unit_vocabularies(config.units, tokenizer)
    corpus = list_corpus(files, config.text_field)
    assignment = assignment_of(config, corpus)
    wordpiece_id = ({"sha256": wordpiece_vocab.vocab_sha256(given)} if given is not None
                    else {"trained_size": config.wordpiece_size, **wordpiece_sample(config)})
    if tokenizer is not None:
        wordpiece_id["tokenizer_sha256"] = tokenizer.sha256
    fingerprint = config_fingerprint(config, corpus, wordpiece_id, units, assignment)

    done = claim_output(config.output, fingerprint, config.overwrite, digests=check_written)
    if done is not None:
        log.info("%s: already prepared with this configuration", config.output)
        return done
    tasks = assignment.tasks()
    recorded = _recorded(config.output, tasks)
    written = (_each(lambda t: t is not None and is_done(config.output, t), recorded) if check_written
               else [t is not None for t in recorded])
    todo = [t for t, done in zip(tasks, written) if not done]
    if len(todo) < len(tasks):
        log.info("resuming: %d of %d shards already written", len(tasks) - len(todo), len(tasks))
    return PreparePlan(config, corpus, given, units, fingerprint, assignment, tasks, todo, tokenizer)


def unrecorded(plan: PreparePlan) -> PreparePlan:
    """`plan` with todo = the shards without a record in .progress/ (one listing)."""
    return dataclasses.replace(plan, todo=[t for t, r in zip(plan.tasks, _recorded(plan.config.output, plan.tasks))
                                           if r is None])


def _each(fn: Callable, items: Sequence) -> list:
    """fn over items in 32 threads: a file request each on gs://, where one shard of a 1T-token
    corpus in 100K would otherwise cost the launcher an hour in round trips."""
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        return list(pool.map(fn, items))


def _recorded(output: str, tasks: list[ShardTask]) -> list[ShardTask | None]:
    """The tasks whose stats file exists (one listing of .progress/), the others None (not done)."""
    names = {n.rstrip("/") for n in storage.gfile.listdir(storage.join(output, PROGRESS_DIR))}
    return [t if t.name + ".json" in names else None for t in tasks]


def finish_prepare(plan: PreparePlan) -> dict:
    """Once every shard is written: metadata.json last (it marks the directory complete), then tidy up."""
    output = plan.config.output
    tokens = wordpiece_vocab.load_vocab(plan.vocab_txt)
    corpus = read_json(corpus_json_path(output))
    metadata = _metadata(plan.config, corpus, tokens, plan.given_wordpiece is None, plan.units, plan.tasks,
                         plan.fingerprint)
    held = sum(split["documents"] for split in metadata["splits"].values())
    if held != corpus["documents"]:  # a runner that lost or repeated documents (benchmarks/README.md, issue 35)
        raise DataLost(f"the shards of {output} hold {held:,} of the corpus's {corpus['documents']:,} "
                       "documents: documents were lost or repeated between reading and writing; nothing "
                       "marks the directory complete: run the same command with --overwrite")
    if plan.tokenizer is not None:
        metadata["tokenizer"] = {"path": prepared_corpus.TOKENIZER_FILE, "source": plan.tokenizer.source,
                                 "model": plan.tokenizer.model, "sha256": plan.tokenizer.sha256,
                                 "words_sha256": plan.tokenizer.words_sha256}
    write_json(prepared_corpus.metadata_path(output), metadata)
    close_run(output)
    return metadata


def prepare(config: PrepareConfig, on_shard_done: Callable[[ShardTask], None] | None = None) -> dict:
    """Prepare (or finish preparing) `config.output`; return its metadata."""
    with removed_unless_begun(config.output):
        plan = plan_prepare(config)
        if not isinstance(plan, PreparePlan):
            return plan
        with storage.scratch_directory(config.output) as scratch:
            pieces = _route(plan, scratch)  # first: an empty corpus is refused before any file is written
            if plan.given_wordpiece is not None:
                plan.install_given()
            else:
                _install_wordpiece(config, plan.corpus, None, scratch)
            _write_shards(plan, pieces, on_shard_done)
        return finish_prepare(plan)


def _metadata(config: PrepareConfig, corpus: dict, tokens: list[str], trained: bool, units: dict,
              tasks: list[ShardTask], fingerprint: str) -> dict:
    splits = {split: {"shards": 0, "sequences": 0, "tokens": 0, "content_tokens": 0, "documents": 0, "files": []}
              for split in prepared_corpus.SPLITS}
    multiword = dict.fromkeys(units, 0)
    shards = {}
    token_counts = {split: np.zeros(len(tokens), np.int64) for split in prepared_corpus.SPLITS}
    for task, stats in zip(tasks, _each(lambda t: read_json(progress_path(config.output, t)), tasks)):
        # Summed per split below, not kept per shard. A shard kept from a finished run that a
        # rerun repairs has no counts in its stats (metadata.json's `shards` holds none): counted
        # from the shard itself.
        counts = stats.pop(prepared_corpus.TOKEN_COUNTS, None)
        if counts is None:
            counts = prepared_corpus.shard_token_counts(storage.join(config.output, task.name), len(tokens))
        token_counts[task.split] += np.asarray(counts, np.int64)
        shards[task.name] = stats
        split = splits[task.split]
        split["shards"] += 1
        split["files"].append(task.name)
        for key in ("sequences", "tokens", "content_tokens", "documents"):
            split[key] += stats[key]
        for name in units:
            multiword[name] += stats["multiword_tokens"][name]
    content = sum(s["content_tokens"] for s in splits.values())
    # Tokens per word (the paper's §2 and Table 1: 1.08 for its 30K vocabulary): WordPiece tokens
    # over words of the basic tokenizer, punctuation included, over every split. Shards written by
    # a version that did not count words leave it out.
    counted = all("words" in shards[t.name] for t in tasks)
    if counted:
        for task in tasks:
            splits[task.split]["words"] = splits[task.split].get("words", 0) + shards[task.name]["words"]
    words = sum(s.get("words", 0) for s in splits.values())
    # Each id's count among the content tokens: random_span's replacement law (SpanBERT draws
    # random tokens from the corpus).
    for split, counts in token_counts.items():
        splits[split][prepared_corpus.TOKEN_COUNTS] = counts.tolist()
    return {
        "format_version": prepared_corpus.FORMAT_VERSION,
        "seq_len": config.seq_len,
        "seed": config.seed,
        "validation_fraction": config.validation_fraction,
        "wordpiece": {"path": prepared_corpus.VOCAB_FILE, "source": config.wordpiece,
                      "sha256": wordpiece_vocab.vocab_sha256(tokens), "size": len(tokens), "trained": trained,
                      **(wordpiece_sample(config) if trained else {})},
        "special_ids": wordpiece_vocab.special_ids(tokens),
        "units": {name: {"source": u["source"], "sha256": u["sha256"], "entries": u["entries"],
                         "coverage": multiword[name] / content if content else 0.0}
                  for name, u in units.items()},
        "splits": splits,
        "shards": shards,
        "corpus": corpus,
        "config_fingerprint": fingerprint,
        **({"tokens_per_word": content / words} if counted and words else {}),
    }
