"""`pmi-jax corpus prepare`: documents -> WordPiece ids, masking units, packed shards.

The contract: docs/design.md, "Prepared corpus". The work is cut into shards, each an
independent, deterministic job (tokenise, segment, pack, write) written under a temporary name
and renamed; a rerun skips finished shards and rewrites missing or damaged ones; metadata.json
is written last. Which document goes where depends only on the corpus, --validation-fraction,
--shards and --seed. Details: docs/design.md, "Module notes", prepare.py.
"""
from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
from typing import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf
import tqdm

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import prepared_corpus, wordpiece_vocab
from preprocess.corpus import segmentation, wordpiece
from preprocess.corpus.output_state import (check_output_apart, claim_output, close_run, is_done,  # noqa: F401
                                            progress_path, read_json, removed_unless_begun, write_json)
from preprocess.text import documents, hf_tokenizer
from preprocess.corpus.sequence_packing import SequencePacker
from preprocess.text.words import split_words_ragged

log = logging.getLogger(__name__)

MIN_SEQ_LEN = 8
_BATCH_CHARS = 1_000_000         # documents are tokenised in batches of about this many characters
_AUTO_SHARD_CHARS = 32 * 2**20   # --shards 0: one train shard per this many characters of text
_AUTO_MIN_SHARDS = 4
_RESUME_EVERY_CHARS = 2**20      # a shard reads at most about this much text before its first document
_DEFAULT_WORDPIECE_SIZE = wordpiece_vocab.DEFAULT_SIZE


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    inputs: tuple[str, ...]
    output: str
    wordpiece: str | None = None              # a BERT vocab.txt, or None to train one
    wordpiece_size: int = _DEFAULT_WORDPIECE_SIZE
    units: tuple[tuple[str, str], ...] = ()   # (name, masking vocabulary dir or n-gram list)
    seq_len: int = 512
    validation_fraction: float = 0.01
    shards: int = 0                           # train shards; 0 picks from the corpus size
    seed: int = 0
    workers: int = 1
    overwrite: bool = False
    progress: bool = True                     # progress bars on stderr
    text_field: str = documents.DEFAULT_TEXT_FIELD  # the documents' field in JSON lines, Parquet and Arrow
    tokenizer: str | None = None              # a tokenizer.json, or a vocab.txt (cased with `cased`)
    cased: bool = False


@dataclasses.dataclass(frozen=True)
class CorpusScan:
    files: tuple[str, ...]
    docs_per_file: tuple[int, ...]
    chars: int
    sha256: str
    invalid_utf8_bytes: int = 0  # replaced by U+FFFD while reading (preprocess/text/documents.py)
    text_field: str = documents.DEFAULT_TEXT_FIELD
    # Per file, (document index in the file, resume point) about every _RESUME_EVERY_CHARS of
    # text: where a shard's read of the file starts (documents.read_documents_with_resume_points).
    resume_points: tuple[tuple[tuple[int, tuple], ...], ...] = ()

    @property
    def documents(self) -> int:
        return sum(self.docs_per_file)


@dataclasses.dataclass(frozen=True)
class ShardTask:
    split: str
    index: int
    num_shards: int
    doc_indices: np.ndarray  # sorted global document indices

    @property
    def name(self) -> str:
        return prepared_corpus.shard_name(self.split, self.index, self.num_shards)


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """Everything a worker process needs to write any shard."""
    output: str
    vocab_txt: str
    units: tuple[tuple[str, str], ...]
    seq_len: int
    seed: int
    scan: CorpusScan
    tokenizer_json: str | None = None  # DIR/tokenizer.json where the ids come from `tokenizers`


# ---------------------------------------------------------------------------------------------
# Inputs: corpus, vocabularies, document assignment.

def scan_corpus(files: Sequence[str], progress: bool = True,
                text_field: str = documents.DEFAULT_TEXT_FIELD) -> CorpusScan:
    """One pass over the corpus: documents per file, characters, a content hash, resume points."""
    digest = hashlib.sha256()
    counts, chars, points = [], 0, []
    with documents.tally_replacements() as replaced:
        for path in tqdm.tqdm(files, desc="scan", unit="file", disable=len(files) < 2 or not progress):
            n, file_points, since = 0, [], _RESUME_EVERY_CHARS
            for doc, resume in documents.read_documents_with_resume_points(path, text_field):
                if resume is not None and since >= _RESUME_EVERY_CHARS and n:
                    file_points.append((n, resume))
                    since = 0
                digest.update(doc.encode("utf-8") + b"\0")
                chars += len(doc)
                since += len(doc)
                n += 1
            counts.append(n)
            points.append(tuple(file_points))
    return CorpusScan(tuple(files), tuple(counts), chars, digest.hexdigest(), sum(replaced.values()), text_field,
                      tuple(points))


