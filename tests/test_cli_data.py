"""`pmi-jax data dump` and `pmi-jax data show`, run in-process through the CLI entry point."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from pmi_jax.cli import main
from pmi_jax.config import SCHEMES
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
    headers = re.findall(r"(\d+) tokens \((\d+) maskable\), (\d+) selected in (\d+) units \(budget (\d+)\)", out)
    assert len(headers) == 2
    texts = [line for line in out.splitlines() if line.startswith("[CLS]")]
    for (num_tokens, maskable, selected, units, budget), text in zip(headers, texts, strict=True):
        assert int(budget) == max(1, 15 * int(maskable) // 100)  # 15% of the maskable tokens, rounded down
        assert int(maskable) < int(num_tokens)  # [CLS] and [SEP] count as tokens, are never masked
        assert 0 < int(selected) <= int(budget)
        marked = re.findall(r"\{([^|}]+)\|([^}]+)\}", text)
        assert len(marked) == int(units)  # each selected unit shown once, as {original|input}
        assert any(shown.split() == ["[MASK]"] * len(shown.split()) for _, shown in marked)


def test_show_gives_random_span_its_rounded_up_budget(corpus_dir, capsys):
    assert main(["data", "show", "--data", corpus_dir, "--scheme", "random_span", "--num", "3"]) == 0
    headers = re.findall(r"\((\d+) maskable\), (\d+) selected in \d+ units \(budget (\d+)\)", capsys.readouterr().out)
    assert len(headers) == 3
    for maskable, selected, budget in headers:
        assert int(budget) == -(-15 * int(maskable) // 100) == int(selected)  # SpanBERT's ceil, filled exactly


def test_mask_rate_sets_the_budget_of_show_and_dump(corpus_dir, tmp_path, capsys):
    assert main(["data", "show", "--data", corpus_dir, "--scheme", "pmi", "--num", "3", "--mask-rate", "0.4"]) == 0
    out = capsys.readouterr().out
    assert "the masking budget is 40% of the maskable tokens" in out
    headers = re.findall(r"\((\d+) maskable\), (\d+) selected in \d+ units \(budget (\d+)\)", out)
    assert len(headers) == 3
    for maskable, selected, budget in headers:
        assert int(budget) == max(1, 40 * int(maskable) // 100) and int(selected) <= int(budget)
    at_15, at_40 = tmp_path / "15.jsonl", tmp_path / "40.jsonl"
    assert _dump(corpus_dir, at_15) == 0 and _dump(corpus_dir, at_40, "--mask-rate", "0.4") == 0
    selected_15 = sum(sum(r["weights"]) for r in _lines(at_15))
    selected_40 = sum(sum(r["weights"]) for r in _lines(at_40))
    maskable = sum(sum(u >= 0 for u in r["units"]) for r in _lines(at_40))
    assert selected_15 <= 0.15 * maskable and 0.37 * maskable < selected_40 <= 0.4 * maskable
    for bad in ("0", "1.5", "0.12345"):
        assert main(["data", "show", "--data", corpus_dir, "--scheme", "pmi", "--mask-rate", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--mask-rate={float(bad)}" in err


def test_help_explains_every_option(capsys):
    for argv in (["data", "--help"], ["data", "dump", "--help"], ["data", "show", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--data", "--scheme", "--num", "--seed", "--split", "--shuffle", "--output", "--overwrite",
                   "--mask-rate"):
        assert option in out


def test_a_bad_scheme_is_refused_by_the_one_check(corpus_dir, capsys):
    """config.check_scheme (not argparse) refuses the name, naming --scheme and the schemes; --help lists them."""
    assert main(["data", "show", "--data", corpus_dir, "--scheme", "spans", "--num", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--scheme 'spans': not a masking scheme; choose one of " + ", ".join(SCHEMES) in err
    with pytest.raises(SystemExit):
        main(["data", "show", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(scheme in help_text for scheme in SCHEMES)


def test_show_counts_tokens_as_corpus_show_does(corpus_dir, capsys):
    """`data show` and `corpus show` give the same token count for the same sequence (both count
    [CLS] and [SEP]); `data show` adds how many of them may be masked."""
    assert main(["data", "show", "--data", corpus_dir, "--scheme", "whole_word", "--num", "1"]) == 0
    data_count, maskable = map(int, re.search(r": (\d+) tokens \((\d+) maskable\)", capsys.readouterr().out).groups())
    assert main(["corpus", "show", corpus_dir, "--num", "1"]) == 0
    corpus_count = int(re.search(r"sequence 0: (\d+) tokens", capsys.readouterr().out).group(1))
    first = read_prepared_split(corpus_dir, "train")[0]
    assert data_count == corpus_count == len(first["input_ids"])
    assert maskable == int((first["input_ids"] > 4).sum())  # ids 0-4 are the special tokens


def _one_line_error(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pmi-jax data: error: "), err
    for fragment in fragments:
        assert fragment in err, err


def test_bad_outputs_and_splits_fail_before_any_work(corpus_dir, tmp_path, capsys):
    bare = str(tmp_path / "bare")
    write_prepared_corpus(bare, sequences={"train": 4}, shards={"train": 1}, seq_len=48, seed=1)
    assert main(["data", "show", "--data", bare, "--scheme", "whole_word", "--split", "validation"]) == 2
    _one_line_error(capsys, "--split validation", "has no such split")

    missing_parent = tmp_path / "no" / "such" / "x.jsonl"
    assert _dump(corpus_dir, missing_parent) == 2
    _one_line_error(capsys, str(tmp_path / "no" / "such"), "does not exist")
    directory = tmp_path / "a_directory"
    directory.mkdir()
    assert _dump(corpus_dir, directory, "--overwrite") == 2
    _one_line_error(capsys, "is a directory")
    assert list(directory.iterdir()) == []

    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        place = read_only if not os.access(read_only, os.W_OK) else "/sys"  # root writes anywhere but /sys
        if not os.path.isdir(place):
            pytest.skip("no read-only directory to try")
        assert _dump(corpus_dir, os.path.join(place, "x.jsonl")) == 2
        _one_line_error(capsys, "cannot write in")
    finally:
        read_only.chmod(0o755)
    assert sorted(os.listdir(tmp_path)) == ["a_directory", "bare", "read_only"]


def test_relative_paths_resolve_against_the_working_directory(corpus_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    relative_data = os.path.relpath(corpus_dir, tmp_path)
    assert main(["data", "dump", "--data", relative_data, "--scheme", "pmi", "--num", "2", "--output", "d.jsonl"]) == 0
    assert f"to {tmp_path / 'd.jsonl'}" in capsys.readouterr().out
    assert len(_lines(tmp_path / "d.jsonl")) == 2
