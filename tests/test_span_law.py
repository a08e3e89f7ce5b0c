"""random_span is SpanBERT's span masking (docs/design.md, "Masking schemes", random_span).

The reference is SpanBERT's code (facebookresearch/SpanBERT, pretraining/fairseq/data/masking.py:
`PairWithSpanMaskingScheme.mask`, `span_masking` with `--replacement-method span`,
`merge_intervals`), re-stated here as a plain Python loop over tokens (`spanbert_span`). Each
rule gets a test: the loop replayed on the same random draws gives the same selection (exact);
the law of the selections, computed exactly by enumerating SpanBERT's loop on small sequences
(`exact_law`), against 20,000 masked rows (chi-square, p > 1e-3, cells with an expectation under
5 pooled), with the same test rejecting the nearest wrong rule (p < 1e-6) so that it has power;
the budget exactly; the replacement law by chi-square.
"""
from __future__ import annotations

import fractions
import math
import os

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from pmi_jax import masking, randomness, tasks
from pmi_jax.randomness import Stream
from tests.prepared_data import PAD, unit_fate, write_prepared_corpus

ROWS = 20_000


def truncated_geometric(p: float = masking.SPAN_P, top: int = masking.SPAN_MAX_WORDS) -> np.ndarray:
    """P(length = k) for k = 1..top (index k - 1), the renormalised truncated geometric (SpanBERT's)."""
    pmf = p * (1 - p) ** np.arange(top)
    return pmf / pmf.sum()


def clipped_geometric(p: float = masking.SPAN_P, top: int = masking.SPAN_MAX_WORDS) -> np.ndarray:
    """The wrong law: the untruncated geometric's tail piled onto `top`."""
    pmf = p * (1 - p) ** np.arange(top)
    pmf[-1] = (1 - p) ** (top - 1)
    return pmf


def spanbert_span(word_ids, selected: frozenset, anchor: int, k: int, left: int, cross_documents=False) -> frozenset:
    """SpanBERT's loop for one accepted anchor: from the anchor's word start, k words, token by
    token, until `left` new tokens are taken or the block (here: document) ends."""
    start = anchor
    while start > 0 and word_ids[start - 1] == word_ids[anchor]:
        start -= 1
    taken, words, i = set(selected), 0, start
    while i < len(word_ids) and len(taken) - len(selected) < left:
        if word_ids[i] < 0:
            if not cross_documents:
                break
            i += 1
            continue
        if i == start or word_ids[i] != word_ids[i - 1]:
            words += 1
            if words > k:
                break
        taken.add(i)
        i += 1
    return frozenset(taken)


def spanbert_replay(word_ids, budget: int, anchors, lengths) -> frozenset:
    """SpanBERT's whole loop on given draws: anchor t is the anchors[t]-th content token."""
    content = [i for i, w in enumerate(word_ids) if w >= 0]
    selected, left = frozenset(), min(budget, len(content))
    for rank, k in zip(anchors, lengths):
        if left == 0:
            break
        anchor = content[rank]
        if anchor in selected:
            continue  # SpanBERT: `if anchor in mask: continue`
        new = spanbert_span(word_ids, selected, anchor, k, left)
        left -= len(new) - len(selected)
        selected = new
    assert left == 0, "ran out of draws"
    return selected


def exact_law(word_ids, budget: int, pmf=None, anchor_weights=None, cross_documents=False) -> dict:
    """{selected positions: probability} of SpanBERT's loop. A rejected anchor only repeats the
    draw, so each accepted anchor is uniform over the unselected content tokens (or weighted
    by `anchor_weights`, for the wrong rules)."""
    pmf = truncated_geometric() if pmf is None else pmf
    content = [i for i, w in enumerate(word_ids) if w >= 0]
    weights = np.ones(len(word_ids)) if anchor_weights is None else np.asarray(anchor_weights, float)
    states, done = {frozenset(): 1.0}, {}
    while states:
        following = {}
        for selected, p in states.items():
            if len(selected) == min(budget, len(content)):
                done[selected] = done.get(selected, 0.0) + p
                continue
            free = [a for a in content if a not in selected]
            total = sum(weights[a] for a in free)
            for anchor in free:
                for k, pk in enumerate(pmf, start=1):
                    new = spanbert_span(word_ids, selected, anchor, k, budget - len(selected), cross_documents)
                    following[new] = following.get(new, 0.0) + p * weights[anchor] / total * pk
        states = following
    return done


