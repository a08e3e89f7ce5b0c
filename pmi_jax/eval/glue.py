"""GLUE (Wang et al. 2019): the nine tasks, read from the distributed TSVs or from TFDS.

Each task is one row of `TASKS` (TSV columns found by header name, so a wrong file fails loudly;
labels, metrics, TFDS names). Scores follow the GLUE leaderboard, ×100; `score` selects by the
paper's metric (Levine et al. 2021, Table 8's caption: dev accuracy, Spearman for STS-B, Matthews
for CoLA; MNLI matched, our choice). `write_predictions` writes the GLUE server's test files.
Details: docs/design.md, "Module notes", glue.py.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import logging
from typing import Iterator, Sequence

import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.eval import heads, metrics
from pmi_jax.eval.bert_inputs import pack
from pmi_jax.vocabularies import WordPieceVocabulary
from pmi_jax.storage import gfile, join

_FIELD_SIZE_LIMIT = 1 << 24  # characters; csv's default of 131,072 is too small for some GLUE fields


@contextlib.contextmanager
def csv_field_size_limit(limit: int) -> Iterator[None]:
    """csv's field size limit is one value for the whole process: raise it for this block only."""
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


@dataclasses.dataclass(frozen=True)
class GlueExample:
    text_a: str
    text_b: str | None
    label: float  # class index, or the similarity score for STS-B; -1 (NaN for STS-B) on test sets
    subset: str = ""  # "" or "mismatched" (MNLI's second dev and test set)
    guid: str = ""  # the test file's index / id


