"""Perplexity with one token, word or unit masked at a time: exact on a uniform model, equal to the
one-pass-per-unit definition, per-token scores that average to the reported figure, the same
units for every run of a seed."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax.eval import perplexity
from pmi_jax.model import BertForMaskedLM
from tests import eval_data, prepared_data

SPECIAL = (prepared_data.PAD, prepared_data.UNK, prepared_data.CLS, prepared_data.SEP, prepared_data.MASK)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("corpus"))
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 4, "validation": 12},
                                        shards={"train": 1, "validation": 2}, seq_len=32)
    return data_dir


@pytest.fixture(scope="module")
def model():
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=len(prepared_data.vocabulary()))
    return BertForMaskedLM(config), eval_data.mlm_params(config, seed=1)


def _score(model, params, sequences, **kwargs):
    return perplexity.single_token_perplexity(model, params, sequences, seq_len=32, special_ids=SPECIAL,
                                              mask_id=prepared_data.MASK, pad_id=prepared_data.PAD, **kwargs)


def test_a_uniform_model_has_the_vocabulary_size_as_perplexity(corpus, model):
    bert, params = model
    zeros = jax.tree.map(jnp.zeros_like, params)  # every logit 0: the uniform distribution
    result = _score(bert, zeros, perplexity.read_sequences(corpus, "validation"), batch_size=16)
    assert result.perplexity == pytest.approx(len(prepared_data.vocabulary()), rel=1e-4)
    sequences = prepared_data.read_prepared_split(corpus, "validation")
    assert result.num_sequences == len(sequences)
    assert result.num_tokens == sum(int(np.sum(~np.isin(s["input_ids"], SPECIAL))) for s in sequences)


def test_batched_perplexity_equals_one_forward_pass_per_token(model):
    bert, params = model
    rng = np.random.default_rng(0)
    sequences = [np.array([2, *rng.integers(5, 200, 6), 3, *rng.integers(5, 200, 4), 3]),
                 np.array([2, *rng.integers(5, 200, 29), 3]), np.array([2, 7, 3])]
    forward = jax.jit(lambda ids_1xL: bert.apply({"params": params}, ids_1xL, (ids_1xL != 0).astype(np.int32),
                                                 deterministic=True))
    nll = []
    for ids_T in sequences:
        for position in np.nonzero(~np.isin(ids_T, SPECIAL))[0]:
            ids_1xL = np.zeros([1, 32], np.int32)
            ids_1xL[0, :len(ids_T)] = ids_T
            ids_1xL[0, position] = prepared_data.MASK
            logits = forward(ids_1xL)
            nll.append(-float(jax.nn.log_softmax(logits[0, position])[ids_T[position]]))
    result = _score(bert, params, sequences, batch_size=8)
    assert result.num_tokens == len(nll) == 6 + 4 + 29 + 1
    assert result.mean_nll == pytest.approx(np.mean(nll), rel=1e-5)
    assert result.perplexity == pytest.approx(np.exp(np.mean(nll)), rel=1e-5)
    assert _score(bert, params, sequences, batch_size=3).mean_nll == pytest.approx(result.mean_nll, rel=1e-6)


def test_position_sample_is_seeded_and_per_sequence(corpus, model):
    bert, params = model
    sequences = list(perplexity.read_sequences(corpus, "validation"))
    sampled = _score(bert, params, sequences, positions=5, seed=3, batch_size=16)
    assert sampled.num_tokens == 5 * len(sequences)
    rebatched = _score(bert, params, sequences, positions=5, seed=3, batch_size=7)
    assert rebatched.num_tokens == sampled.num_tokens and rebatched.mean_nll == pytest.approx(sampled.mean_nll)
    other = _score(bert, params, sequences, positions=5, seed=4, batch_size=16)
    assert other.mean_nll != sampled.mean_nll
    everything = _score(bert, params, sequences, batch_size=16)
    capped = _score(bert, params, sequences, positions=10_000, batch_size=16)
    assert (capped.num_tokens, capped.mean_nll) == (everything.num_tokens, everything.mean_nll)


def test_read_sequences_limits_and_errors(corpus):
    assert len(list(perplexity.read_sequences(corpus, "validation", max_sequences=3))) == 3
    with pytest.raises(perplexity.UserInputError, match="--split test: .* has no such split"):
        next(perplexity.read_sequences(corpus, "test"))


def _units_score(model, params, corpus, unit, **kwargs):
    bert, params = model, params
    return perplexity.unit_perplexity(bert, params, perplexity.read_sequences(corpus, "validation", unit=unit),
                                      seq_len=32, special_ids=SPECIAL, mask_id=prepared_data.MASK,
                                      pad_id=prepared_data.PAD, **kwargs)


@pytest.mark.parametrize("unit, feature", [("word", "word_ids"), ("pmi", "units_pmi")])
def test_unit_perplexity_equals_one_forward_pass_per_unit(corpus, model, unit, feature):
    """Each unit's tokens are masked together, everything else visible, and each is scored."""
    bert, params = model
    forward = jax.jit(lambda ids_1xL: bert.apply({"params": params}, ids_1xL, (ids_1xL != 0).astype(np.int32),
                                                 deterministic=True))
    sequences = prepared_data.read_prepared_split(corpus, "validation")[:3]
    nll, sizes = [], []
    for s in sequences:
        ids_T, units_T = s["input_ids"], s[feature]
        for u in np.unique(units_T[units_T >= 0]):
            positions = np.nonzero(units_T == u)[0]
            ids_1xL = np.zeros([1, 32], np.int32)
            ids_1xL[0, :len(ids_T)] = ids_T
            ids_1xL[0, positions] = prepared_data.MASK
            log_probs = jax.nn.log_softmax(forward(ids_1xL)[0], axis=-1)
            nll.extend(-float(log_probs[p, ids_T[p]]) for p in positions)
            sizes.append(len(positions))
    assert max(sizes) > 1  # some units span several tokens, so masking them whole is exercised
    result = perplexity.unit_perplexity(bert, params, [(s["input_ids"], s[feature]) for s in sequences], seq_len=32,
                                        special_ids=SPECIAL, mask_id=prepared_data.MASK, pad_id=prepared_data.PAD,
                                        batch_size=5)
    assert result.num_units == len(sizes) and result.num_tokens == len(nll) == sum(sizes)
    np.testing.assert_allclose(result.scores.nll_N, nll, rtol=1e-4, atol=1e-5)
    assert result.mean_nll == pytest.approx(np.mean(nll), rel=1e-5)
    multi = perplexity.multi_token_subset(result.scores)
    assert multi.sum() == sum(n for n in sizes if n > 1)


