"""InforMask (docs/design.md, "InforMask"): the offline token rates, the weighted sample that masks
by them, and the scheme end to end through the CLI.

Oracles are hand computations or independent plain-Python re-derivations; statistical checks
state their tolerance where they make them.
"""
from __future__ import annotations

import json
import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from pmi_jax import informask, masking, randomness, tasks
from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.formats import informask_rates, prepared_corpus
from tests.prepared_data import (CLS, MASK, PAD, SEP, SPECIAL_TOKENS, read_prepared_split, write_given_sequences,
                                 write_prepared_corpus)

A, B, C, D, E, Z = range(5, 11)  # the hand corpus's tokens; Z never occurs
HAND_VOCAB = list(SPECIAL_TOKENS) + ["a", "b", "c", "d", "e", "z"]


def _sequence(ids, shard=0, position=0):
    ids = np.asarray(ids, np.int64)
    return informask.content_of(shard, position, ids, np.where(np.isin(ids, [CLS, SEP]), -1, 0))


# ---------------------------------------------------------------- offline: counts, PMI, relevance


def test_window_pairs_stay_inside_a_document():
    seq = _sequence([CLS, A, B, C, SEP, A, B, SEP])  # documents (a b c) and (a b)
    i, j = informask.window_pairs(seq, 2)
    assert sorted(zip(i.tolist(), j.tolist())) == [(0, 1), (0, 2), (1, 2), (3, 4)]
    i, j = informask.window_pairs(seq, 1)
    assert sorted(zip(i.tolist(), j.tolist())) == [(0, 1), (1, 2), (3, 4)]


def test_pmi_by_hand():
    """Two sequences, window 1. Tokens: a 2, b 2, c 3, d 1 (N = 8). Unordered window pairs:
    {a,b} 2, {b,c} 1, {c,c} 1, {c,d} 1 (5 pairs, 10 ordered). PMI = log p(x, y) / (p(x) p(y)) with
    p(x, y) the share of ordered pairs: {a,b}: (2/10) / (2/8 * 2/8) = 3.2; {b,c}: (1/10) / (2/8 * 3/8)
    = 16/15; {c,c}: (2/10) / (3/8)^2 = 64/45; {c,d}: (1/10) / (3/8 * 1/8) = 32/15; {a,c} unseen: 0."""
    sequences = [_sequence([CLS, A, B, C, SEP, A, B, SEP]), _sequence([CLS, C, C, D, SEP])]
    counts = informask.count(sequences, len(HAND_VOCAB), window=1)
    np.testing.assert_array_equal(counts.tokens[A:Z + 1], [2, 2, 3, 1, 0, 0])
    assert counts.pairs.sum() == 5
    a = np.array([A, B, B, C, C, D, A])
    b = np.array([B, A, C, C, D, C, C])
    expected = np.log([3.2, 3.2, 16 / 15, 64 / 45, 32 / 15, 32 / 15, 1.0])
    np.testing.assert_allclose(counts.pmi(a, b, min_pair_count=1), expected, rtol=1e-12)
    # Pairs seen fewer than min_pair_count times count as PMI 0: only {a,b} is seen twice.
    np.testing.assert_allclose(counts.pmi(a, b, min_pair_count=2), [math.log(3.2)] * 2 + [0.0] * 5, rtol=1e-12)


def test_count_merges_partial_counts_exactly(monkeypatch):
    """Counts flushed every few pairs (as on a large corpus) equal counts taken at once."""
    rng = np.random.default_rng(0)
    sequences = [_sequence([CLS, *rng.integers(5, 11, size=20).tolist(), SEP], 0, p) for p in range(30)]
    whole = informask.count(sequences, 11, window=3)
    monkeypatch.setattr(informask, "_FLUSH_PAIRS", 7)
    flushed = informask.count(sequences, 11, window=3)
    np.testing.assert_array_equal(whole.keys, flushed.keys)
    np.testing.assert_array_equal(whole.pairs, flushed.pairs)


