"""RACE (Lai et al. 2017): multiple-choice reading comprehension from English exams.

The distributed data is a folder `RACE/{train,dev,test}/{high,middle}/*.txt`, each file one
JSON object: an `article` with parallel lists `questions`, `options` (four strings each) and
`answers` ("A".."D"). Every (article, question, option) becomes `[CLS] article [SEP] qa [SEP]`,
where qa is the question with its blank ("_") filled by the option, or else the question
followed by the option; the article side is the one cut when the pair is too long. The head
scores the four encodings and a softmax over them picks the answer. Reported: accuracy (×100)
overall, and on the high-school and middle-school parts when both are present; the test split
(`test/`, public with its answers) is scored the same way.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Sequence

import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.eval import heads, metrics
from pmi_jax.eval.bert_inputs import pack
from pmi_jax.vocabularies import WordPieceVocabulary
from pmi_jax.storage import gfile, join

LEVELS = ("high", "middle")
NUM_OPTIONS = 4


@dataclasses.dataclass(frozen=True)
class RaceExample:
    article: str
    question: str
    options: tuple[str, ...]
    label: int  # index of the right option
    level: str  # "high" or "middle"


def question_with_option(question: str, option: str) -> str:
    return question.replace("_", option) if "_" in question else f"{question} {option}"


def examples_from_record(record: dict, level: str, where: str) -> list[RaceExample]:
    try:
        questions, options, answers = record["questions"], record["options"], record["answers"]
        article = record["article"]
    except (KeyError, TypeError):
        raise UserInputError(f"{where}: not a RACE file (needs article, questions, options, answers)") from None
    if not len(questions) == len(options) == len(answers):
        raise UserInputError(f"{where}: {len(questions)} questions, {len(options)} option lists, "
                             f"{len(answers)} answers")
    examples = []
    for question, choices, answer in zip(questions, options, answers):
        if len(choices) != NUM_OPTIONS or answer not in ("A", "B", "C", "D"):
            raise UserInputError(f"{where}: a RACE question has {NUM_OPTIONS} options and an answer A-D "
                                 f"(got {len(choices)} options, answer {answer!r})")
        examples.append(RaceExample(article, question, tuple(choices), "ABCD".index(answer), level))
    return examples


def read_race(path: str, split: str, levels: Sequence[str]) -> list[RaceExample]:
    """Examples of `split` (train/dev/test) for the given levels, files in sorted order."""
    examples = []
    for level in levels:
        folder = join(path, split, level)
        if not gfile.isdir(folder):
            raise UserInputError(f"--data {path}: not a RACE folder (expected {split}/{level}/ holding *.txt)")
        for name in sorted(gfile.listdir(folder)):
            if not name.endswith(".txt"):
                continue
            where = join(folder, name)
            with gfile.GFile(where, "rb") as f:
                try:
                    record = json.loads(f.read().decode("utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise UserInputError(f"{where}: not a RACE file (not JSON)") from None
            examples.extend(examples_from_record(record, level, where))
    if not examples:
        raise UserInputError(f"--data {path}: no RACE questions under {split}/{'|'.join(levels)}")
    return examples


def from_tfds(dataset, level: str) -> list[RaceExample]:
    """Examples from a tf.data.Dataset of TFDS `race/*` feature dicts (one article each)."""
    examples = []
    for f in dataset.as_numpy_iterator():
        record = {"article": f["article"].decode("utf-8"),
                  "questions": [q.decode("utf-8") for q in f["questions"]],
                  "options": [[o.decode("utf-8") for o in opts] for opts in f["options"]],
                  "answers": [a.decode("utf-8") for a in f["answers"]]}
        examples.extend(examples_from_record(record, level, "TFDS race example"))
    return examples


@dataclasses.dataclass(frozen=True)
class RaceTask:
    name: str
    levels: tuple[str, ...]
    epochs: int = 4
    max_seq_len: int = 512
    kind: str = "choice"
    selection_metric: str = "accuracy"

    def read(self, path: str, split: str) -> list[RaceExample]:
        return read_race(path, split, self.levels)

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list[RaceExample]:
        import tensorflow_datasets as tfds

        base = name.split(":")[0].split("/")[0]  # the task's levels decide which configs are read
        examples = []
        for level in self.levels:
            builder = tfds.builder(f"{base}/{level}", data_dir=data_dir)
            tfds_split = "train" if split == "train" else next(
                (s for s in ("dev", "validation") if s in builder.info.splits), "dev")
            examples.extend(from_tfds(builder.as_dataset(split=tfds_split), level))
        return examples

    def head(self, config):
        return heads.MultipleChoice(config)

    @property
    def loss(self):
        return heads.classification_loss

    def encode(self, examples: Sequence[RaceExample], wordpiece: WordPieceVocabulary,
               max_seq_len: int) -> heads.Encoded:
        articles = list(dict.fromkeys(e.article for e in examples))
        article_ids = dict(zip(articles, wordpiece.encode_batch(articles)))
        answers = wordpiece.encode_batch([question_with_option(e.question, o) for e in examples for o in e.options])
        pairs = [(article_ids[e.article], answers[NUM_OPTIONS * i + k])
                 for i, e in enumerate(examples) for k in range(NUM_OPTIONS)]
        packed = pack(wordpiece, pairs, max_seq_len)
        arrays = {k: v.reshape(len(examples), NUM_OPTIONS, max_seq_len) for k, v in packed.as_dict().items()}
        arrays["label"] = np.array([e.label for e in examples], np.int32)
        return heads.Encoded(arrays, np.array([e.level for e in examples]))

    def evaluate(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded) -> dict[str, float]:
        predictions = np.argmax(outputs["logits"], axis=-1)
        labels = encoded.arrays["label"]
        result = {"accuracy": 100.0 * metrics.accuracy(predictions, labels)}
        if len(self.levels) > 1:
            for level in self.levels:
                keep = encoded.info == level
                if keep.any():
                    result[f"accuracy_{level}"] = 100.0 * metrics.accuracy(predictions[keep], labels[keep])
        result["score"] = result["accuracy"]
        return result

    def has_labels(self, encoded: heads.Encoded) -> bool:
        del encoded  # RACE's test set is public, with its answers: test accuracy is reported
        return True

    def write_predictions(self, outputs, encoded, examples, directory: str):
        del outputs, encoded, examples, directory  # RACE has no prediction leaderboard format
        return []


TASKS = {t.name: t for t in [RaceTask("race", LEVELS), RaceTask("race/high", ("high",)),
                             RaceTask("race/middle", ("middle",))]}
