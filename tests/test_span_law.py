"""Random-Span's span lengths, measured in words from `pmi-jax data dump`, follow SpanBERT's law.

SpanBERT (Joshi et al. 2020, §3.1) draws span lengths from Geometric(0.2) truncated to
[1, 10] and renormalised: mean 3.80 words, P(10) = 3.0%. Clipping the geometric at 10 instead
would give mean 4.46 and P(10) = 13.4%; the tolerances below (4 standard errors of the exact
law at the sample size drawn) separate the two by far.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from pmi_jax import masking
from pmi_jax.cli import main
from tests.prepared_data import write_prepared_corpus


def truncated_geometric(p: float = masking.SPAN_P, top: int = masking.SPAN_MAX_WORDS) -> np.ndarray:
    """P(length = k) for k = 1..top (index k - 1), the renormalised truncated geometric."""
    pmf = p * (1 - p) ** np.arange(top)
    return pmf / pmf.sum()


def uncut_span_lengths(record: dict) -> list[int]:
    """Length in words of each span whose drawn length the document's end cannot have cut.

    Spans are laid end to end from each document's first word (`masking.span_units`); a span
    starting at least SPAN_MAX_WORDS words before its document's end keeps its drawn length,
    and whether a span starts there depends only on the spans before it, not on its own length.
    """
    units, word_ids = np.array(record["units"]), np.array(record["word_ids"])
    is_word = word_ids >= 0
    edges = np.flatnonzero(np.diff(np.concatenate([[0], is_word.astype(int), [0]])))
    lengths = []
    for begin, end in zip(edges[::2], edges[1::2]):  # documents: runs between special tokens
        spans, words = units[begin:end], word_ids[begin:end]
        last_word = words.max()
        for span in np.unique(spans):
            span_words = np.unique(words[spans == span])
            if last_word - span_words[0] + 1 >= masking.SPAN_MAX_WORDS:
                lengths.append(len(span_words))
    return lengths


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    root = tmp_path_factory.mktemp("span_law")
    write_prepared_corpus(str(root / "data"), sequences={"train": 60, "validation": 2}, seq_len=128, seed=11,
                          unit_names=())
    output = root / "spans.jsonl"
    assert main(["data", "dump", "--data", str(root / "data"), "--scheme", "random_span", "--num", "600",
                 "--seed", "4", "--output", str(output)]) == 0
    with open(output) as f:
        return [json.loads(line) for line in f]


def test_exact_law_has_spanbert_mean_and_tail():
    pmf = truncated_geometric()
    assert float(np.arange(1, 11) @ pmf) == pytest.approx(3.7971, abs=1e-4)
    assert float(pmf[-1]) == pytest.approx(0.03007, abs=1e-5)


def test_span_lengths_from_data_dump_follow_the_truncated_geometric(dumped):
    lengths = np.array([n for record in dumped for n in uncut_span_lengths(record)])
    assert len(lengths) > 6000 and lengths.min() >= 1 and lengths.max() <= 10
    pmf = truncated_geometric()
    k = np.arange(1, 11)
    mean, sd = float(k @ pmf), float(np.sqrt((k - k @ pmf) ** 2 @ pmf))
    p10 = float(pmf[-1])
    mean_tolerance = 4 * sd / np.sqrt(len(lengths))
    p10_tolerance = 4 * np.sqrt(p10 * (1 - p10) / len(lengths))
    assert abs(lengths.mean() - mean) < mean_tolerance
    assert abs(np.mean(lengths == 10) - p10) < p10_tolerance
    # The clipped law (mean 4.46, P(10) = 0.8^9) lies far outside both tolerances.
    assert abs(4.46 - mean) > 4 * mean_tolerance and abs(0.8 ** 9 - p10) > 4 * p10_tolerance