def tf_selections(word_ids, rate_units: int, rows: int = ROWS, seed: int = 0) -> list[frozenset]:
    """The selections of `rows` copies of one sequence under distinct keys."""
    word_ids_BxL = tf.constant(np.tile(np.asarray(word_ids, np.int32), (rows, 1)))
    keys = randomness.hash_keys(tf.fill([rows], tf.constant(seed, tf.int64)), tf.range(rows, dtype=tf.int64))
    budget = masking.span_budget(tf.reduce_sum(tf.cast(word_ids_BxL >= 0, tf.int32), axis=-1), rate_units)
    selected = tf.function(masking.span_selection, jit_compile=True)(word_ids_BxL, budget, keys).numpy()
    return [frozenset(np.flatnonzero(row).tolist()) for row in selected]


def chi_square_p(observed: list[frozenset], law: dict) -> float:
    """p-value of the observed selections against a law, cells with expectation < 5 pooled
    (an observation outside the law's support counts in the pooled cell)."""
    n = len(observed)
    cells = sorted(law, key=lambda s: -law[s])
    big = [s for s in cells if law[s] * n >= 5]
    index = {s: i for i, s in enumerate(big)}
    counts = np.zeros(len(big) + 1)
    for s in observed:
        counts[index.get(s, len(big))] += 1
    expected = np.array([law[s] * n for s in big] + [n - sum(law[s] * n for s in big)])
    if expected[-1] < 1e-9:  # nothing pooled: a count there is impossible under the law
        return 0.0 if counts[-1] else stats.chisquare(counts[:-1], expected[:-1]).pvalue
    return stats.chisquare(counts, expected).pvalue


def pooled_chi_square_p(observed: np.ndarray, p: np.ndarray) -> float:
    """Chi-square p-value of counts per id against probabilities `p`, the ids expected under 5
    times pooled into one cell (dropped where their probability is 0: a count there fails)."""
    n = observed.sum()
    big, small = p * n >= 5, (p * n < 5) & (p > 0)
    if observed[p == 0].sum():
        return 0.0
    counts, expected = observed[big], p[big] * n
    if small.any():
        counts, expected = np.append(counts, observed[small].sum()), np.append(expected, p[small].sum() * n)
    return stats.chisquare(counts, expected).pvalue


def rate_units_for(budget: int, n: int) -> int:
    """A rate in basis points whose ceil(rate x n) is `budget`."""
    units = budget * 10_000 // n
    assert math.ceil(fractions.Fraction(units * n, 10_000)) == budget
    return units


# ---------------------------------------------------------------------------------------
# The procedure, draw by draw
# ---------------------------------------------------------------------------------------


def _random_rows(rng, rows: int, length: int) -> np.ndarray:
    """word ids [rows, length]: [CLS], documents of words of 1-3 tokens split by [SEP], [SEP], padding."""
    out = np.full((rows, length), -1, np.int32)
    for row in out:
        end = int(rng.integers(3, length + 1))
        word, i = 0, 1
        while i < end - 1:
            if rng.random() < 0.03 and i > 1 and row[i - 1] >= 0:
                i += 1  # a [SEP] between documents
                continue
            size = int(rng.choice([1, 2, 3], p=[0.7, 0.2, 0.1]))
            row[i:min(i + size, end - 1)] = word
            word, i = word + 1, i + size
    return out


