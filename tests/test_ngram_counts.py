"""Exact n-gram counting (the word stream, level counts, coverage) against a plain Counter over the same words."""
import collections
import itertools

import numpy as np
import pytest

from pmi_jax.preprocess.text import word_keys, word_stream
from pmi_jax.preprocess.vocab import byte_pieces, coverage, ngram_counts, sorted_keys
from pmi_jax.preprocess.text.documents import iter_documents
from pmi_jax.preprocess.text.words import split_words

MAX_N = 5
MIN_COUNT = 3


def write_random_corpus(directory, seed, num_documents=120):
    """Zipf-distributed words with a few planted phrases, so that every length has frequent n-grams."""
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}" for i in range(60)] + [",", ".", "New", "York", "naïve"]
    phrases = ["new york city", "once upon a time there", "of the"]
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    documents = []
    for _ in range(num_documents):
        words = list(rng.choice(vocabulary, size=rng.integers(0, 30), p=weights / weights.sum()))
        for _ in range(rng.integers(0, 3)):
            words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(phrases)))
        documents.append(" ".join(words))
    for i in range(2):
        text = "\n\n".join(d if d else "." for d in documents[i::2])
        (directory / f"part{i}.txt").write_text(text)
    return sorted(str(p) for p in directory.glob("*.txt"))


def reference_counts(files):
    """Counter of every n-gram (tuple of str words), n = 1..MAX_N, inside documents."""
    counts = collections.Counter()
    lengths = []
    for words in split_words(list(iter_documents(files))):
        lengths.append(len(words))
        for n in range(1, MAX_N + 1):
            counts.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return counts, lengths


def as_dict(table, n):
    return dict(zip(map(tuple, (t.split(" ") for t in table.text(table.ngram_words(n)))), table.counts[n].tolist()))


def count(files, work_dir, workers=1, budget=1 << 30, chunk=37, min_count=MIN_COUNT):
    stream = word_stream.tokenise_corpus(files, str(work_dir), MAX_N, workers, batch_chars=500)
    table = ngram_counts.count_ngrams(stream, MAX_N, min_count, str(work_dir), workers, budget, chunk)
    return stream, table


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    files = write_random_corpus(directory, seed=0)
    stream, table = count(files, tmp_path_factory.mktemp("work"))
    return files, stream, table, reference_counts(files)


def test_counts_equal_a_plain_counter(corpus):
    files, stream, table, (reference, lengths) = corpus
    for n in range(1, MAX_N + 1):
        expected = {g: c for g, c in reference.items() if len(g) == n and c >= MIN_COUNT}
        assert as_dict(table, n) == expected, n
        assert len(expected) > 3, f"the test corpus should have frequent {n}-grams"
    assert not table.spilled


def test_corpus_sizes(corpus):
    files, stream, table, (reference, lengths) = corpus
    assert table.documents == len(lengths) == 120
    assert table.num_words == stream.num_words == sum(lengths)
    for k in range(1, MAX_N + 1):
        assert table.num_positions[k] == sum(max(0, n - k + 1) for n in lengths)
    assert table.counted[1] == sum(1 for g in reference if len(g) == 1)


def test_counted_ngrams_are_those_whose_sub_grams_are_frequent(corpus):
    files, stream, table, (reference, lengths) = corpus
    for n in range(2, MAX_N + 1):
        apriori = [g for g in reference if len(g) == n and reference[g[:-1]] >= MIN_COUNT
                   and reference[g[1:]] >= MIN_COUNT]
        assert table.counted[n] == len(apriori)


def test_keys_are_sorted_and_words_round_trip(corpus):
    files, stream, table, _ = corpus
    for n in range(2, MAX_N + 1):
        assert np.all(np.diff(table.keys[n]) > 0)
        words = table.ngram_words(n)
        index = words[:, 0].astype(np.int64)
        for j in range(1, n):
            index = table.extend(index, words[:, j], j + 1)
        np.testing.assert_array_equal(index, np.arange(len(words)))


