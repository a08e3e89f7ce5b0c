"""A small prepared corpus in the exact on-disk format of `pmi-jax corpus prepare` (docs/design.md, "Prepared corpus").

Tests of the masking tasks need thousands of sequences with realistic structure: words of
one to three WordPiece tokens, documents packed back to back with a [SEP] between them,
and masking units of one to five words that differ per masking vocabulary (see `_Language`). Generating them
synthetically keeps the tests fast and independent of the corpus-preparation pipeline; the
lead will switch the fixtures to the real `prepare` once it exists, so this writer follows
the format contract to the letter and nothing more:

  DIR/vocab.txt                                 one token per line, id = line number,
                                                ids 0..4 = [PAD] [UNK] [CLS] [SEP] [MASK]
  DIR/{split}-{i:05d}-of-{n:05d}.tfrecord       tf.train.Example, int64 lists, unpadded:
      input_ids        [CLS] ... [SEP], a [SEP] between packed documents
      word_ids         whole-word index within the sequence, -1 on special tokens
      units_<name>     unit index within the sequence, -1 on special tokens
  DIR/metadata.json                             seq_len, special_ids, units, splits (with token_counts)

A word or unit cut by a sequence boundary continues as a new word or unit in the next
sequence, as in the real packing. File names, the record codec and the metadata layout come
from `preprocess.corpus_format`, the format's single definition.
"""
from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from pmi_jax.formats import prepared_corpus

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(5)

_SYLLABLES = ("ka", "lo", "mi", "re", "tu", "sen", "dor", "pa", "vi", "nel", "ost", "ru", "be", "qua")
_SUFFIXES = ("##s", "##ing", "##ed", "##er", "##ly", "##ion", "##al", "##ic", "##ness", "##ous")
_LEXICON_SIZE = 800  # words, each with a fixed WordPiece spelling of one to three tokens
_COLLOCATIONS = 200  # recurring phrases of two to five words
_COLLOCATION_RATE = 0.3  # share of text positions that start a collocation
# Share of the collocations each masking vocabulary lists: the PMI vocabularies cover more of
# the text than the frequency one, as in the paper's corpora.
_VOCABULARY_SHARE = {"pmi": 1.0, "naive_pmi": 0.8, "frequency": 0.6}


def vocabulary() -> list[str]:
    """Special tokens, then pseudo-word stems of two syllables, then suffix pieces."""
    stems = [a + b for a in _SYLLABLES for b in _SYLLABLES]
    return list(SPECIAL_TOKENS) + stems + list(_SUFFIXES)


def _zipf(n: int) -> np.ndarray:
    weights = 1.0 / (np.arange(n) + 2.7)
    return weights / weights.sum()


class _Language:
    """A toy language: Zipf-distributed words and recurring multi-word collocations.

    Text is learnable (frequent words, predictable collocations) and the masking units have
    the structure of real ones: each masking vocabulary lists some of the collocations, and
    an occurrence of a listed collocation is one unit, every other word a unit of its own.
    """

    def __init__(self, rng: np.random.Generator, unit_names: tuple[str, ...]):
        tokens = vocabulary()
        stems = [i for i, t in enumerate(tokens) if i >= len(SPECIAL_TOKENS) and not t.startswith("##")]
        suffixes = [i for i, t in enumerate(tokens) if t.startswith("##")]
        spellings = set()
        while len(spellings) < _LEXICON_SIZE:
            pieces = 1 + rng.choice(3, p=[0.6, 0.3, 0.1])
            spellings.add((int(rng.choice(stems)), *(int(x) for x in rng.choice(suffixes, size=pieces - 1))))
        self.words = [list(w) for w in sorted(spellings)]
        rng.shuffle(self.words)
        self.collocations = [rng.choice(_LEXICON_SIZE, size=int(rng.integers(2, 6)), p=_zipf(_LEXICON_SIZE)).tolist()
                             for _ in range(_COLLOCATIONS)]
        self.listed = {name: rng.random(_COLLOCATIONS) < _VOCABULARY_SHARE.get(name, 0.5) for name in unit_names}

    def document(self, rng: np.random.Generator, num_words: int):
        """(words as token-id lists, {name: unit index per word}) for one document."""
        starts_collocation = rng.random(num_words) < _COLLOCATION_RATE
        collocation_draws = rng.choice(_COLLOCATIONS, size=num_words, p=_zipf(_COLLOCATIONS))
        word_draws = rng.choice(_LEXICON_SIZE, size=num_words, p=_zipf(_LEXICON_SIZE))
        words, units = [], {name: [] for name in self.listed}
        for i in range(num_words):
            if len(words) == num_words:
                break
            if starts_collocation[i]:
                c = int(collocation_draws[i])
                chunk, listed = self.collocations[c][:num_words - len(words)], {n: v[c] for n, v in self.listed.items()}
            else:
                chunk, listed = [int(word_draws[i])], {}
            for name, unit_of_word in units.items():
                first = unit_of_word[-1] + 1 if unit_of_word else 0
                unit_of_word.extend([first] * len(chunk) if listed.get(name) else range(first, first + len(chunk)))
            words.extend(self.words[w] for w in chunk)
        return words, units


