"""`pmi-jax vocab build|show|check`: outputs, messages, and refusing bad input without writing anything."""
import os

import pytest

from pmi_jax.cli import main
from pmi_jax.formats import masking_vocab

DOCUMENTS = ["The editor in chief of the paper, the editor in chief of New York.",
             "New York is big. The paper is read in New York."] * 6


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("\n\n".join(DOCUMENTS))
    (tmp_path / "text" / "b.jsonl").write_text("".join(f'{{"text": "{d}"}}\n' for d in DOCUMENTS))
    return tmp_path


def build(corpus, *extra):
    return main(["vocab", "build", "--input", str(corpus / "text"), "--output", str(corpus / "vocab"),
                 "--min-count", "3", "--size", "12", "--workers", "2", "--no-progress", *extra])


def test_build_show_check(corpus, capsys):
    assert build(corpus) == 0
    out = capsys.readouterr().out
    # quotas: floor(12 * share) = 6, 3, 1, 1 and the remainder 1 to the bigrams
    assert f"wrote 12 n-grams (2-grams 7, 3-grams 3, 4-grams 1, 5-grams 1) to {corpus / 'vocab'}" in out
    assert "24 documents" in out  # 12 from the text file, 12 from the JSON lines
    assert sorted(os.listdir(corpus / "vocab")) == ["masking_vocab.tsv", "masking_vocab.txt", "stats.json"]

    assert main(["vocab", "show", str(corpus / "vocab"), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    headers = [line for line in out if not line.startswith(" ")]
    assert headers == ["2-grams: 7", "3-grams: 3", "4-grams: 1", "5-grams: 1"]
    assert len(out) == 4 + 2 + 2 + 1 + 1  # a header per length and at most --top rows
    best_bigram, _, count, score = (corpus / "vocab" / "masking_vocab.tsv").read_text().split("\n")[1].split("\t")
    assert out[1].split() == best_bigram.split() + ["pmi", f"{float(score):.3f}", "count", count]

    assert main(["vocab", "check", str(corpus / "vocab")]) == 0
    out = capsys.readouterr().out
    assert "12 n-grams (2-grams 7, 3-grams 3, 4-grams 1, 5-grams 1)" in out and out.endswith("ok\n")


def test_check_reports_a_list_in_another_normalisation(tmp_path, capsys):
    (tmp_path / "list.txt").write_text("New York\neditor in chief\nsingle\n")
    assert main(["vocab", "check", str(tmp_path / "list.txt")]) == 1
    out = capsys.readouterr().out
    assert "3 n-grams (1-grams 1, 2-grams 1, 3-grams 1)" in out
    assert "problem: 1 entries have 1 words" in out and "'New York' (as words: 'new york')" in out


def leftovers(directory):
    return sorted(p for p in os.listdir(directory) if p.startswith(".") or p == "vocab")


@pytest.mark.parametrize("args, message", [
    (["--size", "0"], "--size 0: must be at least 1"),
    (["--shares", "0.5,0.25,0.125,0.2"], "--shares 0.5,0.25,0.125,0.2: must be non-negative and sum to 1"),
    (["--shares", "0.5,0.5"], "--shares 0.5,0.5: need 4 values, one per length 2..5"),
    (["--max-n", "1"], "--max-n 1: must be between 2 and 5"),
    (["--max-n", "6"], "--max-n 6: must be between 2 and 5"),
    (["--min-count", "0"], "--min-count 0: must be at least 1"),
    (["--workers", "-2"], "--workers -2: must be at least 1 (or 0: every core)"),
])
def test_nonsense_options_fail_before_reading_input(tmp_path, capsys, args, message):
    status = main(["vocab", "build", "--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "vocab"),
                   "--no-progress", *args])
    err = capsys.readouterr().err
    assert status == 2 and err == f"pmi-jax vocab: error: {message}\n"
    assert leftovers(tmp_path) == []


def test_bad_input_is_one_line_naming_the_path(tmp_path, capsys):
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "blank.txt").write_text("\n \n\n")
    (tmp_path / "symbols_only.txt").write_text("\x00\x01\u200b\n")
    cases = {str(tmp_path / "missing.txt"): "no such file or directory",
             str(tmp_path / "empty_dir"): "directory holds no text files",
             str(tmp_path / "*.gz"): "no file matches",
             str(tmp_path / "blank.txt"): "no words in 1 file(s)",
             str(tmp_path / "symbols_only.txt"): "no words in 1 file(s)"}
    for path, problem in cases.items():
        status = main(["vocab", "build", "--input", path, "--output", str(tmp_path / "vocab"), "--no-progress"])
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1, err
        assert err.startswith(f"pmi-jax vocab: error: --input {path}: {problem}"), err
    assert leftovers(tmp_path) == []


def test_too_little_text_for_any_candidate_is_an_error(corpus, capsys):
    assert build(corpus, "--min-count", "1000") == 2
    assert "no n-gram of 2 or more words occurs --min-count 1000 times" in capsys.readouterr().err
    assert leftovers(corpus) == []


def test_existing_output_needs_overwrite(corpus, capsys):
    (corpus / "vocab").mkdir()
    (corpus / "vocab" / "keep.txt").write_text("mine")
    assert build(corpus) == 2
    assert capsys.readouterr().err == (f"pmi-jax vocab: error: --output {corpus / 'vocab'}: already exists "
                                       "(pass --overwrite to replace it)\n")
    assert os.listdir(corpus / "vocab") == ["keep.txt"]
    assert build(corpus, "--overwrite") == 0
    assert "keep.txt" not in os.listdir(corpus / "vocab")


def test_a_failure_while_writing_leaves_no_half_vocabulary(corpus, monkeypatch):
    def write_then_fail(directory, texts, rows, stats):
        (open(os.path.join(directory, masking_vocab.VOCAB_TXT), "w")).write("partial\n")
        raise OSError("disk full")

    monkeypatch.setattr(masking_vocab, "write_vocabulary", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        build(corpus)
    assert leftovers(corpus) == []


def test_show_rejects_a_directory_without_a_vocabulary(tmp_path, capsys):
    assert main(["vocab", "show", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"pmi-jax vocab: error: {tmp_path}: not a vocabulary directory "
                                       "(no masking_vocab.tsv)\n")


@pytest.mark.parametrize("action, option", [("build", "--shares"), ("show", "--top"), ("check", "FILE"),
                                            ("select", "--labels")])
def test_help_explains_the_options(capsys, action, option):
    with pytest.raises(SystemExit) as exit_info:
        main(["vocab", action, "--help"])
    assert exit_info.value.code == 0
    assert option in capsys.readouterr().out
