"""SQuAD 2.0 (Rajpurkar et al. 2018): reading, sliding windows, answer decoding, official EM/F1.

Windows, training targets and decoding follow BERT's `run_squad.py` (`[CLS] question [SEP]
window [SEP]`, windows every `doc_stride` tokens, a token decided by its max-context window, the
answer "" when the null score beats the best span by `null_score_diff_threshold`). Answer text
is cut from the original context by character offsets. Scoring is the official SQuAD 2.0
script's, checked against transformers' port (tests/test_metrics_crosscheck.py). Details:
docs/design.md, "Module notes", squad.py.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
import string
from typing import Sequence

import numpy as np

from pmi_jax.errors import UserInputError
from pmi_jax.eval import heads
from pmi_jax.vocabularies import WordPieceVocabulary
from pmi_jax.storage import gfile, join

FILES = {"train": "train-v2.0.json", "dev": "dev-v2.0.json"}


@dataclasses.dataclass(frozen=True)
class SquadExample:
    qid: str
    question: str
    context: str
    answers: tuple[str, ...]  # gold answer texts; empty when the question has no answer
    answer_starts: tuple[int, ...]  # character offset of each answer in the context


# ---- official evaluation ---------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop articles, collapse whitespace (official order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def token_f1(gold: str, prediction: str) -> float:
    gold_tokens = normalize_answer(gold).split()
    predicted_tokens = normalize_answer(prediction).split()
    if not gold_tokens or not predicted_tokens:
        return float(gold_tokens == predicted_tokens)  # no-answer: 1 only if both are empty
    same = sum((collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)).values())
    if not same:
        return 0.0
    precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_answers(example: SquadExample) -> list[str]:
    # The official script drops gold answers that normalise to nothing; none left: only "" scores.
    return [a for a in example.answers if normalize_answer(a)] or [""]


def _has_answer(example: SquadExample) -> bool:
    # The official script's HasAns/NoAns split (`make_qid_to_has_ans`) looks at the raw answer
    # list: a question whose only gold answer is "the" is a HasAns question that "" answers.
    return bool(example.answers)


def _per_question(examples: Sequence[SquadExample], predictions: dict[str, str]):
    exact = {e.qid: max(exact_match(g, predictions[e.qid]) for g in _gold_answers(e)) for e in examples}
    f1 = {e.qid: max(token_f1(g, predictions[e.qid]) for g in _gold_answers(e)) for e in examples}
    return exact, f1


def evaluate_predictions(examples: Sequence[SquadExample], predictions: dict[str, str]) -> dict[str, float]:
    """The official script's EM and F1 (×100), overall and split by HasAns / NoAns."""
    missing = [e.qid for e in examples if e.qid not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} questions, e.g. {missing[0]}")
    exact, f1 = _per_question(examples, predictions)
    result = {"exact": 100.0 * np.mean(list(exact.values())), "f1": 100.0 * np.mean(list(f1.values())),
              "total": len(examples)}
    for name, keep in (("HasAns", True), ("NoAns", False)):
        ids = [e.qid for e in examples if _has_answer(e) == keep]
        if ids:
            result[f"{name}_exact"] = 100.0 * np.mean([exact[q] for q in ids])
            result[f"{name}_f1"] = 100.0 * np.mean([f1[q] for q in ids])
            result[f"{name}_total"] = len(ids)
    return {k: float(v) if not isinstance(v, int) else v for k, v in result.items()}


def best_thresholds(examples: Sequence[SquadExample], span_predictions: dict[str, str],
                    null_margins: dict[str, float]) -> dict[str, float]:
    """The official script's best_exact / best_f1: the best score over no-answer thresholds.

    `span_predictions` are the best non-empty spans, `null_margins` how much more the model
    prefers "no answer" (null score − best span score). Answering exactly the questions whose
    margin is <= t, sweep t over the margins in increasing order. The thresholds reported are
    margins: pass one as `null_score_diff_threshold` to reproduce its score.
    """
    exact, f1 = _per_question(examples, span_predictions)
    has_answer = {e.qid: _has_answer(e) for e in examples}
    order = sorted(null_margins, key=null_margins.get)
    result = {}
    for name, scores in (("exact", exact), ("f1", f1)):
        current = best = float(sum(not h for h in has_answer.values()))  # everything answered ""
        threshold = min(null_margins.values()) - 1.0
        for qid in order:
            if has_answer[qid]:
                current += scores[qid]
            elif span_predictions[qid]:
                current -= 1.0
            if current > best:
                best, threshold = current, null_margins[qid]
        result[f"best_{name}"] = 100.0 * best / len(examples)
        result[f"best_{name}_thresh"] = float(threshold)
    return result