def _token_stream(rng, num_tokens, unit_names):
    """Documents flattened to per-token (id, doc, word, units...) rows with global indices."""
    language = _Language(rng, unit_names)
    rows = []  # (token id, document, global word, global unit per name...)
    doc = word_base = 0
    unit_base = dict.fromkeys(unit_names, 0)
    while len(rows) < num_tokens:
        num_words = int(rng.choice([int(rng.integers(3, 12)), int(rng.integers(12, 150))]))
        words, units = language.document(rng, num_words)
        for w, word in enumerate(words):
            for token in word:
                rows.append((token, doc, word_base + w, *(units[n][w] + unit_base[n] for n in unit_names)))
        for n in unit_names:
            unit_base[n] += units[n][-1] + 1
        word_base += num_words
        doc += 1
    return rows


def _dense_index(values: list[int]) -> list[int]:
    """Renumber ids 0, 1, 2, ... in order of first appearance; -1 stays -1."""
    mapping: dict[int, int] = {}
    return [-1 if v < 0 else mapping.setdefault(v, len(mapping)) for v in values]


def _pack(rows, seq_len: int, unit_names):
    """Pack the token stream into [CLS] ... [SEP] sequences with [SEP] between documents."""
    sequences, i = [], 0
    while i < len(rows):
        ids, words, units = [CLS], [-1], {n: [-1] for n in unit_names}
        doc = rows[i][1]
        while i < len(rows) and len(ids) < seq_len - 1:
            token, token_doc, word, *token_units = rows[i]
            if token_doc != doc:
                doc = token_doc
                if len(ids) >= seq_len - 2:
                    break  # no room for a separator and a token
                ids.append(SEP)
                words.append(-1)
                for n in unit_names:
                    units[n].append(-1)
            ids.append(token)
            words.append(word)
            for n, u in zip(unit_names, token_units):
                units[n].append(u)
            i += 1
        ids.append(SEP)
        words.append(-1)
        for n in unit_names:
            units[n].append(-1)
        features = {"input_ids": ids, "word_ids": _dense_index(words)}
        features.update({f"units_{n}": _dense_index(units[n]) for n in unit_names})
        sequences.append(features)
    return sequences


def unit_fate(shown: np.ndarray, original: np.ndarray) -> str:
    """The 80/10/10 fate of one selected unit from what the model sees: "mask" (all [MASK]),
    "keep" (all original; a randomised unit whose draws equal the originals counts here) or "random"."""
    if (shown == MASK).all():
        return "mask"
    return "keep" if (shown == original).all() else "random"


