"""`pmi-jax corpus prepare` end to end on a small corpus: the shards decoded back and checked."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from pmi_jax.cli import main as cli_main
from pmi_jax.errors import DataLost, UserInputError
from pmi_jax.formats import prepared_corpus
from pmi_jax.preprocess.text.documents import expand_inputs, iter_documents
from pmi_jax.preprocess.corpus.sequence_packing import SequencePacker
from pmi_jax.preprocess.corpus.prepare import Assignment, PrepareConfig, in_shard_order, prepare
from pmi_jax.preprocess.corpus.wordpiece_learner import MIN_PARALLEL_WORDS
from pmi_jax.preprocess.text.words import split_words

PHRASES = ["the united states", "air force", "united states air force", "new york city", "new york",
           "york city hall", "of the", "in the", "machine learning", "learning rate"]
FILLER = ("was is a an at by for with from many some data model text word city state force "
          "Running, quickly. Naïve (café) e-mail: 3.14!").split()
PMI = ["united states air force", "the united states", "air force", "new york city", "york city hall",
       "machine learning", "learning rate"]
FREQUENCY = ["of the", "in the", "new york", "air force"]


def _document(rng: np.random.Generator) -> str:
    """Phrases, frequent filler, and made-up rare words (which WordPiece cuts into pieces)."""
    parts = []
    for _ in range(int(rng.choice([2, 5, 40]))):
        pool = PHRASES if rng.random() < 0.4 else FILLER
        parts.append(str(rng.choice(pool)))
        if rng.random() < 0.2:
            parts.append("".join(rng.choice(["zor", "bax", "el", "qui", "dra", "mon"], size=3)))
    return " ".join(parts)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    docs = [_document(rng) for _ in range(90)]
    (root / "a.txt").write_text("\n\n".join(docs[:60]) + "\n")
    (root / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[60:]))
    (root / "pmi.txt").write_text("\n".join(PMI) + "\n")
    (root / "frequency.txt").write_text("\n".join(FREQUENCY) + "\n")
    return {"root": root, "inputs": (str(root / "a.txt"), str(root / "b.jsonl")), "docs": docs}


def _config(corpus, output, **overrides) -> PrepareConfig:
    root = corpus["root"]
    options = dict(inputs=corpus["inputs"], output=str(output), wordpiece_size=300,
                   units=(("pmi", str(root / "pmi.txt")), ("frequency", str(root / "frequency.txt"))),
                   seq_len=24, validation_fraction=0.1, shards=3, seed=1)
    options.update(overrides)
    return PrepareConfig(**options)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> tuple[PrepareConfig, dict]:
    config = _config(corpus, tmp_path_factory.mktemp("out") / "data")
    return config, prepare(config)


def _read_split(data_dir: str, split: str) -> list[dict[str, np.ndarray]]:
    paths = prepared_corpus.PreparedCorpus(data_dir).files(split)
    return [prepared_corpus.decode_example(r) for r in tf.data.TFRecordDataset(paths).as_numpy_iterator()]


def _vocab(data_dir: str) -> list[str]:
    return pathlib.Path(prepared_corpus.vocab_path(data_dir)).read_text(encoding="utf-8").split("\n")[:-1]


def _words_of_stream(sequences, vocab, special_ids) -> list[str]:
    """Content words of consecutive sequences; a word cut by a sequence boundary is joined again."""
    words = []
    for seq in sequences:
        for token_id, word_id in zip(seq["input_ids"], seq["word_ids"]):
            token = vocab[token_id]
            if word_id < 0:
                assert token_id in (special_ids["cls"], special_ids["sep"])
            elif token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
    return words


def _bytes_of(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(directory).iterdir())}


def test_round_trip_to_the_words_of_each_split(corpus, prepared):
    config, metadata = prepared
    vocab = _vocab(config.output)
    by_split = in_shard_order(corpus["docs"], Assignment(config.seed, config.validation_fraction, 3, 1))
    assert 3 <= len(by_split["validation"]) <= 16  # Binomial(90, 0.1): 99.6% of seeds; this one fixed
    for split, docs in by_split.items():
        expected = [w for doc in split_words(docs) for w in doc]
        sequences = _read_split(config.output, split)
        assert _words_of_stream(sequences, vocab, metadata["special_ids"]) == expected
        stats = metadata["splits"][split]
        assert stats["documents"] == len(docs)
        assert stats["sequences"] == len(sequences)
        assert stats["tokens"] == sum(len(s["input_ids"]) for s in sequences)
        assert stats["shards"] == len(stats["files"]) == (3 if split == "train" else 1)
        # Each id's count among the split's content tokens (random_span's replacement law).
        content = np.concatenate([s["input_ids"][s["word_ids"] >= 0] for s in sequences])
        assert stats["token_counts"] == np.bincount(content, minlength=len(vocab)).tolist()
        assert not any("token_counts" in metadata["shards"][name] for name in stats["files"])


def test_sequence_structure(prepared):
    config, metadata = prepared
    special = metadata["special_ids"]
    for split in prepared_corpus.SPLITS:
        sequences = _read_split(config.output, split)
        for seq in sequences:
            ids = seq["input_ids"]
            assert 3 <= len(ids) <= config.seq_len
            assert ids[0] == special["cls"] and ids[-1] == special["sep"]
            assert set(seq) == set(prepared_corpus.feature_names(["frequency", "pmi"]))
            is_special = np.isin(ids, [special["cls"], special["sep"]])
            for name in ("word_ids", "units_pmi", "units_frequency"):
                index = seq[name]
                assert len(index) == len(ids)
                np.testing.assert_array_equal(index < 0, is_special)
                kept = index[index >= 0]
                assert kept[0] == 0 and set(np.diff(kept)) <= {0, 1}
            units, words = seq["units_pmi"], seq["word_ids"]
            body = ~is_special
            # a unit starts only where a word starts; a [SEP] inside always starts a new unit
            new_unit = np.diff(units[body], prepend=-1) > 0
            new_word = np.diff(words[body], prepend=-1) > 0
            assert np.all(new_word[new_unit])
            inner_seps = np.flatnonzero(is_special[1:-1]) + 1
            for s in inner_seps:
                assert units[s - 1] < units[s + 1] and words[s - 1] < words[s + 1]
        full = [len(s["input_ids"]) for s in sequences[:-1]]
        assert np.mean(full) > config.seq_len - 2  # packing wastes at most a slot now and then


def test_multiword_units_are_vocabulary_entries(prepared):
    config, metadata = prepared
    vocab = _vocab(config.output)
    entries = {"pmi": set(PMI), "frequency": set(FREQUENCY)}
    multiword = dict.fromkeys(entries, 0)
    seen = dict.fromkeys(entries, set())
    content = 0
    for split in prepared_corpus.SPLITS:
        for seq in _read_split(config.output, split):
            body = seq["word_ids"] >= 0
            content += body.sum()
            for name in entries:
                units = seq[f"units_{name}"]
                for unit in np.unique(units[body]):
                    at = np.flatnonzero(units == unit)
                    words = _words_of_stream([{"input_ids": seq["input_ids"][at], "word_ids": seq["word_ids"][at]}],
                                             vocab, metadata["special_ids"])
                    if len(words) < 2:
                        continue
                    multiword[name] += len(at)
                    touches_edge = at[0] == 1 or at[-1] == len(units) - 2  # possibly cut by the boundary
                    if not touches_edge:
                        assert " ".join(words) in entries[name]
                        seen[name] = seen[name] | {" ".join(words)}
    for name in entries:
        assert metadata["units"][name]["coverage"] == pytest.approx(multiword[name] / content)
        assert metadata["units"][name]["entries"] == len(entries[name])
    assert "united states air force" in seen["pmi"] and "new york" in seen["frequency"]
    assert 0.1 < metadata["units"]["pmi"]["coverage"] < 0.9


def test_same_inputs_give_identical_bytes_and_resume_finishes_a_killed_run(corpus, prepared, tmp_path):
    config, _ = prepared
    reference = _bytes_of(config.output)
    assert set(reference) == {"metadata.json", "vocab.txt", "train-00000-of-00003.tfrecord",
                              "train-00001-of-00003.tfrecord", "train-00002-of-00003.tfrecord",
                              "validation-00000-of-00001.tfrecord"}

    class Killed(Exception):
        pass

    def kill_after_first(task):
        raise Killed(task.name)

    output = tmp_path / "data"
    with pytest.raises(Killed):
        prepare(_config(corpus, output), on_shard_done=kill_after_first)
    shards = sorted(output.glob("*.tfrecord"))
    assert len(shards) == 1 and not (output / "metadata.json").exists()
    truncated = output / ".train-00001-of-00003.tfrecord.tmp-0123456789ab"
    truncated.write_bytes(reference["train-00001-of-00003.tfrecord"][:100])  # a writer killed mid-shard

    written = []
    prepare(_config(corpus, output), on_shard_done=lambda task: written.append(task.name))
    assert len(written) == 3 and shards[0].name not in written
    assert _bytes_of(output) == reference


def test_shards_missing_a_document_are_never_marked_complete(corpus, tmp_path):
    """A shard whose record holds one document fewer than was read (what a runner that loses data
    between reading and writing leaves) stops the run before metadata.json is written."""
    output = tmp_path / "data"

    def lose_a_document(task):
        record = output / ".progress" / f"{task.name}.json"
        stats = json.loads(record.read_text())
        if stats["documents"] and not lost:
            stats["documents"] -= 1
            record.write_text(json.dumps(stats))
            lost.append(task.name)

    lost = []
    with pytest.raises(DataLost, match="hold .* of the corpus's .* documents"):
        prepare(_config(corpus, output), on_shard_done=lose_a_document)
    assert lost and not (output / "metadata.json").exists()


def test_workers_do_not_change_the_output(corpus, prepared, tmp_path):
    config, _ = prepared
    prepare(_config(corpus, tmp_path / "data", workers=2))
    assert _bytes_of(tmp_path / "data") == _bytes_of(config.output)


def test_a_wordpiece_learned_in_worker_processes_is_the_serial_one(tmp_path):
    """Past MIN_PARALLEL_WORDS distinct words, --workers 2 counts the learner's passes in two
    processes (wordpiece_learner._Workers); the vocabulary and shards must not change."""
    rng = np.random.default_rng(3)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    distinct = MIN_PARALLEL_WORDS + 5_000
    words = ["".join(rng.choice(letters, size=int(n))) for n in rng.integers(4, 10, size=distinct)]
    occurrences = words + [words[i] for i in rng.zipf(1.3, size=60_000) % 500]  # rare words and a frequent head
    rng.shuffle(occurrences)
    text = "\n\n".join(" ".join(occurrences[i:i + 200]) for i in range(0, len(occurrences), 200))
    (tmp_path / "words.txt").write_text(text + "\n")
    assert len(set(occurrences)) >= MIN_PARALLEL_WORDS
    outputs = {}
    for workers in (1, 2):
        config = PrepareConfig(inputs=(str(tmp_path / "words.txt"),), output=str(tmp_path / f"w{workers}"),
                               wordpiece_size=2_000, seq_len=128, validation_fraction=0.1, shards=1, seed=1,
                               workers=workers)
        prepare(config)
        outputs[workers] = _bytes_of(config.output)
    assert outputs[1] == outputs[2]
    assert 1_000 < len(_vocab(str(tmp_path / "w1"))) <= 2_000


def test_another_seed_changes_units_but_not_tokens(corpus, prepared, tmp_path):
    config, _ = prepared
    other = prepare(_config(corpus, tmp_path / "data", seed=2, validation_fraction=0.0, shards=1))
    mine = prepare(_config(corpus, tmp_path / "mine", seed=1, validation_fraction=0.0, shards=1))
    a, b = _read_split(str(tmp_path / "data"), "train"), _read_split(str(tmp_path / "mine"), "train")
    assert [s["input_ids"].tolist() for s in a] == [s["input_ids"].tolist() for s in b]
    assert [s["units_pmi"].tolist() for s in a] != [s["units_pmi"].tolist() for s in b]
    assert other["splits"]["validation"]["shards"] == 0 and mine["splits"]["train"]["documents"] == 90


def test_given_wordpiece_vocabulary_is_copied(corpus, prepared, tmp_path):
    config, _ = prepared
    source = prepared_corpus.vocab_path(config.output)
    metadata = prepare(_config(corpus, tmp_path / "data", wordpiece=source))
    assert (tmp_path / "data" / "vocab.txt").read_bytes() == pathlib.Path(source).read_bytes()
    assert metadata["wordpiece"]["trained"] is False and metadata["wordpiece"]["source"] == source
    assert _read_split(str(tmp_path / "data"), "train")[0]["input_ids"].tolist() == \
        _read_split(config.output, "train")[0]["input_ids"].tolist()


def test_a_short_sequence_length_cuts_words_and_units_in_two(corpus, tmp_path):
    config = _config(corpus, tmp_path / "data", seq_len=8, validation_fraction=0.0, shards=1)
    metadata = prepare(config)
    sequences = _read_split(config.output, "train")
    vocab = _vocab(config.output)
    assert max(len(s["input_ids"]) for s in sequences) == 8
    assert _words_of_stream(sequences, vocab, metadata["special_ids"]) == \
        [w for doc in split_words(corpus["docs"]) for w in doc]
    cut = [s for s in sequences if vocab[s["input_ids"][1]].startswith("##")]
    assert cut and all(s["word_ids"][1] == 0 for s in cut)


@pytest.mark.parametrize("bad, message", [
    ({"seq_len": 7}, "--seq-len 7"),
    ({"validation_fraction": 1.0}, "--validation-fraction"),
    ({"units": (("pmi", "UPPER"),)}, "normalisation"),
    ({"units": (("pmi", "PUNCT"),)}, "normalisation"),
    ({"units": (("PMI", "pmi.txt"),)}, "'PMI'"),
    ({"wordpiece": "NOSPECIAL"}, r"\[MASK\] missing"),
    ({"inputs": ("EMPTY",)}, "no documents"),
    ({"inputs": ("missing/*.txt",)}, "no file matches"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(corpus, tmp_path, bad, message):
    root = corpus["root"]
    (tmp_path / "UPPER").write_text("the United States\nair force\n")
    (tmp_path / "PUNCT").write_text("u.s. army\nair force\n")
    (tmp_path / "NOSPECIAL").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    (tmp_path / "EMPTY").write_text("\n\n   \n\n")
    resolved = {}
    for key, value in bad.items():
        if key == "units":
            value = tuple((n, str(tmp_path / s) if s.isupper() else str(root / s)) for n, s in value)
        elif key == "inputs":
            value = tuple(str(tmp_path / v) for v in value)
        elif key == "wordpiece":
            value = str(tmp_path / value)
        resolved[key] = value
    with pytest.raises(UserInputError, match=message):
        prepare(_config(corpus, tmp_path / "out", **resolved))
    assert not (tmp_path / "out").exists()


def test_output_of_another_configuration_is_refused_unless_overwrite(corpus, prepared, tmp_path):
    config, _ = prepared
    output = tmp_path / "data"
    prepare(_config(corpus, output, validation_fraction=0.0, shards=2))
    before = _bytes_of(output)
    with pytest.raises(UserInputError, match="different configuration"):
        prepare(_config(corpus, output))
    assert _bytes_of(output) == before
    prepare(_config(corpus, output, overwrite=True))
    assert _bytes_of(output) == _bytes_of(config.output)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "train-00000-of-00001.tfrecord").write_bytes(b"not ours")
    with pytest.raises(UserInputError, match="different configuration"):
        prepare(_config(corpus, stray))
    assert (stray / "train-00000-of-00001.tfrecord").read_bytes() == b"not ours"


def test_rerun_of_a_complete_directory_changes_nothing(corpus, prepared):
    config, metadata = prepared
    before = {p: os.stat(os.path.join(config.output, p)).st_mtime_ns for p in os.listdir(config.output)}
    assert prepare(config) == metadata
    assert {p: os.stat(os.path.join(config.output, p)).st_mtime_ns for p in os.listdir(config.output)} == before


def test_cli_prepare_and_show(corpus, prepared, tmp_path, capsys):
    config, _ = prepared
    root = corpus["root"]
    out = tmp_path / "data"
    status = cli_main(["corpus", "prepare", "--input", *corpus["inputs"], "--output", str(out),
                       "--wordpiece-size", "300", "--units", f"pmi={root / 'pmi.txt'}",
                       "--units", f"frequency={root / 'frequency.txt'}", "--seq-len", "24",
                       "--validation-fraction", "0.1", "--shards", "3", "--seed", "1"])
    assert status == 0
    printed = capsys.readouterr().out
    assert "units pmi: 7 entries" in printed and "of tokens inside multi-word units" in printed
    assert _bytes_of(out) == _bytes_of(config.output)
    assert cli_main(["corpus", "show", str(out), "--num", "40", "--units", "pmi"]) == 0
    shown = capsys.readouterr().out
    assert "[CLS]" in shown and ("[united states air force]" in shown or "[the united states]" in shown)
    assert "format version 2 (a seeded hash of each document's text" in shown
    assert cli_main(["corpus", "show", str(out), "--units", "nope"]) == 2
    assert cli_main(["corpus", "prepare", "--input", *corpus["inputs"], "--output", str(out),
                     "--units", "pmi"]) == 2
    assert "expected NAME=VOCAB" in capsys.readouterr().err


def test_render_sequence_joins_pieces_and_brackets_units():
    from pmi_jax.prepared_sequences import render_sequence

    tokens = ["[CLS]", "the", "united", "state", "##s", "air", "force", "was", "found", "##ed", "[SEP]"]
    word_ids = [-1, 0, 1, 2, 2, 3, 4, 5, 6, 6, -1]
    unit_ids = [-1, 0, 0, 0, 0, 1, 1, 2, 3, 3, -1]
    assert render_sequence(tokens, word_ids, unit_ids) == \
        "[CLS] [the united states] [air force] was founded [SEP]"


def _reference_pack(docs, capacity, cls_id=2, sep_id=3):
    """The packing rule one token at a time: docs are lists of (id, starts a word) pairs."""
    rows, row = [], []
    for doc in docs:
        if doc and row:
            if capacity - len(row) >= 2:
                row.append((sep_id, None))
            else:
                rows.append(row)
                row = []
        for token in doc:
            row.append(token)
            if len(row) == capacity:
                rows.append(row)
                row = []
    rows += [row] if row else []
    out = []
    for row in rows:
        word_ids, count = [], -1
        for i, (token_id, starts) in enumerate(row):
            if starts is None:
                word_ids.append(-1)
                continue
            count += starts or i == 0  # a word cut by the row boundary starts anew
            word_ids.append(count)
        out.append(([cls_id] + [t for t, _ in row] + [sep_id], [-1] + word_ids + [-1]))
    return out


@pytest.mark.parametrize("seq_len", [8, 9, 16])
def test_packing_matches_a_token_by_token_reference_for_any_batching(seq_len):
    rng = np.random.default_rng(seq_len)
    docs = []
    for _ in range(60):
        n = int(rng.choice([0, 1, 3, 6, 7, 20]))
        starts = rng.random(n) < 0.6
        starts[:1] = True
        docs.append([(int(t), bool(w)) for t, w in zip(rng.integers(5, 99, n), starts)])
    expected = _reference_pack(docs, seq_len - 2)
    for cuts in ([], [1, 2, 30], list(range(1, 60, 7))):
        packer = SequencePacker(seq_len, cls_id=2, sep_id=3, unit_names=["u"])
        got = []
        for batch in np.split(np.arange(len(docs)), cuts):
            tokens = [t for d in batch for t in docs[d]]
            ids = np.array([t for t, _ in tokens], np.int64)
            word_start = np.array([w for _, w in tokens], bool)
            splits = np.concatenate([[0], np.cumsum([len(docs[d]) for d in batch])]).astype(np.int64)
            got += list(packer.add(ids, word_start, {"u": word_start}, splits))
        got += list(packer.finish())
        assert [(g["input_ids"].tolist(), g["word_ids"].tolist()) for g in got] == expected
        assert all(np.array_equal(g["units_u"], g["word_ids"]) for g in got)


def test_parse_example_in_tf_data_matches_the_records(prepared):
    config, _ = prepared
    paths = prepared_corpus.PreparedCorpus(config.output).files("validation")
    parsed = tf.data.TFRecordDataset(paths).map(lambda r: prepared_corpus.parse_example(r, ["pmi", "frequency"]))
    for got, want in zip(parsed.as_numpy_iterator(), _read_split(config.output, "validation"), strict=True):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_inputs_are_read_in_sorted_order(corpus):
    assert list(iter_documents(expand_inputs(corpus["inputs"]))) == corpus["docs"]


# ---------------------------------------------------------------------------------------------
# Reruns verify what they claim; --overwrite never leaves a state that looks complete.

def _copy_of(prepared, tmp_path) -> pathlib.Path:
    import shutil

    config, _ = prepared
    shutil.copytree(config.output, tmp_path / "data")
    return tmp_path / "data"


@pytest.mark.parametrize("damage", ["delete", "truncate", "vocab"])
def test_a_rerun_rewrites_a_deleted_or_truncated_shard(corpus, prepared, tmp_path, damage):
    config, _ = prepared
    output = _copy_of(prepared, tmp_path)
    reference = _bytes_of(output)
    shard = output / "train-00001-of-00003.tfrecord"
    if damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        shard.write_bytes(reference[shard.name][:-7])
    else:
        (output / "vocab.txt").unlink()
    with pytest.raises(UserInputError, match="shard train-00001-of-00003.tfrecord is|vocab.txt is missing"):
        prepared_corpus.PreparedCorpus(str(output))  # every reader refuses it, in one line
    written = []
    prepare(_config(corpus, output), on_shard_done=lambda task: written.append(task.name))
    assert written == ([] if damage == "vocab" else [shard.name])  # only what was damaged is redone
    assert _bytes_of(output) == reference
    prepared_corpus.PreparedCorpus(str(output))


def test_an_interrupted_overwrite_never_looks_complete(corpus, prepared, tmp_path, monkeypatch):
    """Kill --overwrite after its first deletion of anything but metadata.json: the old
    configuration's rerun must then either refuse or rebuild, never call the rest complete."""
    output = _copy_of(prepared, tmp_path)

    class Killed(BaseException):
        pass

    real_remove = tf.io.gfile.remove

    def remove_then_die(path):
        real_remove(path)
        if not str(path).endswith("metadata.json"):
            raise Killed(path)

    monkeypatch.setattr(tf.io.gfile, "remove", remove_then_die)
    with pytest.raises(Killed):
        prepare(_config(corpus, output, seed=7, overwrite=True))
    monkeypatch.undo()
    try:
        prepare(_config(corpus, output))
    except UserInputError as e:
        assert "of a different configuration" in str(e)
    else:
        prepared_corpus.PreparedCorpus(str(output))  # a rebuild: complete and consistent