@dataclasses.dataclass(frozen=True)
class GlueTask:
    name: str
    folder: str  # directory name in GLUE's download
    text_columns: tuple  # header names, or column indices when the file has no header
    label_column: str | int
    labels: tuple[str, ...] | None  # label strings as in the TSV; None for regression
    metric_names: tuple[str, ...]
    tfds_text: tuple[str, ...]  # TFDS feature names, same order as text_columns
    tfds_labels: tuple[str, ...] | None = None  # TSV label string of each TFDS class index
    dev_files: tuple[tuple[str, str], ...] = (("dev.tsv", ""),)  # (file, subset)
    tfds_dev: tuple[tuple[str, str], ...] = (("validation", ""),)
    has_header: bool = True
    skip_short_rows: bool = False  # QQP's distributed train.tsv has a few broken lines
    epochs: int = 3
    max_seq_len: int = 128
    kind: str = "classification"
    selection_metric: str = "accuracy"
    test_text_columns: tuple | None = None  # when the test file names its text columns differently
    test_files: tuple[tuple[str, str], ...] = (("test.tsv", ""),)  # (file, subset)
    submission_names: tuple[tuple[str, str], ...] = ()  # (subset, file stem); default: the folder name

    @property
    def num_outputs(self) -> int:
        return len(self.labels) if self.labels else 1

    # ---- reading -------------------------------------------------------------------------------

    def read(self, path: str, split: str) -> list[GlueExample]:
        """Examples of `split` ("train", "dev" or "test") from a GLUE task folder (or its parent)."""
        directory = self._task_dir(path)
        if split == "test":
            examples = []
            for name, subset in self.test_files:
                examples.extend(self._read_test_tsv(join(directory, name), subset))
            return examples
        files = [("train.tsv", "")] if split == "train" else list(self.dev_files)
        examples = []
        for name, subset in files:
            examples.extend(self._read_tsv(join(directory, name), subset))
        return examples

    def _read_test_tsv(self, path: str, subset: str) -> list[GlueExample]:
        if not gfile.exists(path):
            raise UserInputError(f"GLUE {self.folder}: missing {path}")
        with gfile.GFile(path, "rb") as f:
            rows = list(csv.reader(io.StringIO(f.read().decode("utf-8-sig")), delimiter="\t",
                                   quoting=csv.QUOTE_NONE))
        header = rows[0] if rows else []
        names = list(self.test_text_columns or self.text_columns)
        id_column = next((c for c in ("index", "id") if c in header), None)
        missing = [c for c in names if c not in header] + ([] if id_column else ["index"])
        if missing:
            raise UserInputError(f"{path}: not a GLUE {self.folder} test TSV: header lacks column(s) "
                                 f"{', '.join(missing)} (found: {', '.join(header) or 'nothing'})")
        columns = [header.index(c) for c in names]
        id_index = header.index(id_column)
        missing_label = -1.0 if self.labels else float("nan")
        examples = []
        for line, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            if len(row) <= max(columns + [id_index]):
                raise UserInputError(f"{path}:{line}: {len(row)} tab-separated fields, too few for its header")
            texts = [row[c] for c in columns]
            examples.append(GlueExample(texts[0], texts[1] if len(texts) > 1 else None, missing_label, subset,
                                        row[id_index]))
        if not examples:
            raise UserInputError(f"{path}: no examples")
        return examples

    def _task_dir(self, path: str) -> str:
        for candidate in (path, join(path, self.folder)):
            if gfile.exists(join(candidate, "train.tsv")):
                return candidate
        raise UserInputError(f"--data {path}: not a GLUE {self.folder} folder (expected train.tsv and "
                             f"{', '.join(f for f, _ in self.dev_files)} in it or in {self.folder}/)")

    def _read_tsv(self, path: str, subset: str) -> list[GlueExample]:
        if not gfile.exists(path):
            raise UserInputError(f"GLUE {self.folder}: missing {path}")
        with gfile.GFile(path, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise UserInputError(f"{path}: not a UTF-8 text TSV (byte {e.start}: {e.reason})") from None
        if "\0" in text:
            raise UserInputError(f"{path}: not a text TSV (NUL byte at character {text.index(chr(0))})")
        with csv_field_size_limit(_FIELD_SIZE_LIMIT):
            rows = iter(list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)))
        columns = list(self.text_columns) + [self.label_column]
        if self.has_header:
            header = next(rows, [])
            missing = [c for c in columns if c not in header]
            if missing:
                raise UserInputError(f"{path}: not a GLUE {self.folder} TSV: header lacks column(s) "
                                     f"{', '.join(missing)} (found: {', '.join(header) or 'nothing'})")
            columns = [header.index(c) for c in columns]
        needed = max(columns) + 1
        examples, skipped = [], 0
        for line, row in enumerate(rows, start=2 if self.has_header else 1):
            if not row:
                continue
            if len(row) < needed:
                if self.skip_short_rows:
                    skipped += 1
                    continue
                raise UserInputError(f"{path}:{line}: {len(row)} tab-separated fields, a GLUE {self.folder} "
                                     f"row has at least {needed}")
            texts = [row[c] for c in columns[:-1]]
            label = self._label(row[columns[-1]], f"{path}:{line}")
            examples.append(GlueExample(texts[0], texts[1] if len(texts) > 1 else None, label, subset))
        if skipped:
            logging.warning("%s: skipped %d rows with missing fields", path, skipped)
        if not examples:
            raise UserInputError(f"{path}: no examples")
        return examples

    def _label(self, raw: str, where: str) -> float:
        if self.labels is None:
            try:
                return float(raw)
            except ValueError:
                raise UserInputError(f"{where}: label {raw!r} is not a number") from None
        if raw not in self.labels:
            raise UserInputError(f"{where}: label {raw!r} is not one of {', '.join(self.labels)}")
        return float(self.labels.index(raw))

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list[GlueExample]:
        import tensorflow_datasets as tfds

        splits = [("train", "")] if split == "train" else list(self.tfds_dev)
        examples = []
        for tfds_split, subset in splits:
            dataset = tfds.load(name, split=tfds_split, data_dir=data_dir, download=False)
            examples.extend(self.from_tfds(dataset, subset))
        return examples

    def from_tfds(self, dataset, subset: str = "") -> list[GlueExample]:
        """Examples from a tf.data.Dataset of TFDS `glue/*` feature dicts."""
        examples = []
        for features in dataset.as_numpy_iterator():
            texts = [features[k].decode("utf-8") for k in self.tfds_text]
            raw = features["label"]
            label = float(raw) if self.labels is None else float(self.labels.index(self.tfds_labels[int(raw)]))
            examples.append(GlueExample(texts[0], texts[1] if len(texts) > 1 else None, label, subset))
        return examples

    # ---- model ---------------------------------------------------------------------------------

    def encode(self, examples: Sequence[GlueExample], wordpiece: WordPieceVocabulary,
               max_seq_len: int) -> heads.Encoded:
        first = wordpiece.encode_batch([e.text_a for e in examples])
        paired = [i for i, e in enumerate(examples) if e.text_b is not None]
        second = dict(zip(paired, wordpiece.encode_batch([examples[i].text_b for i in paired])))
        packed = pack(wordpiece, [(a, second.get(i)) for i, a in enumerate(first)], max_seq_len)
        label_dtype = np.int32 if self.labels else np.float32
        arrays = {**packed.as_dict(), "label": np.array([e.label for e in examples], label_dtype)}
        return heads.Encoded(arrays, np.array([e.subset for e in examples]))

    def head(self, config):
        return heads.SequenceClassifier(config, self.num_outputs)

    @property
    def loss(self):
        return heads.classification_loss if self.labels else heads.regression_loss

    def evaluate(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded) -> dict[str, float]:
        logits = outputs["logits"]
        predictions = logits[:, 0] if self.labels is None else np.argmax(logits, axis=-1)
        labels = encoded.arrays["label"]
        subsets = encoded.info
        result = {}
        for _, subset in self.dev_files:
            keep = subsets == subset
            suffix = f"_{subset}" if subset else ""
            for metric in self.metric_names:
                result[metric + suffix] = 100.0 * _METRICS[metric](predictions[keep], labels[keep])
        result["score"] = result[self.selection_metric]
        return result

    def has_labels(self, encoded: heads.Encoded) -> bool:
        labels = encoded.arrays["label"]
        return bool(np.all(labels >= 0) if self.labels else np.all(np.isfinite(labels)))

    def write_predictions(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded, examples, directory: str):
        """One `<Task>.tsv` per test file in the GLUE server's format; returns the paths written."""
        from pmi_jax import storage

        logits = outputs["logits"]
        stems = dict(self.submission_names) or {"": self.folder}
        written = []
        for _, subset in self.test_files:
            lines = ["index\tprediction"]
            for example, row in zip(examples, logits):
                if example.subset != subset:
                    continue
                value = f"{float(row[0]):.3f}" if self.labels is None else self.labels[int(np.argmax(row))]
                lines.append(f"{example.guid}\t{value}")
            path = join(directory, f"{stems[subset]}.tsv")
            with storage.atomic_file(path) as f:
                f.write("\n".join(lines) + "\n")
            written.append(path)
        return written


