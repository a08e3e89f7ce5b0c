"""Parquet, Arrow and Hugging Face `save_to_disk` inputs, and --text-field (preprocess/text/documents.py).

The save_to_disk directories are written here with pyarrow in the layout `datasets` writes
(Arrow IPC stream files named data-0000i-of-0000n.arrow, state.json listing them,
dataset_info.json), since `datasets` itself is not a dependency. The end-to-end tests check that
one corpus gives the same masking vocabulary and the same prepared shards whichever format it
comes in, through the local pipelines and the Beam pipeline: one reader serves them all.
"""
from __future__ import annotations

import gzip
import itertools
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from pmi_jax.preprocess.corpus import prepare
from pmi_jax.preprocess.vocab import build_vocab
from pmi_jax.preprocess.vocab.build_vocab import VocabOptions
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents
from pmi_jax.preprocess.text.documents import expand_inputs, read_documents

# Empty and blank rows are skipped; a null row is refused (tests/test_preprocess_faults.py).
ROWS = ["first document here", "", "  ", "second one", "third, with punctuation!"]


def write_saved_dataset(directory: pathlib.Path, table: pa.Table, files: int = 2) -> None:
    """A directory in the layout of `datasets.Dataset.save_to_disk` (datasets 2.x/3.x)."""
    directory.mkdir(parents=True)
    features = {name: {"dtype": "string" if pa.types.is_string(t) else "int64", "_type": "Value"}
                for name, t in zip(table.schema.names, table.schema.types)}
    schema = table.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    names, per_file = [], -(-len(table) // files)
    for i in range(files):
        name = f"data-{i:05d}-of-{files:05d}.arrow"
        with pa.ipc.new_stream(str(directory / name), schema) as writer:
            writer.write_table(table.slice(i * per_file, per_file).replace_schema_metadata(schema.metadata),
                               max_chunksize=3)
        names.append(name)
    (directory / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0123456789abcdef",
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": "train"}, indent=2))
    (directory / "dataset_info.json").write_text(json.dumps({"citation": "", "description": "",
                                                              "features": features, "homepage": "", "license": ""}))


def test_parquet_rows_are_documents_and_text_field_picks_the_column(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": list(range(len(ROWS))), "content": ROWS}), path, row_group_size=2)
    assert list(read_documents(str(path), "content")) == ["first document here", "second one",
                                                           "third, with punctuation!"]
    with pytest.raises(UserInputError, match=r"no column 'text' \(columns: id, content\).*--text-field"):
        list(read_documents(str(path)))
    with pytest.raises(UserInputError, match="column 'id' holds int64, not strings"):
        list(read_documents(str(path), "id"))


def test_saved_dataset_directory_reads_its_arrow_files_in_state_json_order(tmp_path):
    write_saved_dataset(tmp_path / "ds", pa.table({"text": ROWS + ["last"]}), files=3)
    (tmp_path / "ds" / ".hidden").write_text("not a document")
    files = expand_inputs([str(tmp_path / "ds")])
    assert [pathlib.Path(f).name for f in files] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert [d for f in files for d in read_documents(f)] == ["first document here", "second one",
                                                              "third, with punctuation!", "last"]


def test_arrow_file_format_and_jsonl_text_field(tmp_path):
    table = pa.table({"body": ROWS})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as writer:
        writer.write_table(table)
    assert list(read_documents(str(tmp_path / "f.arrow"), "body")) == ["first document here", "second one",
                                                                        "third, with punctuation!"]
    path = tmp_path / "d.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"body": "alpha"}\n{"body": "beta", "text": 3}\n'))
    assert list(read_documents(str(path), "body")) == ["alpha", "beta"]
    with pytest.raises(UserInputError, match=r"d.jsonl.gz:1: not a JSON object with a 'text' field"):
        list(read_documents(str(path)))
    path.write_bytes(gzip.compress(b'{"body": "beta", "text": 3}\n'))
    with pytest.raises(UserInputError, match=r"d.jsonl.gz:1: the 'text' field is 3, not a string"):
        list(read_documents(str(path)))


def test_urls_are_read_through_gfile(tmp_path):
    """gs:// goes through tf.io.gfile like every other input; TensorFlow's ram:// filesystem stands in."""
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": ROWS}), buffer, row_group_size=2)
    with tf.io.gfile.GFile("ram://tables/c.parquet", "wb") as f:
        f.write(buffer.getvalue().to_pybytes())
    local = tmp_path / "ds"
    write_saved_dataset(local, pa.table({"text": ROWS}))
    for path in local.iterdir():
        tf.io.gfile.copy(str(path), f"ram://tables/ds/{path.name}")
    files = expand_inputs(["ram://tables/c.parquet", "ram://tables/ds"])
    assert files == ["ram://tables/c.parquet", "ram://tables/ds/data-00000-of-00002.arrow",
                     "ram://tables/ds/data-00001-of-00002.arrow"]
    expected = ["first document here", "second one", "third, with punctuation!"]
    assert list(read_documents(files[0])) == expected
    assert [d for f in files[1:] for d in read_documents(f)] == expected


@pytest.mark.parametrize("bad, message", [
    ("damaged.parquet", "damaged.parquet: not a readable Parquet file"),
    ("damaged.arrow", "damaged.arrow: not a readable Arrow file"),
    ("dict", r"a Hugging Face DatasetDict \(splits: test, train\); give one split's directory, e\.g\. .*dict/test"),
    ("broken_state", "state.json: not the state.json of a saved Hugging Face dataset"),
])
def test_bad_tables_are_one_line_errors(tmp_path, bad, message):
    (tmp_path / "damaged.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "damaged.arrow").write_bytes(b"\xff\xff\xff\xff not arrow at all")
    for split in ("train", "test"):
        write_saved_dataset(tmp_path / "dict" / split, pa.table({"text": ROWS}))
    (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    write_saved_dataset(tmp_path / "broken_state", pa.table({"text": ROWS}))
    (tmp_path / "broken_state" / "state.json").write_text('{"no": "files"}')
    with pytest.raises(UserInputError, match=message):
        for path in expand_inputs([str(tmp_path / bad)]):
            list(read_documents(path))


# ---------------------------------------------------------------------------------------------
# One corpus in three formats: the same outputs from every pipeline.

@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("formats")
    docs = list(itertools.islice(iter_demo_documents(), 200))
    (root / "text").mkdir()
    (root / "text" / "a.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    (root / "parquet").mkdir()
    pq.write_table(pa.table({"article": docs}), root / "parquet" / "a.parquet", row_group_size=50)
    write_saved_dataset(root / "arrow", pa.table({"id": list(range(len(docs))), "article": docs}), files=3)
    return {"text": root / "text", "parquet": root / "parquet", "arrow": root / "arrow"}


def _shards(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.suffix in (".tfrecord", ".txt")}


def test_every_format_gives_the_same_vocabulary_and_shards(corpora, tmp_path):
    options = VocabOptions(size=300, min_count=3, workers=1)
    built, prepared = {}, {}
    for name, source in corpora.items():
        field = "text" if name == "text" else "article"
        stats = build_vocab.build_vocabulary([str(source)], str(tmp_path / f"vocab_{name}"),
                                             VocabOptions(**{**options.__dict__, "text_field": field}))
        built[name] = (tmp_path / f"vocab_{name}" / "masking_vocab.tsv").read_bytes()
        assert stats["documents"] == 200
        out = tmp_path / f"data_{name}"
        prepare.prepare(prepare.PrepareConfig(inputs=(str(source),), output=str(out), wordpiece_size=500,
                                              units=(("pmi", str(tmp_path / "vocab_text")),), seq_len=64,
                                              shards=2, text_field=field, progress=False))
        prepared[name] = _shards(out)
    assert built["text"].count(b"\n") > 100
    assert built["parquet"] == built["text"] and built["arrow"] == built["text"]
    assert len(prepared["text"]) == 4  # vocab.txt, 2 train shards, 1 validation shard
    assert prepared["parquet"] == prepared["text"] and prepared["arrow"] == prepared["text"]


def test_beam_reads_a_saved_dataset_like_the_local_build(corpora, tmp_path):
    local = tmp_path / "local"
    build_vocab.build_vocabulary([str(corpora["arrow"])], str(local),
                                 VocabOptions(size=300, min_count=3, workers=1, text_field="article"))
    beam = tmp_path / "beam"
    assert main(["vocab", "build", "--input", str(corpora["arrow"]), "--text-field", "article", "--output",
                 str(beam), "--size", "300", "--min-count", "3", "--no-progress", "--runner", "DirectRunner"]) == 0
    assert (beam / "masking_vocab.tsv").read_bytes() == (local / "masking_vocab.tsv").read_bytes()


def test_cli_names_a_missing_text_field(corpora, tmp_path, capsys):
    status = main(["corpus", "prepare", "--input", str(corpora["parquet"]), "--output", str(tmp_path / "out"),
                   "--no-progress"])
    assert status == 2
    assert "a.parquet: no column 'text' (columns: article)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
