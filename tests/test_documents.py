"""Input reading (docs/design.md, "Words and n-grams"): formats, compression, globs, gs://-style URLs, bad input."""
import gzip
import json

import pytest
import tensorflow as tf

from pmi_jax.errors import UserInputError
from pmi_jax.preprocess.text.documents import expand_inputs, iter_document_batches, read_documents


def test_text_format_splits_on_blank_lines_and_joins_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("First line\nsecond line\n\n\n  \nNext doc\n\nLast\n")
    assert list(read_documents(str(path))) == ["First line second line", "Next doc", "Last"]


def test_jsonl_and_gzip(tmp_path):
    rows = [{"text": "alpha beta"}, {"text": "   "}, {"text": "gamma", "id": 3}]
    plain = tmp_path / "d.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    packed = tmp_path / "d2.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    gz_text = tmp_path / "t.txt.gz"
    gz_text.write_bytes(gzip.compress(b"one\ntwo\n\nthree"))
    assert list(read_documents(str(plain))) == ["alpha beta", "gamma"]
    assert list(read_documents(str(packed))) == ["alpha beta", "gamma"]
    assert list(read_documents(str(gz_text))) == ["one two", "three"]


def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"caf\xc3\xa9 ok\n\nbroken \xff\xfe bytes\n")
    assert list(read_documents(str(path))) == ["café ok", "broken \ufffd\ufffd bytes"]


def test_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(UserInputError, match=r"x\.jsonl:2"):
        list(read_documents(str(path)))


def test_expand_inputs_globs_dirs_sorted_and_deduplicated(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    files = expand_inputs([str(tmp_path / "*.txt"), str(tmp_path), str(tmp_path / "a.txt")])
    assert files == sorted({str(tmp_path / n) for n in ("a.txt", "b.txt", "sub/c.jsonl")})


@pytest.mark.parametrize("make_bad, message", [
    (lambda d: str(d / "missing.txt"), "no such file"),
    (lambda d: str(d / "*.nothing"), "no file matches"),
    (lambda d: (d / "empty").mkdir() or str(d / "empty"), "holds no text files"),
])
def test_expand_inputs_errors_name_the_input(tmp_path, make_bad, message):
    bad = make_bad(tmp_path)
    with pytest.raises(UserInputError, match=message) as e:
        expand_inputs([bad])
    assert bad in str(e.value)


def test_non_local_filesystem_through_gfile():
    """ram:// stands in for gs://: both go through tf.io.gfile, never through open()."""
    tf.io.gfile.makedirs("ram://corpus")
    with tf.io.gfile.GFile("ram://corpus/part-0.txt", "w") as f:
        f.write("hello world\n\nsecond document")
    files = expand_inputs(["ram://corpus/*.txt"])
    assert files == ["ram://corpus/part-0.txt"]
    assert list(read_documents(files[0])) == ["hello world", "second document"]


def test_batches_cover_every_document_in_order(tmp_path):
    path = tmp_path / "a.txt"
    docs = [f"document number {i} " * (i % 7 + 1) for i in range(200)]
    path.write_text("\n\n".join(docs))
    batches = list(iter_document_batches([str(path)], max_chars=500))
    assert len(batches) > 5
    assert [d for b in batches for d in b] == [d.strip() for d in docs]