def test_selection_is_spanbert_loop_replayed_on_the_same_draws():
    rng = np.random.default_rng(7)
    word_ids = _random_rows(rng, 300, 96)
    keys = randomness.hash_keys(tf.range(300, dtype=tf.int64), tf.constant(5, tf.int64) + tf.zeros(300, tf.int64))
    rate_units = tf.constant(rng.choice([1500, 3000, 4000, 10_000], size=300).astype(np.int32))
    num = (word_ids >= 0).sum(axis=1)
    budget = masking.span_budget(tf.constant(num), rate_units)
    selected = masking.span_selection(tf.constant(word_ids), budget, keys).numpy()
    draws = 3000
    anchors = randomness.random_below(keys, Stream.SPAN_ANCHORS, draws, tf.constant(np.maximum(num, 1))).numpy()
    lengths = masking.span_lengths(keys, draws).numpy()
    for row, ids in enumerate(word_ids):
        expected = spanbert_replay(ids.tolist(), int(budget[row]), anchors[row], lengths[row])
        assert frozenset(np.flatnonzero(selected[row]).tolist()) == expected, row


def test_one_fate_per_merged_span():
    """Runs of selected tokens (overlapping and adjacent spans merged, SpanBERT's
    `merge_intervals`) are the units of the 80/10/10 draw: span s of a row draws UNIT_FATE at s."""
    selected = np.array([[0, 1, 1, 0, 1, 1, 1, 0, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0, 1, 1]], bool)
    keys = randomness.hash_keys(tf.constant([3, 4], tf.int64))
    codes = masking.span_codes(tf.constant(selected), keys).numpy()
    fates = randomness.random_uniform(keys, Stream.UNIT_FATE, 10).numpy()
    for row in range(2):
        runs = np.split(np.flatnonzero(selected[row]), np.flatnonzero(np.diff(np.flatnonzero(selected[row])) > 1) + 1)
        for s, run in enumerate(runs):
            u = fates[row, s]
            expected = masking._MASKED if u < 0.8 else masking._RANDOMISED if u < 0.9 else masking._KEPT
            assert (codes[row, run] == expected).all()
        assert (codes[row, ~selected[row]] == masking._UNSELECTED).all()


# ---------------------------------------------------------------------------------------
# The laws, one rule each, against exact enumerations of SpanBERT's loop
# ---------------------------------------------------------------------------------------


def test_span_draws_follow_the_truncated_geometric():
    pmf = truncated_geometric()
    assert float(np.arange(1, 11) @ pmf) == pytest.approx(3.7971, abs=1e-4)
    assert float(pmf[-1]) == pytest.approx(0.03007, abs=1e-5)
    lengths = masking.span_lengths(randomness.hash_keys(tf.range(400, dtype=tf.int64)), 500).numpy().ravel()
    counts = np.bincount(lengths, minlength=11)[1:]
    assert len(counts) == 10 and counts.sum() == lengths.size
    assert stats.chisquare(counts, pmf * lengths.size).pvalue > 1e-3
    assert stats.chisquare(counts, clipped_geometric() * lengths.size).pvalue < 1e-6


def test_selected_spans_follow_the_length_law_with_its_truncation():
    """One document of 14 one-token words, a budget of 10: how often the mask is one run of
    10 (a draw of 10 words from the first 5 words) and the shapes of shorter spans depend on
    the whole law; the untruncated law clipped at 10 (P(10) = 13.4% instead of 3.0%) is rejected."""
    word_ids = [-1, *range(14), -1]
    rate = rate_units_for(10, 14)
    observed = tf_selections(word_ids, rate)
    assert chi_square_p(observed, exact_law(word_ids, 10)) > 1e-3
    assert chi_square_p(observed, exact_law(word_ids, 10, pmf=clipped_geometric())) < 1e-6


