"""Metric functions against values computed by hand from their definitions."""
import math

import numpy as np
import pytest

from pmi_jax.eval import metrics, squad
from pmi_jax.eval.squad import SquadExample


def test_accuracy_and_f1_of_the_positive_class():
    predictions = [1, 1, 1, 0, 0, 0, 1]
    labels = [1, 1, 0, 0, 1, 0, 1]  # TP 3, FP 1, FN 1, TN 2
    assert metrics.accuracy(predictions, labels) == pytest.approx(5 / 7)
    assert metrics.f1(predictions, labels) == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert metrics.f1([0, 0], [0, 0]) == 0.0  # no positives anywhere: nothing to score


def test_matthews_correlation():
    predictions = [1, 1, 1, 0, 0, 0, 1]
    labels = [1, 1, 0, 0, 1, 0, 1]  # TP 3, FP 1, FN 1, TN 2
    expected = (3 * 2 - 1 * 1) / math.sqrt((3 + 1) * (3 + 1) * (2 + 1) * (2 + 1))
    assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(expected)
    assert metrics.matthews_corrcoef([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    assert metrics.matthews_corrcoef([0, 1, 0], [1, 0, 1]) == pytest.approx(-1.0)
    assert metrics.matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0  # constant prediction


def test_matthews_binary_form_on_random_labels():
    """The multi-class formula reduces to (TP·TN − FP·FN)/sqrt(...) for two classes."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, y = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
        tp, tn = np.sum((p == 1) & (y == 1)), np.sum((p == 0) & (y == 0))
        fp, fn = np.sum((p == 1) & (y == 0)), np.sum((p == 0) & (y == 1))
        expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        assert metrics.matthews_corrcoef(p, y) == pytest.approx(expected)


def test_matthews_three_classes():
    # Confusion (rows true, columns predicted): [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    labels = [0, 0, 0, 1, 1, 2]
    predictions = [0, 0, 1, 1, 2, 2]
    t, p, c, s = np.array([3, 2, 1]), np.array([2, 2, 2]), 4, 6
    expected = (c * s - t @ p) / math.sqrt((s * s - p @ p) * (s * s - t @ t))
    assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(expected)


def test_pearson_and_spearman():
    assert metrics.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    # deviations (-1.5, -.5, .5, 1.5) and (-1.5, .5, -.5, 1.5): 4 / sqrt(5 · 5)
    assert metrics.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties get average ranks: (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 · 5)
    assert metrics.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert metrics.spearman([1, 5, 6, 100], [0, 1, 2, 3]) == pytest.approx(1.0)
    assert metrics.pearson([2, 2, 2], [1, 2, 3]) == 0.0 and metrics.spearman([1, 2, 3], [0, 0, 0]) == 0.0


def test_metrics_refuse_mismatched_lengths():
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        metrics.accuracy([1, 0], [1, 0, 1])


# ---- SQuAD 2.0 -----------------------------------------------------------------------------------

def test_answer_normalisation_removes_case_punctuation_articles_and_extra_space():
    assert squad.normalize_answer("The  Cat's   hat!") == "cats hat"
    assert squad.normalize_answer("an apple a day, the end.") == "apple day end"
    assert squad.normalize_answer("Theory of the Atom") == "theory of atom"  # "the" only as a word
    assert squad.normalize_answer("A") == ""


def test_exact_match_and_token_f1():
    assert squad.exact_match("the Eiffel Tower", "Eiffel tower.") == 1.0
    assert squad.exact_match("Denver Broncos", "Broncos") == 0.0
    assert squad.token_f1("Denver Broncos", "Broncos") == pytest.approx(2 / 3)  # P 1, R 1/2
    assert squad.token_f1("x y y z", "y y y w") == pytest.approx(0.5)  # common {y: 2}: P 2/4, R 2/4
    assert squad.token_f1("a x y y z", "y y y w") == pytest.approx(2 * (2 / 4) * (2 / 4) / (2 / 4 + 2 / 4))
    assert squad.token_f1("x y y", "y y y w") == pytest.approx(2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3))
    assert squad.token_f1("", "") == 1.0 and squad.token_f1("", "Paris") == 0.0 and squad.token_f1("Paris", "") == 0.0


def _examples():
    return [SquadExample("has1", "q", "c", ("Denver Broncos", "the Broncos"), (0, 0)),
            SquadExample("has2", "q", "c", ("Paris",), (0,)),
            SquadExample("none1", "q", "c", (), ()),
            SquadExample("none2", "q", "c", (), ())]


def test_squad2_scores_with_unanswerable_questions():
    predictions = {"has1": "Broncos", "has2": "", "none1": "", "none2": "Rome"}
    result = squad.evaluate_predictions(_examples(), predictions)
    # has1: EM 1 against "the Broncos" (articles dropped), F1 1; has2: 0; none1: 1; none2: 0.
    assert result == pytest.approx({"exact": 50.0, "f1": 50.0, "total": 4, "HasAns_exact": 50.0, "HasAns_f1": 50.0,
                                    "HasAns_total": 2, "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})
    partial = squad.evaluate_predictions(_examples(), {**predictions, "has1": "Denver"})
    assert partial["exact"] == 25.0 and partial["f1"] == pytest.approx(100 * (2 / 3 + 1) / 4)


def test_gold_answers_that_normalise_to_nothing_make_a_question_unanswerable():
    example = SquadExample("q", "q", "c", ("The",), (0,))
    assert squad.evaluate_predictions([example], {"q": ""})["exact"] == 100.0


def test_best_threshold_sweeps_the_null_margins():
    spans = {"has1": "Broncos", "has2": "Rome", "none1": "Oslo", "none2": "Rome"}
    margins = {"has1": -2.0, "none1": -1.0, "has2": 0.5, "none2": 3.0}
    result = squad.best_thresholds(_examples(), spans, margins)
    # All "": 2 right. Answering in margin order: has1 +1 -> 3, none1 -1 -> 2, has2 +0 -> 2, none2 -1 -> 1.
    assert result["best_exact"] == 75.0 and result["best_exact_thresh"] == -2.0
    assert result["best_f1"] == 75.0 and result["best_f1_thresh"] == -2.0