def test_span_counts_of_candidates(corpus):
    files, stream, table, (reference, _) = corpus
    words = table.ngram_words(4)
    spans = table.span_counts(words)
    for row, text in enumerate(table.text(words)):
        ngram = tuple(text.split(" "))
        for (i, j), c in spans.items():
            assert c[row] == reference[ngram[i:j]]


@pytest.mark.parametrize("workers", [2, 3])
def test_result_does_not_depend_on_workers_or_chunking(corpus, tmp_path, workers):
    files, _, table, _ = corpus
    _, other = count(files, tmp_path, workers=workers, chunk=1 << 20)
    assert other.words == table.words
    for n in range(2, MAX_N + 1):
        np.testing.assert_array_equal(other.keys[n], table.keys[n])
        np.testing.assert_array_equal(other.counts[n], table.counts[n])


def test_spilling_to_disk_gives_the_same_counts(corpus, tmp_path):
    files, _, table, (reference, _) = corpus
    _, spilled = count(files, tmp_path, workers=2, budget=256)
    assert spilled.spilled
    assert spilled.counted == table.counted
    for n in range(2, MAX_N + 1):
        np.testing.assert_array_equal(spilled.keys[n], table.keys[n])
        np.testing.assert_array_equal(spilled.counts[n], table.counts[n])
        assert as_dict(spilled, n) == {g: c for g, c in reference.items() if len(g) == n and c >= MIN_COUNT}


def test_ngrams_never_cross_documents(tmp_path):
    (tmp_path / "a.txt").write_text("\n\n".join(["x y", "z w"] * 10))
    _, table = count([str(tmp_path / "a.txt")], tmp_path, min_count=1)
    assert as_dict(table, 2) == {("x", "y"): 10, ("z", "w"): 10}
    assert table.keys[3].size == 0


@pytest.mark.parametrize("ids_on_disk", [False, True])
def test_covered_fraction_matches_brute_force(corpus, tmp_path, ids_on_disk):
    files, stream, table, _ = corpus
    if ids_on_disk:  # a memory budget too small to hold the per-position n-gram indices
        stream, _ = count(files, tmp_path, budget=256)
        assert all(isinstance(ids, np.memmap) for ids in stream.ngram_ids.values())
    else:
        assert not any(isinstance(ids, np.memmap) for ids in stream.ngram_ids.values())
    rng = np.random.default_rng(1)
    selected = {n: np.flatnonzero(rng.random(len(table.keys[n])) < 0.3) for n in range(2, MAX_N + 1)}
    chosen = {tuple(t.split(" ")) for n in selected for t in table.text(table.ngram_words(n)[selected[n]])}
    covered = total = 0
    for words in split_words(list(iter_documents(files))):
        inside = np.zeros(len(words), bool)
        for n, i in itertools.product(range(2, MAX_N + 1), range(len(words))):
            if tuple(words[i:i + n]) in chosen and i + n <= len(words):
                inside[i:i + n] = True
        covered += inside.sum()
        total += len(words)
    for chunk in (2, 7, 1 << 20):
        got = coverage.covered_fraction(stream, table, selected, workers=2, chunk_positions=chunk)
        assert got == covered / total
    assert 0 < covered < total


def test_lookup_finds_present_keys_and_rejects_absent_ones():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 1000, 300))
    queries = rng.integers(-5, 1005, 2000)
    position = {k: i for i, k in enumerate(keys.tolist())}
    expected = [position.get(q, -1) for q in queries.tolist()]
    np.testing.assert_array_equal(sorted_keys.lookup(keys, queries), expected)
    assert sorted_keys.lookup(keys[:0], queries).tolist() == [-1] * len(queries)


def test_lookup_of_large_keys_in_several_sorted_blocks():
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 2**47, 5000))
    queries = np.where(rng.random(300_000) < 0.5, keys[rng.integers(0, len(keys), 300_000)],
                       rng.integers(0, 2**47, 300_000))  # 47-bit keys leave 16 bits: blocks of 65536 queries
    expected = np.searchsorted(keys, queries)
    expected = np.where(keys[np.minimum(expected, len(keys) - 1)] == queries, expected, -1)
    np.testing.assert_array_equal(sorted_keys.lookup(keys, queries), expected)


