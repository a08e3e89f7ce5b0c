"""WordPiece: training, loading, and ids equal to tensorflow_text's BertTokenizer on hard text."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from pmi_jax.errors import UserInputError
from pmi_jax.formats import wordpiece_vocab
from pmi_jax.preprocess.corpus import wordpiece
from pmi_jax.preprocess.text.words import split_words

TRAINING_TEXT = [
    "The United States Air Force was founded in 1947; its headquarters are in the Pentagon.",
    "Naïve café owners in Zürich serve crème brûlée, and the Straße is busy at 5:30 p.m.",
    "Tokyo (東京) and Kyoto (京都) are cities; 'quoted' words, hyphen-ated words, e-mail@example.com.",
    "Running runners ran quickly; unbelievable, unbelievably, believers believing in belief.",
]
HARD_TEXT = [
    "HELLO   World!!  The UNITED states’ AIR-force…",
    "Ǆungla ﬁnance ß İstanbul ΣΊΣΥΦΟΣ naïve CAFÉ",
    "东京 Tōkyō, 서울 and  ‐ dashes – — and zero\u200bwidth\u00adsoft tab\tend",
    "an emoji 😀 and control\x07char and a " + "verylong" * 16 + " word",
    "",
    "   ",
]


@pytest.fixture(scope="module")
def vocab_txt(tmp_path_factory):
    counts = wordpiece.count_words([TRAINING_TEXT * 12])
    tokens = wordpiece.train_vocab(counts, size=400)
    path = tmp_path_factory.mktemp("wp") / "vocab.txt"
    path.write_text(wordpiece_vocab.vocab_text(tokens), encoding="utf-8")
    return str(path)


def test_ids_equal_bert_tokenizer(vocab_txt):
    docs = TRAINING_TEXT + HARD_TEXT
    expected = tf_text.BertTokenizer(vocab_txt, lower_case=True).tokenize(tf.constant(docs))
    expected = expected.merge_dims(1, 2).to_list()
    got = wordpiece.WordPieceEncoder(vocab_txt).encode_documents(docs)
    assert got == expected
    unk = wordpiece_vocab.special_ids(wordpiece_vocab.load_vocab(vocab_txt))["unk"]
    assert any(unk in row for row in got[len(TRAINING_TEXT):])  # the hard text does reach [UNK]


def test_pieces_join_back_into_the_words(vocab_txt):
    tokens = wordpiece_vocab.load_vocab(vocab_txt)
    encoder = wordpiece.WordPieceEncoder(vocab_txt)
    words = tf.constant([w for doc in split_words(TRAINING_TEXT) for w in doc])
    ids, splits = encoder.encode_words(words)
    rebuilt = ["".join(tokens[i].removeprefix("##") for i in ids[a:b]) for a, b in zip(splits, splits[1:])]
    assert rebuilt == [w.decode() for w in words.numpy()]
    assert np.all(np.diff(splits) >= 1)


def test_trained_vocabulary_layout_and_determinism():
    counts = wordpiece.count_words([TRAINING_TEXT * 12])
    tokens = wordpiece.train_vocab(counts, size=400)
    assert tuple(tokens[:5]) == wordpiece_vocab.SPECIAL_TOKENS
    assert len(tokens) == len(set(tokens)) <= 400
    assert all(t == t.lower() for t in tokens[5:])  # uncased
    assert {w for doc in split_words(TRAINING_TEXT) for w in doc if len(w) > 2 and w.isalpha()} & set(tokens)
    assert wordpiece.train_vocab(counts, size=400) == tokens
    small = wordpiece.train_vocab(counts, size=30)
    assert len(small) <= 30 and tuple(small[:5]) == wordpiece_vocab.SPECIAL_TOKENS


def test_frequent_words_become_single_pieces():
    counts = wordpiece.count_words([["pretraining corpus " * 50 + "zyx"]])
    tokens = wordpiece.train_vocab(counts, size=200)
    assert "pretraining" in tokens and "corpus" in tokens


def test_special_ids_of_a_bert_style_vocabulary(tmp_path):
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##s"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n")
    assert wordpiece_vocab.special_ids(wordpiece_vocab.load_vocab(str(path))) == {
        "pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}


@pytest.mark.parametrize("lines, message", [
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the"], "[MASK] missing"),
    (["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"], "first line must be [PAD]"),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "the"], "appear twice"),
    ([], "first line must be [PAD]"),
    (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "", "a"], "blank"),
])
def test_bad_vocabulary_files(tmp_path, lines, message):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in lines))
    with pytest.raises(UserInputError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        wordpiece_vocab.load_vocab(str(path))
    assert str(path) in str(e.value)


@pytest.mark.parametrize("content, message", [
    (None, "no such vocabulary file"),
    (b"[PAD]\n[UNK]\n\xff\xfe\n", "not UTF-8"),
])
def test_unreadable_vocabulary_files(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserInputError, match=message) as e:
        wordpiece_vocab.load_vocab(str(path))
    assert str(path) in str(e.value)


def test_vocabulary_reader_keeps_ids_as_line_numbers(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\r\n[UNK]\r\n[CLS]\n[SEP]\n[MASK]\ncaf\xc3\xa9\n\n\n")
    assert wordpiece_vocab.read_vocab(str(path)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "café"]


def test_training_on_nothing_is_an_error():
    with pytest.raises(UserInputError, match="no words"):
        wordpiece.train_vocab(wordpiece.count_words([[" "]]), size=100)


@pytest.mark.parametrize("workers", [1, 3])
def test_threaded_word_counts_equal_the_tokenizers(tmp_path, workers):
    """corpus prepare counts words for training with the vocabulary build's threaded reader
    (preprocess.word_stream.count_words): the same counts as tensorflow_text's tokenizer, so the
    trained vocab.txt is unchanged."""
    import itertools

    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
    from pmi_jax.preprocess.text.documents import iter_document_batches
    from pmi_jax.preprocess.text.word_stream import count_words

    docs = list(itertools.islice(iter_demo_documents(), 300)) + [
        "Ünïcödé Straße ΣΊΣΥΦΟΣ café 北京大学 e-mail: naïve—dash…", "ＦＵＬＬＷＩＤＴＨ ﬁ ligature \u200bzero\u00adwidth"] * 5
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    expected = wordpiece.count_words(iter_document_batches([str(path)], 20_000))
    counted = count_words([str(path)], workers, batch_chars=20_000)
    assert counted == dict(expected)
    assert len(counted) > 3_000 and any(not w.isascii() for w in counted)


@pytest.fixture(scope="module")
def perturbed_counts():
    """Word counts of real English (the demo corpus's words) with rare variants: one word in
    five gets a suffix, often a number, so there are many pieces, rare ones and long words."""
    import itertools

    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents

    counts = wordpiece.count_words([list(itertools.islice(iter_demo_documents(), 800))])
    rng = np.random.default_rng(0)
    suffixes = ["s", "ed", "ing", "ism", "ville", "berg", "o", "x"]
    for word, count in list(counts.items()) * 2:
        if word.isalpha() and rng.random() < 0.3:
            variant = word + str(rng.choice(suffixes)) + (str(rng.integers(100)) if rng.random() < 0.5 else "")
            counts[variant] += int(rng.integers(1, 30))
    counts["##ab"] += 15  # a "word" spelled like a suffix piece: same string, another length table
    counts["ab"] += 40
    return sorted(counts.items())


def test_the_learner_learns_what_tensorflow_texts_learns(perturbed_counts):
    """preprocess/corpus/wordpiece_learner.py counts suffixes in linear time instead of every
    substring: the vocabulary, token for token and in order, must be the library's, at single
    thresholds (including the floor pass corpus prepare runs first) and through its binary search."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library

    from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner

    reserved = list(wordpiece_vocab.SPECIAL_TOKENS)
    assert len(perturbed_counts) > 6_000
    for size in (600,):  # a binary search of several passes
        learner = WordPieceLearner(perturbed_counts, size, reserved)
        expected = library.learn(perturbed_counts, size, reserved, lower_thresh=2)
        assert learner.learn(lower_thresh=2) == expected
        assert learner.learn(upper_thresh=10, lower_thresh=10) == library.learn(perturbed_counts, size, reserved,
                                                                              upper_thresh=10, lower_thresh=10)
    no_joiner = WordPieceLearner(perturbed_counts, 800, reserved, include_joiner_token=False)
    params = library.Params(None, None, 4, int(5e6), 50, 1000, 800, 0.05, False, "##", reserved)
    assert no_joiner.learn_with_thresh(3) == library.learn_with_thresh(no_joiner.filtered, 3, params)


def _syllable_counts() -> dict[str, int]:
    """12,124 made-up words with Zipf counts (7.0M in all); numpy's seeded generator makes them the
    same under every Python, unlike the demo corpus (the running Python's own documentation)."""
    rng = np.random.default_rng(11)
    syllables = ["ka", "to", "ri", "mun", "se", "lo", "pra", "ni", "x", "qu", "e", "ab", "th", "ing", "ed",
                 "ous", "str", "a", "i", "o", "ble", "con", "de", "un"]
    counts: dict[str, int] = {}
    for _ in range(20_000):
        word = "".join(rng.choice(syllables, size=int(rng.integers(1, 6))))
        counts[word] = counts.get(word, 0) + int(rng.zipf(1.4)) % 20_000 + 1
    return counts


def test_train_vocab_is_unchanged_by_the_linear_time_learner():
    """The vocab.txt corpus prepare trains, byte for byte, as tensorflow_text's learner itself
    gives it (`library_train_vocab` in benchmarks/wordpiece_train.py, the code before the
    linear-time learner; sha256 recorded under Python 3.11 and 3.12 alike): through the floor pass
    alone (the syllable words' floor vocabulary has 5,265 tokens) and through the binary search."""
    import hashlib

    syllables = _syllable_counts()
    for counts, size, digest in (
            (wordpiece.count_words([TRAINING_TEXT * 12]), 400, "02f3f06b2a5c7ef820859f84d4d536ff7f6c503398e4f4d1451af02e907a8531"),
            (wordpiece.count_words([TRAINING_TEXT * 12]), 30, "c8f9d4b6b256d7422e69c0135dac098289e01d5005700e07e37bd46e8eb52099"),
            (syllables, 6000, "d071097e5456f2a47a73d8c33ff4b968ec84fde6b276b62bfe6de13aae227364"),
            (syllables, 1000, "1fec40836af13082b4201f784bd9f5376d0922caf3b99566297a18615b63fca7"),
            (syllables, 4000, "bfcb9abbc7bb9fdbf8351b7c46f8d2ce409e532f6b4e48682c3e8b1428db0a27")):
        text = wordpiece_vocab.vocab_text(wordpiece.train_vocab(counts, size=size))
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == digest, size


def test_the_learner_counts_the_same_in_worker_processes():
    """Each iteration's counting split over 2 or 3 processes (slices of the words; totals summed
    across them) gives the serial vocabulary, token for token and in order: through the binary
    search, at the floor threshold, and without the joiner."""
    from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner

    rng = np.random.default_rng(7)
    syllables = ["ka", "to", "ri", "mun", "se", "lo", "pra", "ni", "x", "qu", "e", "ab", "##"]
    counts: dict[str, int] = {}
    for _ in range(5_000):
        word = "".join(rng.choice(syllables, size=int(rng.integers(1, 6))))
        counts[word] = counts.get(word, 0) + int(rng.zipf(1.5)) % 5_000 + 1
    counts["##ab"] = counts.get("##ab", 0) + 15  # spelled like a suffix piece: same string, another length
    table = sorted(counts.items())
    reserved = list(wordpiece_vocab.SPECIAL_TOKENS)
    serial = WordPieceLearner(table, 300, reserved)
    expected = (serial.learn(lower_thresh=2), serial.learn(upper_thresh=10, lower_thresh=10))
    no_joiner = WordPieceLearner(table, 300, reserved, include_joiner_token=False).learn_with_thresh(5)
    for workers in (2, 3):
        with WordPieceLearner(table, 300, reserved, workers=workers, min_parallel_words=0) as learner:
            assert learner.workers == workers
            assert (learner.learn(lower_thresh=2), learner.learn(upper_thresh=10, lower_thresh=10)) == expected
        with WordPieceLearner(table, 300, reserved, include_joiner_token=False, workers=workers,
                              min_parallel_words=0) as learner:
            assert learner.learn_with_thresh(5) == no_joiner
    assert WordPieceLearner(table, 300, reserved, workers=4).workers == 1  # small: counted here


def test_the_search_skips_only_passes_that_would_end_under_the_target():
    """`WordPieceLearner.learn` skips a pass when iteration 0's counts prove its vocabulary would be
    under the target by more than the slack: the result is still tensorflow_text's, and every
    skipped pass, run anyway, is under its bound and under the target."""
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as library

    from pmi_jax.preprocess.corpus.wordpiece_learner import WordPieceLearner

    counts = sorted(_syllable_counts().items())
    reserved = list(wordpiece_vocab.SPECIAL_TOKENS)
    size = 3000
    learner = WordPieceLearner(counts, size, reserved)
    assert learner.size_bound(1000) == float("inf")  # nothing counted yet: nothing proved
    assert len(learner.learn(upper_thresh=10, lower_thresh=10)) > size  # the floor pass, as train_vocab
    tokens = learner.learn(lower_thresh=10)
    assert tokens == library.learn(counts, size, reserved, lower_thresh=10)
    assert len(learner.skipped) >= 5, learner.skipped
    slack = 0.05 * size
    for thresh in learner.skipped:
        run = len(learner.learn_with_thresh(thresh))
        assert run <= learner.size_bound(thresh) and size - run > slack, (thresh, run)