@pytest.mark.parametrize("unit", ["token", "word", "pmi"])
def test_per_token_scores_average_to_the_reported_perplexity(corpus, model, unit):
    bert, params = model
    result = _units_score(bert, params, corpus, unit, positions=3, seed=1, batch_size=16)
    s = result.scores
    assert len(s.nll_N) == result.num_tokens and np.all(s.nll_N > 0)
    assert np.exp(np.mean(s.nll_N)) == pytest.approx(result.perplexity, rel=1e-12)
    # and after the JSON round trip (NLLs rounded to 1e-6)
    from pmi_jax.formats import perplexity_result

    decoded = perplexity_result.decode_scores(
        perplexity_result.encode_scores(s.sequence_N, s.position_N, s.unit_N, s.nll_N), "x")
    assert np.exp(np.mean(decoded["nll"])) == pytest.approx(result.perplexity, rel=1e-5)
    np.testing.assert_array_equal(decoded["sequence"], s.sequence_N)
    np.testing.assert_array_equal(decoded["position"], s.position_N)


@pytest.mark.parametrize("unit", ["token", "word", "pmi"])
def test_the_same_seed_gives_the_same_units_for_any_model(corpus, model, unit):
    bert, params = model
    other = eval_data.mlm_params(bert.config, seed=7)
    a = _units_score(bert, params, corpus, unit, positions=2, seed=5, batch_size=16)
    b = _units_score(bert, other, corpus, unit, positions=2, seed=5, batch_size=3)
    c = _units_score(bert, params, corpus, unit, positions=2, seed=6, batch_size=16)
    assert a.scores.digest() == b.scores.digest() != c.scores.digest()
    assert a.num_units == 2 * a.num_sequences  # every sequence has more than two units
    assert not np.allclose(a.scores.nll_N, b.scores.nll_N)  # other model, same tokens
    # every unit is scored whole: a sampled unit brings all of its tokens
    sequences = prepared_data.read_prepared_split(corpus, "validation")
    feature = {"token": None, "word": "word_ids", "pmi": "units_pmi"}[unit]
    s = a.scores
    for index, position in zip(s.sequence_N, s.position_N):
        if feature:
            units_T = sequences[index][feature]
            whole = set(np.nonzero(units_T == units_T[position])[0])
            scored = set(s.position_N[s.sequence_N == index])
            assert whole <= scored