def _stream_contents(stream):
    return (stream.words, stream.word_counts.tolist(), stream.ids().tolist(), stream.documents, stream.num_positions)


@pytest.fixture
def long_word_corpus(tmp_path):
    """Words of every length 1..40 bytes (keys of up to 7 bytes are exact, longer ones hashed),
    accents, and text the fast splitter hands to tensorflow_text, over several batches."""
    rng = np.random.default_rng(3)
    vocabulary = ["x" * n for n in range(1, 41)] + ["X" * 12, "internationalisation", "internationalization", "naïve",
                                                    "ﬁnal", "中文", "a\u0301b", "ab", "Ab", ",", "."]
    documents = [" ".join(rng.choice(vocabulary, size=rng.integers(1, 40))) for _ in range(200)]
    (tmp_path / "text.txt").write_text("\n\n".join(documents))
    return [str(tmp_path / "text.txt")]


@pytest.mark.parametrize("workers", [1, 2])
def test_word_keys_give_the_same_stream_as_words_as_strings(long_word_corpus, tmp_path, workers):
    by_keys = word_stream.tokenise_corpus(long_word_corpus, str(tmp_path), MAX_N, workers, batch_chars=700)
    keyed = _stream_contents(by_keys)
    (tmp_path / "strings").mkdir()
    by_strings = word_stream._tokenise_corpus_by_strings(long_word_corpus, str(tmp_path / "strings"), MAX_N, workers,
                                                          False, 700)
    assert keyed == _stream_contents(by_strings)


def test_word_keys_of_short_words_are_their_bytes():
    from pmi_jax.preprocess.text.words import split_words_spans

    spans = split_words_spans(["a ab abc abcdefg abcdefgh b a abc"])
    keys = word_keys.word_keys(spans.buffer, spans.starts, spans.lengths)
    assert keys[0] == keys[6] and keys[2] == keys[7] and len(set(keys[:6].tolist())) == 6
    assert keys[1] == int.from_bytes(b"ab", "little") | 2 << 56


@pytest.mark.parametrize("batch_chars", [700, 1_000_000])  # a collision inside one batch, and across batches
def test_a_key_collision_falls_back_to_exact_strings(long_word_corpus, tmp_path, monkeypatch, caplog, batch_chars):
    (tmp_path / "strings").mkdir()
    expected = _stream_contents(word_stream._tokenise_corpus_by_strings(
        long_word_corpus, str(tmp_path / "strings"), MAX_N, 1, False, batch_chars))
    # Every long word of the same length gets the same key.
    monkeypatch.setattr(word_keys, "_hash_bytes", lambda words, starts, lengths: np.zeros(len(starts), np.uint64))
    stream = word_stream.tokenise_corpus(long_word_corpus, str(tmp_path), MAX_N, 1, batch_chars=batch_chars)
    assert _stream_contents(stream) == expected
    assert "hash alike" in caplog.text


def test_join_pieces():
    buffer = np.frombuffer("ab cé".encode(), np.uint8)
    assert byte_pieces.join_pieces(buffer, np.array([[0, 2, 3], [3, 1, 0]]), np.array([[2, 1, 3], [3, 1, 0]])) == \
        ["ab cé", "cé" + "b"]
    assert byte_pieces.join_pieces(buffer, np.zeros([0, 2], np.int64), np.zeros([0, 2], np.int64)) == []


def test_a_key_collision_across_batches_falls_back_to_exact_strings(tmp_path, monkeypatch, caplog):
    (tmp_path / "text.txt").write_text("internationalisation a\n\nb internationalization")
    monkeypatch.setattr(word_keys, "_hash_bytes", lambda words, starts, lengths: np.zeros(len(starts), np.uint64))
    stream = word_stream.tokenise_corpus([str(tmp_path / "text.txt")], str(tmp_path), MAX_N, 1, batch_chars=10)
    assert stream.words == [b"", b"internationalisation", b"a", b"b", b"internationalization"]
    assert stream.ids().tolist() == [1, 2, 0, 3, 4, 0]
    assert "hash alike" in caplog.text
