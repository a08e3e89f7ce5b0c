"""Each fine-tuning head fits a tiny handmade dataset; the protocol sweep selects as specified.

The encoder is a randomly initialised two-layer model (hidden 32): what is tested is that the
heads, losses, optimizer and decoding learn the task end to end, not what pretraining buys.
The learning rate is larger than the paper's grid because nothing here is pretrained.
"""
import dataclasses

import numpy as np
import pytest

from pmi_jax.eval import finetune, glue, race, squad
from pmi_jax.eval.wordpiece import WordPiece
from tests import eval_data

FIT_LR = 3e-3


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    return WordPiece(eval_data.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt")))


@pytest.fixture(scope="module")
def config():
    return eval_data.tiny_config()


@pytest.fixture(scope="module")
def encoder(config):
    return eval_data.mlm_params(config)["encoder"]


def _fit(task, examples, wordpiece, config, encoder, max_seq_len, epochs, batch_size=8, learning_rate=FIT_LR):
    encoded = task.encode(examples, wordpiece, max_seq_len)
    run = finetune.RunConfig(batch_size=batch_size, learning_rate=learning_rate, epochs=epochs, seed=0)
    return finetune.finetune_run(task, config, encoder, encoded, encoded, run)


def test_classifier_fits_sentiment(wordpiece, config, encoder):
    examples = [glue.GlueExample(t, None, y) for t, y in eval_data.sentiment(16)]
    result = _fit(glue.TASKS["glue/sst2"], examples, wordpiece, config, encoder, 16, epochs=25)
    assert result["best"]["accuracy"] == 100.0
    assert result["epochs"][-1]["train_loss"] < result["epochs"][0]["train_loss"] / 5


def test_regressor_fits_similarity(wordpiece, config, encoder):
    examples = [glue.GlueExample(a, b, s) for a, b, s in eval_data.similarity(18)]
    result = _fit(glue.TASKS["glue/stsb"], examples, wordpiece, config, encoder, 24, epochs=40, batch_size=6,
                  learning_rate=5e-3)
    assert result["best"]["pearson"] > 98.0 and result["best"]["spearman"] > 95.0
    assert result["epochs"][-1]["train_loss"] < 0.1  # mean squared error, on scores spanning 0..5


def test_span_head_fits_questions_with_and_without_answers(wordpiece, config, encoder):
    paragraphs = eval_data.city_questions(16)
    examples = [squad.SquadExample(qa["id"], qa["question"], p["context"], tuple(a["text"] for a in qa["answers"]),
                                   tuple(a["answer_start"] for a in qa["answers"]))
                for p in paragraphs for qa in p["qas"]]
    task = dataclasses.replace(squad.SquadTask(), doc_stride=4, max_query_len=8)
    # max_seq_len 16 leaves 10 context tokens: every context is split into overlapping windows.
    result = _fit(task, examples, wordpiece, config, encoder, 16, epochs=16)
    assert result["best"]["exact"] == 100.0 and result["best"]["f1"] == 100.0
    assert result["best"]["NoAns_total"] == 4 and result["best"]["HasAns_total"] == 12


def test_multiple_choice_head_fits_race(wordpiece, config, encoder):
    examples = [e for record in eval_data.choice_articles(16)
                for e in race.examples_from_record(record, "middle", "toy")]
    result = _fit(race.TASKS["race"], examples, wordpiece, config, encoder, 24, epochs=4)
    assert result["best"]["accuracy"] == 100.0


def test_runs_are_deterministic_given_the_seed(wordpiece, config, encoder):
    task = glue.TASKS["glue/sst2"]
    encoded = task.encode([glue.GlueExample(t, None, y) for t, y in eval_data.sentiment(16)], wordpiece, 16)
    run = finetune.RunConfig(batch_size=8, learning_rate=FIT_LR, epochs=2, seed=3)
    first = finetune.finetune_run(task, config, encoder, encoded, encoded, run)
    again = finetune.finetune_run(task, config, encoder, encoded, encoded, run)
    other = finetune.finetune_run(task, config, encoder, encoded, encoded, dataclasses.replace(run, seed=4))
    assert first == again
    assert first["epochs"][0]["train_loss"] != other["epochs"][0]["train_loss"]


def test_sweep_takes_the_best_median_over_seeds(wordpiece, config, encoder):
    task = glue.TASKS["glue/sst2"]
    encoded = task.encode([glue.GlueExample(t, None, y) for t, y in eval_data.sentiment(16)], wordpiece, 16)
    result = finetune.sweep(task, config, encoder, encoded, encoded, batch_sizes=[8], learning_rates=[1e-4, 3e-3],
                            seeds=3, epochs=2)
    assert len(result["runs"]) == 6 and len(result["configs"]) == 2
    for c in result["configs"]:
        runs = [r for r in result["runs"] if (r["batch_size"], r["learning_rate"]) == (c["batch_size"],
                                                                                       c["learning_rate"])]
        best_scores = [max(e["score"] for e in r["epochs"]) for r in runs]  # early stopping per run
        assert c["seed_scores"] == best_scores
        assert c["median"]["score"] == float(np.median(best_scores))
    assert result["best"]["median"]["score"] == max(c["median"]["score"] for c in result["configs"])
    table = finetune.markdown_report(result, "toy")
    assert table.count("\n| ") == 3 and "Best median" in table  # header + one row per configuration


def test_learning_rate_warms_up_over_ten_percent_then_decays_to_zero():
    rates = [finetune.learning_rate_at(s, 2.0, 100) for s in range(101)]
    assert rates[0] == 0.0 and rates[5] == pytest.approx(1.0) and rates[10] == pytest.approx(2.0)
    assert rates[55] == pytest.approx(1.0) and rates[100] == 0.0
    assert np.argmax(rates) == 10
