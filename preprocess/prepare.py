"""`pmi-jax corpus prepare`: documents -> WordPiece ids, masking units, packed shards.

The contract: docs/design.md, "Prepared corpus".

The work is cut into shards, each an independent, deterministic job over a fixed list of
documents: tokenise, segment into units for every masking vocabulary, pack, write. A shard is
written under a temporary name and renamed when complete, after a small stats file beside it
(`.progress/`, with the shard's size). A rerun with the same configuration skips finished shards
(present, with the size recorded), deletes leftover temporary files and does the rest;
`metadata.json`, written last, records every shard's size and stats. A rerun of a finished
directory checks it (`formats.prepared_corpus.damaged_shards`, vocab.txt's hash) and, if a shard
or vocab.txt is missing or damaged, reopens it as an unfinished run that rewrites only those.

Which document goes where depends only on the corpus, --validation-fraction, --shards and
--seed: `validation` takes a seeded random choice of round(fraction * documents) documents, and
each split's documents, in corpus order, are cut into contiguous runs, one per shard.
"""
from __future__ import annotations

import contextlib
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
from preprocess import documents, segmentation, wordpiece
from preprocess.packing import SequencePacker
from preprocess.words import split_words_ragged

log = logging.getLogger(__name__)

MIN_SEQ_LEN = 8
_MARKER = ".prepare.json"        # the configuration of an unfinished run
_PROGRESS = ".progress"          # per-shard stats of finished shards
_BATCH_CHARS = 1_000_000         # documents are tokenised in batches of about this many characters
_AUTO_SHARD_CHARS = 32 * 2**20   # --shards 0: one train shard per this many characters of text
_AUTO_MIN_SHARDS = 4
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


@dataclasses.dataclass(frozen=True)
class CorpusScan:
    files: tuple[str, ...]
    docs_per_file: tuple[int, ...]
    chars: int
    sha256: str
    invalid_utf8_bytes: int = 0  # replaced by U+FFFD while reading (preprocess/documents.py)

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


# ---------------------------------------------------------------------------------------------
# Inputs: corpus, vocabularies, document assignment.

def scan_corpus(files: Sequence[str], progress: bool = True) -> CorpusScan:
    """One pass over the corpus: documents per file, characters, and a content hash."""
    digest = hashlib.sha256()
    counts, chars = [], 0
    with documents.tally_replacements() as replaced:
        for path in tqdm.tqdm(files, desc="scan", unit="file", disable=len(files) < 2 or not progress):
            n = 0
            for doc in documents.read_documents(path):
                digest.update(doc.encode("utf-8") + b"\0")
                chars += len(doc)
                n += 1
            counts.append(n)
    return CorpusScan(tuple(files), tuple(counts), chars, digest.hexdigest(), sum(replaced.values()))


def load_unit_vocabularies(units: Sequence[tuple[str, str]]) -> dict[str, dict]:
    """Load and check every --units vocabulary: {name: {"source", "sha256", "entries"}}."""
    from pmi_jax.formats.masking_vocab import load_ngrams
    from preprocess.vocab_selection import check_ngrams

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
        problems = check_ngrams(ngrams)  # wrong normalisation, lengths outside 2..5, duplicates
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
    if config.wordpiece is None and config.wordpiece_size <= len(wordpiece_vocab.SPECIAL_TOKENS):
        raise UserInputError(f"--wordpiece-size {config.wordpiece_size}: must exceed the special tokens")


# ---------------------------------------------------------------------------------------------
# The output directory: claim it, resume it, finish it.

def _our_files(output: str) -> list[str]:
    """Files in `output` that a prepare run writes (shards, vocab, metadata, marker, temporaries)."""
    if not storage.gfile.isdir(output):
        return []
    return [storage.join(output, name) for name in storage.gfile.listdir(output) if _is_ours(name)]


def _is_ours(name: str) -> bool:
    name = name.rstrip("/")
    return (name.endswith(".tfrecord") or ".tmp-" in name
            or name in (prepared_corpus.VOCAB_FILE, prepared_corpus.METADATA_FILE, _MARKER, _PROGRESS))