_METRICS = {"accuracy": metrics.accuracy, "f1": metrics.f1, "matthews_corrcoef": metrics.matthews_corrcoef,
            "pearson": metrics.pearson, "spearman": metrics.spearman}

_BINARY = ("0", "1")
_ENTAILMENT = ("entailment", "not_entailment")

TASKS = {t.name: t for t in [
    GlueTask("glue/cola", "CoLA", (3,), 1, _BINARY, ("matthews_corrcoef",), ("sentence",), _BINARY,
             has_header=False, selection_metric="matthews_corrcoef", test_text_columns=("sentence",)),
    GlueTask("glue/sst2", "SST-2", ("sentence",), "label", _BINARY, ("accuracy",), ("sentence",), _BINARY),
    GlueTask("glue/mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", _BINARY, ("f1", "accuracy"),
             ("sentence1", "sentence2"), _BINARY),
    GlueTask("glue/stsb", "STS-B", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman"),
             ("sentence1", "sentence2"), epochs=10, selection_metric="spearman"),
    GlueTask("glue/qqp", "QQP", ("question1", "question2"), "is_duplicate", _BINARY, ("f1", "accuracy"),
             ("question1", "question2"), _BINARY, skip_short_rows=True),
    GlueTask("glue/mnli", "MNLI", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
             ("accuracy",), ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
             dev_files=(("dev_matched.tsv", ""), ("dev_mismatched.tsv", "mismatched")),
             tfds_dev=(("validation_matched", ""), ("validation_mismatched", "mismatched")),
             test_files=(("test_matched.tsv", ""), ("test_mismatched.tsv", "mismatched")),
             submission_names=(("", "MNLI-m"), ("mismatched", "MNLI-mm"))),
    GlueTask("glue/qnli", "QNLI", ("question", "sentence"), "label", _ENTAILMENT, ("accuracy",),
             ("question", "sentence"), _ENTAILMENT),
    GlueTask("glue/rte", "RTE", ("sentence1", "sentence2"), "label", _ENTAILMENT, ("accuracy",),
             ("sentence1", "sentence2"), _ENTAILMENT, epochs=10),
    # TFDS names WNLI's classes (not_entailment, entailment) = the TSV's 0, 1.
    GlueTask("glue/wnli", "WNLI", ("sentence1", "sentence2"), "label", _BINARY, ("accuracy",),
             ("sentence1", "sentence2"), _BINARY),
]}
