"""InforMask's token-specific masking rates on disk (docs/design.md, "InforMask"): one JSON file in a prepared corpus.

`DATA/informask_rates.json`, written by `pmi-jax corpus informask` (pmi_jax/informask.py)
and read by the `informask` scheme. It lives in the data directory, not beside the masking
vocabularies, because a rate belongs to a WordPiece id of that corpus's vocab.txt and was
measured on that corpus's train split: the file records both (`source`), and a corpus prepared
again differently makes it stale, which `read_rates` refuses. Keys: format_version, source
{vocab_sha256, train}, options, totals, and per token id `occurrences`, `masked`, `rates`.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from pmi_jax import storage
from pmi_jax.errors import UserInputError

FORMAT_VERSION = 1
FILE = "informask_rates.json"


def path(data_dir: str) -> str:
    return storage.join(data_dir, FILE)


def exists(data_dir: str) -> bool:
    return storage.gfile.exists(path(data_dir))


def corpus_source(corpus) -> dict:
    """What the rates were measured on: the vocabulary's sha256 and a digest of the train split
    as metadata.json records it (its files, their sizes and digests, its counts)."""
    train = corpus.metadata["splits"]["train"]
    shards = {name: corpus.metadata.get("shards", {}).get(name) for name in train.get("files", [])}
    record = json.dumps({"split": train, "shards": shards, "fingerprint": corpus.metadata.get("config_fingerprint")},
                        sort_keys=True)
    return {"vocab_sha256": corpus.vocab_sha256, "train": hashlib.sha256(record.encode()).hexdigest()}


def write_rates(data_dir: str, content: dict) -> None:
    """Write the file atomically: the old one, if any, stays whole until the new one is complete.
    Floats are written by Python's shortest repr, so equal inputs give identical bytes."""
    with storage.atomic_file(path(data_dir)) as f:
        f.write(json.dumps({"format_version": FORMAT_VERSION, **content}, sort_keys=True, indent=1) + "\n")


def read_content(data_dir: str) -> dict:
    """The parsed file, its structure checked; a one-line error naming the file otherwise."""
    file = path(data_dir)
    advice = f"; rerun `pmi-jax corpus informask {data_dir} --overwrite`"
    if not storage.gfile.exists(file):
        raise UserInputError(f"{data_dir}: no InforMask rates ({FILE}); run `pmi-jax corpus informask {data_dir}`")
    content = storage.read_json_object(file, advice)
    if content.get("format_version") != FORMAT_VERSION:
        raise UserInputError(f"{file}: format_version {content.get('format_version')!r}, this pmi-jax reads "
                             f"{FORMAT_VERSION}{advice}")
    rates = content.get("rates")
    if not isinstance(rates, list) or not all(isinstance(r, (int, float)) and 0 <= r <= 1 for r in rates):
        raise UserInputError(f"{file}: 'rates' is not a list of shares in [0, 1]{advice}")
    if not isinstance(content.get("source"), dict):
        raise UserInputError(f"{file}: no 'source' object{advice}")
    return content


def read_rates(corpus) -> np.ndarray:
    """float64 [vocab size]: each token id's masking rate, checked against the corpus it was
    measured on (a `PreparedCorpus`)."""
    content = read_content(corpus.data_dir)
    file = path(corpus.data_dir)
    if content["source"] != corpus_source(corpus):
        raise UserInputError(f"{file}: measured on another version of {corpus.data_dir} (its vocab.txt or train "
                             f"split changed since); rerun `pmi-jax corpus informask {corpus.data_dir} --overwrite`")
    rates = np.asarray(content["rates"], np.float64)
    if len(rates) != corpus.vocab_size:
        raise UserInputError(f"{file}: {len(rates)} rates for a vocabulary of {corpus.vocab_size} tokens; rerun "
                             f"`pmi-jax corpus informask {corpus.data_dir} --overwrite`")
    return rates