def test_anchors_are_uniform_over_tokens_and_moved_to_their_word_start():
    """A budget of one token: the one selected token is the first of the anchor's word, whose
    probability is its share of the tokens (not of the words, the rejected alternative)."""
    sizes = [1, 3, 1, 2, 4, 1, 1, 2]
    word_ids = [-1, *np.repeat(np.arange(len(sizes)), sizes).tolist(), -1]
    observed = tf_selections(word_ids, rate_units_for(1, sum(sizes)))
    starts = {1 + sum(sizes[:w]) for w in range(len(sizes))}
    assert all(len(s) == 1 and next(iter(s)) in starts for s in observed)
    assert chi_square_p(observed, exact_law(word_ids, 1)) > 1e-3
    per_word = np.array([1.0 / size if w >= 0 else 0.0 for w in word_ids for size in [sizes[w]]])
    assert chi_square_p(observed, exact_law(word_ids, 1, anchor_weights=per_word)) < 1e-6


def test_spans_run_into_earlier_spans_and_merge():
    """One document of 9 one-token words, budget 6: later spans run through earlier ones (their
    tokens count among the span's words, not against the budget). The alternative that SpanBERT
    does not do, a span starting at an anchor that overlaps nothing being cut at an earlier
    span, would give each selection another probability: the law of the loop itself is tested,
    and a law without overlaps (spans stop before a selected token) is rejected."""
    word_ids = [-1, *range(9), -1]
    observed = tf_selections(word_ids, rate_units_for(6, 9))
    assert chi_square_p(observed, exact_law(word_ids, 6)) > 1e-3
    runs = np.array([len(np.split(sorted(s), np.flatnonzero(np.diff(sorted(s)) > 1) + 1)) for s in observed])
    law = exact_law(word_ids, 6)
    mean_runs = sum(p * len(np.split(sorted(s), np.flatnonzero(np.diff(sorted(s)) > 1) + 1)) for s, p in law.items())
    assert abs(runs.mean() - mean_runs) < 5 * runs.std() / math.sqrt(len(runs))
    stopping = _stopping_law(word_ids, 6)
    assert chi_square_p(observed, stopping) < 1e-6


def _stopping_law(word_ids, budget: int) -> dict:
    """The wrong rule: a span ends before the first token already selected."""
    pmf = truncated_geometric()
    content = [i for i, w in enumerate(word_ids) if w >= 0]
    states, done = {frozenset(): 1.0}, {}
    while states:
        following = {}
        for selected, p in states.items():
            if len(selected) == budget:
                done[selected] = done.get(selected, 0.0) + p
                continue
            free = [a for a in content if a not in selected]
            for anchor in free:
                for k, pk in enumerate(pmf, start=1):
                    taken, i = set(selected), anchor
                    while i < len(word_ids) and word_ids[i] >= 0 and i not in selected and i - anchor < k \
                            and len(taken) - len(selected) < budget - len(selected):
                        taken.add(i)
                        i += 1
                    new = frozenset(taken)
                    following[new] = following.get(new, 0.0) + p / len(free) * pk
        states = following
    return done


def test_spans_stop_at_document_ends():
    """Two documents in one sequence (words 0-2, then 3-9), budget 5: a span from the first
    document ends at its [SEP]; anchors are uniform over the whole sequence's tokens. The law
    of spans that run on into the next document is rejected."""
    word_ids = [-1, 0, 1, 2, -1, *range(3, 10), -1]
    observed = tf_selections(word_ids, rate_units_for(5, 10))
    assert chi_square_p(observed, exact_law(word_ids, 5)) > 1e-3
    assert chi_square_p(observed, exact_law(word_ids, 5, cross_documents=True)) < 1e-6


def test_budget_is_the_rate_rounded_up():
    n = np.arange(0, 3000)
    for rate in (0.15, 0.3, 0.0001, 0.3333, 1.0):
        units = round(rate * 10_000)
        expected = [math.ceil(fractions.Fraction(str(rate)) * int(k)) for k in n]
        np.testing.assert_array_equal(masking.span_budget(tf.constant(n), units).numpy(), expected)
        assert [masking.scheme_budget("random_span", int(k), units) for k in n[::97]] == expected[::97]


