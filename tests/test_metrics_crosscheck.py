"""Our task metrics against independent implementations, on random inputs.

SQuAD 2.0: transformers' `squad_metrics` (a port of the official SQuAD 2.0 evaluation script:
EM, F1, HasAns/NoAns, best thresholds), on questions with several gold answers, unanswerable
questions, and gold answers that normalise to nothing. GLUE: scikit-learn's accuracy, F1 and
Matthews correlation (binary and three-class), and Pearson/Spearman written out here on NumPy.
Both run offline: transformers is pinned by the bench extra, scikit-learn by the dev extra.
"""
from __future__ import annotations

import numpy as np
import pytest

from pmi_jax.eval import metrics, squad

squad_metrics = pytest.importorskip("transformers.data.metrics.squad_metrics")
squad_processors = pytest.importorskip("transformers.data.processors.squad")
sklearn_metrics = pytest.importorskip("sklearn.metrics")

WORDS = ["the", "a", "an", "Cat", "cat", "sat", "on", "mat", "New", "York", "city", "hall", "in", "1999", "of",
         "river", "Paris", "is", "big", "small"]
PUNCTUATION = ["", "", "", ".", ",", "!", "'s", "-"]


def _phrase(rng, low=1, high=5) -> str:
    return " ".join(rng.choice(WORDS) + rng.choice(PUNCTUATION) for _ in range(rng.integers(low, high)))


def _variant(rng, text: str) -> str:
    """The same answer as a reader might write it: other case, an article, punctuation, more words."""
    choice = rng.integers(5)
    if choice == 0:
        return text.upper()
    if choice == 1:
        return "the " + text + "."
    if choice == 2:
        return text + " " + _phrase(rng, 1, 3)
    if choice == 3:
        return " ".join(text.split()[1:]) or text
    return text


def _random_questions(rng, n: int):
    """(our examples, transformers' examples, predictions): about a third unanswerable, some with
    up to four gold answers, some with a gold answer that normalises to nothing ("the", ".")."""
    ours, theirs, predictions = [], [], {}
    for i in range(n):
        qid = f"q{i}"
        context = _phrase(rng, 20, 40)
        kind = rng.random()
        if kind < 0.33:
            answers = []
        elif kind < 0.4:
            answers = [str(rng.choice(["the", ".", "an !"]))] + ([_phrase(rng)] if rng.random() < 0.5 else [])
        else:
            answers = [_phrase(rng) for _ in range(rng.integers(1, 5))]
        starts = [int(rng.integers(0, len(context))) for _ in answers]
        roll = rng.random()
        if roll < 0.25:
            prediction = ""
        elif roll < 0.7 and answers:
            prediction = _variant(rng, str(rng.choice(answers)))
        else:
            prediction = _phrase(rng)
        ours.append(squad.SquadExample(qid, "what?", context, tuple(answers), tuple(starts)))
        theirs.append(squad_processors.SquadExample(
            qid, "what?", context, None, None, "", answers=[{"text": a, "answer_start": s} for a, s in
                                                           zip(answers, starts)], is_impossible=not answers))
        predictions[qid] = prediction
    return ours, theirs, predictions


@pytest.mark.parametrize("seed", range(4))
def test_squad_em_f1_and_no_answer_split_match_the_official_script(seed):
    rng = np.random.default_rng(seed)
    ours, theirs, predictions = _random_questions(rng, 300)
    got = squad.evaluate_predictions(ours, predictions)
    expected = {k: v for k, v in squad_metrics.squad_evaluate(theirs, predictions).items()
                if not k.startswith("best_")}  # thresholds: the next test
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert 0 < got["NoAns_total"] < got["total"] and 0 < got["exact"] < got["f1"] < 100


