"""`pmi-jax data dump` and `pmi-jax data show`, run in-process through the CLI entry point."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from pmi_jax.cli import main
from tests.prepared_data import MASK, read_prepared_split, write_prepared_corpus


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("prepared"))
    write_prepared_corpus(data_dir, sequences={"train": 30, "validation": 4}, seq_len=48, seed=3,
                          unit_names=("pmi", "naive_pmi"))
    return data_dir


def _dump(corpus_dir, output, *extra):
    return main(["data", "dump", "--data", corpus_dir, "--scheme", "pmi", "--num", "12", "--output", str(output),
                 *extra])


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_dump_writes_the_masked_examples(corpus_dir, tmp_path):
    out = tmp_path / "pmi.jsonl"
    assert _dump(corpus_dir, out, "--seed", "5") == 0
    records = _lines(out)
    prepared = read_prepared_split(corpus_dir, "train")
    assert len(records) == 12
    for record, source in zip(records, prepared):  # file order, unpadded
        assert set(record) == {"inputs", "targets", "weights", "units", "word_ids", "shard", "position", "epoch"}
        assert record["targets"] == source["input_ids"].tolist()
        assert record["word_ids"] == source["word_ids"].tolist()
        assert record["units"] == source["units_pmi"].tolist()
        inputs, targets, weights = (np.array(record[k]) for k in ("inputs", "targets", "weights"))
        assert set(weights.tolist()) <= {0.0, 1.0} and weights.sum() > 0
        assert (inputs[weights == 0] == targets[weights == 0]).all()
    assert sum(r["inputs"].count(MASK) for r in records) > 0

    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    assert _dump(corpus_dir, again, "--seed", "5") == 0
    assert _dump(corpus_dir, other, "--seed", "6") == 0
    assert again.read_bytes() == out.read_bytes()
    assert _lines(other) != records

    past_epoch = tmp_path / "long.jsonl"
    n = len(prepared)
    assert main(["data", "dump", "--data", corpus_dir, "--scheme", "whole_word", "--num", str(n + 2),
                 "--output", str(past_epoch)]) == 0
    epochs = [r["epoch"] for r in _lines(past_epoch)]
    assert epochs == [0] * n + [1, 1]


def test_dump_errors_are_one_line_and_leave_nothing(corpus_dir, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    out.write_text("keep me\n")
    assert _dump(corpus_dir, out) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert out.read_text() == "keep me\n"
    assert _dump(corpus_dir, out, "--overwrite") == 0

    missing = tmp_path / "freq.jsonl"
    assert main(["data", "dump", "--data", corpus_dir, "--scheme", "frequency", "--num", "3",
                 "--output", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "units_frequency" in err
    assert not os.path.exists(missing) and os.listdir(tmp_path) == ["x.jsonl"]


def test_show_marks_every_selected_unit(corpus_dir, capsys):
    assert main(["data", "show", "--data", corpus_dir, "--scheme", "naive_pmi", "--num", "2", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    headers = re.findall(r"(\d+) tokens, (\d+) selected in (\d+) units \(budget (\d+)\)", out)
    assert len(headers) == 2
    texts = [line for line in out.splitlines() if line.startswith("[CLS]")]
    for (num_tokens, selected, units, budget), text in zip(headers, texts, strict=True):
        assert int(budget) == max(1, 15 * int(num_tokens) // 100)  # 15%, rounded down
        assert 0 < int(selected) <= int(budget)
        marked = re.findall(r"\{([^|}]+)\|([^}]+)\}", text)
        assert len(marked) == int(units)  # each selected unit shown once, as {original|input}
        assert any(shown.split() == ["[MASK]"] * len(shown.split()) for _, shown in marked)


def test_help_explains_every_option(capsys):
    for argv in (["data", "--help"], ["data", "dump", "--help"], ["data", "show", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--data", "--scheme", "--num", "--seed", "--split", "--shuffle", "--output", "--overwrite"):
        assert option in out