def check_output_apart(config: PrepareConfig, files: Sequence[str]) -> None:
    """Refuse an --output that would mix the corpus into something else or feed a later run.

    It may not hold files that prepare does not write (a masking vocabulary directory, say),
    be an --input directory or lie inside one (the next run would read this output as input),
    or hold an --input file (--overwrite would delete it).
    """
    output = config.output.rstrip("/")
    storage.check_new_output(output, overwrite=True, directory=True)
    documents.check_output_apart(config.inputs, files, output)
    if storage.gfile.isdir(output):
        foreign = sorted(n.rstrip("/") for n in storage.gfile.listdir(output) if not _is_ours(n))
        if foreign:
            raise UserInputError(f"--output {output}: holds files that `corpus prepare` does not write "
                                 f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                                 "choose a new or empty directory")
    for name, source in config.units:
        if _inside(source, output) or _inside(output, source):
            raise UserInputError(f"--output {output}: overlaps the masking vocabulary --units {name}={source}")


def _inside(path: str, directory: str) -> bool:
    return storage.is_inside(path, directory)


def _read_json(path: str) -> dict | None:
    """A JSON file written by this module, or None if it is absent or unreadable (a damaged run)."""
    if not storage.gfile.exists(path):
        return None
    try:
        with storage.gfile.GFile(path, "r") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: str, value: dict) -> None:
    with storage.atomic_file(path) as f:
        f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _remove(path: str) -> None:
    storage.remove_tree(path)


def claim_output(output: str, fingerprint: str, overwrite: bool) -> dict | None:
    """Make `output` ours for this configuration; return its metadata if it is already complete.

    Complete means: metadata.json of this configuration, vocab.txt with the hash it records, and
    every shard it lists with the size it records. A directory that is not (a shard deleted or
    truncated) is reopened as an unfinished run that rewrites only what is damaged. A directory
    left by another configuration is an error unless --overwrite, which deletes metadata.json
    first (so nothing looks complete meanwhile), then the other files a prepare run writes.
    Leftover temporary files of an interrupted run are deleted.
    """
    metadata_file = prepared_corpus.metadata_path(output)
    metadata = _read_json(metadata_file)
    marker = _read_json(storage.join(output, _MARKER))
    found = (metadata or marker or {}).get("config_fingerprint")
    if found == fingerprint and metadata is not None:
        if _intact(output, metadata, fingerprint):
            _remove(storage.join(output, _PROGRESS))  # left if a run was killed right after its metadata
            _remove(storage.join(output, _MARKER))
            return metadata
    else:
        ours = _our_files(output)
        if found != fingerprint and ours:
            if not overwrite:
                what = ("a prepared corpus" if metadata else "an unfinished run" if marker
                        else "a damaged metadata.json" if storage.gfile.exists(metadata_file) else "shards or a vocab.txt")
                raise UserInputError(f"--output {output}: holds {what} of a different configuration; "
                                     "pass --overwrite to replace it, or choose another directory")
            _remove(metadata_file)  # first: nothing may look complete while the rest goes
            marker_file = storage.join(output, _MARKER)
            _write_json(marker_file, {"config_fingerprint": fingerprint})  # now an unfinished run of ours
            for path in _our_files(output):
                if path != marker_file:
                    _remove(path)
    for path in _our_files(output):
        if ".tmp-" in path:
            _remove(path)  # a shard or file whose writer was killed
    storage.gfile.makedirs(storage.join(output, _PROGRESS))
    _write_json(storage.join(output, _MARKER), {"config_fingerprint": fingerprint})
    return None