def load_unit_vocabularies(units: Sequence[tuple[str, str]],
                           tokenizer: hf_tokenizer.HFTokenizer | None = None) -> dict[str, dict]:
    """Load and check every --units vocabulary: {name: {"source", "sha256", "entries"}}.

    A vocabulary directory records the word splitting it was built with (stats.json's
    "tokenizer", absent for BERT's uncased words); it must be this corpus's, or no unit would
    ever match. A plain list is checked against BERT's uncased words on the default path only.
    """
    from pmi_jax.formats.masking_vocab import load_ngrams, read_stats
    from preprocess.text.unit_lists import check_ngrams

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


def assign_documents(num_docs: int, validation_fraction: float, seed: int) -> np.ndarray:
    """bool [num_docs], True for the validation documents: a seeded choice of round(f * D)."""
    is_validation = np.zeros(num_docs, dtype=bool)
    count = int(round(validation_fraction * num_docs))
    if validation_fraction > 0 and num_docs >= 2:
        count = min(max(count, 1), num_docs - 1)  # both splits non-empty
    else:
        count = 0
    rng = np.random.default_rng([seed, 0x5A11D])
    is_validation[rng.choice(num_docs, size=count, replace=False)] = True
    return is_validation


def shard_counts(config: PrepareConfig, scan: CorpusScan, is_validation: np.ndarray) -> dict[str, int]:
    """Shards per split: --shards (or one per 32 MiB of text, at least 4) for train,
    ceil(train shards * fraction) for validation; never more shards than documents."""
    num_val = int(is_validation.sum())
    num_train = len(is_validation) - num_val
    train = config.shards or max(_AUTO_MIN_SHARDS, math.ceil(scan.chars / _AUTO_SHARD_CHARS))
    validation = math.ceil(train * config.validation_fraction) if num_val else 0
    return {"train": min(train, num_train), "validation": min(validation, num_val)}


def shard_tasks(is_validation: np.ndarray, counts: dict[str, int]) -> list[ShardTask]:
    tasks = []
    for split, members in (("train", ~is_validation), ("validation", is_validation)):
        indices = np.flatnonzero(members)
        n = counts[split]
        bounds = np.linspace(0, len(indices), n + 1).round().astype(np.int64) if n else []
        for i in range(n):
            tasks.append(ShardTask(split, i, n, indices[bounds[i]:bounds[i + 1]]))
    return tasks


