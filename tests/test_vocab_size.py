"""`pmi-jax vocab select`: the paper's Appendix A (r, c, f per list size) on labelled n-grams.

The expected values are worked out by hand from Appendix A's definitions on a vocabulary whose
ranks this file writes itself; the last test runs the command on a vocabulary `vocab build` made.
"""
import json
import os

import pytest

from pmi_jax.cli import main
from pmi_jax.formats import masking_vocab
from pmi_jax.preprocess.vocab import vocab_size

# (n-gram, score), best first within each length; counts all 10. 8 n-grams, built with --size 8
# and the default shares: quotas 4 bigrams, 2 trigrams, one 4-gram, one 5-gram.
VOCAB = [("new york", 9.0), ("of the", 8.0), ("prime minister", 7.0), ("in a", 6.0),
         ("as well as", 9.5), ("united states army", 8.5), ("and then there was", 4.0),
         ("the united states of america", 3.0)]
# 5 collocations (one, "ice cream", not in the vocabulary), 4 not ("at the end" not in it either).
LABELS = ("New York\t1\nof the\t0\nprime minister\t1\nIn a\t0\nunited states army\t1\n\n"
          "and then there was\t0\nthe United States of America\t1\nice cream\t1\nat the end\t0\n")


@pytest.fixture
def vocab_dir(tmp_path):
    directory = tmp_path / "vocab"
    directory.mkdir()
    lines = "".join(g + "\n" for g, _ in VOCAB)
    rows = "".join(f"{g}\t{len(g.split())}\t10\t{s}\n" for g, s in VOCAB)
    quota = {"2": 4, "3": 2, "4": 1, "5": 1}
    stats = {"quota": quota, "selected": quota, "vocabulary_size": 8, "measure": "pmi",
             "options": {"size": 8, "max_n": 5, "shares": [0.5, 0.25, 0.125, 0.125]}}
    masking_vocab.write_vocabulary(str(directory), lines, rows, stats)
    (tmp_path / "labels.tsv").write_text(LABELS)
    return directory


def _f(r, c):
    return 2 * r * c / (r + c)


def test_shares_order_is_what_vocab_build_would_select(vocab_dir, tmp_path):
    selection = vocab_size.select_size(str(vocab_dir), str(tmp_path / "labels.tsv"), step=2, order="shares")
    # size 2: quotas 2 bigrams -> {new york, of the}: r = 1/5, c = 3/4 (in a, and then.., at the end)
    # size 4: 3 bigrams + 1 trigram -> + prime minister, as well as: r = 2/5, c = 3/4
    # size 6: 5 bigrams are asked for but the vocabulary held its full 4: not readable, skipped
    # size 8: everything: r = 4/5 (not ice cream), c = 1/4 (only at the end)
    got = [(s.size, round(s.recall, 6), round(s.complement_recall, 6), round(s.f, 6)) for s in selection.scores]
    assert got == [(2, 20.0, 75.0, round(_f(20, 75), 6)), (4, 40.0, 75.0, round(_f(40, 75), 6)),
                   (8, 80.0, 25.0, round(_f(80, 25), 6))]
    assert selection.skipped_sizes == [6]
    assert selection.recommended.size == 4
    assert (selection.positives, selection.negatives) == (5, 4)


def test_score_order_is_the_papers_top_m(vocab_dir, tmp_path):
    selection = vocab_size.select_size(str(vocab_dir), str(tmp_path / "labels.tsv"), step=2, order="score")
    # all lengths by score: as well as 9.5, new york 9, united states army 8.5, of the 8,
    # prime minister 7, in a 6, and then there was 4, the united states of america 3
    expected = {2: (20.0, 100.0), 4: (40.0, 75.0), 6: (60.0, 50.0), 8: (80.0, 25.0)}
    for s in selection.scores:
        r, c = expected[s.size]
        assert (s.recall, s.complement_recall) == pytest.approx((r, c))
        assert s.f == pytest.approx(_f(r, c))
    assert [s.size for s in selection.scores] == [2, 4, 6, 8] and not selection.skipped_sizes
    assert selection.recommended.size == 6  # f 54.5 against 52.2 at 4


