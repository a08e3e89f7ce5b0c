"""The output directory of `corpus prepare` as a resumable job: claim it, resume it, finish it.

A marker file holds the configuration's fingerprint while a run is unfinished; `.progress/` holds
the stats of each finished shard. A rerun of the same configuration skips what is done, one of
another configuration is refused unless --overwrite, and a finished directory that turns out
damaged is reopened to rewrite only the damaged files (docs/reliability.md).
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Iterator, Sequence

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import informask_rates, prepared_corpus, run_dir
from pmi_jax.preprocess.text import documents

log = logging.getLogger("pmi_jax.preprocess.corpus.prepare")

MARKER = ".prepare.json"      # the configuration of an unfinished run
PROGRESS_DIR = ".progress"    # per-shard stats of finished shards



def _our_files(output: str) -> list[str]:
    """Files in `output` that a prepare run writes (shards, vocab, metadata, marker, temporaries),
    and the InforMask rates measured on it: they go with the corpus they were measured on."""
    if not storage.gfile.isdir(output):
        return []
    return [storage.join(output, name) for name in storage.gfile.listdir(output) if _is_ours(name)]


def _is_ours(name: str) -> bool:
    name = name.rstrip("/")
    return (name.endswith(".tfrecord") or ".tmp-" in name
            or name in (prepared_corpus.VOCAB_FILE, prepared_corpus.TOKENIZER_FILE, prepared_corpus.METADATA_FILE,
                        MARKER, PROGRESS_DIR, informask_rates.FILE))


def check_output_apart(config, files: Sequence[str]) -> None:
    """Refuse an --output that would mix the corpus into something else or feed a later run.

    It may not hold files that prepare does not write (a masking vocabulary directory, say),
    be an --input directory or lie inside one (the next run would read this output as input),
    or hold an --input file (--overwrite would delete it).
    """
    output = config.output.rstrip("/")
    run_dir.check_new_output(output, overwrite=True, directory=True)
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


def read_json(path: str) -> dict | None:
    """A JSON file written by this module, or None if it is absent or unreadable (a damaged run)."""
    if not storage.gfile.exists(path):
        return None
    try:
        with storage.gfile.GFile(path, "r") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: str, value: dict) -> None:
    with storage.atomic_file(path) as f:
        f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def remove(path: str) -> None:
    storage.remove_tree(path)


def claim_output(output: str, fingerprint: str, overwrite: bool, digests: bool = True) -> dict | None:
    """Make `output` ours for this configuration; return its metadata if it is already complete.

    Complete means: metadata.json of this configuration, vocab.txt with the hash it records, and
    every shard it lists with the size it records (and, with `digests`, its sha256: a read of every
    shard, which the Beam launcher leaves out). A directory that is not (a shard deleted or
    truncated) is reopened as an unfinished run that rewrites only what is damaged. A directory
    left by another configuration is an error unless --overwrite, which deletes metadata.json
    first (so nothing looks complete meanwhile), then the other files a prepare run writes.
    Leftover temporary files of an interrupted run are deleted.
    """
    metadata_file = prepared_corpus.metadata_path(output)
    metadata = read_json(metadata_file)
    marker = read_json(storage.join(output, MARKER))
    found = (metadata or marker or {}).get("config_fingerprint")
    if found == fingerprint and metadata is not None:
        if _intact(output, metadata, fingerprint, digests):
            remove(storage.join(output, PROGRESS_DIR))  # left if a run was killed right after its metadata
            remove(storage.join(output, MARKER))
            return metadata
    else:
        ours = _our_files(output)
        if found != fingerprint and ours:
            if not overwrite:
                what = ("a prepared corpus" if metadata else "an unfinished run" if marker
                        else "a damaged metadata.json" if storage.gfile.exists(metadata_file) else "shards or a vocab.txt")
                raise UserInputError(f"--output {output}: holds {what} of a different configuration; "
                                     "pass --overwrite to replace it, or choose another directory")
            remove(metadata_file)  # first: nothing may look complete while the rest goes
            marker_file = storage.join(output, MARKER)
            write_json(marker_file, {"config_fingerprint": fingerprint})  # now an unfinished run of ours
            for path in _our_files(output):
                if path != marker_file:
                    remove(path)
    for path in _our_files(output):
        if ".tmp-" in path:
            remove(path)  # a shard or file whose writer was killed
    storage.gfile.makedirs(storage.join(output, PROGRESS_DIR))
    write_json(storage.join(output, MARKER), {"config_fingerprint": fingerprint})
    return None


def _intact(output: str, metadata: dict, fingerprint: str, digests: bool) -> bool:
    """Check a finished directory; if it is damaged, turn it back into an unfinished run and say so.

    The shards that are intact keep their stats (metadata.json's `shards`, written back to
    `.progress/`), so that only the damaged ones are rewritten. The marker goes first and
    metadata.json last, so a kill in between leaves either the damaged finished state (checked
    again next time) or an unfinished run.
    """
    try:
        prepared_corpus.check_metadata(metadata, prepared_corpus.metadata_path(output))
        damaged = prepared_corpus.damaged_shards(output, metadata, digests=digests)
    except UserInputError as e:
        log.warning("%s", e)
        damaged = {name: "unreadable" for name in metadata.get("shards", {})}
        metadata = {"shards": {}}
    vocab = prepared_corpus.vocab_path(output)
    vocab_ok = (storage.gfile.exists(vocab)
                and storage.file_sha256(vocab) == metadata.get("wordpiece", {}).get("sha256"))
    if "tokenizer" in metadata:  # `--tokenizer`: its tokenizer.json is checked like vocab.txt
        tokenizer = prepared_corpus.tokenizer_path(output)
        vocab_ok = vocab_ok and (storage.gfile.exists(tokenizer)
                                 and storage.file_sha256(tokenizer) == metadata["tokenizer"].get("sha256"))
    if not damaged and vocab_ok:
        return True  # (an older run's metadata records no sizes: presence is what can be checked)
    problems = [f"{name} is {what}" for name, what in damaged.items()]
    if not vocab_ok:
        problems.append(f"{prepared_corpus.VOCAB_FILE} or {prepared_corpus.TOKENIZER_FILE} is missing or not the "
                        "one recorded")
    log.warning("%s: prepared with this configuration, but %s; rewriting what is damaged", output,
                "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
    write_json(storage.join(output, MARKER), {"config_fingerprint": fingerprint})
    storage.gfile.makedirs(storage.join(output, PROGRESS_DIR))
    for name, stats in metadata.get("shards", {}).items():
        if name not in damaged:
            write_json(storage.join(output, PROGRESS_DIR, name + ".json"), stats)
    remove(prepared_corpus.metadata_path(output))
    for name in damaged:
        remove(storage.join(output, name))
    if not vocab_ok:
        remove(vocab)
        remove(prepared_corpus.tokenizer_path(output))
    return False


def progress_path(output: str, task) -> str:
    return storage.join(output, PROGRESS_DIR, task.name + ".json")


def is_done(output: str, task) -> bool:
    """Written by an earlier run: the shard and its stats exist, and the shard has the size and
    sha256 recorded."""
    path = storage.join(output, task.name)
    stats = read_json(progress_path(output, task))
    if stats is None or not storage.gfile.exists(path):
        return False
    return (stats.get("bytes") in (None, storage.gfile.stat(path).length)
            and stats.get("sha256") in (None, storage.file_sha256(path)))


def forget_damaged(output: str, task) -> bool:
    """A shard recorded as written that is not intact loses its record and its file, so that the next
    listing of .progress/ counts it as still to write; True if it did. The Beam runner calls this on
    its workers, one shard each, so that a resume does not read every written shard on the launcher."""
    if is_done(output, task):
        return False
    remove(progress_path(output, task))
    remove(storage.join(output, task.name))
    return True


def close_run(output: str) -> None:
    """After metadata.json is written: the run's bookkeeping goes."""
    remove(storage.join(output, PROGRESS_DIR))
    remove(storage.join(output, MARKER))


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