def test_an_overwrite_keeps_no_file_of_the_old_run(corpus, prepared, tmp_path):
    output = _copy_of(prepared, tmp_path)
    prepare(_config(corpus, output, shards=2, overwrite=True))
    assert sorted(p.name for p in output.glob("*.tfrecord")) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord", "validation-00000-of-00001.tfrecord"]


def test_metadata_records_every_shard_size(prepared):
    config, metadata = prepared
    files = [name for split in metadata["splits"].values() for name in split["files"]]
    assert sorted(metadata["shards"]) == sorted(files)
    for name in files:
        assert metadata["shards"][name]["bytes"] == os.path.getsize(os.path.join(config.output, name))
    assert metadata["corpus"]["invalid_utf8_bytes"] == 0


# ---------------------------------------------------------------------------------------------
# Outputs that would mix into or feed something else are refused before anything is written.

def test_output_may_not_be_a_masking_vocabulary_or_inside_an_input(corpus, tmp_path, capsys):
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    for name in ("masking_vocab.txt", "masking_vocab.tsv", "stats.json"):
        (vocab_dir / name).write_text("x\n")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.txt").write_text((corpus["root"] / "a.txt").read_text())
    cases = [(str(vocab_dir), [], "holds files that `corpus prepare` does not write"),
             (str(inputs / "data"), [], f"lies inside the input --input {inputs}"),
             (str(inputs), ["--overwrite"], f"is the input --input {inputs}")]
    for output, extra, message in cases:
        before = sorted(p.name for p in pathlib.Path(output).parent.rglob("*"))
        status = cli_main(["corpus", "prepare", "--input", str(inputs), "--output", output, "--wordpiece-size", "200",
                           "--seq-len", "24", "--no-progress", *extra])
        err = capsys.readouterr().err
        assert status == 2 and message in err and err.count("\n") == 1, err
        assert sorted(p.name for p in pathlib.Path(output).parent.rglob("*")) == before


