"""Single-token perplexity: exact on a uniform model, equal to the one-pass-per-token definition."""
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
    assert _score(bert, params, sequences, positions=10_000, batch_size=16) == everything


def test_read_sequences_limits_and_errors(corpus):
    assert len(list(perplexity.read_sequences(corpus, "validation", max_sequences=3))) == 3
    with pytest.raises(perplexity.UserInputError, match="--split test: .* has no such split"):
        next(perplexity.read_sequences(corpus, "test"))