def test_the_mlm_head_gathers_every_span_budget():
    """The ceil budget can pass BERT's rounded share (83 tokens at 15%: 13 against 12):
    config.max_predictions covers it at every length and rate."""
    from pmi_jax.config import max_predictions

    assert (max_predictions(128), max_predictions(512), max_predictions(83)) == (20, 80, 16)
    for rate in (0.15, 0.3, 0.01, 0.4, 1.0):
        units = round(rate * 10_000)
        lengths = np.arange(3, 2048)
        budgets = masking.span_budget(tf.constant(lengths - 2), units).numpy()
        assert all(b <= max_predictions(int(n), rate) for n, b in zip(lengths, budgets))


def test_random_replacements_follow_the_unigram_counts():
    counts = np.array([0, 0, 0, 0, 0, 5000, 1, 0, 300, 20, 2000, 7, 0, 90] + [3] * 30, np.int64)
    keys = randomness.hash_keys(tf.range(500, dtype=tf.int64))
    draws = masking.unigram_draws(keys, 200, tf.constant(np.cumsum(counts))).numpy().ravel()
    observed = np.bincount(draws, minlength=len(counts))
    assert len(observed) == len(counts) and observed[counts == 0].sum() == 0
    assert pooled_chi_square_p(observed, counts / counts.sum()) > 1e-3
    uniform = np.where(counts > 0, 1.0, 0.0)
    assert pooled_chi_square_p(observed, uniform / uniform.sum()) < 1e-6
    # Totals beyond 2^32 (a corpus of billions of tokens) keep the law: two ids, counts 3 : 1.
    huge = np.array([3 * 2**40, 2**40], np.int64)
    share = masking.unigram_draws(keys, 200, tf.constant(np.cumsum(huge))).numpy().mean()
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 100_000)


# ---------------------------------------------------------------------------------------
# Through the seqio task on a prepared corpus
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("spanbert"))
    write_prepared_corpus(data_dir, sequences={"train": 600, "validation": 4}, seq_len=128, seed=11, unit_names=())
    return data_dir


def test_a_corpus_without_token_counts_lacks_only_random_span(tmp_path):
    import json

    from pmi_jax.errors import UserInputError

    data_dir = str(tmp_path / "old")
    write_prepared_corpus(data_dir, sequences={"train": 20, "validation": 4}, seq_len=64, unit_names=("pmi",))
    path = os.path.join(data_dir, "metadata.json")
    metadata = json.load(open(path))
    for split in metadata["splits"].values():
        del split["token_counts"]
    json.dump(metadata, open(path, "w"))
    corpus = tasks.TaskCorpus(data_dir)
    assert corpus.schemes == ["random_token", "whole_word", "pmi"]
    assert tasks.register_corpus("old_corpus", data_dir) == ["old_corpus_random_token", "old_corpus_whole_word",
                                                             "old_corpus_pmi"]
    with pytest.raises(UserInputError, match=r"no token counts .* corpus prepare --overwrite"):
        corpus.check_scheme("random_span")


def _task_examples(data_dir: str, rate: float = masking.MASK_RATE) -> list[dict]:
    task = tasks.make_task("test_spanbert", tasks.TaskCorpus(data_dir), "random_span", mask_rate=masking.MaskRate(rate))
    examples = []
    for batch in task.get_dataset(None, "train", shuffle=False, seed=3).batch(256).as_numpy_iterator():
        for i, length in enumerate((batch["targets"] != PAD).sum(axis=1)):
            examples.append({k: v[i, :length] if v.ndim == 2 else v[i] for k, v in batch.items()})
    return examples