def test_a_sequence_length_no_config_can_train_is_refused(corpus, tmp_path, capsys):
    status = cli_main(["corpus", "prepare", "--input", *corpus["inputs"], "--output", str(tmp_path / "data"),
                       "--seq-len", "1024", "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2 and "--seq-len 1024: no config can train on it (max_position_embeddings is at most 512" in err
    assert not (tmp_path / "data").exists()


def test_no_progress_prints_no_bars(corpus, tmp_path, capsys):
    status = cli_main(["corpus", "prepare", "--input", *corpus["inputs"], "--output", str(tmp_path / "data"),
                       "--wordpiece-size", "200", "--seq-len", "24", "--shards", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert status == 0 and "shards:" not in captured.err and "\r" not in captured.err


def test_tokens_per_word_is_recorded_and_grows_as_the_vocabulary_shrinks(corpus, prepared, tmp_path):
    """The paper's Table 1 reports tokens per word (1.08, 1.22, 2.06 for 30K, 10K, 2K pieces):
    metadata.json's tokens_per_word is the corpus's WordPiece tokens over its basic-tokenizer words."""
    config, metadata = prepared
    special = set(metadata["special_ids"].values())
    words = sum(len(w) for w in split_words(corpus["docs"]))
    tokens = sum(int(np.sum(~np.isin(s["input_ids"], list(special))))
                 for split in ("train", "validation") for s in _read_split(config.output, split))
    assert metadata["tokens_per_word"] == pytest.approx(tokens / words)
    assert metadata["splits"]["train"]["words"] + metadata["splits"]["validation"]["words"] == words
    assert 1.0 < metadata["tokens_per_word"] < 3.0
    smaller = prepare(_config(corpus, tmp_path / "small", wordpiece_size=80, units=()))
    assert smaller["tokens_per_word"] > metadata["tokens_per_word"] + 0.2


def test_the_plan_reads_no_document_only_file_names_and_sizes(corpus, tmp_path, monkeypatch):
    """What the launcher does before the workers start is independent of the corpus's length:
    with the document reader disabled, the plan (assignment, fingerprint, shards to write) is made."""
    from pmi_jax.preprocess.corpus import prepare as prepare_module
    from pmi_jax.preprocess.text import documents

    def no_reading(*args, **kwargs):
        raise AssertionError("the plan read a document")

    monkeypatch.setattr(documents, "read_documents", no_reading)
    plan = prepare_module.plan_prepare(_config(corpus, tmp_path / "data"))
    assert [t.name for t in plan.todo] == ["train-00000-of-00003.tfrecord", "train-00001-of-00003.tfrecord",
                                           "train-00002-of-00003.tfrecord", "validation-00000-of-00001.tfrecord"]
    assert plan.corpus.sizes == tuple(os.path.getsize(p) for p in corpus["inputs"])


def test_the_assignment_draws_splits_and_shards_as_stated():
    """Over 200,000 keys: the validation share is Binomial(n, fraction) and each split's shards
    are equally likely (exact binomial bound and a chi-square test, each at p = 1e-6); the same
    key always gets the same shard, another seed reassigns about all of them."""
    from scipy import stats

    keys = np.random.default_rng(11).integers(0, 2**63, size=200_000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    assignment = Assignment(seed=3, validation_fraction=0.05, train_shards=7, validation_shards=2)
    task = assignment.task_of(keys)
    validation = task >= 7
    lo, hi = stats.binom.ppf([5e-7, 1 - 5e-7], len(keys), 0.05)
    assert lo <= validation.sum() <= hi
    for members, shards, offset in ((~validation, 7, 0), (validation, 2, 7)):
        counts = np.bincount(task[members] - offset, minlength=shards)
        assert len(counts) == shards
        assert stats.chisquare(counts).pvalue > 1e-6
    np.testing.assert_array_equal(assignment.task_of(keys[::-1]), task[::-1])  # a function of the key alone
    other = Assignment(seed=4, validation_fraction=0.05, train_shards=7, validation_shards=2).task_of(keys)
    assert 0.80 < np.mean(other != task) < 0.90  # independent draws agree about 0.95 * 1/7 + 0.05 * 1/2 of the time
    assert (Assignment(3, 0.0, 5, 0).task_of(keys) < 5).all()  # no validation shards: every key trains


def test_a_duplicated_document_lands_in_one_shard(tmp_path):
    """Equal texts share a key: a document repeated across files is never in both splits."""
    docs = [f"document number {i} with some words" for i in range(200)]
    (tmp_path / "a.txt").write_text("\n\n".join(docs) + "\n")
    (tmp_path / "b.txt").write_text("\n\n".join(reversed(docs)) + "\n")
    config = PrepareConfig(inputs=(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")), output=str(tmp_path / "data"),
                           wordpiece_size=200, seq_len=32, validation_fraction=0.2, shards=2, seed=5, progress=False)
    metadata = prepare(config)
    by_split = in_shard_order(docs, Assignment(5, 0.2, 2, 1))
    assert metadata["splits"]["validation"]["documents"] == 2 * len(by_split["validation"]) > 0
    assert metadata["splits"]["train"]["documents"] == 2 * len(by_split["train"])
    assert metadata["corpus"]["documents"] == 400 and metadata["format_version"] == 2


def test_a_resume_refuses_input_whose_text_changed_under_the_same_sizes(tmp_path):
    """The fingerprint knows file sizes only; .progress/corpus.json's sha256 catches the rest."""
    docs = [f"document {i} about the united states air force" for i in range(40)]
    text = tmp_path / "a.txt"
    text.write_text("\n\n".join(docs) + "\n")
    config = PrepareConfig(inputs=(str(text),), output=str(tmp_path / "data"), wordpiece_size=200, seq_len=32,
                           validation_fraction=0.0, shards=2, progress=False)

    class Killed(Exception):
        pass

    def kill(task):
        raise Killed(task.name)

    with pytest.raises(Killed):
        prepare(config, on_shard_done=kill)
    text.write_text(text.read_text().replace("air force", "air FORCE"))  # same bytes, other text
    with pytest.raises(UserInputError, match="the text changed since an interrupted run"):
        prepare(config)
    assert (tmp_path / "data" / "train-00000-of-00002.tfrecord").exists() != \
        (tmp_path / "data" / "train-00001-of-00002.tfrecord").exists()  # the one shard kept for the fix
    shutil.rmtree(tmp_path / "data")
    assert prepare(config)["corpus"]["documents"] == 40