def test_informative_relevance_by_hand():
    """Tokens x0 x1 x2 with pairs (0,1) PMI 2, (1,2) PMI -1, (0,2) PMI 0.5. Masking {x1}: both its
    pairs cross the mask, 2 - 1 = 1. Masking {x0}: 2 + 0.5. Masking {x0, x1}: only the pairs with
    x2 cross, -1 + 0.5. Masking nothing or everything: 0."""
    i, j, pmi = np.array([0, 1, 0]), np.array([1, 2, 2]), np.array([2.0, -1.0, 0.5])
    masks = np.array([[0, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 1, 1]], bool)
    np.testing.assert_allclose(informask.informative_relevance(masks, i, j, pmi), [1.0, 2.5, -0.5, 0.0, 0.0])


HAND_SEQUENCES = [
    [CLS, A, B, C, A, B, D, E, SEP],
    [CLS, A, B, A, B, C, C, D, SEP],
    [CLS, E, D, C, B, A, A, B, SEP],
    [CLS, A, B, SEP, C, D, E, D, C, SEP],
]


def _oracle_rates(sequences, window, vocab_size):
    """The rates re-derived in plain Python for sequences of 7 content tokens (budget 1 at 15%),
    where enough candidates try every single-token mask: the token masked in a sequence is the one
    whose PMI with its window context is largest (the test corpus has no ties)."""
    docs = []
    for ids in sequences:
        doc, docs_of = [], []
        for t in ids[1:]:
            if t in (CLS, SEP):
                docs_of.append(doc)
                doc = []
            else:
                doc.append(t)
        docs.append([d for d in docs_of if d])
    tokens, pairs = {}, {}
    for seq_docs in docs:
        for doc in seq_docs:
            for x in doc:
                tokens[x] = tokens.get(x, 0) + 1
            for p in range(len(doc)):
                for q in range(p + 1, min(p + window, len(doc) - 1) + 1):
                    for key in ((doc[p], doc[q]), (doc[q], doc[p])):  # ordered, both ways
                        pairs[key] = pairs.get(key, 0) + 1
    n_tokens, n_pairs = sum(tokens.values()), sum(pairs.values())

    def pmi(x, y):
        if (x, y) not in pairs:
            return 0.0
        return math.log(pairs[(x, y)] / n_pairs / (tokens[x] / n_tokens * tokens[y] / n_tokens))

    masked = {}
    for seq_docs in docs:
        scores = []
        for doc in seq_docs:
            for p, x in enumerate(doc):
                context = [doc[q] for q in range(max(0, p - window), min(len(doc), p + window + 1)) if q != p]
                scores.append((sum(pmi(x, y) for y in context), x))
        ranked = sorted(scores, reverse=True)
        assert ranked[0][0] > ranked[1][0] + 1e-9, "the hand corpus must have one best token per sequence"
        masked[ranked[0][1]] = masked.get(ranked[0][1], 0) + 1
    overall = len(sequences) / n_tokens
    # [PAD] [CLS] [SEP] [MASK] are never content: 0. [UNK] is content, unseen here: the overall share.
    return [0.0 if t in (PAD, CLS, SEP, MASK) else masked.get(t, 0) / tokens[t] if t in tokens else overall
            for t in range(vocab_size)]


def test_rates_of_a_hand_corpus(tmp_path):
    data_dir = str(tmp_path / "hand")
    write_given_sequences(data_dir, HAND_VOCAB, {"train": HAND_SEQUENCES})
    # 300 candidates per 7-token sequence: every one of the 7 single-token masks is drawn unless
    # one is missed 300 times (7 (6/7)^300 < 1e-19).
    options = informask.InformaskOptions(window=2, candidates=300, min_pair_count=1)
    summary = informask.build_rates(data_dir, options)
    content = informask_rates.read_content(data_dir)
    expected = _oracle_rates(HAND_SEQUENCES, 2, len(HAND_VOCAB))
    np.testing.assert_allclose(content["rates"], expected, rtol=1e-12)
    assert content["rates"][Z] == pytest.approx(4 / 28)  # unseen: the overall share, one token of 7 per sequence
    assert content["totals"]["masked"] == 4 and content["totals"]["tokens"] == 28 and summary["sequences"] == 4
    assert content["occurrences"][A:Z + 1] == [7, 7, 6, 5, 3, 0]
    assert sum(r * n for r, n in zip(content["rates"], content["occurrences"])) == pytest.approx(4)