def _intact(output: str, metadata: dict, fingerprint: str) -> bool:
    """Check a finished directory; if it is damaged, turn it back into an unfinished run and say so.

    The shards that are intact keep their stats (metadata.json's `shards`, written back to
    `.progress/`), so that only the damaged ones are rewritten. The marker goes first and
    metadata.json last, so a kill in between leaves either the damaged finished state (checked
    again next time) or an unfinished run.
    """
    try:
        prepared_corpus.check_metadata(metadata, prepared_corpus.metadata_path(output))
        damaged = prepared_corpus.damaged_shards(output, metadata, digests=True)
    except UserInputError as e:
        log.warning("%s", e)
        damaged = {name: "unreadable" for name in metadata.get("shards", {})}
        metadata = {"shards": {}}
    vocab = prepared_corpus.vocab_path(output)
    vocab_ok = (storage.gfile.exists(vocab)
                and storage.file_sha256(vocab) == metadata.get("wordpiece", {}).get("sha256"))
    if not damaged and vocab_ok:
        return True  # (an older run's metadata records no sizes: presence is what can be checked)
    problems = [f"{name} is {what}" for name, what in damaged.items()]
    if not vocab_ok:
        problems.append(f"{prepared_corpus.VOCAB_FILE} is missing or not the one recorded")
    log.warning("%s: prepared with this configuration, but %s; rewriting what is damaged", output,
                "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
    _write_json(storage.join(output, _MARKER), {"config_fingerprint": fingerprint})
    storage.gfile.makedirs(storage.join(output, _PROGRESS))
    for name, stats in metadata.get("shards", {}).items():
        if name not in damaged:
            _write_json(storage.join(output, _PROGRESS, name + ".json"), stats)
    _remove(prepared_corpus.metadata_path(output))
    for name in damaged:
        _remove(storage.join(output, name))
    if not vocab_ok:
        _remove(vocab)
    return False


def _progress_path(output: str, task: ShardTask) -> str:
    return storage.join(output, _PROGRESS, task.name + ".json")


def _is_done(output: str, task: ShardTask) -> bool:
    """Written by an earlier run: the shard and its stats exist, and the shard has the size recorded."""
    path = storage.join(output, task.name)
    stats = _read_json(_progress_path(output, task))
    if stats is None or not storage.gfile.exists(path):
        return False
    return (stats.get("bytes") in (None, storage.gfile.stat(path).length)
            and stats.get("sha256") in (None, storage.file_sha256(path)))


# ---------------------------------------------------------------------------------------------
# One shard.

def shard_documents(scan: CorpusScan, doc_indices: np.ndarray) -> Iterator[tuple[int, str]]:
    """(global index, text) of the given documents, reading only the files that hold them."""
    if not len(doc_indices):
        return
    first_of_file = np.concatenate([[0], np.cumsum(scan.docs_per_file)])
    wanted = set(doc_indices.tolist())
    lo, hi = int(doc_indices[0]), int(doc_indices[-1])
    for f, path in enumerate(scan.files):
        if first_of_file[f + 1] <= lo or first_of_file[f] > hi:
            continue
        for i, doc in enumerate(documents.read_documents(path), start=int(first_of_file[f])):
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
        self.encoder = wordpiece.WordPieceEncoder(context.vocab_txt)
        self.matchers = {name: segmentation.NgramMatcher(_load_ngrams(source)) for name, source in context.units}

    def sequences(self, docs: Iterator[tuple[int, str]], packer: SequencePacker) -> Iterator[dict[str, np.ndarray]]:
        """Packed sequences of the documents, in order."""
        for doc_indices, texts in _batches(docs):
            words = split_words_ragged(tf.constant(texts))
            flat_words, doc_word_splits = words.flat_values, words.row_splits.numpy()
            ids, word_token_splits = self.encoder.encode_words(flat_words)
            pieces_per_word = np.diff(word_token_splits)
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
        try:
            with tf.io.TFRecordWriter(tmp) as writer:
                for features in self.sequences(shard_documents(ctx.scan, task.doc_indices), packer):
                    writer.write(encode(features))
                    stats["sequences"] += 1
                    stats["tokens"] += len(features[prepared_corpus.INPUT_IDS])
            stats["content_tokens"] = packer.tokens
            stats["multiword_tokens"] = dict(packer.multiword_tokens)
            stats["bytes"] = storage.gfile.stat(tmp).length
            stats["sha256"] = storage.file_sha256(tmp)
            _write_json(_progress_path(ctx.output, task), stats)
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
        counts = wordpiece.count_words(documents.iter_document_batches(scan.files, _BATCH_CHARS))
        tokens = wordpiece.train_vocab(counts, config.wordpiece_size)
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

    @property
    def vocab_txt(self) -> str:
        return prepared_corpus.vocab_path(self.config.output)

    def worker_context(self) -> WorkerContext:
        c = self.config
        return WorkerContext(c.output, self.vocab_txt, c.units, c.seq_len, c.seed, self.scan)


def plan_prepare(config: PrepareConfig) -> PreparePlan | dict:
    """Check the inputs, claim the output and list the shards still to write.

    Returns the finished metadata instead when `config.output` is already prepared with this
    exact configuration, so a rerun of a complete job does nothing.
    """
    check_config(config)
    files = documents.expand_inputs(config.inputs)
    check_output_apart(config, files)
    given = wordpiece_vocab.load_vocab(config.wordpiece) if config.wordpiece is not None else None
    units = load_unit_vocabularies(config.units)
    scan = scan_corpus(files, config.progress)
    if scan.documents == 0:
        raise UserInputError(f"--input {' '.join(config.inputs)}: the corpus holds no documents")
    is_validation = assign_documents(scan.documents, config.validation_fraction, config.seed)
    counts = shard_counts(config, scan, is_validation)
    wordpiece_id = ({"sha256": wordpiece_vocab.vocab_sha256(given)} if given is not None
                    else {"trained_size": config.wordpiece_size})
    fingerprint = config_fingerprint(config, scan, wordpiece_id, units, counts)

    done = claim_output(config.output, fingerprint, config.overwrite)
    if done is not None:
        log.info("%s: already prepared with this configuration", config.output)
        return done
    tasks = shard_tasks(is_validation, counts)
    todo = [t for t in tasks if not _is_done(config.output, t)]
    if len(todo) < len(tasks):
        log.info("resuming: %d of %d shards already written", len(tasks) - len(todo), len(tasks))
    return PreparePlan(config, scan, given, units, fingerprint, counts, tasks, todo)


def finish_prepare(plan: PreparePlan) -> dict:
    """Once every shard is written: metadata.json last (it marks the directory complete), then tidy up."""
    output = plan.config.output
    tokens = wordpiece_vocab.load_vocab(plan.vocab_txt)
    metadata = _metadata(plan.config, plan.scan, tokens, plan.given_wordpiece is None, plan.units, plan.tasks,
                         plan.fingerprint)
    _write_json(prepared_corpus.metadata_path(output), metadata)
    _remove(storage.join(output, _PROGRESS))
    _remove(storage.join(output, _MARKER))
    return metadata


def prepare(config: PrepareConfig, on_shard_done: Callable[[ShardTask], None] | None = None) -> dict:
    """Prepare (or finish preparing) `config.output`; return its metadata."""
    with removed_unless_begun(config.output):
        plan = plan_prepare(config)
        if not isinstance(plan, PreparePlan):
            return plan
        _install_wordpiece(config, plan.scan, plan.given_wordpiece)
        _run_tasks(plan.worker_context(), plan.todo, config.workers, on_shard_done, config.progress)
        return finish_prepare(plan)


@contextlib.contextmanager
def removed_unless_begun(output: str) -> Iterator[None]:
    """On failure, remove an output directory this run created if it holds no work worth resuming.

    Finished shards and a trained vocab.txt are kept for the rerun that resumes them; a run that
    fails before either (a full disk, a bad input found late) leaves no directory behind.
    """
    created = not storage.gfile.exists(output)
    try:
        yield
    except BaseException:
        if created and storage.gfile.isdir(output) and not any(
                name.endswith(".tfrecord") or name == prepared_corpus.VOCAB_FILE
                for name in storage.gfile.listdir(output)):
            storage.remove_tree(output)
        raise


def _metadata(config: PrepareConfig, scan: CorpusScan, tokens: list[str], trained: bool, units: dict,
              tasks: list[ShardTask], fingerprint: str) -> dict:
    splits = {split: {"shards": 0, "sequences": 0, "tokens": 0, "content_tokens": 0, "documents": 0, "files": []}
              for split in prepared_corpus.SPLITS}
    multiword = dict.fromkeys(units, 0)
    shards = {}
    for task in tasks:
        stats = _read_json(_progress_path(config.output, task))
        shards[task.name] = stats
        split = splits[task.split]
        split["shards"] += 1
        split["files"].append(task.name)
        for key in ("sequences", "tokens", "content_tokens", "documents"):
            split[key] += stats[key]
        for name in units:
            multiword[name] += stats["multiword_tokens"][name]
    content = sum(s["content_tokens"] for s in splits.values())
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
    }
