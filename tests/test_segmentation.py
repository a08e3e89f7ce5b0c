"""Masking units: the vectorised segmentation against a literal reading of its definition."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from pmi_jax.preprocess.corpus import segmentation
from pmi_jax.preprocess.corpus.segmentation import NgramMatcher, span_priority


def segment(vocab, docs, seed, doc_indices=None):
    """Units of each document (lists of word tuples) via the production path."""
    matcher = NgramMatcher([tuple(g.split()) for g in vocab])
    words = [w for d in docs for w in d.split()]
    splits = np.concatenate([[0], np.cumsum([len(d.split()) for d in docs])])
    doc_indices = np.arange(len(docs)) if doc_indices is None else np.asarray(doc_indices)
    starts = segmentation.unit_starts(matcher, tf.constant(words, dtype=tf.string), splits, doc_indices, seed)
    units = []
    for d in range(len(docs)):
        doc_words, doc_starts = words[splits[d]:splits[d + 1]], starts[splits[d]:splits[d + 1]]
        bounds = list(np.flatnonzero(doc_starts)) + [len(doc_words)]
        units.append([tuple(doc_words[a:b]) for a, b in zip(bounds, bounds[1:])])
    return units


def all_matches(vocab, words):
    """Every span whose words are an entry, by plain string comparison (independent of the trie)."""
    entries = set(vocab)
    return [(s, e) for s in range(len(words)) for e in range(s + 2, len(words) + 1) if " ".join(words[s:e]) in entries]


def reference_units(vocab, words, seed, doc_index):
    """The module docstring's procedure, one match at a time, as spans [s, e)."""
    remaining = all_matches(vocab, words)
    accepted = []

    def overlap(a, b):
        return a[0] < b[1] and b[0] < a[1]

    while remaining:
        top = [m for m in remaining if not any(o != m and o[0] <= m[0] and m[1] <= o[1] for o in remaining)]
        prio = {m: int(span_priority(seed, np.array(doc_index), np.array(m[0]), np.array(m[1]))) for m in top}
        won = []
        for m in sorted(top, key=lambda m: (prio[m], -m[0]), reverse=True):
            if not any(overlap(m, a) for a in won):
                won.append(m)
        accepted += won
        remaining = [m for m in remaining if m not in top and not any(overlap(m, a) for a in accepted)]
    return sorted(accepted)


def spans_of(units):
    out, pos = [], 0
    for u in units:
        if len(u) > 1:
            out.append((pos, pos + len(u)))
        pos += len(u)
    return out


def random_case(rng):
    """Few distinct words and many entries, so that matches nest and overlap often."""
    alphabet = list("abcdef"[:rng.integers(2, 7)])
    vocab = sorted({" ".join(rng.choice(alphabet, size=rng.integers(2, 6))) for _ in range(rng.integers(1, 40))})
    docs = [" ".join(rng.choice(alphabet, size=rng.integers(0, 30))) for _ in range(rng.integers(1, 6))]
    return vocab, docs


@pytest.mark.parametrize("case", range(40))
def test_matches_reference_and_properties(case):
    rng = np.random.default_rng(case)
    vocab, docs = random_case(rng)
    seed = int(rng.integers(0, 1000))
    doc_indices = rng.permutation(1000)[:len(docs)]
    units = segment(vocab, docs, seed, doc_indices)
    for doc, doc_units, doc_index in zip(docs, units, doc_indices):
        words = doc.split()
        assert [w for u in doc_units for w in u] == words  # a partition of the document, in order
        spans = spans_of(doc_units)
        assert spans == reference_units(vocab, words, seed, int(doc_index))
        for s, e in spans:
            assert " ".join(words[s:e]) in vocab  # every multi-word unit is an entry
        for m in all_matches(vocab, words):
            if m not in spans:  # nothing left that could still be a unit
                assert any(m[0] < e and s < m[1] for s, e in spans), (m, spans)
        for s, e in spans:  # maximal: a longer entry containing a unit collides with another unit
            for m in all_matches(vocab, words):
                if m != (s, e) and m[0] <= s and e <= m[1]:
                    assert any(m[0] < e2 and s2 < m[1] for s2, e2 in spans if (s2, e2) != (s, e))