def test_task_masks_fill_the_budget_exactly_at_every_rate_and_nest(corpus_dir):
    by_rate = {rate: _task_examples(corpus_dir, rate) for rate in (0.15, 0.3)}
    for rate, examples in by_rate.items():
        for ex in examples:
            n = int((ex["units"] >= 0).sum())
            assert int(ex["weights"].sum()) == math.ceil(fractions.Fraction(str(rate)) * n)
    for low, high in zip(by_rate[0.15], by_rate[0.3]):  # the same draws, a larger budget
        assert (high["weights"] >= low["weights"]).all()


def test_task_replacements_follow_the_train_split_unigram_counts(corpus_dir):
    counts = tasks.TaskCorpus(corpus_dir).token_counts("train")
    drawn, fates = [], {"mask": 0, "random": 0, "keep": 0}
    for ex in _task_examples(corpus_dir):
        selected = ex["weights"] > 0
        runs = np.split(np.flatnonzero(selected), np.flatnonzero(np.diff(np.flatnonzero(selected)) > 1) + 1)
        for run in runs:
            shown, original = ex["inputs"][run], ex["targets"][run]
            fate = unit_fate(shown, original)
            fates[fate] += 1
            if fate == "random":
                drawn.extend(shown.tolist())
            assert len(np.unique(ex["units"][run])) == 1, "a merged span is one unit"
    total = sum(fates.values())
    for fate, p in (("mask", 0.8), ("random", 0.1), ("keep", 0.1)):  # per merged span, 5 binomial sds
        assert abs(fates[fate] / total - p) < 5 * math.sqrt(p * (1 - p) / total), fates
    observed = np.bincount(drawn, minlength=len(counts))
    assert len(drawn) > 1000 and len(observed) == len(counts)
    # Chi-square against the train split's unigram law, p > 1e-3 (a random span whose draws all
    # equal the originals counts as kept: a bias far below the test's resolution); the uniform
    # law over the regular ids (every other scheme's) is rejected.
    assert pooled_chi_square_p(observed, counts / counts.sum()) > 1e-3
    regular = np.zeros(len(counts))
    regular[tasks.TaskCorpus(corpus_dir).regular_ids] = 1.0
    assert pooled_chi_square_p(observed, regular / regular.sum()) < 1e-6


# ---------------------------------------------------------------------------------------
# The lag's measure: masked tokens whose two neighbours are visible
# ---------------------------------------------------------------------------------------


def test_neighbour_visibility_counts_tokens_with_both_neighbours_unselected():
    weights = np.array([[0, 1, 0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0, 0, 0, 1]], np.float32)
    v = masking.neighbour_visibility(weights)
    # Row 0: positions 1 and 7 are isolated, 3 and 4 neighbour each other; row 1: 2 and 8 (the
    # row's end counts as unselected).
    assert (v.isolated, v.selected) == (4, 6) and v.share == pytest.approx(4 / 6)
    assert 0 < v.half_width < 1


def test_neighbour_visibility_of_random_token_masks_is_its_exact_expectation(corpus_dir):
    """random_token selects `budget` of a row's n content tokens uniformly: token i is selected
    with its c content neighbours unselected with probability C(n - 1 - c, b - 1) / C(n, b);
    the measured count over 600 sequences lies within 5 of its standard errors of the sum."""
    task = tasks.make_task("test_context", tasks.TaskCorpus(corpus_dir), "random_token")
    weights, expected = [], 0.0
    for batch in task.get_dataset(None, "train", shuffle=False, seed=0).batch(256).as_numpy_iterator():
        weights.append(batch["weights"])
        for units in batch["units"]:
            content = units >= 0
            n = int(content.sum())
            b = masking.masking_budget(n)
            padded = np.pad(content, 1)
            neighbours = padded[:-2].astype(int) + padded[2:].astype(int)
            for c in neighbours[content]:
                expected += math.comb(n - 1 - int(c), b - 1) / math.comb(n, b)
    v = masking.neighbour_visibility(np.concatenate(weights))
    assert abs(v.isolated - expected) < 5 * (v.half_width / 1.96) * v.selected, (v.isolated, expected)
