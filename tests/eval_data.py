"""Small handmade inputs for the evaluation tests, in each task's distributed format.

A WordPiece vocabulary of a few dozen English words; GLUE TSVs, SQuAD 2.0 JSON and RACE
folders written exactly as those benchmarks ship them; toy tasks a two-layer encoder can fit
in a few dozen steps; and a checkpoint written through `pmi_jax.checkpoints`, as the trainer
writes it, for the command-line tests.
"""
from __future__ import annotations

import json
import os

import numpy as np

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = ["the", "a", "an", "cat", "dog", "sat", "on", "mat", "it", "was", "is", "movie", "film", "very",
          "quite", "of", "in", "and", "what", "which", "where", "who", "did", "city", "capital", "red",
          "blue", "green", "tall", "small"]
POSITIVE = ["good", "great", "fine"]
NEGATIVE = ["bad", "awful", "poor"]
CITIES = ["paris", "rome", "oslo", "lima"]
PIECES = ["cafe", "new", "york", "based", "##s", "##ed", "##ly", ".", ",", "?", "-", "(", ")", "'", "_"]
WORDS = FILLER + POSITIVE + NEGATIVE + CITIES + PIECES


def write_vocab(path: str) -> str:
    with open(path, "w") as f:
        f.write("\n".join(SPECIAL + WORDS) + "\n")
    return path


def vocab_size() -> int:
    return len(SPECIAL) + len(WORDS)


def tiny_config(max_position_embeddings: int = 64, dropout: float = 0.0):
    from pmi_jax.config import ModelConfig

    return ModelConfig(vocab_size=vocab_size(), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                       max_position_embeddings=max_position_embeddings, dropout_rate=dropout,
                       attention_dropout_rate=dropout)


def mlm_params(config, seed: int = 0):
    """Randomly initialised BertForMaskedLM parameters (unboxed), as a checkpoint holds them."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from pmi_jax.model import BertForMaskedLM

    ids = jnp.zeros((1, 8), jnp.int32)
    init = jax.jit(lambda key: BertForMaskedLM(config).init(key, ids, ids, deterministic=True))
    return nn.unbox(init(jax.random.key(seed)))["params"]


def _filler(rng, n: int) -> list[str]:
    return list(rng.choice(FILLER[:18], size=n))


# ---- toy tasks ---------------------------------------------------------------------------------

def sentiment(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """(text, label): label 1 iff the one sentiment word in the text is positive."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = i % 2
        words = _filler(rng, 5)
        words.insert(int(rng.integers(0, 6)), str(rng.choice(POSITIVE if label else NEGATIVE)))
        out.append((" ".join(words), label))
    return out


SCORES = {"awful": 0.0, "poor": 1.0, "fine": 2.5, "good": 4.0, "great": 5.0}


def similarity(n: int, seed: int = 0) -> list[tuple[str, str, float]]:
    """(a, b, score): the score is set by which one of five graded words b holds."""
    rng = np.random.default_rng(seed)
    graded = list(SCORES)
    out = []
    for i in range(n):
        word = graded[i % len(graded)]
        b = _filler(rng, 4)
        b.insert(int(rng.integers(0, 5)), word)
        out.append((" ".join(_filler(rng, 4)), " ".join(b), SCORES[word]))
    return out


def city_questions(n: int, seed: int = 0) -> list[dict]:
    """SQuAD 2.0 paragraphs: 'which city ?' answered by the one city in the context, if any."""
    rng = np.random.default_rng(seed)
    paragraphs = []
    for i in range(n):
        words = _filler(rng, 8)
        qa = {"id": f"q{seed}-{i}", "question": "which city ?"}
        if i % 4 == 3:
            qa.update(answers=[], is_impossible=True)
            context = " ".join(words) + " ."
        else:
            position = int(rng.integers(0, 9))
            city = str(rng.choice(CITIES)).capitalize()
            words.insert(position, city)
            context = " ".join(words) + " ."
            start = len(" ".join(words[:position])) + (1 if position else 0)
            qa.update(answers=[{"text": city, "answer_start": start}], is_impossible=False)
        paragraphs.append({"context": context, "qas": [qa]})
    return paragraphs


def choice_articles(n: int, seed: int = 0) -> list[dict]:
    """RACE records: 'which is good ?' — the right option holds a positive word, the others negative."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        answer = int(rng.integers(0, 4))
        options = [" ".join([str(rng.choice(POSITIVE if k == answer else NEGATIVE)), *_filler(rng, 1)])
                   for k in range(4)]
        out.append({"article": " ".join(_filler(rng, 12)), "questions": ["which is good ?"], "options": [options],
                    "answers": ["ABCD"[answer]], "id": f"{i}.txt"})
    return out


# ---- the distributed formats ---------------------------------------------------------------------

def write_tsv(path: str, header: list[str] | None, rows: list[list]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if header is not None:
            f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(str(x) for x in row) + "\n")


def write_rte(folder: str, train, dev) -> str:
    """RTE layout: index, sentence1, sentence2, label (entailment / not_entailment)."""
    header = ["index", "sentence1", "sentence2", "label"]
    for name, rows in (("train.tsv", train), ("dev.tsv", dev)):
        write_tsv(os.path.join(folder, name), header,
                  [[i, a, b, "entailment" if y else "not_entailment"] for i, (a, b, y) in enumerate(rows)])
    return folder


def write_squad(folder: str, train_paragraphs, dev_paragraphs) -> str:
    os.makedirs(folder, exist_ok=True)
    for name, paragraphs in (("train-v2.0.json", train_paragraphs), ("dev-v2.0.json", dev_paragraphs)):
        with open(os.path.join(folder, name), "w") as f:
            json.dump({"version": "v2.0", "data": [{"title": "toy", "paragraphs": paragraphs}]}, f)
    return folder


def write_race(folder: str, splits: dict[str, dict[str, list[dict]]]) -> str:
    """splits: {"train": {"high": [records], "middle": [...]}, "dev": {...}} -> RACE/split/level/N.txt"""
    for split, levels in splits.items():
        for level, records in levels.items():
            os.makedirs(os.path.join(folder, split, level), exist_ok=True)
            for i, record in enumerate(records):
                with open(os.path.join(folder, split, level, f"{i}.txt"), "w") as f:
                    json.dump(record, f)
    return folder


def save_checkpoint(workdir: str, config, params, *, data_dir: str, vocab_sha256: str | None, step: int = 7,
                    scheme: str = "pmi") -> str:
    """A checkpoint as `pmi-jax train` leaves it (parameters and the metadata evaluation reads)."""
    from pmi_jax.checkpoints import Checkpointer
    from pmi_jax.config import CheckpointConfig, to_dict

    checkpointer = Checkpointer(workdir, CheckpointConfig())
    checkpointer.save(step, {"params": params}, {
        "step": step, "model": to_dict(config), "data_dir": data_dir, "scheme": scheme,
        "vocab_size": config.vocab_size, "vocab_sha256": vocab_sha256})
    checkpointer.wait()
    checkpointer.close()
    return workdir