def config_fingerprint(config: PrepareConfig, scan: CorpusScan, wordpiece_id: dict, units: dict,
                       counts: dict[str, int]) -> str:
    """sha256 of everything that determines the output bytes (not paths, not --workers)."""
    determinants = {
        "format_version": prepared_corpus.FORMAT_VERSION,
        "corpus_sha256": scan.sha256,
        "documents": scan.documents,
        "wordpiece": wordpiece_id,
        "units": {name: u["sha256"] for name, u in units.items()},
        "seq_len": config.seq_len,
        "seed": config.seed,
        "validation_fraction": config.validation_fraction,
        "shards": counts,
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


# ---------------------------------------------------------------------------------------------
# One shard.

def shard_documents(scan: CorpusScan, doc_indices: np.ndarray) -> Iterator[tuple[int, str]]:
    """(global index, text) of the given documents, reading only the files that hold them, each
    from the last resume point before its first wanted document (so that the shards of one big
    file do not each read it from its start)."""
    if not len(doc_indices):
        return
    first_of_file = np.concatenate([[0], np.cumsum(scan.docs_per_file)])
    wanted = set(doc_indices.tolist())
    lo, hi = int(doc_indices[0]), int(doc_indices[-1])
    for f, path in enumerate(scan.files):
        if first_of_file[f + 1] <= lo or first_of_file[f] > hi:
            continue
        first, start = 0, None
        points = scan.resume_points[f] if scan.resume_points else ()
        k = bisect.bisect_right([n for n, _ in points], lo - int(first_of_file[f])) - 1
        if k >= 0:
            first, start = points[k]
        for i, doc in enumerate(documents.read_documents(path, scan.text_field, start),
                                start=int(first_of_file[f]) + first):
            if i > hi:
                break
            if i in wanted:
                yield i, doc


def _batches(docs: Iterator[tuple[int, str]]) -> Iterator[tuple[np.ndarray, list[str]]]:
    indices, texts, size = [], [], 0
    for i, text in docs:
        indices.append(i)
        texts.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            yield np.array(indices, np.int64), texts
            indices, texts, size = [], [], 0
    if texts:
        yield np.array(indices, np.int64), texts


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
        self.words = 0  # words split off by `sequences` since the last `write` began

    def sequences(self, docs: Iterator[tuple[int, str]], packer: SequencePacker) -> Iterator[dict[str, np.ndarray]]:
        """Packed sequences of the documents, in order."""
        for doc_indices, texts in _batches(docs):
            if isinstance(self.encoder, hf_tokenizer.HFTokenizer):
                words, doc_word_splits, ids, word_token_splits = self.encoder.encode(texts)
                flat_words = tf.constant(words, tf.string)
            else:
                words = split_words_ragged(tf.constant(texts))
                flat_words, doc_word_splits = words.flat_values, words.row_splits.numpy()
                ids, word_token_splits = self.encoder.encode_words(flat_words)
            pieces_per_word = np.diff(word_token_splits)
            self.words += len(pieces_per_word)
            word_start = np.zeros(len(ids), dtype=bool)
            word_start[word_token_splits[:-1][pieces_per_word > 0]] = True
            unit_start = {}
            for name, matcher in self.matchers.items():
                starts_w = segmentation.unit_starts(matcher, flat_words, doc_word_splits, doc_indices,
                                                    self.context.seed)
                unit_start[name] = np.repeat(starts_w, pieces_per_word) & word_start
            yield from packer.add(ids, word_start, unit_start, word_token_splits[doc_word_splits])
        yield from packer.finish()

    def write(self, task: ShardTask) -> dict:
        """Write one shard (atomically, stats first) and return its stats."""
        ctx = self.context
        packer = SequencePacker(ctx.seq_len, self.special["cls"], self.special["sep"], [n for n, _ in ctx.units])
        path = storage.join(ctx.output, task.name)
        tmp = storage.temporary_sibling(path)
        encode = prepared_corpus.ExampleEncoder(prepared_corpus.feature_names(packer.unit_names))
        stats = {"sequences": 0, "tokens": 0, "documents": int(len(task.doc_indices))}
        self.words = 0
        try:
            with tf.io.TFRecordWriter(tmp) as writer:
                for features in self.sequences(shard_documents(ctx.scan, task.doc_indices), packer):
                    writer.write(encode(features))
                    stats["sequences"] += 1
                    stats["tokens"] += len(features[prepared_corpus.INPUT_IDS])
            stats["content_tokens"] = packer.tokens
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


_WORKER: ShardWriter | None = None


def _init_worker(context: WorkerContext) -> None:
    global _WORKER
    _WORKER = ShardWriter(context)


def _write_in_worker(task: ShardTask) -> tuple[ShardTask, dict]:
    return task, _WORKER.write(task)


def _run_tasks(context: WorkerContext, tasks: list[ShardTask], workers: int,
               on_shard_done: Callable[[ShardTask], None] | None, progress: bool = True) -> None:
    bar = tqdm.tqdm(total=len(tasks), desc="shards", unit="shard", disable=not progress)
    if workers == 1 or len(tasks) <= 1:
        writer = ShardWriter(context)
        results = ((task, writer.write(task)) for task in tasks)
        pool = None
    else:
        pool = multiprocessing.get_context("spawn").Pool(min(workers, len(tasks)), _init_worker, (context,))
        results = pool.imap_unordered(_write_in_worker, tasks)
    try:
        for task, _ in results:
            bar.update(1)
            if on_shard_done is not None:
                on_shard_done(task)
        if pool is not None:
            pool.close()
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()  # after close(): waits for nothing; after an error: stops the workers
            pool.join()


# ---------------------------------------------------------------------------------------------
# The whole run.

def _install_wordpiece(config: PrepareConfig, scan: CorpusScan, given: list[str] | None) -> list[str]:
    """Write DIR/vocab.txt (the given vocabulary, or one trained on the corpus) and return its tokens.

    Called on a claimed directory, so a vocab.txt found there was trained by an interrupted run
    of this same configuration, and training is deterministic: it is kept.
    """
    target = prepared_corpus.vocab_path(config.output)
    if given is None and storage.gfile.exists(target):
        return wordpiece_vocab.load_vocab(target)
    tokens = given
    if tokens is None:
        log.info("training a WordPiece vocabulary of at most %d tokens", config.wordpiece_size)
        from preprocess.text.word_stream import count_words  # the vocabulary build's threaded reader: same counts

        counts = collections.Counter(count_words(scan.files, config.workers, scan.text_field, config.progress,
                                                 _BATCH_CHARS))
        tokens = wordpiece.train_vocab(counts, config.wordpiece_size, config.workers)
    wordpiece_vocab.write_vocab(target, tokens)
    return tokens


@dataclasses.dataclass(frozen=True)
class PreparePlan:
    """What a run must do, decided before any shard is written; shared by the local and Beam runners."""
    config: PrepareConfig
    scan: CorpusScan
    given_wordpiece: list[str] | None  # None: train one on the corpus
    units: dict
    fingerprint: str
    shard_counts: dict[str, int]  # shards per split
    tasks: list[ShardTask]  # every shard of the output
    todo: list[ShardTask]   # those not yet written (all of them, unless resuming)
    tokenizer: hf_tokenizer.HFTokenizer | None = None  # --tokenizer (not an uncased vocab.txt)

    @property
    def vocab_txt(self) -> str:
        return prepared_corpus.vocab_path(self.config.output)

    def worker_context(self) -> WorkerContext:
        c = self.config
        tokenizer_json = prepared_corpus.tokenizer_path(c.output) if self.tokenizer is not None else None
        return WorkerContext(c.output, self.vocab_txt, c.units, c.seq_len, c.seed, self.scan, tokenizer_json)

    def install_given(self) -> None:
        """Write the given vocabulary as vocab.txt, and the tokenizer that goes with it (first)."""
        if self.tokenizer is not None:
            with storage.atomic_file(prepared_corpus.tokenizer_path(self.config.output)) as f:
                f.write(self.tokenizer.json_text)
        if self.given_wordpiece is not None:
            wordpiece_vocab.write_vocab(self.vocab_txt, self.given_wordpiece)


def plan_prepare(config: PrepareConfig) -> PreparePlan | dict:
    """Check the inputs, claim the output and list the shards still to write.

    Returns the finished metadata instead when `config.output` is already prepared with this
    exact configuration, so a rerun of a complete job does nothing.
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
    scan = scan_corpus(files, config.progress, config.text_field)
    if scan.documents == 0:
        raise UserInputError(f"--input {' '.join(config.inputs)}: the corpus holds no documents")
    is_validation = assign_documents(scan.documents, config.validation_fraction, config.seed)
    counts = shard_counts(config, scan, is_validation)
    wordpiece_id = ({"sha256": wordpiece_vocab.vocab_sha256(given)} if given is not None
                    else {"trained_size": config.wordpiece_size})
    if tokenizer is not None:
        wordpiece_id["tokenizer_sha256"] = tokenizer.sha256
    fingerprint = config_fingerprint(config, scan, wordpiece_id, units, counts)

    done = claim_output(config.output, fingerprint, config.overwrite)
    if done is not None:
        log.info("%s: already prepared with this configuration", config.output)
        return done
    tasks = shard_tasks(is_validation, counts)
    todo = [t for t in tasks if not is_done(config.output, t)]
    if len(todo) < len(tasks):
        log.info("resuming: %d of %d shards already written", len(tasks) - len(todo), len(tasks))
    return PreparePlan(config, scan, given, units, fingerprint, counts, tasks, todo, tokenizer)


def finish_prepare(plan: PreparePlan) -> dict:
    """Once every shard is written: metadata.json last (it marks the directory complete), then tidy up."""
    output = plan.config.output
    tokens = wordpiece_vocab.load_vocab(plan.vocab_txt)
    metadata = _metadata(plan.config, plan.scan, tokens, plan.given_wordpiece is None, plan.units, plan.tasks,
                         plan.fingerprint)
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
        if plan.given_wordpiece is not None:
            plan.install_given()
        else:
            _install_wordpiece(config, plan.scan, None)
        _run_tasks(plan.worker_context(), plan.todo, config.workers, on_shard_done, config.progress)
        return finish_prepare(plan)


def _metadata(config: PrepareConfig, scan: CorpusScan, tokens: list[str], trained: bool, units: dict,
              tasks: list[ShardTask], fingerprint: str) -> dict:
    splits = {split: {"shards": 0, "sequences": 0, "tokens": 0, "content_tokens": 0, "documents": 0, "files": []}
              for split in prepared_corpus.SPLITS}
    multiword = dict.fromkeys(units, 0)
    shards = {}
    for task in tasks:
        stats = read_json(progress_path(config.output, task))
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
    return {
        "format_version": prepared_corpus.FORMAT_VERSION,
        "seq_len": config.seq_len,
        "seed": config.seed,
        "validation_fraction": config.validation_fraction,
        "wordpiece": {"path": prepared_corpus.VOCAB_FILE, "source": config.wordpiece,
                      "sha256": wordpiece_vocab.vocab_sha256(tokens), "size": len(tokens), "trained": trained},
        "special_ids": wordpiece_vocab.special_ids(tokens),
        "units": {name: {"source": u["source"], "sha256": u["sha256"], "entries": u["entries"],
                         "coverage": multiword[name] / content if content else 0.0}
                  for name, u in units.items()},
        "splits": splits,
        "shards": shards,
        "corpus": {"files": len(scan.files), "documents": scan.documents, "sha256": scan.sha256,
                   "invalid_utf8_bytes": scan.invalid_utf8_bytes},
        "config_fingerprint": fingerprint,
        **({"tokens_per_word": content / words} if counted and words else {}),
    }
