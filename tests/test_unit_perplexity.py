"""`pmi-jax eval perplexity --unit word` and `--unit pmi` end to end: a model trained briefly with
that unit masking (`pmi-jax train --scheme whole_word` / `pmi`) scores lower on it than the same
model untrained, by a paired interval over the scored sequences that excludes 0; the result file
keeps every scored token."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pmi_jax.cli import main
from tests import prepared_data

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

TRAIN = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=2",
         "model.max_position_embeddings=32", "model.vocab_size=0", "data.seq_len=0", "train.batch_size=16",
         "train.num_steps=120", "train.log_every_steps=40", "optimizer.warmup_steps=10",
         "optimizer.peak_learning_rate=3e-3", "checkpoint.every_steps=0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("units") / "data")
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 200, "validation": 16},
                                        shards={"train": 2, "validation": 1}, seq_len=32)
    return data_dir


@pytest.mark.parametrize("scheme, unit", [("whole_word", "word"), ("pmi", "pmi")])
def test_a_briefly_trained_model_beats_an_untrained_one_on_its_unit(corpus, tmp_path, capsys, scheme, unit):
    from pmi_jax import checkpoints, intervals
    from pmi_jax.eval import perplexity
    from pmi_jax.formats import perplexity_result, prepared_corpus
    from pmi_jax.model import BertForMaskedLM
    from tests import eval_data

    workdir = str(tmp_path / "run")
    sets = [a for o in TRAIN for a in ("--set", o)]
    assert main(["train", "--config", "tiny", "--data", corpus, "--scheme", scheme, "--workdir", workdir, *sets]) == 0
    capsys.readouterr()
    assert main(["eval", "perplexity", "--checkpoint", workdir, "--unit", unit, "--positions", "6"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{unit}-unit perplexity ") and "units of 2+ tokens" in printed
    path = os.path.join(workdir, "eval", f"perplexity-validation-{unit}-step120.json")
    with open(path) as f:
        raw = json.load(f)
    trained = perplexity_result.read(path)
    assert raw["unit"] == unit and raw["step"] == 120 and raw["num_tokens"] == len(trained["scores"]["nll"])
    assert 6 * (raw["num_sequences"] - 1) <= raw["num_units"] <= 6 * raw["num_sequences"]  # the last is short
    assert raw["num_tokens"] > raw["num_units"]
    assert raw["interval"]["perplexity"][0] < raw["perplexity"] < raw["interval"]["perplexity"][1]

    # --skip-existing finishes an interrupted evaluation: the same settings are skipped, others scored
    again = ["eval", "perplexity", "--checkpoint", workdir, "--steps", "all", "--unit", unit, "--positions", "6",
             "--skip-existing"]
    assert main(again) == 0 and "already scored with these settings; skipped" in capsys.readouterr().out
    assert main(again[:-1] + ["--seed", "1", "--skip-existing"]) == 0
    assert "skipped" not in capsys.readouterr().out
    assert main(again[:-1] + ["--skip-existing"]) == 0  # seed 1 replaced the seed-0 file: scored again
    assert "skipped" not in capsys.readouterr().out

    # The same model untrained, scored on the same units (the same seed, so the same tokens).
    config, _, _ = checkpoints.restore_for_eval(workdir)
    data = prepared_corpus.PreparedCorpus(corpus)
    untrained = perplexity.unit_perplexity(
        BertForMaskedLM(config), eval_data.mlm_params(config, seed=0),
        perplexity.read_sequences(corpus, "validation", unit=unit), seq_len=data.seq_len,
        special_ids=list(data.special_ids.values()), mask_id=data.special_ids["mask"],
        pad_id=data.special_ids["pad"], positions=6, seed=0)
    assert untrained.scores.digest() == raw["scored_set"]
    _, trained_S, counts_S = intervals.per_sequence(trained["scores"]["sequence"], trained["scores"]["nll"])
    _, untrained_S, _ = intervals.per_sequence(untrained.scores.sequence_N, untrained.scores.nll_N)
    comparison = intervals.compare_schemes({"trained": trained_S[None], "untrained": untrained_S[None]}, counts_S)
    d = next(d for d in comparison.differences if d.first == "trained")
    assert d.interval.high < 0, (raw["mean_nll"], untrained.mean_nll, d)
    assert untrained.mean_nll > np.log(config.vocab_size) - 0.5  # untrained: near chance
