"""`vocab build --sample-words` (preprocess/text/sample.py): the sample is the documents of lowest
priority reaching N words, found in one pass or by combining any parts; the local build and Beam
build the same vocabulary from it."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy import stats

from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.preprocess.text import sample
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
from pmi_jax.preprocess.vocab import build_vocab
from pmi_jax.preprocess.vocab.build_vocab import VocabOptions


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{int(w)}" for w in rng.zipf(1.5, size=int(rng.integers(1, 60)))) for _ in range(n)]


def test_the_cut_is_the_lowest_priorities_reaching_n_words_however_the_corpus_is_cut(tmp_path):
    docs = _docs(3_000)
    (tmp_path / "a.txt").write_text("\n\n".join(docs[:1_000]) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(docs[1_000:]) + "\n")
    files, target = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], 20_000
    priority, words = sample.priorities(docs, 7), sample.whitespace_words(docs)
    order = np.argsort(priority)
    first = int(np.searchsorted(np.cumsum(words[order]), target))  # the document that reaches N
    expected = {int(i) for i in order[:first + 1]}
    cut = sample.find_cut(files, target, 7, batch_chars=5_000)
    chosen = [d for batch in sample.sampled_batches(files, target, 7, batch_chars=5_000) for d in batch]
    assert chosen == [docs[i] for i in sorted(expected)]  # corpus order
    assert target <= sum(len(d.split()) for d in chosen) < target + 60
    rng = np.random.default_rng(1)
    for _ in range(5):  # parts in any grouping, combined in any order (Beam's CombineFn)
        bounds = np.sort(rng.choice(len(docs), size=6, replace=False))
        parts = [sample.lowest(priority[p], words[p], target) for p in np.split(rng.permutation(len(docs)), bounds)]
        merged = sample.lowest(np.concatenate([p for p, _ in parts]), np.concatenate([w for _, w in parts]), target)
        assert sample.cut(*merged, target) == cut
    assert sample.find_cut(files, 10**9, 7) == sample.ALL  # fewer words than asked: every document


def test_the_sample_is_uniform_over_the_corpus():
    """Each document is in with about the same probability wherever it sits: over 20 seeds the
    share of sampled documents from the corpus's first half is Binomial(k, 1/2) (p = 1e-6)."""
    docs = [f"document {i} " + "word " * 9 for i in range(4_000)]  # 11 words each
    priority_words = sample.whitespace_words(docs)
    first_half = total = 0
    for seed in range(20):
        priority = sample.priorities(docs, seed)
        kept = priority <= sample.cut(priority, priority_words, 4_400)  # a tenth of the corpus
        assert kept.sum() == 400
        first_half += int(kept[:2_000].sum())
        total += int(kept.sum())
    assert stats.binomtest(first_half, total, 0.5).pvalue > 1e-6


def test_sampled_vocabulary_is_the_same_on_beam_and_refers_to_the_sample(tmp_path):
    docs = list(itertools.islice(iter_demo_documents(), 600))
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    options = VocabOptions(size=300, min_count=3, workers=1, sample_words=20_000, sample_seed=2)
    local = build_vocab.build_vocabulary([str(tmp_path / "corpus.txt")], str(tmp_path / "local"), options)
    whole = build_vocab.build_vocabulary([str(tmp_path / "corpus.txt")], str(tmp_path / "whole"),
                                         VocabOptions(size=300, min_count=3, workers=1))
    assert local["sample"] == {"words": 20_000, "seed": 2}
    assert local["documents"] < whole["documents"] and local["words"] < whole["words"]
    assert main(["vocab", "build", "--input", str(tmp_path / "corpus.txt"), "--output", str(tmp_path / "beam"),
                 "--size", "300", "--min-count", "3", "--sample-words", "20000", "--sample-seed", "2",
                 "--no-progress", "--runner", "DirectRunner"]) == 0
    for name in ("masking_vocab.txt", "masking_vocab.tsv"):
        assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    beam = json.loads((tmp_path / "beam" / "stats.json").read_text())
    assert {k: v for k, v in beam.items() if k != "elapsed_seconds"} == \
        {k: v for k, v in local.items() if k != "elapsed_seconds"}


def test_a_negative_sample_is_refused(tmp_path, capsys):
    assert main(["vocab", "build", "--input", str(tmp_path / "corpus"), "--output", str(tmp_path / "v"),
                 "--sample-words", "-1"]) == 2
    assert "--sample-words -1" in capsys.readouterr().err
    with pytest.raises(UserInputError, match="--sample-words -5"):
        VocabOptions(sample_words=-5).validated()
