"""Word splitting (docs/design.md, "Words and n-grams") against an independent reference: Google BERT's
BasicTokenizer logic.

The project splits words with tensorflow_text's BasicTokenizer so that vocabulary words are the
words WordPiece sees later. `reference_words` below re-states the original Python tokenizer of
google-research/bert (clean control characters, space out CJK ideographs, lower-case, NFD,
strip combining marks, split punctuation). The two agree on most text; where tensorflow_text's
NFKC case folding or its control-character handling differs, the expected words are spelled
out in DIFFERENCES.
"""
import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmi_jax.preprocess.text.documents import read_documents
from pmi_jax.preprocess.text.words import split_words

_CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def _is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch):
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch):
    cp = ord(ch)
    ascii_symbol = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    return ascii_symbol or unicodedata.category(ch).startswith("P")


def _is_cjk(ch):
    return any(lo <= ord(ch) <= hi for lo, hi in _CJK_RANGES)


def reference_words(text):
    """BERT's uncased BasicTokenizer, restated."""
    cleaned = []
    for ch in text:
        if ord(ch) == 0 or ord(ch) == 0xFFFD or _is_control(ch):
            continue
        cleaned.append(" " if _is_whitespace(ch) else f" {ch} " if _is_cjk(ch) else ch)
    words = []
    for token in "".join(cleaned).split():
        token = "".join(c for c in unicodedata.normalize("NFD", token.lower()) if unicodedata.category(c) != "Mn")
        current = ""
        for ch in token:
            if _is_punctuation(ch):
                words.extend([current, ch] if current else [ch])
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return words


HARD_TEXT = [
    "Héllo, Wörld!!  Naïve café RÉSUMÉ",
    "Crème brûlée à la façon d'Élodie",
    "e\u0301 o\u0308 combining marks",
    "日本語のテキスト and 中文字符 mixed",
    "𠀀𠀁 ideographs outside the BMP",
    "...!?--  ((nested)) [brackets] {braces} \"quotes\" 'single'",
    "$100 @user #tag ^caret `tick` a+b=c<d>e|f~g_h",
    "tabs\tand\nnewlines\r\nand  multiple   spaces",
    "non\u00a0breaking\u3000ideographic\u2009thin spaces",
    "soft\u00adhyphen zero\u200bwidth \ufeffbom left\u200eright",
    "emoji 😀👍🏽 🇫🇷 mixed 😀text",
    "«guillemets» ¿pregunta? ¡exclamación! em—dash en–dash 、。",
    "Ünïcödé ÅÄÖ åäö ÆØ æø Ñ ñ Ç ç",
    "Москва Привет мир",
    "한국어 텍스트",
    "",
    "   ",
]

# Characters on which the two definitions agree, for random text.
AGREEING_ALPHABET = list("abcXYZ019 .,;:!?'\"()[]-_$%&*+/<=>@#^`{|}~\t\n") + [
    "é", "É", "ü", "Ö", "ñ", "Ç", "å", "\u0301", "\u0308", "中", "文", "字", "の", "テ", "한", "Д", "д", "α", "β",
    "—", "«", "»", "¿", "、", "。", "€", "©", "😀", "\u00ad", "\u200b", "\ufeff", "\u00a0", "\u3000", "\u2009"]

# tensorflow_text case-folds with NFKC_Casefold and splits at control characters; BERT's Python
# tokenizer lower-cases, applies NFD only, and deletes control characters and U+FFFD.
DIFFERENCES = [
    # text, words here (tensorflow_text), words of the original Python tokenizer
    ("straße", ["strasse"], ["straße"]),
    ("\ufb01ne", ["fine"], ["\ufb01ne"]),
    ("ΣΙΣΥΦΟΣ", ["σισυφοσ"], ["σισυφος"]),
    ("½ ™", ["1\u20442", "tm"], ["½", "™"]),
    ("Ａｂｃ", ["abc"], ["ａｂｃ"]),
    ("wait…", ["wait", ".", ".", "."], ["wait", "…"]),
    ("a\x00b\x01c", ["a", "b", "c"], ["abc"]),
    ("x\ufffdy", ["x\ufffdy"], ["xy"]),
    ("a\u1680b", ["a\u1680b"], ["a", "b"]),
]


@pytest.mark.parametrize("text", HARD_TEXT)
def test_hard_text_matches_reference(text):
    assert split_words([text]) == [reference_words(text)]


def test_batches_split_each_document_on_its_own():
    assert split_words(HARD_TEXT) == [reference_words(t) for t in HARD_TEXT]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(AGREEING_ALPHABET), max_size=40), min_size=1, max_size=4))
def test_random_text_matches_reference(documents):
    assert split_words(documents) == [reference_words(t) for t in documents]


@pytest.mark.parametrize("text, ours, bert_python", DIFFERENCES)
def test_documented_differences_follow_tensorflow_text(text, ours, bert_python):
    assert split_words([text]) == [ours]
    assert reference_words(text) == bert_python


def test_invalid_utf8_in_a_file_is_replaced_not_fatal(tmp_path):
    path = tmp_path / "broken.txt"
    path.write_bytes(b"caf\xc3\xa9 ok \xff\xfe end\n\nsecond \xc3 doc\n\ntruncated \xe6\x97")
    documents = list(read_documents(str(path)))
    assert documents == ["café ok \ufffd\ufffd end", "second \ufffd doc", "truncated \ufffd"]
    assert split_words(documents) == [["cafe", "ok", "\ufffd\ufffd", "end"], ["second", "\ufffd", "doc"],
                                      ["truncated", "\ufffd"]]


def test_invalid_utf8_never_crashes_a_vocabulary_build(tmp_path):
    from pmi_jax.preprocess.vocab.build_vocab import VocabOptions, build_vocabulary
    from pmi_jax.formats.masking_vocab import load_ngrams

    text = b"\n\n".join([b"the caf\xe9 \xff opens at noon", b"{\"text\": 1}", b"the caf\xe9 \xff opens late"] * 3)
    (tmp_path / "broken.txt").write_bytes(text)
    (tmp_path / "broken.jsonl").write_bytes(b'{"text": "the caf\\u00e9 \xff opens"}\n' * 2)
    stats = build_vocabulary([str(tmp_path / "broken.*")], str(tmp_path / "vocab"),
                             VocabOptions(min_count=2, size=1000, workers=1))
    assert stats["documents"] == 9 + 2
    ngrams = load_ngrams(str(tmp_path / "vocab"))
    assert ("caf\ufffd", "\ufffd", "opens") in ngrams
    assert json.loads((tmp_path / "vocab" / "stats.json").read_text())["words"] == stats["words"]
