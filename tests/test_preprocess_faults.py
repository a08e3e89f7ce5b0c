"""Hostile inputs and faults for the preprocessing commands (`vocab`, `corpus`, `demo-corpus`).

Each must end in one line on stderr naming what is wrong, exit status 2, and nothing written:
no output, no hidden temporaries. docs/reliability.md, "Preprocessing commands", lists them.
"""
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pmi_jax.cli import main
from pmi_jax.errors import UserInputError
from tests.damage import one_line_error as _one_line_error
from tests.damage import tmpfs as _tmpfs

PHRASES = ["the editor in chief", "new york city", "machine learning", "of the paper", "air force"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("faults")
    rng = np.random.default_rng(0)
    docs = [" ".join(str(rng.choice(PHRASES)) for _ in range(12)) + "." for _ in range(60)]
    (root / "good.txt").write_text("\n\n".join(docs) + "\n")
    return root


def _listing(directory: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _vocab_build(inputs, output, *extra) -> int:
    return main(["vocab", "build", "--input", *map(str, inputs), "--output", str(output), "--min-count", "2",
                 "--size", "20", "--workers", "1", "--no-progress", *extra])


def _prepare(inputs, output, *extra) -> int:
    return main(["corpus", "prepare", "--input", *map(str, inputs), "--output", str(output), "--wordpiece-size",
                 "150", "--seq-len", "32", "--shards", "2", "--no-progress",
                 "--validation-fraction", "0.2", *extra])  # about 12 of 60 documents: a validation shard to damage


def _prepare_given(inputs, output, *extra) -> int:
    """`corpus prepare` with the --wordpiece or --tokenizer in `extra` (no vocabulary trained)."""
    return main(["corpus", "prepare", "--input", *map(str, inputs), "--output", str(output), "--seq-len", "32",
                 "--shards", "2", "--no-progress", *extra])


# ---------------------------------------------------------------------------------------------
# Input that is not what it claims to be.

def _bad_inputs(directory: pathlib.Path) -> dict[str, str]:
    """{file: the message fragment its error must carry}."""
    directory.mkdir(exist_ok=True)
    (directory / "plain.txt.gz").write_text("this is not gzip\n")
    (directory / "number.jsonl").write_text('{"text": "fine words here"}\n{"text": 42}\n')
    (directory / "null.jsonl").write_text('{"text": null}\n')
    (directory / "random.txt").write_bytes(np.random.default_rng(1).integers(0, 256, 100_000, np.uint8).tobytes())
    text = " ".join(PHRASES) + ".\n\n"
    (directory / "utf16.txt").write_text(text * 50, encoding="utf-16")  # with its byte-order mark
    (directory / "utf32.txt").write_text(text * 50, encoding="utf-32-le")  # without one
    return {"utf16.txt": "utf16.txt: UTF-16 text, not UTF-8; convert it first (e.g. iconv -f UTF-16 -t UTF-8)",
            "utf32.txt": "utf32.txt: UTF-16 or UTF-32 text, not UTF-8",
            "plain.txt.gz": "not a readable gzip file",
            "number.jsonl": "number.jsonl:2: the 'text' field is 42, not a string",
            "null.jsonl": "null.jsonl:1: the 'text' field is null, not a string",
            "random.txt": "random.txt: not UTF-8 text"}


@pytest.mark.parametrize("command", ["vocab", "corpus"])
def test_input_that_is_not_text_is_refused(corpus, tmp_path, capsys, command):
    cases = _bad_inputs(tmp_path / "bad")
    for name, message in cases.items():
        run = _vocab_build if command == "vocab" else _prepare
        status = run([tmp_path / "bad" / name, corpus / "good.txt"], tmp_path / "out")
        _one_line_error(capsys, status, message)
        assert _listing(tmp_path) == sorted(["bad", *(f"bad/{n}" for n in cases)])


def test_vocab_check_of_a_file_that_is_not_text_is_one_line(tmp_path, capsys):
    cases = _bad_inputs(tmp_path / "bad")
    for name in ("random.txt", "utf16.txt", "utf32.txt"):
        message = cases[name].split(": ", 1)[1]
        _one_line_error(capsys, main(["vocab", "check", str(tmp_path / "bad" / name)]),
                        f"{tmp_path / 'bad' / name}: {message}")


def test_a_few_bad_bytes_in_real_text_are_replaced_and_counted(corpus, tmp_path, capsys):
    text = (corpus / "good.txt").read_bytes()
    (tmp_path / "latin1.txt").write_bytes(text.replace(b"chief", b"chi\xe9f", 3))
    assert _vocab_build([tmp_path / "latin1.txt"], tmp_path / "vocab") == 0
    stats = json.loads((tmp_path / "vocab" / "stats.json").read_text())
    assert stats["invalid_utf8_bytes"] == 3
    assert _prepare([tmp_path / "latin1.txt"], tmp_path / "data") == 0
    metadata = json.loads((tmp_path / "data" / "metadata.json").read_text())
    assert metadata["corpus"]["invalid_utf8_bytes"] == 3


# ---------------------------------------------------------------------------------------------
# Useless results are refused before they are written (issue 33 cases 6, 11, 12, 13).

def test_parquet_rows_with_a_null_text_are_refused_like_json_lines(corpus, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [None if i % 7 == 3 else f"row {i} of the editor in chief" for i in range(400)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "nulls.parquet")
    for run in (_vocab_build, _prepare):
        _one_line_error(capsys, run([tmp_path / "nulls.parquet"], tmp_path / "out"),
                        f"--input {tmp_path / 'nulls.parquet'}: 57 rows of this batch have a null 'text', the first "
                        "row 4; drop or fill the nulls")
    assert _listing(tmp_path) == ["nulls.parquet"]


def _spaced_words_tokenizer(path: pathlib.Path) -> pathlib.Path:
    """A WordPiece tokenizer whose pre-tokenizer splits on line breaks only: each line one "word"."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "editor", "in"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("\n"), behavior="removed")
    tokenizer.save(str(path))
    return path


def test_a_pre_tokenizer_whose_words_hold_spaces_is_refused(corpus, tmp_path, capsys):
    tokenizer = _spaced_words_tokenizer(tmp_path / "tokenizer.json")
    for run in (_vocab_build, _prepare_given):
        _one_line_error(capsys, run([corpus / "good.txt"], tmp_path / "out", "--tokenizer", str(tokenizer)),
                        f"--tokenizer {tokenizer}: its pre-tokenizer makes words holding white space ('The United "
                        "States Air Force was formed i'); masking units need words without it")
    assert _listing(tmp_path) == ["tokenizer.json"]


def test_a_vocabulary_that_makes_mostly_unk_of_the_text_is_refused(corpus, tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra", "##s", "quagga"]) + "\n")
    message = _one_line_error(capsys, _prepare_given([corpus / "good.txt"], tmp_path / "out", "--wordpiece",
                                                     str(vocab)),
                              f"--wordpiece {vocab}: ", " tokens of the corpus's first 60 documents are [UNK]")
    import re

    unknown, total = map(int, re.search(r": (\d+) of the (\d+) tokens", message).groups())
    assert unknown == total > 700
    assert _listing(tmp_path) == ["vocab.txt"]


def test_text_without_spaces_yields_no_corpus(tmp_path, capsys):
    (tmp_path / "nospace.txt").write_text("".join(np.random.default_rng(0).choice(list("abcdefgh"), 200_000)))
    _one_line_error(capsys, _prepare([tmp_path / "nospace.txt"], tmp_path / "out"),
                    "the corpus yields no WordPiece token besides the special ones (1 words, 1 distinct")
    assert _listing(tmp_path) == ["nospace.txt"]


def test_latin1_text_is_named_with_its_share_of_replaced_bytes(corpus, tmp_path, caplog):
    text = (corpus / "good.txt").read_text().replace("editor", "éditör").replace("chief", "chéf")
    (tmp_path / "latin1.txt").write_bytes(text.encode("latin-1"))
    invalid = text.count("é") + text.count("ö")
    assert _vocab_build([tmp_path / "latin1.txt"], tmp_path / "vocab") == 0
    warnings = [r.getMessage() for r in caplog.records if "U+FFFD" in r.getMessage()]
    total = len(text.encode("latin-1"))
    assert warnings == [f"--input {tmp_path / 'latin1.txt'}: {invalid} of its {total} bytes "
                        f"({100 * invalid / total:.1f}%) are not valid UTF-8 and became U+FFFD; if it is Latin-1 or "
                        "another encoding, convert it first (e.g. iconv -f LATIN1 -t UTF-8)"]


def test_the_beam_runner_reports_a_bad_json_line_in_one_line(corpus, tmp_path, capsys):
    _bad_inputs(tmp_path / "bad")
    status = _vocab_build([tmp_path / "bad" / "number.jsonl"], tmp_path / "out", "--runner", "DirectRunner")
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.endswith("pmi-jax vocab: error: " + f"{tmp_path / 'bad' / 'number.jsonl'}:2: the 'text' field is 42, "
                        "not a string\n"), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    # A few bad bytes: replaced and counted as the local build counts them.
    text = (corpus / "good.txt").read_bytes()
    (tmp_path / "latin1.txt").write_bytes(text.replace(b"chief", b"chi\xe9f", 3))
    assert _vocab_build([tmp_path / "latin1.txt"], tmp_path / "vocab", "--runner", "DirectRunner") == 0
    assert json.loads((tmp_path / "vocab" / "stats.json").read_text())["invalid_utf8_bytes"] == 3


def test_nonsense_counts_are_refused(corpus, tmp_path, capsys):
    _one_line_error(capsys, _prepare([corpus / "good.txt"], tmp_path / "data", "--workers", "0"),
                    "--workers 0: must be at least 1")
    _one_line_error(capsys, main(["corpus", "show", str(tmp_path), "--num", "-1"]), "--num -1: must be at least 1")
    assert _listing(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Outputs that cannot be written.

COMMANDS = {
    "vocab build": lambda corpus, out: _vocab_build([corpus / "good.txt"], out),
    "corpus prepare": lambda corpus, out: _prepare([corpus / "good.txt"], out),
    "demo-corpus": lambda corpus, out: main(["demo-corpus", "--output", str(out)]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_outputs_that_cannot_be_written(corpus, tmp_path, capsys, command):
    run = COMMANDS[command]
    (tmp_path / "file").write_text("keep")
    _one_line_error(capsys, run(corpus, tmp_path / "file"), "is a file; name a directory")
    _one_line_error(capsys, run(corpus, tmp_path / "file" / "sub" / "out"), f"{tmp_path / 'file'} is a file")
    assert (tmp_path / "file").read_text() == "keep"
    assert _listing(tmp_path) == ["file"]
    with _tmpfs(tmp_path / "ro", "ro,size=1m") as read_only:
        _one_line_error(capsys, run(corpus, read_only / "out"), "cannot write", "Read-only file system")
        assert _listing(read_only) == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_full_disk_is_one_line_and_leaves_nothing(corpus, tmp_path, capsys, command):
    with _tmpfs(tmp_path / "full", "size=256k") as full:
        with contextlib.suppress(OSError), open(full / "filler", "wb") as f:
            while True:  # a disk with room for directories and empty files only
                f.write(b"x" * 4096)
                f.flush()
        _one_line_error(capsys, COMMANDS[command](corpus, full / "out"), "No space left on device")
        assert _listing(full) == ["filler"]


# ---------------------------------------------------------------------------------------------
# Damaged files of a vocabulary or a prepared corpus, for every command that reads them.

@pytest.fixture(scope="module")
def vocab_dir(corpus, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("vocab") / "vocab"
    assert _vocab_build([corpus / "good.txt"], out) == 0
    return out


@pytest.fixture(scope="module")
def data_dir(corpus, vocab_dir, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("data") / "data"
    assert _prepare([corpus / "good.txt"], out, "--units", f"pmi={vocab_dir}") == 0
    return out


def _damaged_copy(source: pathlib.Path, copy: pathlib.Path, name: str, change) -> pathlib.Path:
    """A copy of `source` whose file `name` is deleted (`change` None) or replaced by change(bytes)."""
    shutil.copytree(source, copy)
    if change is None:
        (copy / name).unlink()
    else:
        (copy / name).write_bytes(change((copy / name).read_bytes()))
    return copy


VOCAB_DAMAGE = {
    "corrupted tsv": ("masking_vocab.tsv", lambda b: b + b"half a row\t2\n", "not a row `ngram<TAB>n"),
    "empty stats": ("stats.json", lambda b: b"", "stats.json: not valid JSON"),
    "missing txt": ("masking_vocab.txt", None, "no masking_vocab.txt"),
}


@pytest.mark.parametrize("damage", sorted(VOCAB_DAMAGE))
def test_a_damaged_vocabulary_is_one_line(vocab_dir, tmp_path, capsys, damage):
    name, change, message = VOCAB_DAMAGE[damage]
    broken = _damaged_copy(vocab_dir, tmp_path / "vocab", name, change)
    _one_line_error(capsys, main(["vocab", "show", str(broken)]), message)


def test_a_damaged_unit_list_is_one_line_for_prepare(corpus, vocab_dir, tmp_path, capsys):
    broken = tmp_path / "vocab"
    shutil.copytree(vocab_dir, broken)
    (broken / "masking_vocab.txt").write_bytes(b"\xff\xfe\x00garbage\n" * 3)
    status = _prepare([corpus / "good.txt"], tmp_path / "data", "--units", f"pmi={broken}")
    _one_line_error(capsys, status, f"--units pmi={broken}")
    assert not (tmp_path / "data").exists()


CORPUS_DAMAGE = {
    "broken metadata": ("metadata.json", lambda b: b[:len(b) // 2], "metadata.json: not valid JSON"),
    "empty metadata": ("metadata.json", lambda b: b"", "metadata.json: not valid JSON"),
    "metadata not an object": ("metadata.json", lambda b: b"[1, 2]", "metadata.json: not a JSON object"),
    "missing vocab": ("vocab.txt", None, "vocab.txt is missing"),
    "permuted vocab": ("vocab.txt", lambda b: b"\n".join(reversed(b.rstrip(b"\n").split(b"\n"))) + b"\n",
                       "not the vocabulary the shards were written with"),
    "truncated shard": ("train-00001-of-00002.tfrecord", lambda b: b[:-5],
                        "shard train-00001-of-00002.tfrecord is"),
    "missing shard": ("train-00000-of-00002.tfrecord", None, "shard train-00000-of-00002.tfrecord is missing"),
}


@pytest.mark.parametrize("damage", sorted(CORPUS_DAMAGE))
def test_a_damaged_prepared_corpus_is_one_line_for_every_reader(data_dir, tmp_path, capsys, damage):
    from pmi_jax import tasks

    name, change, message = CORPUS_DAMAGE[damage]
    broken = _damaged_copy(data_dir, tmp_path / "data", name, change)
    _one_line_error(capsys, main(["corpus", "show", str(broken)]), message)
    with pytest.raises(UserInputError, match=message.replace("`", ".").split(" (")[0]):
        tasks.TaskCorpus(str(broken))  # what `train`, `data` and `eval` open


def _flip_bytes(path: pathlib.Path, offset: int = 20) -> None:
    """Change bytes inside the first record of a shard, keeping its size (a disk error, a bad copy)."""
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = bytes(b ^ 0xFF for b in data[offset:offset + 4])
    path.write_bytes(bytes(data))


def test_bytes_changed_inside_a_shard_are_named_and_rewritten(corpus, vocab_dir, data_dir, tmp_path, capsys,
                                                              caplog):
    from pmi_jax.batches import TaskBatches

    metadata = json.loads((data_dir / "metadata.json").read_text())
    assert all(len(stats["sha256"]) == 64 for stats in metadata["shards"].values())
    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    shard = "train-00000-of-00002.tfrecord"
    _flip_bytes(broken / shard)
    message = f"{broken}: shard {shard} is damaged (its sha256 is not the one recorded); rerun the same"
    _one_line_error(capsys, main(["corpus", "show", str(broken)]), message)
    _one_line_error(capsys, main(["data", "dump", "--data", str(broken), "--scheme", "pmi", "--num", "100",
                                  "--output", str(tmp_path / "dump.jsonl")]), message)
    assert not (tmp_path / "dump.jsonl").exists()
    with pytest.raises(UserInputError, match=message.split(" (")[0]):  # what `train` reads through
        next(iter(TaskBatches(str(broken), "pmi", "train", 32, 4, 0).batches(0, 0, 1)))
    # The same `corpus prepare` finds the damage by its digest and rewrites that shard alone.
    untouched = (broken / "train-00001-of-00002.tfrecord").stat().st_mtime_ns
    assert _prepare([corpus / "good.txt"], broken, "--units", f"pmi={vocab_dir}") == 0
    assert f"{shard} is damaged (its sha256 is not the one recorded); rewriting" in caplog.text
    assert (broken / shard).read_bytes() == (data_dir / shard).read_bytes()
    assert (broken / "train-00001-of-00002.tfrecord").stat().st_mtime_ns == untouched
    assert _listing(broken) == _listing(data_dir)
    assert main(["corpus", "show", str(broken)]) == 0


def _tree(directory: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_corpus_show_names_damage_in_shards_it_does_not_show(data_dir, tmp_path, capsys):
    """`corpus show --num 1` reads one record of the first train shard, but checks every shard's
    digest: bytes changed in the other train shard and in the validation shard are named, all in
    one line, with the fix; nothing is changed."""
    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    metadata = json.loads((broken / "metadata.json").read_text())
    unread = [metadata["splits"]["train"]["files"][1], metadata["splits"]["validation"]["files"][0]]
    for shard in unread:
        _flip_bytes(broken / shard, offset=(broken / shard).stat().st_size // 2)
    before = _tree(broken)
    _one_line_error(capsys, main(["corpus", "show", str(broken), "--num", "1"]),
                    f"{broken}: shard {unread[0]} is damaged (its sha256 is not the one recorded), shard {unread[1]} "
                    "is damaged (its sha256 is not the one recorded); rerun the same `pmi-jax corpus prepare` to "
                    "rewrite them")
    assert _tree(broken) == before
    (broken / unread[1]).write_bytes((data_dir / unread[1]).read_bytes())  # one left: "it"
    _one_line_error(capsys, main(["corpus", "show", str(broken), "--num", "1", "--split", "validation"]),
                    f"{broken}: shard {unread[0]} is damaged (its sha256 is not the one recorded); rerun the same "
                    "`pmi-jax corpus prepare` to rewrite it")


def test_a_changed_shard_of_a_corpus_without_digests_is_one_line(data_dir, tmp_path, capsys):
    """Corpora prepared before digests were recorded still open; a shard that fails to read is
    reported in one line, which cannot name it."""
    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    metadata = json.loads((broken / "metadata.json").read_text())
    for stats in metadata["shards"].values():
        del stats["sha256"]
    (broken / "metadata.json").write_text(json.dumps(metadata))
    assert main(["corpus", "show", str(broken), "--num", "1"]) == 0
    capsys.readouterr()
    _flip_bytes(broken / "train-00000-of-00002.tfrecord")
    _one_line_error(capsys, main(["corpus", "show", str(broken)]), f"{broken}: a shard does not read (",
                    "records no digests to tell which: rerun `pmi-jax corpus prepare --overwrite`")


# ---------------------------------------------------------------------------------------------
# `corpus show`: an unambiguous rendering.

def test_show_escapes_brackets_inside_words():
    from pmi_jax.prepared_sequences import render_sequence

    tokens = ["[CLS]", "[", "1", "]", "[UNK]", "2", "\\", "[SEP]"]
    words = [-1, 0, 1, 2, 3, 4, 5, -1]
    units = [-1, 0, 0, 1, 1, 2, 3, -1]
    # Units: ("[", "1"), ("]", "[UNK]"), ("2",), ("\",). Unescaped, this would read `[[ 1] [] [UNK]] 2 \`.
    assert render_sequence(tokens, words, units) == "[CLS] [\\[ 1] [\\] [UNK]] 2 \\\\ [SEP]"


# ---------------------------------------------------------------------------------------------
# Kill -9 leaves hidden temporaries only, and the next run of the same output sweeps them.

def test_a_killed_vocab_build_leaves_nothing_after_the_next_run(corpus, tmp_path):
    """Kill `vocab build` while it holds its spill directory, then rerun: no leftovers anywhere."""
    import signal
    import time

    scratch_tmp = tmp_path / "TMPDIR"
    scratch_tmp.mkdir()
    out_parent = tmp_path / "outputs"
    out_parent.mkdir()
    big = tmp_path / "big.txt"
    big.write_text(((corpus / "good.txt").read_text() + "\n\n") * 40)
    env = dict(os.environ, TMPDIR=str(scratch_tmp), PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, "-c", "import sys; from pmi_jax.cli import main; sys.exit(main(sys.argv[1:]))",
               "vocab", "build", "--input", str(big), "--output",
               str(out_parent / "vocab"), "--min-count", "2", "--size", "20", "--workers", "1", "--no-progress"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            if any(p.is_dir() for p in [*scratch_tmp.iterdir(), *out_parent.iterdir()]):
                break
            time.sleep(0.05)
        assert process.poll() is None, process.stdout.read().decode()[-3000:]
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=60)
    left = [p.name for p in [*scratch_tmp.iterdir(), *out_parent.iterdir()]]
    assert left, "the kill came after the build finished: nothing was tested"
    rerun = subprocess.run(command, env=env, capture_output=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
    assert _listing(scratch_tmp) == [] and [p.name for p in out_parent.iterdir()] == ["vocab"]


def test_an_overwrite_killed_between_its_renames_gives_the_old_output_back(corpus, tmp_path, caplog):
    """`vocab build --overwrite` killed after moving the old vocabulary aside and before renaming
    the new one in: the next command restores the old one, whole, and says so; nothing is lost."""
    output = tmp_path / "vocab"
    assert _vocab_build([corpus / "good.txt"], output) == 0
    old = {p.name: p.read_bytes() for p in output.iterdir()}
    killer = ("import os, sys, tensorflow as tf\n"
              "from pmi_jax.cli import main\n"
              "rename = tf.io.gfile.rename\n"
              "def killed_before_the_second_rename(src, dst, overwrite=False):\n"
              "    if dst.rstrip('/') == sys.argv[1] and '.tmp-' in src:\n"
              "        os._exit(9)\n"
              "    return rename(src, dst, overwrite)\n"
              "tf.io.gfile.rename = killed_before_the_second_rename\n"
              "sys.exit(main(sys.argv[2:]))\n")
    command = [sys.executable, "-c", killer, str(output), "vocab", "build", "--input", str(corpus / "good.txt"),
               "--output", str(output), "--min-count", "2", "--size", "10", "--workers", "1", "--no-progress",
               "--overwrite"]
    killed = subprocess.run(command, capture_output=True, timeout=600,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert killed.returncode == 9, killed.stderr.decode()[-3000:]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not output.exists() and any(name.startswith(".vocab.tmp-aside-") for name in left), left
    # The next run (the same command without --overwrite) finds the old vocabulary back in place.
    assert _vocab_build([corpus / "good.txt"], output) == 2
    assert "restored the previous output" in caplog.text
    assert {p.name: p.read_bytes() for p in output.iterdir()} == old
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vocab.tmp-aside-")] == []
    # With --overwrite, it is replaced as asked, and the unfinished new one is swept.
    assert _vocab_build([corpus / "good.txt"], output, "--overwrite") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab"]


def _dead_pid() -> int:
    """The id of a process that has ended: the owner of a killed run's leftovers."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_an_old_output_set_aside_is_never_deleted_unseen(corpus, tmp_path, caplog):
    """Leftovers that may hold a complete old output are kept, named in a warning, when they are
    not put back: an aside of an older version (named `.NAME.tmp-<hex>-...`, as work in progress
    was too), an aside beside an output that exists (a kill after the new output was renamed in),
    and all but the newest of several asides. Work in progress (`.NAME.tmp-work-*`) is swept."""
    import socket

    def vocabulary(directory):  # its files but stats.json, which records the seconds the build took
        return {name: data for name, data in _tree(directory).items() if name != "stats.json"}

    output = tmp_path / "vocab"
    assert _vocab_build([corpus / "good.txt"], output) == 0
    old = vocabulary(output)
    assert len(old) == 2
    dead, host = _dead_pid(), socket.gethostname()
    # An older version's aside, the output absent: the same command builds the output anew and keeps it.
    older = tmp_path / f".vocab.tmp-0123456789ab-{dead}-{host}"
    output.rename(older)
    work = tmp_path / f".vocab.tmp-work-0123456789ab-{dead}-{host}"
    work.mkdir()
    assert _vocab_build([corpus / "good.txt"], output) == 0
    assert f"{output}: kept {older}, which may hold an earlier output that an interrupted overwrite moved aside; " \
           "look inside, then move it back or delete it" in caplog.text
    assert caplog.text.count(f"kept {older}") == 1
    assert vocabulary(older) == old and vocabulary(output) == old and not work.exists()
    # An aside beside the output: --overwrite replaces the output and keeps both leftovers, named.
    beside = tmp_path / f".vocab.tmp-aside-0123456789ab-{dead}-{host}"
    shutil.copytree(older, beside)
    caplog.clear()
    assert _vocab_build([corpus / "good.txt"], output, "--overwrite") == 0
    assert f"kept {beside}" in caplog.text and f"kept {older}" in caplog.text
    assert vocabulary(beside) == old and vocabulary(older) == old
    # Two asides and no output: the newest is put back, the older aside stays (kept at the next sweep).
    shutil.rmtree(output)
    newest = tmp_path / f".vocab.tmp-aside-ba9876543210-{dead}-{host}"
    shutil.copytree(older, newest)
    (newest / "stats.json").write_text((newest / "stats.json").read_text() + " ")  # tell them apart
    os.utime(beside, ns=(1, 1))
    caplog.clear()
    assert _vocab_build([corpus / "good.txt"], output) == 2  # the output is back, and not replaced without --overwrite
    assert f"{output}: restored the previous output from {newest}" in caplog.text
    assert (output / "stats.json").read_text().endswith(" ") and not newest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([output.name, older.name, beside.name])