def test_cli_prints_the_table_writes_the_plot_and_recommends(vocab_dir, tmp_path, capsys):
    assert main(["vocab", "select", str(vocab_dir), "--labels", str(tmp_path / "labels.tsv"), "--step", "2",
                 "--order", "score"]) == 0
    out = capsys.readouterr().out
    assert "5 n-grams labelled collocation, 4 not" in out
    assert "recommended size: 6 (f 54.5: r 60.0%, c 50.0%)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(" ")][1:]  # the header aside
    assert rows == [["2", "20.0", "100.0", "33.3"], ["4", "40.0", "75.0", "52.2"],
                    ["6", "60.0", "50.0", "54.5", "<-", "recommended"], ["8", "80.0", "25.0", "38.1"]]
    plot = tmp_path / "labels.select.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary left behind


@pytest.mark.parametrize("content, message", [
    ("new york\tyes\n", "labels.tsv:1: expected `n-gram<TAB>1` (collocation) or `n-gram<TAB>0` (not)"),
    ("new york 1\n", "labels.tsv:1: expected `n-gram<TAB>1`"),
    ("new york\t1\nNew  York\t0\n", "labels.tsv:2: 'new york' is labelled again (first on line 1)"),
    ("new york\t1\nyork\t0\n", "labels.tsv:2: 'york' is 1 word(s)"),
    ("new york\t1\nof the\t1\n", "needs n-grams labelled 1 and n-grams labelled 0 (has 2 of 1 and 0 of 0)"),
])
def test_bad_labels_are_one_line_naming_the_line(vocab_dir, tmp_path, capsys, content, message):
    (tmp_path / "labels.tsv").write_text(content)
    assert main(["vocab", "select", str(vocab_dir), "--labels", str(tmp_path / "labels.tsv"), "--step", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pmi-jax vocab: error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "labels.select.png").exists()


def test_a_step_larger_than_the_vocabulary_is_refused(vocab_dir, tmp_path, capsys):
    assert main(["vocab", "select", str(vocab_dir), "--labels", str(tmp_path / "labels.tsv")]) == 2
    assert "--step 50000: larger than the vocabulary (8 n-grams)" in capsys.readouterr().err


def test_on_a_built_vocabulary_r_rises_and_c_falls_with_size(tmp_path, capsys):
    """End to end on `vocab build`'s output: in score order each list contains the one before, so
    r can only rise and c only fall; the recommendation is the best f."""
    text = ("The editor in chief of the paper met the prime minister of New York. " * 3 + "\n\n"
            + "New York is big and the prime minister is busy. The paper is read in New York.\n\n") * 8
    (tmp_path / "text.txt").write_text(text)
    assert main(["vocab", "build", "--input", str(tmp_path / "text.txt"), "--output", str(tmp_path / "vocab"),
                 "--min-count", "3", "--size", "20", "--workers", "2", "--no-progress"]) == 0
    built = [line.split("\t")[0] for line in (tmp_path / "vocab" / "masking_vocab.tsv").read_text().splitlines()[1:]]
    assert "new york" in built and "prime minister" in built
    (tmp_path / "labels.tsv").write_text("new york\t1\nprime minister\t1\neditor in chief\t1\nice cream\t1\n"
                                         "the paper\t0\nof the\t0\nis read\t0\nthe editor\t0\n")
    capsys.readouterr()
    assert main(["vocab", "select", str(tmp_path / "vocab"), "--labels", str(tmp_path / "labels.tsv"),
                 "--step", "4", "--order", "score", "--plot", str(tmp_path / "fig3.png")]) == 0
    selection = vocab_size.select_size(str(tmp_path / "vocab"), str(tmp_path / "labels.tsv"), step=4, order="score")
    sizes = [s.size for s in selection.scores]
    assert sizes == list(range(4, len(built) + 1, 4)) + ([len(built)] if len(built) % 4 else [])
    recalls = [s.recall for s in selection.scores]
    complements = [s.complement_recall for s in selection.scores]
    assert recalls == sorted(recalls) and complements == sorted(complements, reverse=True)
    labelled_in = {g for g in ("new york", "prime minister", "editor in chief") if g in built}
    assert selection.scores[-1].recall == pytest.approx(100 * len(labelled_in) / 4)
    assert selection.recommended.f == max(s.f for s in selection.scores)
    assert (tmp_path / "fig3.png").stat().st_size > 5000
    assert json.loads((tmp_path / "vocab" / "stats.json").read_text())["vocabulary_size"] == len(built)
