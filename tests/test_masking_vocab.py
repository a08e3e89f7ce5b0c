"""Masking vocabulary assembly (docs/design.md, "Masking vocabulary"): against a plain-Python build, and the
paper's argument."""
import collections
import itertools
import json
import logging
import math
import random

import numpy as np
import pytest

from pmi_jax.errors import UserInputError
from pmi_jax.formats import masking_vocab
from pmi_jax.preprocess.text import unit_lists
from pmi_jax.preprocess.vocab import vocab_selection
from pmi_jax.preprocess.vocab.build_vocab import SCORE_DECIMALS, VocabOptions, build_vocabulary
from pmi_jax.preprocess.text.documents import iter_documents
from pmi_jax.preprocess.text.words import split_words


# ---------------------------------------------------------------------------------------------
# Quotas and ranking


def test_default_shares_are_the_papers():
    assert vocab_selection.default_shares(5) == (0.5, 0.25, 0.125, 0.125)
    assert vocab_selection.default_shares(3) == (0.5, 0.5)
    assert vocab_selection.default_shares(2) == (1.0,)


def test_quotas_floor_each_share_and_give_the_remainder_to_bigrams():
    assert vocab_selection.quotas(800_000, (0.5, 0.25, 0.125, 0.125)) == {2: 400_000, 3: 200_000, 4: 100_000, 5: 100_000}
    assert vocab_selection.quotas(10, (0.5, 0.25, 0.125, 0.125)) == {2: 6, 3: 2, 4: 1, 5: 1}
    assert vocab_selection.quotas(3, (1 / 3, 1 / 3, 1 / 3)) == {2: 1, 3: 1, 4: 1}
    assert vocab_selection.quotas(1, (0.5, 0.5)) == {2: 1, 3: 0}


def test_rank_orders_by_score_then_count_then_string():
    rng = np.random.default_rng(0)
    words = ["b", "a", "ab", "a-", "z", "é"]
    order = np.argsort(np.array(words, dtype=object).astype(str))
    word_rank = np.empty(len(words), np.int64)
    word_rank[order] = np.arange(len(words))
    ngrams = rng.integers(0, len(words), (200, 3))
    scores = rng.integers(0, 3, 200).astype(np.float64)
    counts = rng.integers(1, 4, 200)
    got = vocab_selection.rank(scores, counts, word_rank[ngrams]).tolist()
    text = [" ".join(words[w] for w in row) for row in ngrams]
    assert got == sorted(range(200), key=lambda i: (-scores[i], -counts[i], text[i]))


# ---------------------------------------------------------------------------------------------
# Loading and checking lists


def test_load_ngrams_from_a_file_and_a_directory(tmp_path):
    (tmp_path / "list.txt").write_text("new york\n\n  editor in chief \nline\u2028separator word\r\n")
    assert masking_vocab.load_ngrams(str(tmp_path / "list.txt")) == [
        ("new", "york"), ("editor", "in", "chief"), ("line\u2028separator", "word")]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / masking_vocab.VOCAB_TXT).write_text("a b\nc d e\n")
    assert masking_vocab.load_ngrams(str(tmp_path / "vocab")) == [("a", "b"), ("c", "d", "e")]


@pytest.mark.parametrize("content", [None, "", "\n \n"])
def test_load_ngrams_rejects_missing_or_empty_files(tmp_path, content):
    path = tmp_path / "list.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserInputError, match=str(path)):
        masking_vocab.load_ngrams(str(path))


def test_check_accepts_a_list_in_our_normalisation():
    valid = [("new", "york"), ("u", ".", "s", "."), ("cafe", "au", "lait"), ("日", "本")]
    assert unit_lists.check_ngrams(valid) == []


def test_check_reports_each_kind_of_problem():
    problems = unit_lists.check_ngrams([("New", "York"), ("u.s.", "army"), ("café", "noir"), ("alone",),
                                           ("a", "b", "c", "d", "e", "f"), ("ok", "pair"), ("ok", "pair")])
    assert len(problems) == 4
    assert "1 entries have 1 words" in problems[0] and "1 entries have 6 words" in problems[1]
    assert problems[2].startswith("3 entries are not in the uncased BERT word normalisation")
    assert "'New York' (as words: 'new york')" in problems[2]
    assert problems[3].startswith("1 entries appear more than once")