# ---------------------------------------------------------------- the weighted sample


def test_inclusion_probabilities_by_hand():
    """Proportional to weight, summing to the budget; a share that would pass 1 is capped at 1 and
    the rest shared again; a row with fewer positive weights than its budget takes them all."""
    weights = tf.constant([[0, 1, 1, 2, 4, 0], [1, 1, 10, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0],
                           [3, 1, 0, 0, 0, 0]], tf.float64)
    pi = masking.inclusion_probabilities(weights, tf.constant([2, 2, 3, 2, 1])).numpy()
    np.testing.assert_allclose(pi, [[0, .25, .25, .5, 1, 0], [.5, .5, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                    [0, 1, 0, 0, 0, 0], [.75, .25, 0, 0, 0, 0]], atol=1e-12)


def _keys(n, seed=0):
    return randomness.example_keys(tf.fill([n], tf.constant(seed, tf.int64)), tf.zeros([n], tf.int64),
                                   tf.range(n, dtype=tf.int64), tf.zeros([n], tf.int64))


def test_systematic_sample_takes_each_position_with_its_probability():
    """20,000 rows of one set of inclusion probabilities (one certain, zeros, tiny and large ones):
    every row takes exactly sum(pi) positions, zero-probability positions never, and each position's
    count passes an exact two-sided binomial test against pi at a family-wise level of 0.001
    (Bonferroni over the positions)."""
    rng = np.random.default_rng(5)
    w = rng.random(24) ** 2
    w[[0, 23, 11]] = 0.0
    w[7] = 40.0
    rows = 20_000
    pi_row = masking.inclusion_probabilities(tf.constant(w[None, :]), tf.constant([6])).numpy()[0]
    assert pi_row[7] == 1.0 and pi_row.sum() == pytest.approx(6.0)
    taken = masking.systematic_sample(tf.constant(np.tile(pi_row, (rows, 1))), _keys(rows)).numpy()
    assert (taken.sum(axis=1) == 6).all()
    assert not taken[:, pi_row == 0].any() and taken[:, 7].all()
    counts = taken.sum(axis=0)
    for i in np.flatnonzero((pi_row > 0) & (pi_row < 1)):
        p_value = stats.binomtest(int(counts[i]), rows, pi_row[i]).pvalue
        assert p_value > 0.001 / 24, (i, counts[i], rows * pi_row[i])
    # The random order lets neighbours be taken together (in document order a systematic sample
    # with pi_i + pi_(i+1) <= 1 never takes both).
    pair = np.flatnonzero((pi_row[:-1] > 0.2) & (pi_row[1:] > 0.2) & (pi_row[:-1] + pi_row[1:] <= 1))[0]
    assert (taken[:, pair] & taken[:, pair + 1]).any()


def test_weighted_sample_is_deterministic_per_key():
    pi = tf.constant(np.full((3, 40), 0.2))
    first, again = masking.systematic_sample(pi, _keys(3)).numpy(), masking.systematic_sample(pi, _keys(3)).numpy()
    np.testing.assert_array_equal(first, again)
    assert (masking.systematic_sample(pi, _keys(3, seed=1)).numpy() != first).any()


# ---------------------------------------------------------------- the scheme over a prepared corpus


@pytest.fixture(scope="module")
def rated_corpus(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("informask"))
    write_prepared_corpus(data_dir, sequences={"train": 600, "validation": 20}, seq_len=128, seed=4, unit_names=())
    informask.build_rates(data_dir)
    return data_dir


def _examples(data_dir, *, seed=0, num_epochs=1, rate=0.15):
    task = tasks.make_task("test_informask", tasks.TaskCorpus(data_dir), "informask",
                           mask_rate=masking.MaskRate(rate))
    out = []
    for batch in task.get_dataset(None, "train", shuffle=False, seed=seed, num_epochs=num_epochs).batch(256) \
            .as_numpy_iterator():
        for i, length in enumerate((batch["targets"] != PAD).sum(axis=1)):
            out.append({k: v[i, :length] if v.ndim == 2 else v[i] for k, v in batch.items()})
    return out


def _numpy_inclusion(weights, budget):
    """Inclusion probabilities re-derived in NumPy: scale to the budget, cap at 1, repeat."""
    certain = np.zeros(len(weights), bool)
    while True:
        scale = (budget - certain.sum()) / weights[~certain].sum()
        grown = certain | (scale * weights >= 1 - 1e-9)
        if (grown == certain).all():
            return np.where(certain, 1.0, scale * weights)
        certain = grown


@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_exact_budget_specials_never_and_80_10_10(rated_corpus, rate):
    examples = _examples(rated_corpus, rate=rate)
    fates = {"mask": 0, "random": 0, "keep": 0}
    for ex in examples:
        special = np.isin(ex["targets"], [CLS, SEP])
        tokens = int((~special).sum())
        assert int(ex["weights"].sum()) == masking.masking_budget(tokens, round(rate * 10_000))
        assert not ex["weights"][special].any()
        np.testing.assert_array_equal(ex["inputs"][ex["weights"] == 0], ex["targets"][ex["weights"] == 0])
        shown, original = ex["inputs"][ex["weights"] > 0], ex["targets"][ex["weights"] > 0]
        fates["mask"] += int((shown == MASK).sum())
        fates["keep"] += int((shown == original).sum())
        fates["random"] += int(((shown != MASK) & (shown != original)).sum())
    # Each selected token's fate: 5 binomial standard deviations (a random draw that hits the
    # original counts as kept: 1 in ~200 ids of the test vocabulary, a bias below 0.001).
    total = sum(fates.values())
    for fate, p in (("mask", 0.8), ("random", 0.1), ("keep", 0.1)):
        assert abs(fates[fate] / total - p) < 5 * math.sqrt(p * (1 - p) / total), (fate, fates, total)


def test_tokens_are_masked_at_their_rates(rated_corpus):
    """Over 4 epochs (fresh masks each), each token id's masked count against its expectation, the
    sum of its occurrences' inclusion probabilities (each sequence's rates scaled to its budget,
    re-derived in NumPy): |z| < 5 with the binomial variance sum pi (1 - pi), for every id
    expected at least 5 times. And the masked share of each frequent id (200+ occurrences) is its
    rate within the spread of the per-sequence scaling: the median share/rate lies in [0.9, 1.1]."""
    rates = informask_rates.read_rates(prepared_corpus.PreparedCorpus(rated_corpus))
    prepared = read_prepared_split(rated_corpus, "train")
    epochs = 4
    examples = _examples(rated_corpus, num_epochs=epochs)
    assert len(examples) == epochs * len(prepared)
    vocab = len(rates)
    observed, expected, variance, occurrences = (np.zeros(vocab) for _ in range(4))
    for n, ex in enumerate(examples):
        source = prepared[n % len(prepared)]
        content = source["word_ids"] >= 0
        ids = source["input_ids"][content]
        pi = _numpy_inclusion(np.maximum(rates[ids], masking.MIN_TOKEN_WEIGHT),
                              masking.masking_budget(len(ids)))
        np.add.at(expected, ids, pi)
        np.add.at(variance, ids, pi * (1 - pi))
        np.add.at(occurrences, ids, 1)
        np.add.at(observed, ex["targets"][ex["weights"] > 0], 1)
    checked = expected >= 5
    assert checked.sum() > 100
    z = (observed[checked] - expected[checked]) / np.sqrt(variance[checked])
    assert np.abs(z).max() < 5, np.abs(z).max()
    frequent = occurrences >= 200
    ratio = observed[frequent] / occurrences[frequent] / rates[frequent]
    assert 0.9 <= np.median(ratio) <= 1.1, np.median(ratio)
    # The rates matter: the masked shares spread as the rates do (a uniform scheme gives ~0.15 each).
    shares = observed[frequent] / occurrences[frequent]
    assert np.corrcoef(shares, rates[frequent])[0, 1] > 0.9


def test_masks_are_deterministic_and_fresh_per_seed(rated_corpus):
    first, again, other = (_examples(rated_corpus, seed=s) for s in (0, 0, 1))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["weights"], b["weights"])
    assert any((a["weights"] != c["weights"]).any() for a, c in zip(first, other))