def test_longest_match_wins_for_every_seed():
    for seed in range(50):
        assert segment(["a b", "b c", "a b c", "b c d"], ["x a b c d y"], seed) in (
            [[("x",), ("a", "b", "c"), ("d",), ("y",)]],
            [[("x",), ("a",), ("b", "c", "d"), ("y",)]],
        )
        assert segment(["united states", "the united states"], ["in the united states now"], seed) == [
            [("in",), ("the", "united", "states"), ("now",)]]


def test_overlap_goes_both_ways_fairly_and_reproducibly():
    """'a b' vs 'b c' in 'a b c': each wins about half the seeds (400 seeds, 5 standard deviations)."""
    outcomes = [segment(["a b", "b c"], ["a b c"], seed)[0] for seed in range(400)]
    first = sum(u == [("a", "b"), ("c",)] for u in outcomes)
    second = sum(u == [("a",), ("b", "c")] for u in outcomes)
    assert first + second == 400
    assert abs(first / 400 - 0.5) < 5 * 0.025
    assert outcomes == [segment(["a b", "b c"], ["a b c"], seed)[0] for seed in range(400)]


def test_overlap_choice_varies_across_documents_of_one_seed():
    docs = ["a b c"] * 200
    units = segment(["a b", "b c"], docs, seed=7)
    assert 60 < sum(u == [("a", "b"), ("c",)] for u in units) < 140


def test_contained_entry_gets_its_turn_when_its_container_loses():
    """'a b' is inside 'a b c'; when 'c d' beats 'a b c', 'a b' becomes a unit."""
    seen = set()
    for seed in range(60):
        (units,) = segment(["a b", "a b c", "c d"], ["a b c d"], seed)
        seen.add(tuple(units))
    assert seen == {(("a", "b", "c"), ("d",)), (("a", "b"), ("c", "d"))}


def test_units_never_cross_documents():
    units = segment(["a b", "x a b y"], ["x a", "b y", "a", "b"], seed=0)
    assert units == [[("x",), ("a",)], [("b",), ("y",)], [("a",)], [("b",)]]


def test_independent_of_batching():
    rng = np.random.default_rng(3)
    vocab, docs = random_case(rng)
    docs = docs * 4
    whole = segment(vocab, docs, seed=5)
    halves = (segment(vocab, docs[:5], seed=5, doc_indices=range(5))
              + segment(vocab, docs[5:], seed=5, doc_indices=range(5, len(docs))))
    assert whole == halves


def test_word_ids_unknown_words_and_longer_entries():
    matcher = NgramMatcher([("new", "york"), ("new", "york", "city", "hall", "park", "west")])
    assert matcher.max_n == 6
    ids = matcher.word_ids(tf.constant(["new", "zebra", "york", ""]))
    assert ids[1] == ids[3] == -1 and ids[0] >= 0 and ids[2] >= 0
    (units,) = segment(["new york", "new york city hall park west"], ["the new york city hall park west"], 0)
    assert units == [("the",), ("new", "york", "city", "hall", "park", "west")]


def test_priority_is_a_function_of_its_arguments():
    a = span_priority(1, np.array([0, 0, 1]), np.array([2, 2, 2]), np.array([4, 4, 4]))
    assert a[0] == a[1] != a[2]
    bits = np.unpackbits(span_priority(0, np.arange(4096), np.zeros(4096, np.int64), np.full(4096, 2)).view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.01  # 262144 bits: sd 0.001


def test_all_vocabulary_entries_are_found():
    """A document made of every entry, separated by a word in no entry: each entry is a unit."""
    vocab = [" ".join(p) for p in itertools.product("abc", repeat=3)][:20]
    doc = " z ".join(vocab)
    (units,) = segment(vocab, [doc], seed=0)
    assert [" ".join(u) for u in units if len(u) > 1] == vocab


def test_random_cases_exercise_overlaps_and_later_rounds():
    """Guard against vacuous random cases: they must contain partial overlaps and round-2 units."""
    partial = later_rounds = 0
    for case in range(40):
        vocab, docs = random_case(np.random.default_rng(case))
        for doc in docs:
            words = doc.split()
            matches = all_matches(vocab, words)
            top = [m for m in matches if not any(o != m and o[0] <= m[0] and m[1] <= o[1] for o in matches)]
            partial += sum(a < b and a[0] < b[1] and b[0] < a[1] for a in top for b in top)
            later_rounds += sum(u not in top for u in reference_units(vocab, words, 0, 0))
    assert partial >= 50 and later_rounds >= 5
