"""The measures of docs/design.md, "Measures", checked against their definitions by brute force."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pmi_jax.preprocess.vocab import measures


def compositions(n):
    """Every segmentation of [0, n) into contiguous spans, as lists of (i, j)."""
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        yield list(zip(bounds[:-1], bounds[1:]))


def brute_force_best_split(span_log_prob, n, row):
    return max(sum(span_log_prob[s][row] for s in seg) for seg in compositions(n) if seg != [(0, n)])


def test_compositions_enumerates_all_segmentations():
    assert len(list(compositions(5))) == 2 ** 4
    assert sorted(map(tuple, compositions(3))) == sorted([((0, 1), (1, 2), (2, 3)), ((0, 1), (1, 3)),
                                                          ((0, 2), (2, 3)), ((0, 3),)])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 5), data=st.data())
def test_dynamic_program_matches_enumeration(n, data):
    num = data.draw(st.integers(1, 8))
    values = hnp.arrays(np.float64, num, elements=st.floats(-30.0, 0.0, allow_nan=False))
    span_log_prob = {(i, j): data.draw(values) for i in range(n) for j in range(i + 1, n + 1)}
    got = measures.best_split_log_prob(span_log_prob, n)
    for row in range(num):
        assert got[row] == pytest.approx(brute_force_best_split(span_log_prob, n, row), rel=1e-12, abs=1e-12)


def random_span_counts(rng, n, num, num_positions):
    """Consistent counts: a span's count never exceeds the count of a span inside it."""
    counts = {}
    for length in range(1, n + 1):
        for i in range(n - length + 1):
            j = i + length
            if length == 1:
                counts[(i, j)] = rng.integers(50, num_positions[1] // 4, num)
            else:
                cap = np.minimum(counts[(i, j - 1)], counts[(i + 1, j)])
                counts[(i, j)] = 1 + (rng.random(num) * cap).astype(np.int64)
    return counts


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_scores_match_their_definitions_on_random_counts(n):
    rng = np.random.default_rng(n)
    num_positions = [0] + [100_000 - k for k in range(1, 6)]
    counts = random_span_counts(rng, n, 40, num_positions)
    log_prob = {s: [math.log(c / num_positions[s[1] - s[0]]) for c in counts[s].tolist()] for s in counts}
    pmi = measures.score("pmi", counts, num_positions, n)
    pmi_p2 = measures.score("pmi-p2", counts, num_positions, n)
    naive = measures.score("naive-pmi", counts, num_positions, n)
    frequency = measures.score("frequency", counts, num_positions, n)
    for row in range(40):
        whole = log_prob[(0, n)][row]
        best = max(sum(log_prob[s][row] for s in seg) for seg in compositions(n) if seg != [(0, n)])
        assert pmi[row] == pytest.approx(whole - best, abs=1e-9)
        assert pmi_p2[row] == pytest.approx(2 * whole - best, abs=1e-9)
        assert naive[row] == pytest.approx(whole - sum(log_prob[(i, i + 1)][row] for i in range(n)), abs=1e-9)
        assert frequency[row] == counts[(0, n)][row]
    # The all-words segmentation is one of those maximised over, so PMI never exceeds naive PMI,
    # and for bigrams it is the only one: the two coincide.
    assert np.all(pmi <= naive + 1e-9)
    if n == 2:
        np.testing.assert_allclose(pmi, naive, atol=1e-12)


def test_pmi_penalises_an_ngram_explained_by_a_strong_sub_span():
    # "kuala lumpur is": the bigram "kuala lumpur" explains the trigram, "is" is common.
    num_positions = [0, 10_000, 10_000, 10_000]
    counts = {(0, 1): np.array([20]), (1, 2): np.array([20]), (2, 3): np.array([1000]),
              (0, 2): np.array([20]), (1, 3): np.array([20]), (0, 3): np.array([20])}
    naive = measures.score("naive-pmi", counts, num_positions, 3)[0]
    pmi = measures.score("pmi", counts, num_positions, 3)[0]
    assert naive == pytest.approx(math.log(20 / 1e4) - 2 * math.log(20 / 1e4) - math.log(0.1))
    assert pmi == pytest.approx(-math.log(1000 / 1e4))  # = log p(kl is) - log p(kl) - log p(is)


def test_unknown_measure_is_rejected():
    with pytest.raises(ValueError, match="unknown measure"):
        measures.score("tf-idf", {(0, 2): np.array([1])}, [0, 1, 1], 2)
