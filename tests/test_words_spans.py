"""The fast word splitter (split_words_spans) against tensorflow_text's tokenizer (split_words_flat).

split_words_spans computes ASCII text with a byte-class rule measured from tensorflow_text and
hands only the chunks holding other characters to the tokenizer; its words must be exactly the
tokenizer's, in the same order and documents, on any text.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmi_jax.preprocess.text.words import SPAN_PADDING, split_words_flat, split_words_spans

ASCII = [chr(c) for c in range(128)]
# Characters around which normalisation, case folding and splitting do something unusual:
# combining marks (also at a chunk's start), compatibility forms that expand into several words
# or into spaces, Unicode spaces, format and control characters, CJK, astral characters, U+FFFD.
NON_ASCII = ["é", "É", "\u0301", "\u0308", "´", "¨", "ß", "ﬁ", "½", "…", "\ufdfa", "Ａ", "ｂ", "\u00a0", "\u3000",
             "\u2009", "\u1680", "\u2028", "\u0085", "\u00ad", "\u200b", "\ufeff", "\u200e", "中", "の", "한",
             "𠀀", "😀", "🏽", "Σ", "ς", "Д", "—", "«", "¿", "、", "。", "\ufffd", "\x80", "\x9f", "İ", "ǅ"]


def assert_same_words(documents):
    spans = split_words_spans(documents)
    flat, row_splits = split_words_flat(documents)
    assert spans.words() == flat.tolist()
    assert np.cumsum(spans.row_lengths).tolist() == row_splits[1:].tolist()
    assert not spans.buffer[-SPAN_PADDING:].any()


def test_every_ascii_character_between_letters():
    assert_same_words([f"xA{c}Bz" for c in ASCII] + [f"{c}" for c in ASCII] + [f"{c}{c}a{c}" for c in ASCII])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(ASCII), max_size=60), min_size=1, max_size=6))
def test_random_ascii_text(documents):
    assert_same_words(documents)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(ASCII[:48] + ASCII[120:] + NON_ASCII + list("aZ09")), max_size=40),
                min_size=1, max_size=6))
def test_random_mixed_text(documents):
    assert_same_words(documents)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_random_unicode_text(documents):
    documents = [d.encode("utf-8", "replace").decode("utf-8") for d in documents]  # no lone surrogates
    assert_same_words(documents)


@pytest.mark.parametrize("documents", [
    [""], ["", "", ""], [" \t\n"], ["\x00"], ["a"], ["é"], ["\u0301"], ["a b", "", "é"], ["\ufdfa\ufdfa"],
    ["ascii only", "then ﬁne", "and É at the end"], ["é" * 100 + " " + "x" * 100],
])
def test_edge_cases(documents):
    assert_same_words(documents)


def test_demo_corpus_text():
    from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents

    documents = list(itertools.islice(iter_demo_documents(), 3000))
    assert any(not d.isascii() for d in documents)
    for start in range(0, len(documents), 500):
        assert_same_words(documents[start:start + 500])
