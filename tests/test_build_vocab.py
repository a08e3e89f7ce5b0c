"""build_vocab.tsv_rows_text: the TSV rows built as bytes, equal to formatting each row with repr()."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmi_jax.preprocess.vocab import build_vocab

from pmi_jax.preprocess.vocab import vocab_selection
from pmi_jax.preprocess.vocab.ngram_counts import NgramCounts


def _table(words):
    return NgramCounts(words=[w.encode() for w in words], keys={}, counts={}, counted={}, num_positions=[],
                       documents=0, num_words=0, min_count=1, spilled=False)


EDGE_SCORES = [0.0, -0.0, 1e-4, -1e-4, 9.9999e-5, 1e-5, 5e-324, 2.0**21, -(2.0**21), 2.0**21 - 1e-9, 2097151.999999999,
               1.5, -3.0, 0.1, 0.3, 123456.000000001, 1e16, 1e300, float("inf"), float("-inf"), float("nan"),
               12345678901.0, 0.000123456789, 999999.999999999]


def _check(scores, counts, n=3):
    words = ["the", "café", "ﬁ", "x" * 30, "中"]
    rng = np.random.default_rng(len(scores))
    words_CxN = rng.integers(0, len(words), size=(len(scores), n)).astype(np.int32)
    table = _table(words)
    texts = table.text(words_CxN)
    assert texts == [" ".join(words[i] for i in row) for row in words_CxN.tolist()]
    expected = "".join(f"{t}\t{n}\t{c}\t{float(s)!r}\n" for t, c, s in zip(texts, counts, scores))
    assert build_vocab.tsv_rows_text(table, words_CxN, n, np.asarray(counts, np.int64), np.asarray(scores)) == expected


def test_edge_scores():
    _check(np.array(EDGE_SCORES), np.arange(1, len(EDGE_SCORES) + 1) * 997)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e6, 1e9])
def test_scores_rounded_as_in_ranking(scale):
    rng = np.random.default_rng(int(scale) + 1)
    scores = (rng.normal(size=20000) * scale).round(build_vocab.SCORE_DECIMALS)
    _check(scores, rng.integers(1, 10**12, len(scores)), n=2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=2**62))
def test_any_float(scores, count):
    _check(np.array(scores, np.float64), [count] * len(scores), n=5)


@pytest.mark.parametrize("num_words, n", [(2, 5), (3, 2), (300, 5), (2**13, 5), (2**21 + 1, 3)])
def test_rank_packs_word_ranks_without_changing_the_order(num_words, n):
    """vocab_selection.rank packs several word ranks into one sort key: same order as one key each."""
    rng = np.random.default_rng(n)
    rows = 3000
    word_order = rng.permutation(num_words).astype(np.int64)  # as NgramCounts.word_order: a rank per word
    words_CxN = rng.integers(0, len(word_order), size=(rows, n)).astype(np.int32)
    words_CxN[:50] = words_CxN[50:100]  # same words, same scores and counts: the string decides
    words_CxN[:50, -1] = rng.integers(0, len(word_order), 50)
    scores = rng.integers(0, 5, rows) / 4.0
    counts = rng.integers(11, 14, rows)
    scores[:50], counts[:50] = scores[50:100], counts[50:100]
    ranks_CxN = word_order[words_CxN]
    expected = np.lexsort([ranks_CxN[:, j] for j in range(n - 1, -1, -1)] + [-counts, -scores])
    assert vocab_selection.rank(scores, counts, ranks_CxN).tolist() == expected.tolist()
