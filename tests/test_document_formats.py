"""preprocess/text/documents.py reads the same documents, in order, from every format: blank-line
text (Unix, Windows and old Mac line ends), JSON lines (plain and gzipped), Parquet row groups and
Arrow record batches."""
import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from pmi_jax.preprocess.text.documents import read_documents


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
def test_every_format_yields_its_documents_in_order(tmp_path, kind):
    docs = _docs(60)
    assert list(read_documents(_write(tmp_path, kind, docs))) == docs
