"""Classification and regression metrics, defined as GLUE's official evaluation defines them.

GLUE scores CoLA by Matthews correlation, MRPC and QQP by F1 of the positive class (1) and
accuracy, STS-B by Pearson and Spearman correlation, every other task by accuracy. These are
the definitions of scikit-learn's `matthews_corrcoef` / `f1_score` and SciPy's `pearsonr` /
`spearmanr` that the GLUE baselines call; written out here on NumPy so that the numbers do not
depend on a library we do not ship, and checked against scikit-learn on random inputs
(tests/test_metrics_crosscheck.py). All functions return fractions in [0, 1] (or [-1, 1]).
"""
from __future__ import annotations

import numpy as np
import scipy.stats


def accuracy(predictions, labels) -> float:
    predictions, labels = _paired(predictions, labels)
    return float(np.mean(predictions == labels))


def f1(predictions, labels, positive=1) -> float:
    """F1 of the `positive` class: 2·TP / (2·TP + FP + FN); 0 when there is nothing to score."""
    predictions, labels = _paired(predictions, labels)
    tp = np.sum((predictions == positive) & (labels == positive))
    fp = np.sum((predictions == positive) & (labels != positive))
    fn = np.sum((predictions != positive) & (labels == positive))
    denominator = 2 * tp + fp + fn
    return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
    """Matthews correlation, in its multi-class form (Gorodkin 2004); binary MCC for two classes.

    From the confusion matrix C: (c·s − t·p) / sqrt((s² − p·p)(s² − t·t)) with t, p the true and
    predicted class counts, c the correct count and s the total; 0 when a marginal is constant.
    """
    predictions, labels = _paired(predictions, labels)
    classes, encoded = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true_K = np.bincount(encoded[:len(labels)], minlength=len(classes)).astype(np.float64)
    pred_K = np.bincount(encoded[len(labels):], minlength=len(classes)).astype(np.float64)
    correct = float(np.sum(predictions == labels))
    total = float(len(labels))
    denominator = np.sqrt((total ** 2 - pred_K @ pred_K) * (total ** 2 - true_K @ true_K))
    return float((correct * total - true_K @ pred_K) / denominator) if denominator else 0.0


def pearson(predictions, labels) -> float:
    """Pearson correlation; 0 when either side is constant (SciPy would give NaN)."""
    predictions, labels = _paired(predictions, labels, dtype=np.float64)
    if _constant(predictions) or _constant(labels):
        return 0.0
    return float(scipy.stats.pearsonr(predictions, labels)[0])


def spearman(predictions, labels) -> float:
    """Spearman rank correlation (ties get average ranks); 0 when either side is constant."""
    predictions, labels = _paired(predictions, labels, dtype=np.float64)
    if _constant(predictions) or _constant(labels):
        return 0.0
    return float(scipy.stats.spearmanr(predictions, labels)[0])


def _constant(x: np.ndarray) -> bool:
    return bool(np.all(x == x[0]))


def _paired(predictions, labels, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    predictions = np.asarray(predictions, dtype=dtype).reshape(-1)
    labels = np.asarray(labels, dtype=dtype).reshape(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not len(labels):
        raise ValueError("no examples to score")
    return predictions, labels