def test_token_units_sample_the_same_positions_as_before(corpus, model):
    """`--unit token` keeps the positions the single-token measure drew from a seed before units existed."""
    bert, params = model
    sequences = list(perplexity.read_sequences(corpus, "validation"))
    result = _score(bert, params, sequences, positions=5, seed=3, batch_size=16)
    special = np.asarray(SPECIAL)
    expected = []
    for index, ids_T in enumerate(sequences):
        chosen = np.nonzero(~np.isin(ids_T, special))[0]
        if len(chosen) > 5:
            chosen = np.sort(np.random.default_rng([3, index]).choice(chosen, size=5, replace=False))
        expected.extend(chosen)
    np.testing.assert_array_equal(result.scores.position_N, expected)


def test_unknown_unit_is_an_input_error(corpus):
    from pmi_jax.formats import prepared_corpus

    with pytest.raises(perplexity.UserInputError, match="--unit nope: .* no unit set 'nope' .*token, word, frequency"):
        perplexity.check_unit("nope", prepared_corpus.PreparedCorpus(corpus))


@pytest.mark.parametrize("unit, feature", [("token", None), ("pmi", "units_pmi")])
def test_spacing_masks_every_kth_unit_together_and_scores_each_unit_once(corpus, model, unit, feature):
    bert, params = model
    forward = jax.jit(lambda ids_1xL: bert.apply({"params": params}, ids_1xL, (ids_1xL != 0).astype(np.int32),
                                                 deterministic=True))
    sequences = prepared_data.read_prepared_split(corpus, "validation")[:2]
    items = [s["input_ids"] if feature is None else (s["input_ids"], s[feature]) for s in sequences]
    spaced = perplexity.unit_perplexity(bert, params, items, seq_len=32, special_ids=SPECIAL,
                                        mask_id=prepared_data.MASK, pad_id=prepared_data.PAD, spacing=4, batch_size=3)
    exact = perplexity.unit_perplexity(bert, params, items, seq_len=32, special_ids=SPECIAL,
                                       mask_id=prepared_data.MASK, pad_id=prepared_data.PAD, batch_size=3)
    for name in ("sequence_N", "position_N", "unit_N"):  # the same tokens, in the same order
        np.testing.assert_array_equal(getattr(spaced.scores, name), getattr(exact.scores, name))
    assert spaced.num_units == exact.num_units and spaced.scores.digest(4) != exact.scores.digest()
    # the oracle: copy g of a sequence masks units g, g+4, g+8, ... together
    expected = {}
    for index, s in enumerate(sequences):
        ids_T = s["input_ids"]
        content = np.nonzero(~np.isin(ids_T, SPECIAL))[0]
        units = ([np.array([p]) for p in content] if feature is None else
                 [np.nonzero(s[feature] == u)[0] for u in dict.fromkeys(s[feature][content].tolist())])
        for g in range(4):
            masked = np.concatenate(units[g::4])
            ids_1xL = np.zeros([1, 32], np.int32)
            ids_1xL[0, :len(ids_T)] = ids_T
            ids_1xL[0, masked] = prepared_data.MASK
            log_probs = jax.nn.log_softmax(forward(ids_1xL)[0], axis=-1)
            expected.update({(index, int(p)): -float(log_probs[p, ids_T[p]]) for p in masked})
    got = {(int(i), int(p)): v for i, p, v in zip(spaced.scores.sequence_N, spaced.scores.position_N,
                                                   spaced.scores.nll_N)}
    assert got.keys() == expected.keys()
    np.testing.assert_allclose([got[k] for k in expected], list(expected.values()), rtol=1e-4, atol=1e-5)