# ---- reading ---------------------------------------------------------------------------------

def read_squad_file(path: str) -> list[SquadExample]:
    if not gfile.exists(path):
        raise UserInputError(f"SQuAD 2.0: missing {path}")
    try:
        with gfile.GFile(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise UserInputError(f"{path}: not SQuAD JSON (expected an object with a \"data\" list of articles)")
    examples = []
    try:
        for article in data["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    # Test inputs carry no answers: read as unanswerable, only predicted.
                    answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                    examples.append(SquadExample(str(qa["id"]), qa["question"], context,
                                                 tuple(a["text"] for a in answers),
                                                 tuple(int(a["answer_start"]) for a in answers)))
    except (KeyError, TypeError) as e:
        raise UserInputError(f"{path}: not SQuAD JSON (article/paragraph/question lacks {e})") from None
    if not examples:
        raise UserInputError(f"{path}: no questions")
    return examples


def from_tfds(dataset) -> list[SquadExample]:
    """Examples from a tf.data.Dataset of TFDS `squad/v2.0` feature dicts."""
    examples = []
    for f in dataset.as_numpy_iterator():
        impossible = bool(f.get("is_impossible", False))
        texts = () if impossible else tuple(t.decode("utf-8") for t in f["answers"]["text"])
        starts = () if impossible else tuple(int(s) for s in f["answers"]["answer_start"])
        examples.append(SquadExample(f["id"].decode("utf-8"), f["question"].decode("utf-8"),
                                     f["context"].decode("utf-8"), texts, starts))
    return examples


# ---- context tokens with character offsets ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ContextTokens:
    ids: np.ndarray  # [T] WordPiece ids of the whole context
    char_start: np.ndarray  # [T] first character of each token in the context
    char_end: np.ndarray  # [T] one past its last character


def tokenize_contexts(wordpiece: WordPieceVocabulary, contexts: Sequence[str]) -> list[ContextTokens]:
    """Each context's token ids with the characters each token covers, from the model's own
    vocabulary (uncased WordPiece or the corpus's tokenizer.json: `encode_with_offsets`)."""
    return [ContextTokens(*encoded) for encoded in wordpiece.encode_with_offsets(contexts)]


# ---- the task ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Windows:
    """What decoding needs about each window, beside the model arrays."""

    example_index: np.ndarray  # [N] which question
    char_start: np.ndarray  # [N, L] context character span of each position; -1 outside the context
    char_end: np.ndarray  # [N, L]
    max_context: np.ndarray  # [N, L] bool: this window is the token's best-centred one
    examples: tuple[SquadExample, ...]


@dataclasses.dataclass(frozen=True)
class SquadTask:
    name: str = "squad/v2.0"
    epochs: int = 4
    max_seq_len: int = 384
    doc_stride: int = 128
    max_query_len: int = 64
    max_answer_len: int = 30
    n_best: int = 20
    null_score_diff_threshold: float = 0.0
    kind: str = "span"
    selection_metric: str = "f1"

    def read(self, path: str, split: str) -> list[SquadExample]:
        if split == "test":  # a file in SQuAD's JSON format, as the leaderboard's test inputs are
            if gfile.isdir(path):
                raise UserInputError(f"--test-data {path}: expected a SQuAD 2.0 JSON file of test questions")
            return read_squad_file(path)
        if not gfile.isdir(path):
            raise UserInputError(f"--data {path}: expected a folder holding {FILES['train']} and {FILES['dev']}")
        return read_squad_file(join(path, FILES[split]))

    def read_tfds(self, name: str, split: str, data_dir: str | None) -> list[SquadExample]:
        import tensorflow_datasets as tfds

        tfds_split = "train" if split == "train" else "validation"
        return from_tfds(tfds.load(name, split=tfds_split, data_dir=data_dir, download=False))

    def head(self, config):
        return heads.SpanExtractor(config)

    @property
    def loss(self):
        return heads.span_loss

    def encode(self, examples: Sequence[SquadExample], wordpiece: WordPieceVocabulary,
               max_seq_len: int) -> heads.Encoded:
        contexts = list(dict.fromkeys(e.context for e in examples))
        tokens_of = dict(zip(contexts, tokenize_contexts(wordpiece, contexts)))
        queries = wordpiece.encode_batch([e.question for e in examples])
        rows = collections.defaultdict(list)
        unmatched = 0
        for index, (example, query) in enumerate(zip(examples, queries)):
            query = query[:self.max_query_len]
            context = tokens_of[example.context]
            answer = _answer_tokens(example, context)
            if example.answers and answer is None:
                unmatched += 1
            for window in self._windows(wordpiece, query, context, answer, max_seq_len):
                for key, value in window.items():
                    rows[key].append(value)
                rows["example_index"].append(index)
        if unmatched:
            logging.warning("%d answers do not cover any context token; trained as unanswerable", unmatched)
        arrays = {k: np.stack(rows[k]) for k in ("input_ids", "input_mask", "token_type_ids",
                                                 "start_position", "end_position")}
        info = Windows(np.array(rows["example_index"]), np.stack(rows["char_start"]), np.stack(rows["char_end"]),
                       np.stack(rows["max_context"]), tuple(examples))
        return heads.Encoded(arrays, info)

    def _windows(self, wordpiece, query, context: ContextTokens, answer, max_seq_len):
        """BERT's doc-stride windows over the context, each packed with the question."""
        room = max_seq_len - len(query) - 3
        if room < 1:
            raise UserInputError(f"max sequence length {max_seq_len} leaves no room for the context "
                                 f"after a {len(query)}-token question")
        total = len(context.ids)
        spans, start = [], 0
        while True:
            length = min(room, total - start)
            spans.append((start, length))
            if start + length >= total:
                break
            start += min(length, self.doc_stride)
        offset = len(query) + 2  # [CLS] question [SEP]
        owner_T = _max_context_window(spans, total)
        for window, (start, length) in enumerate(spans):
            ids = np.full([max_seq_len], wordpiece.pad_id, np.int32)
            types = np.zeros([max_seq_len], np.int32)
            char_start = np.full([max_seq_len], -1, np.int32)
            char_end = np.full([max_seq_len], -1, np.int32)
            max_context = np.zeros([max_seq_len], bool)
            ids[:offset + length + 1] = [wordpiece.cls_id, *query, wordpiece.sep_id,
                                         *context.ids[start:start + length], wordpiece.sep_id]
            types[offset:offset + length + 1] = 1
            char_start[offset:offset + length] = context.char_start[start:start + length]
            char_end[offset:offset + length] = context.char_end[start:start + length]
            max_context[offset:offset + length] = owner_T[start:start + length] == window
            start_position = end_position = 0
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                start_position, end_position = answer[0] - start + offset, answer[1] - start + offset
            yield {"input_ids": ids, "input_mask": (np.arange(max_seq_len) < offset + length + 1).astype(np.int32),
                   "token_type_ids": types, "start_position": np.int32(start_position),
                   "end_position": np.int32(end_position), "char_start": char_start, "char_end": char_end,
                   "max_context": max_context}

    def decode(self, outputs: dict[str, np.ndarray], windows: Windows):
        """Best span text and null margin (null score − best span score) per question id."""
        best = {}  # example index -> (span score, text)
        null = {}  # example index -> smallest null score over its windows
        for w, index in enumerate(windows.example_index):
            start_L, end_L = outputs["start_logits"][w], outputs["end_logits"][w]
            null[index] = min(null.get(index, np.inf), float(start_L[0] + end_L[0]))
            in_context_L = windows.char_start[w] >= 0
            start_L = np.where(in_context_L & windows.max_context[w], start_L, -np.inf)
            end_L = np.where(in_context_L, end_L, -np.inf)
            starts, ends = _top(start_L, self.n_best), _top(end_L, self.n_best)
            scores_SxE = start_L[starts][:, None] + end_L[ends][None, :]
            length_SxE = ends[None, :] - starts[:, None]
            scores_SxE = np.where((length_SxE >= 0) & (length_SxE < self.max_answer_len), scores_SxE, -np.inf)
            i, j = np.unravel_index(np.argmax(scores_SxE), scores_SxE.shape)
            if np.isfinite(scores_SxE[i, j]) and scores_SxE[i, j] > best.get(index, (-np.inf, ""))[0]:
                context = windows.examples[index].context
                best[index] = (float(scores_SxE[i, j]),
                               context[windows.char_start[w][starts[i]]:windows.char_end[w][ends[j]]])
        spans, margins = {}, {}
        for index, example in enumerate(windows.examples):
            score, text = best.get(index, (-np.inf, ""))
            spans[example.qid] = text
            margins[example.qid] = float(null[index] - score) if np.isfinite(score) else float("inf")
        return spans, margins

    def evaluate(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded) -> dict[str, float]:
        windows: Windows = encoded.info
        spans, margins = self.decode(outputs, windows)
        predictions = {q: ("" if margins[q] > self.null_score_diff_threshold else spans[q]) for q in spans}
        finite = {q: min(m, 1e30) for q, m in margins.items()}
        result = evaluate_predictions(windows.examples, predictions)
        result.update(best_thresholds(windows.examples, spans, finite))
        result["score"] = result["f1"]
        return result

    def has_labels(self, encoded: heads.Encoded) -> bool:
        del encoded  # SQuAD 2.0's test set is hidden: test questions are predicted, never scored here
        return False

    def predictions(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded) -> dict[str, str]:
        """question id -> answer text ("" for no answer), with the null-score threshold applied."""
        spans, margins = self.decode(outputs, encoded.info)
        return {q: ("" if margins[q] > self.null_score_diff_threshold else spans[q]) for q in spans}

    def write_predictions(self, outputs: dict[str, np.ndarray], encoded: heads.Encoded, examples, directory: str):
        """SQuAD's prediction file ({question id: answer}, the official script's and CodaLab's input)."""
        from pmi_jax import storage

        del examples  # the windows know their questions
        path = join(directory, "predictions.json")
        with storage.atomic_file(path) as f:
            f.write(json.dumps(self.predictions(outputs, encoded), indent=1, ensure_ascii=False) + "\n")
        return [path]


def _top(values: np.ndarray, k: int) -> np.ndarray:
    k = min(k, len(values))
    return np.argpartition(-values, k - 1)[:k]


def _answer_tokens(example: SquadExample, context: ContextTokens) -> tuple[int, int] | None:
    """First and last context token overlapping the first gold answer's characters."""
    if not example.answers:
        return None
    begin = example.answer_starts[0]
    end = begin + len(example.answers[0])
    overlapping = np.nonzero((context.char_end > begin) & (context.char_start < end))[0]
    if not len(overlapping):
        return None
    return int(overlapping[0]), int(overlapping[-1])


def _max_context_window(spans, total: int) -> np.ndarray:
    """For each context token, the window where it has the most context: BERT's
    min(tokens left, tokens right) + 0.01 · window length, the first window on ties."""
    starts_S = np.array([s for s, _ in spans])[:, None]
    lengths_S = np.array([n for _, n in spans])[:, None]
    position_T = np.arange(total)[None, :]
    left_SxT, right_SxT = position_T - starts_S, starts_S + lengths_S - 1 - position_T
    score_SxT = np.where((left_SxT >= 0) & (right_SxT >= 0),
                         np.minimum(left_SxT, right_SxT) + 0.01 * lengths_S, -np.inf)
    return np.argmax(score_SxT, axis=0)