@pytest.mark.parametrize("seed", range(4))
def test_squad_best_thresholds_match_the_official_script(seed):
    """The best EM/F1 over no-answer thresholds, from non-empty span predictions and null-score
    margins (the official script's na_probs)."""
    rng = np.random.default_rng(100 + seed)
    ours, theirs, predictions = _random_questions(rng, 300)
    spans = {q: p or _phrase(rng) for q, p in predictions.items()}
    margins = {q: float(rng.normal()) for q in spans}
    got = squad.best_thresholds(ours, spans, margins)
    exact_raw, f1_raw = squad_metrics.get_raw_scores(theirs, spans)
    expected = {}
    has_answer = {e.qas_id: bool(e.answers) for e in theirs}
    squad_metrics.find_all_best_thresh(expected, spans, exact_raw, f1_raw, margins, has_answer)
    everything_empty = 100.0 * sum(not h for h in has_answer.values()) / len(has_answer)
    for name in ("exact", "f1"):
        assert got[f"best_{name}"] == pytest.approx(expected[f"best_{name}"], abs=1e-9)
        if expected[f"best_{name}"] > everything_empty:  # else the script reports 0.0, we min - 1
            assert got[f"best_{name}_thresh"] == expected[f"best_{name}_thresh"]


def test_the_examples_exercise_every_case():
    rng = np.random.default_rng(0)
    ours, _, predictions = _random_questions(rng, 300)
    assert any(len(e.answers) >= 3 for e in ours)
    assert any(not e.answers for e in ours)
    assert any(e.answers and not squad.normalize_answer(e.answers[0]) for e in ours)
    assert any(p == "" for p in predictions.values()) and any(p for p in predictions.values())


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), by sorting."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    begin = 0
    while begin < len(x):
        end = begin
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[begin]:
            end += 1
        ranks[order[begin:end + 1]] = (begin + end) / 2.0
        begin = end + 1
    return ranks


@pytest.mark.parametrize("seed", range(10))
def test_glue_metrics_match_scikit_learn_and_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    labels = rng.integers(0, 2, n)
    predictions = np.where(rng.random(n) < 0.7, labels, rng.integers(0, 2, n))
    assert metrics.accuracy(predictions, labels) == pytest.approx(sklearn_metrics.accuracy_score(labels, predictions))
    assert metrics.f1(predictions, labels) == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions, pos_label=1, zero_division=0.0))
    assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
    three_labels = rng.integers(0, 3, n)  # MNLI's three classes
    three_predictions = np.where(rng.random(n) < 0.5, three_labels, rng.integers(0, 3, n))
    assert metrics.matthews_corrcoef(three_predictions, three_labels) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(three_labels, three_predictions), abs=1e-12)
    assert metrics.accuracy(three_predictions, three_labels) == pytest.approx(
        sklearn_metrics.accuracy_score(three_labels, three_predictions))

    scores = np.round(rng.uniform(0, 5, n), 1)  # STS-B: similarity 0..5, ties from the rounding
    guesses = np.round(scores + rng.normal(0, 1.5, n), 1)
    assert metrics.pearson(guesses, scores) == pytest.approx(np.corrcoef(guesses, scores)[0, 1], abs=1e-12)
    assert metrics.spearman(guesses, scores) == pytest.approx(
        np.corrcoef(_ranks(guesses), _ranks(scores))[0, 1], abs=1e-12)


def test_degenerate_glue_inputs_agree_with_scikit_learn():
    """One class only, or no positive at all: scikit-learn's conventions (0 for an undefined MCC or F1)."""
    ones, zeros = np.ones(20, int), np.zeros(20, int)
    mixed = np.array([0, 1] * 10)
    for predictions, labels in ((ones, ones), (zeros, mixed), (mixed, zeros), (zeros, zeros)):
        assert metrics.matthews_corrcoef(predictions, labels) == sklearn_metrics.matthews_corrcoef(labels, predictions)
        assert metrics.f1(predictions, labels) == sklearn_metrics.f1_score(labels, predictions, zero_division=0.0)
