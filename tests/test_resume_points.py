"""Resume points (preprocess/text/documents.py): a read from any of them yields exactly the rest of
the file, in every format."""
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from pmi_jax.errors import UserInputError

from pmi_jax.preprocess.text.documents import read_documents, read_documents_with_resume_points


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "épée", "naïve", "x"]
    return [" ".join(rng.choice(words, size=rng.integers(1, 12))) for _ in range(n)]


def _write(tmp_path, kind: str, docs: list[str]) -> str:
    if kind == "text":  # documents of one to three lines, one to three blank lines apart
        rng, parts = np.random.default_rng(1), ["\n"]
        for doc in docs:
            words = doc.split(" ")
            cut = sorted(rng.choice(len(words) + 1, size=2))
            lines = [" ".join(w) for w in (words[:cut[0]], words[cut[0]:cut[1]], words[cut[1]:]) if w]
            parts.append("\n".join(lines) + "\n" * int(rng.integers(2, 5)))
        path = tmp_path / "c.txt"
        path.write_text("".join(parts), encoding="utf-8")
    elif kind == "text-crlf-and-cr":  # Windows and old Mac line ends, mixed
        path = tmp_path / "c.txt"
        path.write_bytes("".join(d + ("\r\n\r\n" if i % 3 else "\r\r") for i, d in enumerate(docs)).encode())
    elif kind == "jsonl":
        path = tmp_path / "c.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + ("\n\n" if i % 5 == 0 else "\n") for i, d in enumerate(docs)))
    elif kind == "jsonl.gz":
        path = tmp_path / "c.jsonl.gz"
        path.write_bytes(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode()))
    elif kind == "parquet":  # small row groups, some rows empty
        path = tmp_path / "c.parquet"
        texts = [t for d in docs for t in ([d, ""] if len(d) % 4 == 0 else [d])]
        pq.write_table(pa.table({"text": texts}), path, row_group_size=7)
    elif kind == "arrow":  # the IPC file format, small record batches
        path = tmp_path / "c.arrow"
        feather.write_feather(pa.table({"text": docs}), path, chunksize=9, compression="uncompressed")
    return str(path)


KINDS = ("text", "text-crlf-and-cr", "jsonl", "jsonl.gz", "parquet", "arrow")


@pytest.mark.parametrize("kind", KINDS)
def test_a_read_from_every_resume_point_yields_the_rest_of_the_file(tmp_path, kind):
    docs = _docs(60)
    path = _write(tmp_path, kind, docs)
    pairs = list(read_documents_with_resume_points(path))
    assert [d for d, _ in pairs] == docs == list(read_documents(path))
    points = [(i, p) for i, (_, p) in enumerate(pairs) if p is not None]
    if kind == "jsonl.gz":
        assert points == []  # a gzip stream cannot seek: shards read it from the start
        return
    assert len(points) >= (6 if kind in ("parquet", "arrow") else len(docs) // 2), points  # every row group or batch
    for i, point in points:
        assert list(read_documents(path, start=point)) == docs[i:], (i, point)


def test_a_resumed_read_seeks_past_the_files_start(tmp_path):
    """Reading from a late resume point does not read what comes before it: bytes there may change."""
    docs = _docs(40)
    path = _write(tmp_path, "jsonl", docs)
    i, point = [(i, p) for i, (_, p) in enumerate(read_documents_with_resume_points(path)) if p][-5]
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(b"\xff" * point[0] + raw[point[0]:])  # not even UTF-8 before the point
    assert list(read_documents(path, start=point)) == docs[i:]


def test_a_resumed_json_read_still_names_the_bad_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs(30)) + "{broken\n")
    pairs = read_documents_with_resume_points(str(path))
    points = [next(pairs)[1] for _ in range(30)]  # the 31st line is the broken one
    with pytest.raises(UserInputError, match=r"c\.jsonl:31: not a JSON object"):
        list(read_documents(str(path), start=points[-1]))
