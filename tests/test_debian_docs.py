"""benchmarks/debian_docs.py keeps prose once and drops code; benchmarks/sample_study.py's
per-length overlap and disjoint split count what they say."""
from __future__ import annotations

import gzip
import io
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import debian_docs  # noqa: E402
import sample_study  # noqa: E402

PROSE = ("The open call opens the file that is named by its path, and it returns a descriptor that "
         "the process can use in the calls that follow it. If the file does not exist, it may be "
         "created when the flag asks for it, with the mode that is given as the third argument.")


def _blocks(paragraphs):
    return [" ".join(p.split()) for p in paragraphs if p.split()]


def test_html_drops_code_and_joins_inline_tags():
    page = (b"<html><head><title>t</title></head><body><p>The <code>open</code>() call &amp; more</p>"
            b"<pre>int fd = open(path);</pre><script>var x;</script><div>Second<br>Third</div></body>")
    assert _blocks(debian_docs.html_paragraphs(page)) == ["The open() call & more", "Second", "Third"]


def test_man_page_text_without_examples():
    page = b'.TH OPEN 2\n.SH NAME\nopen \\- open a file\n.PP\nThe\n.BR open ()\ncall.\n.nf\nfd = open(p);\n.fi\nDone.\n'
    assert _blocks(debian_docs.man_paragraphs(page)) == ["open - open a file", "The open() call. Done."]


def test_corpus_keeps_a_paragraph_once_and_drops_code_and_other_languages():
    out = io.StringIO()
    corpus = debian_docs.Corpus(out)
    code = "x = f(a, b); y[i] += 2 * x; return y; } else { z = -1; }"
    assert corpus.add([PROSE, code, PROSE])["documents"] == 1
    assert out.getvalue() == " ".join(PROSE.split()) + "\n\n"
    assert corpus.add([PROSE]) == {"documents": 0, "words": 0, "duplicate_words": len(PROSE.split())}
    german = " ".join(["Die Datei wird geöffnet und der Deskriptor zurückgegeben"] * 8)
    assert corpus.add([german])["documents"] == 0


def test_dict_entries_from_the_index(tmp_path):
    entries = [b"00-database-short\n   Test dictionary\n", b"Abdicate \\Ab\"di*cate\\, v.\n   To give up.\n"
               b"   [1913 Webster]\n", b"Abdomen \\Ab*do\"men\\, n.\n   The belly.\n"]
    data, index, offset = b"".join(entries), [], 0
    for head, entry in zip(["00-database-short", "abdicate", "abdomen"], entries):
        index.append(f"{head}\t{_b64(offset)}\t{_b64(len(entry))}\n")
        offset += len(entry)
    with gzip.open(tmp_path / "t.dict.dz", "wb") as f:
        f.write(data)
    (tmp_path / "t.index").write_text("".join(index))
    documents = debian_docs.dict_documents(str(tmp_path / "t.dict.dz"), str(tmp_path / "t.index"))
    assert _blocks(documents[0]) == ['Abdicate \\Ab"di*cate\\, v. To give up.', 'Abdomen \\Ab*do"men\\, n. The belly.']


def _b64(value: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = ""
    while True:
        digits, value = alphabet[value % 64] + digits, value // 64
        if not value:
            return digits


def test_overlap_per_length():
    # (ngram, n, count, score) by n then rank, as masking_vocab.read_table gives them
    a = [("a b", 2, 20, 5.0), ("c d", 2, 20, 4.0), ("e f g", 3, 20, 6.0)]
    b = [("a b", 2, 20, 5.5), ("x y", 2, 20, 4.5), ("e f g", 3, 20, 6.5), ("p q r", 3, 20, 3.0)]
    result = sample_study.compare(sample_study.top_k(a, 800_000), sample_study.top_k(b, 800_000))
    assert result["overlap"] == 2 / 4 and result["overlap_by_length"] == {"2": 1 / 2, "3": 1 / 2}
    assert result["median_abs_score_diff"] == 0.5


def test_disjoint_parts_share_no_document(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"doc {i} line one\ndoc {i} line two\n\n" for i in range(7)))
    first, second = sample_study.disjoint_parts([str(corpus)], str(tmp_path), 3)
    assert open(first).read().split("\n\n")[:-1] == [f"doc {i} line one\ndoc {i} line two" for i in (0, 3, 6)]
    assert open(second).read().split("\n\n")[:-1] == [f"doc {i} line one\ndoc {i} line two" for i in (1, 4)]