def test_rates_file_is_deterministic_and_stale_rates_are_refused(rated_corpus, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(rated_corpus, copy)
    before = open(informask_rates.path(copy), "rb").read()
    with pytest.raises(UserInputError, match="exists; add --overwrite"):
        informask.build_rates(copy)
    informask.build_rates(copy, overwrite=True)
    assert open(informask_rates.path(copy), "rb").read() == before
    informask.build_rates(copy, informask.InformaskOptions(seed=1), overwrite=True)
    assert open(informask_rates.path(copy), "rb").read() != before

    other = str(tmp_path / "other")
    write_prepared_corpus(other, sequences={"train": 60, "validation": 4}, seq_len=128, seed=9, unit_names=())
    shutil.copy(informask_rates.path(rated_corpus), informask_rates.path(other))
    with pytest.raises(UserInputError, match="measured on another version of .*rerun `pmi-jax corpus informask"):
        tasks.TaskCorpus(other).check_scheme("informask")


# ---------------------------------------------------------------- the CLI end to end


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("cli") / "corpus")
    write_prepared_corpus(data_dir, sequences={"train": 40, "validation": 6}, shards={"train": 1, "validation": 1},
                          seq_len=32, unit_names=("pmi",))
    return data_dir


def test_cli_measures_rates_then_dumps_and_registers_informask(small_corpus, tmp_path, capsys):
    dump = tmp_path / "informask.jsonl"
    command = ["data", "dump", "--data", small_corpus, "--scheme", "informask", "--num", "8", "--output", str(dump)]
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"run `pmi-jax corpus informask {small_corpus}`" in err
    assert "informask" not in tasks.register_corpus("cli", small_corpus)

    assert main(["corpus", "informask", small_corpus, "--window", "0"]) == 2
    assert "--window 0: must be at least 1" in capsys.readouterr().err
    assert main(["corpus", "informask", small_corpus, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {informask_rates.path(small_corpus)}" in out and "highest rates" in out
    assert main(["corpus", "informask", small_corpus]) == 2
    assert "--overwrite" in capsys.readouterr().err

    assert main(command) == 0
    with open(dump) as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 8
    for record in records:
        tokens = sum(w >= 0 for w in record["word_ids"])
        assert sum(record["weights"]) == masking.masking_budget(tokens)
    assert tasks.register_corpus("cli", small_corpus)[-1] == "cli_informask"
    assert main(["data", "show", "--data", small_corpus, "--scheme", "informask", "--num", "1"]) == 0
    assert "informask masking of" in capsys.readouterr().out


def test_cli_trains_with_informask(small_corpus, tmp_path):
    if not informask_rates.exists(small_corpus):
        informask.build_rates(small_corpus)
    workdir = str(tmp_path / "run")
    settings = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
                "model.max_position_embeddings=32", "model.num_layers=1", "model.vocab_size=0", "data.seq_len=32",
                "train.batch_size=8", "train.num_steps=2", "train.log_every_steps=1", "checkpoint.every_steps=0",
                "optimizer.warmup_steps=1"]
    assert main(["train", "--config", "tiny", "--data", small_corpus, "--scheme", "informask", "--workdir", workdir,
                 "--no-progress", *[a for s in settings for a in ("--set", s)]]) == 0
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"]


def test_rates_stay_with_a_rerun_of_prepare_and_go_with_a_different_one(tmp_path, capsys):
    """`corpus prepare` accepts its output holding the rates (a rerun of the same configuration
    keeps them, still valid); --overwrite with another configuration deletes them with the corpus."""
    text = tmp_path / "text.txt"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    rng = np.random.default_rng(0)
    text.write_text("\n\n".join(" ".join(rng.choice(words, size=40)) for _ in range(30)) + "\n")
    data = str(tmp_path / "data")
    prepare = ["corpus", "prepare", "--input", str(text), "--output", data, "--seq-len", "32", "--no-progress",
               "--validation-fraction", "0.1"]
    assert main(prepare) == 0
    assert main(["corpus", "informask", data, "--no-progress"]) == 0
    assert main(prepare) == 0
    tasks.TaskCorpus(data).check_scheme("informask")  # kept, and still the corpus's
    assert main([*prepare, "--seq-len", "16", "--overwrite"]) == 0
    assert not informask_rates.exists(data)
    capsys.readouterr()
