"""The comparison's statistics on synthetic scores with known truth: the bootstrap interval's
coverage, the seed-aware interval's false-winner rate when seeds differ more than schemes, a
clear difference marked, determinism.

Synthetic runs: per-sequence NLL sums = tokens × (scheme mean + seed effect + sequence effect +
scheme-by-sequence effect) + token noise, the structure real per-token scores have (sequences
differ in difficulty, shared by every run; runs differ by seed). Tolerances are stated per test;
each uses a few hundred independent experiments, so a miscalibrated interval fails clearly.
"""
from __future__ import annotations

import numpy as np
import pytest

from pmi_jax import intervals

EXPERIMENTS = 300


def _counts(rng, num_sequences):
    return rng.integers(20, 126, num_sequences).astype(np.float64)


def _runs(rng, counts_S, means: dict[str, float], seeds: int, seed_sd: float, text_sd: float = 0.3,
          interaction_sd: float = 0.02, token_sd: float = 1.5):
    """{scheme: sums [R, S]} for runs scored on the same sequences."""
    difficulty_S = rng.normal(0, text_sd, len(counts_S))
    out = {}
    for scheme, mu in means.items():
        interaction_S = rng.normal(0, interaction_sd, len(counts_S))
        rows = []
        for _ in range(seeds):
            seed_effect = rng.normal(0, seed_sd)
            noise_S = rng.normal(0, token_sd, len(counts_S)) * np.sqrt(counts_S)  # a sum of token noises
            rows.append(counts_S * (mu + seed_effect + difficulty_S + interaction_S) + noise_S)
        out[scheme] = np.stack(rows)
    return out


def test_bootstrap_interval_covers_the_true_mean_95_percent_of_the_time():
    """Ratio mean over 60 sequences of varying length with sequence effects: 300 experiments,
    coverage within 0.035 of 0.95 (the binomial s.d. at 300 is 0.013; the percentile bootstrap
    runs slightly narrow at 60 clusters)."""
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(EXPERIMENTS):
        counts_S = _counts(rng, 60)
        sums_S = _runs(rng, counts_S, {"a": 4.0}, seeds=1, seed_sd=0.0)["a"][0]
        interval = intervals.mean_interval(sums_S, counts_S)
        covered += interval.low <= 4.0 <= interval.high
    assert abs(covered / EXPERIMENTS - 0.95) <= 0.035, covered / EXPERIMENTS


def test_seed_aware_interval_marks_no_winner_when_seeds_differ_more_than_schemes():
    """No scheme effect; the seed spread (s.d. 0.05 nats) dwarfs the text noise. Three seeds per
    scheme: a winner is marked in at most 10% of experiments (nominal 5%), while an interval
    over the scored text alone calls a difference in over a quarter of them (measured: 3.7% and 35%)."""
    rng = np.random.default_rng(2)
    marked = text_only_separated = 0
    for _ in range(EXPERIMENTS):
        counts_S = _counts(rng, 40)
        sums = _runs(rng, counts_S, {"random_token": 4.0, "pmi": 4.0}, seeds=3, seed_sd=0.05)
        comparison = intervals.compare_schemes(sums, counts_S, samples=500, seed=0)
        marked += comparison.best is not None
        text_only_separated += comparison.differences[0].text_interval.excludes_zero
    assert marked / EXPERIMENTS <= 0.10, marked / EXPERIMENTS
    assert text_only_separated / EXPERIMENTS >= 0.25, text_only_separated / EXPERIMENTS  # 5x the nominal rate


def test_seed_aware_difference_interval_covers_the_true_difference():
    """Scheme effect 0.03 nats, seed s.d. 0.03, two seeds per scheme: coverage ≥ 0.92."""
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(EXPERIMENTS):
        counts_S = _counts(rng, 40)
        sums = _runs(rng, counts_S, {"a": 4.0, "b": 4.03}, seeds=2, seed_sd=0.03)
        d = next(d for d in intervals.compare_schemes(sums, counts_S, samples=500).differences
                 if (d.first, d.second) == ("a", "b"))
        covered += d.interval.low <= -0.03 <= d.interval.high
    assert covered / EXPERIMENTS >= 0.92, covered / EXPERIMENTS


def test_a_clear_difference_is_marked_and_reported_with_the_seed_spread():
    rng = np.random.default_rng(4)
    counts_S = _counts(rng, 40)
    sums = _runs(rng, counts_S, {"random_token": 3.7, "random_span": 4.0, "pmi": 4.2}, seeds=3, seed_sd=0.01)
    c = intervals.compare_schemes(sums, counts_S)
    assert c.best == "random_token" and c.seed_aware and c.seed_df == 6
    d = next(d for d in c.differences if (d.first, d.second) == ("random_token", "pmi"))
    assert d.interval.high < 0 and d.interval.estimate == pytest.approx(-0.5, abs=0.05)
    assert 0 < d.seed_spread < 0.1
    assert d.interval.high - d.interval.low >= d.text_interval.high - d.text_interval.low  # seeds only widen
    value = next(v for v in c.values if v.scheme == "pmi")
    assert len(value.seed_means) == 3 and value.interval.low < value.interval.estimate < value.interval.high


def test_one_seed_per_scheme_covers_the_text_only_and_marks_no_winner():
    rng = np.random.default_rng(5)
    counts_S = _counts(rng, 40)
    sums = _runs(rng, counts_S, {"random_token": 3.0, "pmi": 4.0}, seeds=1, seed_sd=0.05)
    c = intervals.compare_schemes(sums, counts_S)
    assert not c.seed_aware and c.seed_sd is None and c.best is None
    d = c.differences[0]
    assert d.interval == d.text_interval and d.interval.excludes_zero  # clear on this text, but one seed


def test_the_bootstrap_is_deterministic():
    rng = np.random.default_rng(6)
    counts_S = _counts(rng, 30)
    sums = _runs(rng, counts_S, {"a": 4.0, "b": 4.1}, seeds=2, seed_sd=0.02)
    assert intervals.compare_schemes(sums, counts_S) == intervals.compare_schemes(sums, counts_S)
    assert intervals.mean_interval(sums["a"][0], counts_S) == intervals.mean_interval(sums["a"][0], counts_S)
    assert intervals.mean_interval(sums["a"][0], counts_S, seed=1) != intervals.mean_interval(sums["a"][0], counts_S)


def test_per_sequence_sums_and_counts():
    ids, sums, counts = intervals.per_sequence(np.array([3, 3, 5, 9, 9, 9]), np.array([1.0, 2.0, 3.0, 1.0, 1.0, 2.0]))
    assert ids.tolist() == [3, 5, 9] and sums.tolist() == [3.0, 3.0, 4.0] and counts.tolist() == [2, 1, 3]