def write_prepared_corpus(
    data_dir: str,
    *,
    sequences: dict[str, int] | None = None,
    shards: dict[str, int] | None = None,
    seq_len: int = 128,
    unit_names: tuple[str, ...] = ("pmi", "naive_pmi", "frequency"),
    seed: int = 0,
) -> dict:
    """Write a prepared corpus to `data_dir` and return its metadata.

    `sequences` is approximate per split (packing decides the exact count, recorded in the
    metadata); the last sequence of each split is shorter than `seq_len`, as in real data.
    """
    sequences = sequences or {"train": 400, "validation": 40}
    shards = shards or {"train": 3, "validation": 1}
    rng = np.random.default_rng(seed)
    vocab = vocabulary()
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, prepared_corpus.VOCAB_FILE), "w") as f:
        f.write("\n".join(vocab) + "\n")
    splits = {}
    for split, count in sequences.items():
        rows = _token_stream(rng, count * (seq_len - 3) - seq_len // 2, unit_names)
        packed = _pack(rows, seq_len, unit_names)
        n = shards[split]
        bounds = np.linspace(0, len(packed), n + 1).astype(int)
        names = [prepared_corpus.shard_name(split, i, n) for i in range(n)]
        for i, name in enumerate(names):
            with tf.io.TFRecordWriter(os.path.join(data_dir, name)) as writer:
                for features in packed[bounds[i]:bounds[i + 1]]:
                    writer.write(prepared_corpus.encode_example(features))
        splits[split] = {
            "shards": n,
            "sequences": len(packed),
            "tokens": sum(len(s["input_ids"]) for s in packed),
            "files": names,
            prepared_corpus.TOKEN_COUNTS: sum(prepared_corpus.content_token_counts(s, len(vocab)) for s in packed).tolist(),
        }
    units = {name: {"source": "synthetic", "entries": int(_VOCABULARY_SHARE.get(name, 0.5) * _COLLOCATIONS)}
             for name in unit_names}
    return _write_metadata(data_dir, vocab, splits, seq_len=seq_len, seed=seed, units=units)


def _write_metadata(data_dir: str, vocab: list[str], splits: dict, *, seq_len: int, seed: int, units: dict) -> dict:
    """metadata.json of a test corpus whose shards are written (their sizes are read here)."""
    metadata = {
        "format_version": prepared_corpus.FORMAT_VERSION,
        "seq_len": seq_len,
        "seed": seed,
        "wordpiece": {"path": prepared_corpus.VOCAB_FILE, "size": len(vocab), "trained": True},
        "special_ids": {"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP, "mask": MASK},
        "units": units,
        "splits": splits,
        "shards": {name: {"bytes": os.path.getsize(os.path.join(data_dir, name))}
                   for split in splits.values() for name in split["files"]},
    }
    with open(prepared_corpus.metadata_path(data_dir), "w") as f:
        json.dump(metadata, f, indent=2)
    return metadata


def read_prepared_split(data_dir: str, split: str) -> list[dict[str, np.ndarray]]:
    """All sequences of a split in file order, as NumPy arrays (for test oracles)."""
    records = tf.data.TFRecordDataset(prepared_corpus.PreparedCorpus(data_dir).files(split))
    return [prepared_corpus.decode_example(r) for r in records.as_numpy_iterator()]


def write_given_sequences(data_dir: str, vocab: list[str], sequences: dict[str, list[list[int]]]) -> dict:
    """A prepared corpus holding exactly `sequences` ({split: [input_ids with [CLS] and [SEP]]}),
    each token a word of its own, in one shard per split; for oracles computed by hand."""
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, prepared_corpus.VOCAB_FILE), "w") as f:
        f.write("\n".join(vocab) + "\n")
    splits = {}
    for split, rows in sequences.items():
        name = prepared_corpus.shard_name(split, 0, 1)
        with tf.io.TFRecordWriter(os.path.join(data_dir, name)) as writer:
            for ids in rows:
                words = np.cumsum([t not in (CLS, SEP) for t in ids]) - 1
                words = np.where(np.isin(ids, [CLS, SEP]), -1, words)
                writer.write(prepared_corpus.encode_example({"input_ids": ids, "word_ids": words}))
        splits[split] = {"shards": 1, "sequences": len(rows), "tokens": sum(map(len, rows)), "files": [name]}
    seq_len = max(len(ids) for rows in sequences.values() for ids in rows)
    return _write_metadata(data_dir, vocab, splits, seq_len=seq_len, seed=0, units={})