# ---------------------------------------------------------------------------------------------
# A whole build against a plain-Python implementation of docs/design.md, "Words and n-grams" to
# "Masking vocabulary"


def compositions(n):
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        yield list(zip(bounds[:-1], bounds[1:]))


def reference_build(files, measure, size, min_count, max_n, shares):
    documents = split_words(list(iter_documents(files)))
    counts = collections.Counter()
    for words in documents:
        for n in range(1, max_n + 1):
            counts.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    positions = [0] + [sum(max(0, len(d) - k + 1) for d in documents) for k in range(1, max_n + 1)]

    def log_p(span):
        return math.log(counts[span] / positions[len(span)])

    def score(g):
        n = len(g)
        if measure == "frequency":
            return float(counts[g])
        if measure == "naive-pmi":
            return log_p(g) - sum(log_p(g[i:i + 1]) for i in range(n))
        best = max(sum(log_p(g[i:j]) for i, j in seg) for seg in compositions(n) if len(seg) > 1)
        return (2 if measure == "pmi-p2" else 1) * log_p(g) - best

    quota = {n: math.floor(size * s + 1e-9) for n, s in enumerate(shares, 2)}
    quota[2] += size - sum(quota.values())
    rows = []
    for n in range(2, max_n + 1):
        candidates = [(round(score(g), SCORE_DECIMALS), counts[g], " ".join(g)) for g in counts
                      if len(g) == n and counts[g] >= min_count]
        candidates.sort(key=lambda c: (-c[0], -c[1], c[2]))
        rows += [(text, n, c, s) for s, c, text in candidates[:quota[n]]]
    chosen = {tuple(r[0].split(" ")) for r in rows}
    covered = 0
    for words in documents:
        inside = [False] * len(words)
        for i, n in itertools.product(range(len(words)), range(2, max_n + 1)):
            if tuple(words[i:i + n]) in chosen and i + n <= len(words):
                inside[i:i + n] = [True] * n
        covered += sum(inside)
    return rows, covered / positions[1], positions


def write_corpus(directory, seed=0):
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(25)] + ["York", "New", ",", ".", "über"]
    weights = [1 / (i + 1) for i in range(len(vocabulary))]
    documents = []
    for _ in range(150):
        words = rng.choices(vocabulary, weights, k=rng.randint(1, 25))
        if rng.random() < 0.4:
            words[rng.randrange(len(words)):0] = "the editor in chief of".split()
        documents.append(" ".join(words))
    (directory / "corpus.txt").write_text("\n\n".join(documents))
    return [str(directory / "corpus.txt")]


def read_rows(directory):
    lines = (directory / masking_vocab.VOCAB_TSV).read_text().split("\n")
    assert lines[0] == "ngram\tn\tcount\tscore" and lines[-1] == ""
    return [(t, int(n), int(c), float(s)) for t, n, c, s in (line.split("\t") for line in lines[1:-1])]


@pytest.mark.parametrize("measure, size, shares", [("pmi", 60, None), ("pmi-p2", 40, (0.25, 0.25, 0.25, 0.25)),
                                                   ("naive-pmi", 50, None), ("frequency", 30, (0.4, 0.3, 0.2, 0.1))])
def test_build_equals_a_plain_python_build(tmp_path, measure, size, shares):
    files = write_corpus(tmp_path)
    options = VocabOptions(measure=measure, size=size, min_count=3, shares=shares, workers=2)
    stats = build_vocabulary(files, str(tmp_path / "vocab"), options, chunk_positions=50)
    expected, coverage, positions = reference_build(files, measure, size, 3, 5, options.validated().shares)
    got = read_rows(tmp_path / "vocab")
    assert [(t, n, c) for t, n, c, s in got] == [(t, n, c) for t, n, c, s in expected]
    np.testing.assert_allclose([s for *_, s in got], [s for *_, s in expected], rtol=0, atol=1e-8)
    assert (tmp_path / "vocab" / masking_vocab.VOCAB_TXT).read_text() == "".join(r[0] + "\n" for r in got)
    assert stats["coverage"] == pytest.approx(coverage, abs=1e-12)
    assert stats["positions"] == {str(k): positions[k] for k in range(1, 6)}
    assert stats["selected"] == {str(n): sum(1 for r in got if r[1] == n) for n in range(2, 6)}
    assert json.loads((tmp_path / "vocab" / masking_vocab.STATS_JSON).read_text()) == stats