def _alone_in_one_program(bert, params, corpus, unit, batch_size, **kwargs):
    """(sequence, position, unit, nll) of one unit kind scored by itself, each batch of masked copies
    through the encoder and the head in one jitted program: how `eval perplexity` scored before the
    kinds shared their encoder passes (its result files must not change)."""
    @jax.jit
    def nll(params, ids_BxL, positions_BxP, targets_BxP):  # params an argument, not constants folded in
        logits_BxPxV = bert.apply({"params": params}, ids_BxL, (ids_BxL != prepared_data.PAD).astype(jnp.int32),
                                  deterministic=True, positions_BxP=positions_BxP)
        return -jnp.take_along_axis(jax.nn.log_softmax(logits_BxPxV, axis=-1), targets_BxP[..., None], axis=-1)[..., 0]

    copies = perplexity._masked_copies(perplexity.read_sequences(corpus, "validation", unit=unit), seq_len=32,
                                       special_ids=SPECIAL, mask_id=prepared_data.MASK, pad_id=prepared_data.PAD,
                                       **kwargs)
    scored = []
    for ids_BxL, positions_BxP, targets_BxP, _, rows in perplexity._batches(copies, batch_size, prepared_data.PAD):
        nll_BxP = np.asarray(nll(params, ids_BxL, positions_BxP, targets_BxP), np.float64)
        scored += [(index, p, u, nll_BxP[b, j]) for b, (index, masked, unit_of, _) in enumerate(rows)
                   for j, (p, u) in enumerate(zip(masked, unit_of))]
    return sorted(scored, key=lambda t: (t[0], t[1]))


@pytest.mark.parametrize("kwargs", [{}, {"positions": 3, "seed": 2}, {"spacing": 2}])
def test_all_unit_kinds_in_one_pass_give_exactly_each_kinds_numbers_alone(corpus, model, caplog, kwargs):
    """One pass shares the encoder between kinds (a one-token word is a token unit too), yet every
    NLL is bitwise the one of each kind scored alone in one program per batch, and fewer rows go
    through the encoder than the kinds mask."""
    bert, params = model
    units = ("token", "word", "pmi")
    kwargs = {"positions": None, "seed": 0, **kwargs}
    with caplog.at_level("INFO", logger="root"):
        together = perplexity.unit_perplexities(
            bert, params, perplexity.read_unit_sequences(corpus, "validation", units=units), units=units, seq_len=32,
            special_ids=SPECIAL, mask_id=prepared_data.MASK, pad_id=prepared_data.PAD, batch_size=5, **kwargs)
    masked_rows, part_filled, total = set(), False, 0
    for unit in units:
        alone = _alone_in_one_program(bert, params, corpus, unit, 5, **kwargs)
        s = together[unit].scores
        got = list(zip(s.sequence_N.tolist(), s.position_N.tolist(), s.unit_N.tolist(), s.nll_N.tolist()))
        assert got == [(int(i), int(p), int(u), float(v)) for i, p, u, v in alone]  # exact, not approximately
        one = _units_score(bert, params, corpus, unit, batch_size=5, **kwargs)  # the library's kind alone
        assert one.mean_nll == together[unit].mean_nll and one.num_units == together[unit].num_units
        np.testing.assert_array_equal(one.scores.nll_N, s.nll_N)
        copies = perplexity._masked_copies(perplexity.read_sequences(corpus, "validation", unit=unit), seq_len=32,
                                           special_ids=SPECIAL, mask_id=prepared_data.MASK, pad_id=prepared_data.PAD,
                                           **kwargs)
        rows = [ids_L.tobytes() for _, ids_KxL, _, _ in copies for ids_L in ids_KxL]
        masked_rows |= set(rows)
        part_filled, total = part_filled or len(rows) % 5 > 0, total + len(rows)
    distinct = len(masked_rows) + part_filled  # and an all-[PAD] row for a part-filled last batch's padding
    shared = f"{', '.join(units)}: {distinct} distinct masked rows in {-(-distinct // 5)} encoder passes"
    assert shared in caplog.text
    assert distinct < total
