"""`vocab build --sample-words` and `corpus prepare --wordpiece-sample-words` (preprocess/text/sample.py):
the sample is the documents of lowest priority reaching N words, found in one pass or by combining
any parts; the local runs and Beam build the same vocabularies from it."""
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


def test_wordpiece_is_trained_on_the_same_sample_locally_and_on_beam(tmp_path):
    """corpus prepare --wordpiece-sample-words: vocab.txt is what the learner makes of the sample's
    word counts (not the whole corpus's), and Beam writes the same bytes."""
    from pmi_jax.preprocess.corpus import prepare, wordpiece

    docs = list(itertools.islice(iter_demo_documents(), 600))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    config = prepare.PrepareConfig(inputs=(str(corpus),), output=str(tmp_path / "local"), wordpiece_size=800,
                                   wordpiece_sample_words=20_000, wordpiece_sample_seed=2, seq_len=64,
                                   validation_fraction=0.0, shards=2, progress=False)
    local = prepare.prepare(config)
    assert local["wordpiece"]["sample"] == {"words": 20_000, "seed": 2}
    tokens = (tmp_path / "local" / "vocab.txt").read_text().splitlines()
    sampled = wordpiece.count_words(sample.sampled_batches([str(corpus)], 20_000, 2))
    assert 20_000 <= sum(sampled.values()) < sum(wordpiece.count_words([docs]).values())
    assert tokens == wordpiece.train_vocab(sampled, 800)
    assert tokens != wordpiece.train_vocab(wordpiece.count_words([docs]), 800)
    assert main(["corpus", "prepare", "--input", str(corpus), "--output", str(tmp_path / "beam"),
                 "--wordpiece-size", "800", "--wordpiece-sample-words", "20000", "--wordpiece-sample-seed", "2",
                 "--seq-len", "64", "--validation-fraction", "0", "--shards", "2", "--no-progress",
                 "--runner", "DirectRunner"]) == 0
    assert (tmp_path / "beam" / "vocab.txt").read_bytes() == (tmp_path / "local" / "vocab.txt").read_bytes()
    assert json.loads((tmp_path / "beam" / "metadata.json").read_text()) == local


def test_a_wordpiece_sample_with_a_given_wordpiece_is_refused(tmp_path, capsys):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    assert main(["corpus", "prepare", "--input", str(tmp_path / "corpus"), "--output", str(tmp_path / "out"),
                 "--wordpiece", str(tmp_path / "vocab.txt"), "--wordpiece-sample-words", "1000"]) == 2
    assert "--wordpiece-sample-words 1000" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_negative_sample_is_refused(tmp_path, capsys):
    assert main(["vocab", "build", "--input", str(tmp_path / "corpus"), "--output", str(tmp_path / "v"),
                 "--sample-words", "-1"]) == 2
    assert "--sample-words -1" in capsys.readouterr().err
    with pytest.raises(UserInputError, match="--sample-words -5"):
        VocabOptions(sample_words=-5).validated()


def _losing_first_kept_batch(real):
    """`beam_pipeline.sampled` whose filter drops the first batch of kept documents it makes (in
    each copy of the stage), as the DirectRunner dropped batches."""
    seen = []

    def losing(batch, seed, cut):
        for kept in real(batch, seed, cut):
            seen.append(len(kept))
            if len(seen) > 1:
                yield kept

    return losing


def test_a_sample_missing_a_batch_stops_both_beam_builds_before_they_write(tmp_path, monkeypatch):
    """The filter's kept documents are checked against the cut's count of the sample (`lowest` of
    the corpus, ties included); a lost batch fails `vocab build` and the WordPiece step of `corpus
    prepare` with nothing written."""
    from pmi_jax.errors import DataLost
    from pmi_jax.preprocess.beam import beam_pipeline, beam_prepare, beam_vocab
    from pmi_jax.preprocess.corpus import prepare

    assert beam_pipeline.check_sample(12, (5, 12)) == 12
    with pytest.raises(DataLost, match="kept 11 of the sample's 12 documents"):
        beam_pipeline.check_sample(11, (5, 12))
    docs = list(itertools.islice(iter_demo_documents(), 600))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    real_read, real_sampled = beam_pipeline._read_batches, beam_pipeline.sampled
    # Small batches: the sample spans several, and one can go missing.
    monkeypatch.setattr(beam_pipeline, "_read_batches",
                        lambda path, batch_chars, text_field: real_read(path, 20_000, text_field))
    monkeypatch.setattr(beam_pipeline, "sampled", _losing_first_kept_batch(real_sampled))
    options = VocabOptions(size=300, min_count=3, workers=1, sample_words=20_000, sample_seed=2)
    with pytest.raises(DataLost, match="the sample's filter kept"):
        beam_vocab.build_vocabulary([str(corpus)], str(tmp_path / "vocab"), options)
    assert not (tmp_path / "vocab").exists()
    monkeypatch.setattr(beam_pipeline, "sampled", _losing_first_kept_batch(real_sampled))
    config = prepare.PrepareConfig(inputs=(str(corpus),), output=str(tmp_path / "prepared"), wordpiece_size=800,
                                   wordpiece_sample_words=20_000, wordpiece_sample_seed=2, seq_len=64,
                                   validation_fraction=0.0, shards=2, progress=False)
    with pytest.raises(DataLost, match="the sample's filter kept"):
        beam_prepare.prepare(config)
    assert not (tmp_path / "prepared" / "vocab.txt").exists()