def test_output_bytes_do_not_depend_on_workers_or_spilling(tmp_path):
    files = write_corpus(tmp_path, seed=1)
    outputs = []
    for name, workers, budget, chunk in [("one", 1, None, 1 << 20), ("three", 3, None, 64), ("spill", 2, 128, 64)]:
        stats = build_vocabulary(files, str(tmp_path / name), VocabOptions(size=40, min_count=2, workers=workers),
                                 memory_budget_bytes=budget, chunk_positions=chunk)
        assert stats["spilled_to_disk"] == (name == "spill")
        outputs.append([(tmp_path / name / f).read_bytes() for f in (masking_vocab.VOCAB_TXT, masking_vocab.VOCAB_TSV)])
        for key in ("options", "elapsed_seconds", "spilled_to_disk"):
            stats.pop(key)
        outputs[-1].append(stats)
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_short_length_keeps_all_its_candidates_and_warns(tmp_path, caplog):
    (tmp_path / "c.txt").write_text("\n\n".join(["a b c", "a b d", "x y"] * 4))
    with caplog.at_level(logging.WARNING):
        stats = build_vocabulary([str(tmp_path / "c.txt")], str(tmp_path / "v"),
                                 VocabOptions(size=100, min_count=4, max_n=3, workers=1))
    assert stats["selected"] == {"2": 4, "3": 2} and stats["quota"] == {"2": 50, "3": 50}
    assert "only 2 3-grams occur at least 4 times" in caplog.text


# ---------------------------------------------------------------------------------------------
# The paper's argument (Levine et al. 2021, §2): naive PMI favours an n-gram made of a strong
# sub-span plus a common word; PMI_n, which compares with the best segmentation, does not.


def write_paper_corpus(path):
    rng = random.Random(0)
    nouns = "city river road market house museum school park garden station bridge harbour tower library".split()
    adjectives = "large quiet busy old beautiful far near famous small green new dark bright empty open".split()
    verbs = ["is", "is", "was", "looks", "seems", "became"]
    # "is" follows "kuala lumpur" no more often than it follows any subject: the trigram is no unit.
    documents = [f"the {rng.choice(nouns)} is {rng.choice(adjectives)} ." for _ in range(500)]
    documents += [f"kuala lumpur {rng.choice(verbs)} {rng.choice(adjectives)} ." for _ in range(30)]
    documents += [f"the editor in chief {rng.choice(verbs)} {rng.choice(adjectives)} in the {rng.choice(nouns)} ."
                  for _ in range(10)]
    rng.shuffle(documents)
    path.write_text("\n\n".join(documents))


def trigram_ranks(tmp_path, measure):
    build_vocabulary([str(tmp_path / "corpus.txt")], str(tmp_path / measure),
                     VocabOptions(measure=measure, size=1000, min_count=5, max_n=3, workers=1))
    return [text for text, n, _, _ in read_rows(tmp_path / measure) if n == 3]


def test_pmi_demotes_a_strong_bigram_plus_a_common_word(tmp_path):
    write_paper_corpus(tmp_path / "corpus.txt")
    naive = trigram_ranks(tmp_path, "naive-pmi")
    pmi = trigram_ranks(tmp_path, "pmi")
    assert sorted(naive) == sorted(pmi) and len(pmi) > 30
    assert naive.index("kuala lumpur is") < 0.1 * len(naive)  # near the top under naive PMI
    assert pmi.index("kuala lumpur is") > 0.9 * len(pmi)  # near the bottom under PMI_n
    assert naive.index("editor in chief") == pmi.index("editor in chief") == 0  # a true trigram tops both
