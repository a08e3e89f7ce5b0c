"""The Beam pipelines (DirectRunner) produce the local pipelines' outputs, byte for byte.

The corpus is real English (the standard library's documentation, preprocess/text/demo_corpus.py),
cut into a plain text file and a gzipped JSON-lines file so that both readers run.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import itertools
import json
import os
import pathlib

import pytest

from pmi_jax.cli import main
from pmi_jax.errors import DataLost, UserInputError
from pmi_jax.preprocess.beam import beam_prepare, beam_vocab
from pmi_jax.preprocess.corpus import prepare
from pmi_jax.preprocess.vocab import build_vocab
from pmi_jax.preprocess.vocab.build_vocab import VocabOptions
from pmi_jax.preprocess.text.demo_corpus import iter_demo_documents

VOCAB = VocabOptions(size=400, min_count=3, workers=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("corpus")
    docs = list(itertools.islice(iter_demo_documents(), 260))
    (root / "a.txt").write_text("\n\n".join(docs[:150]) + "\n", encoding="utf-8")
    with gzip.open(root / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": doc}) + "\n" for doc in docs[150:])
    return root


@pytest.fixture(scope="module")
def local_vocab(corpus, tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("local") / "vocab"
    build_vocab.build_vocabulary([str(corpus)], str(out), VOCAB)
    return out


def direct_runner() -> list[str]:
    return ["--runner", "DirectRunner"]


def test_beam_vocabulary_equals_the_local_build(corpus, local_vocab, tmp_path):
    out = tmp_path / "vocab"
    status = main(["vocab", "build", "--input", str(corpus), "--output", str(out), "--size", str(VOCAB.size),
                   "--min-count", str(VOCAB.min_count), "--no-progress", *direct_runner()])
    assert status == 0
    for name in ("masking_vocab.txt", "masking_vocab.tsv"):
        assert (out / name).read_bytes() == (local_vocab / name).read_bytes(), name
    beam_stats = json.loads((out / "stats.json").read_text())
    local_stats = json.loads((local_vocab / "stats.json").read_text())
    assert list(beam_stats) == list(local_stats)
    assert {k: v for k, v in beam_stats.items() if k != "elapsed_seconds"} == \
        {k: v for k, v in local_stats.items() if k != "elapsed_seconds"}
    # Not a trivial agreement: every length is selected, and the sub-gram joins pruned n >= 3.
    assert all(local_stats["selected"][str(n)] > 0 for n in range(2, 6))
    assert local_stats["counted_ngrams"]["3"] > local_stats["candidates"]["3"]


def test_a_stage_that_missed_data_stops_the_build_before_anything_is_written(corpus, tmp_path, monkeypatch):
    """What each level's stage read and summed is checked against the corpus's totals: counts lost
    in a combine, or batches that never reached a stage, fail the build before it writes."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    with pytest.raises(DataLost, match="3-gram stage .* summed 79 of the 80"):
        beam_vocab.check_levels([(2, [100, 90], 90), (3, [98, 80], 79)], [4, 102, 100, 98])
    with pytest.raises(DataLost, match="2-gram stage read 99 of"):
        beam_vocab.check_levels([(2, [99, 90], 90)], [4, 102, 100, 98])
    beam_vocab.check_levels([(2, [100, 90], 90), (3, [98, 80], 80)], [4, 102, 100, 98])
    with pytest.raises(DataLost, match="1-gram stage read 101 of the corpus's 102"):
        beam_vocab.check_levels([beam_vocab.words_read(101), (2, [100, 90], 90)], [4, 102, 100, 98])

    real = beam_vocab.level_counts

    def no_batch_for_2grams(batch, n, *args):  # a Count stage that never received the batches
        if n == 2:
            yield beam.pvalue.TaggedOutput("read", [0, 0])
            return
        yield from real(batch, n, *args)

    out = tmp_path / "vocab"
    with monkeypatch.context() as m:
        m.setattr(beam_vocab, "level_counts", no_batch_for_2grams)
        with pytest.raises(DataLost, match="2-gram stage read 0 of"):
            beam_vocab.build_vocabulary([str(corpus / "a.txt")], str(out), VOCAB,
                                        pipeline_options=PipelineOptions(direct_runner()))
    assert not out.exists()


def test_beams_batch_words_stay_exact_when_two_word_keys_collide(monkeypatch):
    """Every long word of one length gets the same key: the batch falls back to exact strings."""
    import numpy as np

    from pmi_jax.preprocess.text import word_keys

    monkeypatch.setattr(word_keys, "_hash_bytes", lambda words, starts, lengths: np.zeros(len(starts), np.uint64))
    words, inverse, lengths = beam_vocab.document_words(["internationalisation a",
                                                         "b internationalization internationalisation"])
    assert [words[i] for i in inverse] == [b"internationalisation", b"a", b"b", b"internationalization",
                                           b"internationalisation"]
    assert len(words) == 4 and lengths.tolist() == [2, 3]


def test_beam_prepare_equals_the_local_prepare(corpus, local_vocab, tmp_path):
    config = prepare.PrepareConfig(inputs=(str(corpus),), output=str(tmp_path / "local"), wordpiece_size=1500,
                                   units=(("pmi", str(local_vocab)),), seq_len=64, validation_fraction=0.05,
                                   shards=3, seed=7)
    local_metadata = prepare.prepare(config)
    beam_config = dataclasses.replace(config, output=str(tmp_path / "beam"))
    assert main(["corpus", "prepare", "--input", str(corpus), "--output", beam_config.output, "--wordpiece-size",
                 "1500", "--units", f"pmi={local_vocab}", "--seq-len", "64", "--validation-fraction", "0.05",
                 "--shards", "3", "--seed", "7", *direct_runner()]) == 0
    with open(os.path.join(beam_config.output, "metadata.json")) as f:
        assert json.load(f) == local_metadata
    local_files = sorted(os.listdir(config.output))
    assert local_files == sorted(os.listdir(beam_config.output))
    assert {"vocab.txt", "metadata.json", "train-00002-of-00003.tfrecord", "validation-00000-of-00001.tfrecord"} \
        <= set(local_files)
    for name in local_files:
        assert (tmp_path / "beam" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert local_metadata["wordpiece"]["trained"] and local_metadata["units"]["pmi"]["coverage"] > 0

    # A second run finds the directory complete and writes nothing.
    before = {name: os.stat(tmp_path / "beam" / name).st_mtime_ns for name in local_files}
    from apache_beam.options.pipeline_options import PipelineOptions

    assert beam_prepare.prepare(beam_config, PipelineOptions(direct_runner())) == local_metadata
    assert before == {name: os.stat(tmp_path / "beam" / name).st_mtime_ns for name in local_files}


def test_existing_vocabulary_output_is_refused_before_any_work(corpus, local_vocab):
    with pytest.raises(UserInputError, match="already exists"):
        beam_vocab.build_vocabulary([str(corpus)], str(local_vocab), VOCAB)


_MALLOC_NAMES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


def test_direct_runner_worker_processes_get_the_fixed_malloc_thresholds(monkeypatch):
    """The DirectRunner's worker processes are started with the fixed mmap threshold and arena
    count (what keeps their resident memory from ratcheting up stage by stage); the caller's
    environment is as before afterwards, and a Dataflow launch is left alone."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from pmi_jax.preprocess.beam import beam_options

    monkeypatch.setenv("MALLOC_ARENA_MAX", "7")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    options = PipelineOptions(["--runner", "DirectRunner", "--direct_num_workers", "2",
                               "--direct_running_mode", "multi_processing"])
    with beam_options.malloc_for_runner(argparse.Namespace(runner="DirectRunner")), \
            beam.Pipeline(options=options) as pipeline:
        # A lambda: pickled by value, for worker processes that cannot import this test module.
        seen = pipeline | beam.Create([0, 1]) | beam.Map(
            lambda _, names=_MALLOC_NAMES: {name: __import__("os").environ.get(name) for name in names})
        expected = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "MALLOC_TRIM_THRESHOLD_": str(32 << 20),
                    "MALLOC_ARENA_MAX": "2"}
        assert_that(seen, equal_to([expected, expected]))
    assert {name: os.environ.get(name) for name in _MALLOC_NAMES} == {
        "MALLOC_MMAP_THRESHOLD_": None, "MALLOC_TRIM_THRESHOLD_": None, "MALLOC_ARENA_MAX": "7"}
    with beam_options.malloc_for_runner(argparse.Namespace(runner="DataflowRunner")):
        assert os.environ.get("MALLOC_ARENA_MAX") == "7"
        assert "MALLOC_MMAP_THRESHOLD_" not in os.environ and "MALLOC_TRIM_THRESHOLD_" not in os.environ


def _stream_delivery(stream, chunks: int = 300, size: int = 4096, seconds: float = 1.5) -> int:
    """Write `chunks` chunks over `seconds` (longer than Beam's one-second timed flush), close,
    and return the bytes the stream handed on."""
    import time

    for i in range(chunks):
        stream.write(bytes([i % 256]) * size)
        time.sleep(seconds / chunks)
    stream.close()
    return chunks * size


def test_beams_timed_flush_drops_what_is_written_while_it_hands_a_buffer_on():
    """Beam's timed stream (what the FnApiRunner's gRPC data plane uses) loses every write made
    while its flush callback runs, here one that waits as a full send queue does; the size-based
    stream that `direct_data_plane` selects hands on every byte. (If Beam fixes the race, this
    test says so, and the workaround can go.)"""
    import time

    from apache_beam.runners.worker import data_plane

    for limit_ms, must_lose in ((20, True), (0, False)):
        handed = []

        def slow(data):
            time.sleep(0.05)
            handed.append(len(data))

        stream = data_plane.ClosableOutputStream.create(lambda data: handed.append(len(data)), slow, limit_ms)
        written = _stream_delivery(stream)
        assert (sum(handed) < written) == must_lose, (limit_ms, sum(handed), written)


def test_pipelines_run_with_a_runner_data_plane_that_has_no_timed_flush():
    """Inside `beam_pipeline.running` the gRPC server the FnApiRunner starts for its workers hands
    out size-based streams, which deliver every byte written across several seconds; afterwards
    Beam's own setting is back."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.runners.worker import data_plane

    from pmi_jax.preprocess.beam import beam_pipeline

    before = worker_handlers.DATA_BUFFER_TIME_LIMIT_MS
    assert before > 0  # Beam's default: the timed flush is on
    with beam_pipeline.running() as pipeline:
        server = worker_handlers.GrpcServer(worker_handlers.StateServicer(), None, None)
        try:
            channel = server.data_plane_handler.get_conn_by_worker_id("worker")
            stream = channel.output_stream("bundle", "read")
            assert not isinstance(stream, data_plane.TimeBasedBufferingClosableOutputStream)
            written = _stream_delivery(stream)
            sent = []
            while True:
                element = channel._to_send.get(timeout=30)
                if element.is_last:
                    break
                sent.append(len(element.data))
            assert sum(sent) == written
        finally:
            server.close()
        _ = pipeline | beam.Create([1])
    assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS == before


def test_a_beam_without_the_flush_setting_is_refused_in_one_line(monkeypatch):
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    from pmi_jax.preprocess.beam import direct_data_plane

    monkeypatch.delattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS")
    with pytest.raises(UserInputError, match=r"apache-beam [\d.]+: .* install apache-beam as constraints.txt pins"):
        with direct_data_plane.without_timed_flush():
            pass


@pytest.mark.parametrize("command", [["vocab", "build"], ["corpus", "prepare"]])
def test_help_documents_the_dataflow_flags(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = capsys.readouterr().out
    for flag in ("--runner", "DataflowRunner", "--project", "--region", "--temp_location", "--machine_type",
                 "--setup_file", "--requirements_file", "--beam-option", "--input", "--output"):
        assert flag in text, flag


def test_beams_wordpiece_step_learns_in_worker_processes_what_one_process_learns(tmp_path):
    """The pipeline's one-worker WordPiece step counts the learner's passes in that machine's
    processes: past MIN_PARALLEL_WORDS distinct words they start, and vocab.txt does not change."""
    import numpy as np

    from pmi_jax.preprocess.corpus import wordpiece
    from pmi_jax.preprocess.corpus.wordpiece_learner import MIN_PARALLEL_WORDS

    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = {"".join(rng.choice(letters, size=int(n))) for n in rng.integers(4, 10, size=MIN_PARALLEL_WORDS + 5_000)}
    counts = [(w, int(c)) for w, c in zip(sorted(words), rng.zipf(1.5, size=len(words)) % 1_000 + 1)]
    assert len(counts) >= MIN_PARALLEL_WORDS
    written = beam_prepare.train_and_write_wordpiece(counts, 2_000, str(tmp_path / "vocab.txt"), read=7, corpus=7,
                                                     workers=2)
    serial = wordpiece.train_vocab(collections.Counter(dict(counts)), 2_000, workers=1)
    assert pathlib.Path(written).read_text().split("\n")[:len(serial)] == serial


def test_beam_finishes_a_killed_run_writing_only_the_missing_shards(corpus, local_vocab, tmp_path, monkeypatch):
    """A local run killed after two shards, one of them then damaged in place (same size), finished
    on Beam: the launcher reads no shard, the workers find the damaged one, the intact one is not
    touched, the others are written, and the directory equals an uninterrupted run's byte for byte."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pmi_jax import storage

    config = prepare.PrepareConfig(inputs=(str(corpus),), output=str(tmp_path / "whole"), wordpiece_size=1500,
                                   units=(("pmi", str(local_vocab)),), seq_len=64, validation_fraction=0.05,
                                   shards=3, seed=7, progress=False)
    prepare.prepare(config)
    killed = dataclasses.replace(config, output=str(tmp_path / "killed"))

    class Killed(Exception):
        pass

    done = []

    def kill(task):
        done.append(task)
        if len(done) == 2:
            raise Killed(task.name)

    with pytest.raises(Killed):
        prepare.prepare(killed, on_shard_done=kill)
    intact, damaged = (pathlib.Path(killed.output) / task.name for task in done)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    written_at = intact.stat().st_mtime_ns

    def no_shard(path, file_sha256=storage.file_sha256):
        assert not path.endswith(".tfrecord"), f"the launcher read {path}"
        return file_sha256(path)

    with monkeypatch.context() as m:  # the launcher's plan reads no shard
        m.setattr(storage, "file_sha256", no_shard)
        plan = prepare.plan_prepare(killed, check_written=False)
    assert {t.name for t in plan.tasks} - {t.name for t in plan.todo} == {intact.name, damaged.name}

    beam_prepare.prepare(killed, PipelineOptions(direct_runner()))
    assert intact.stat().st_mtime_ns == written_at
    whole = sorted(os.listdir(config.output))
    assert sorted(os.listdir(killed.output)) == whole
    for name in whole:
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_wordpiece_counting_that_missed_a_batch_writes_no_vocabulary(tmp_path, monkeypatch):
    """Beam's WordPiece step compares the documents its counting read with those routing read
    (each file read again on its own); reading that skips a file's last batch fails the step
    before vocab.txt or any metadata is written."""
    from pmi_jax.preprocess.beam import beam_pipeline

    docs = list(itertools.islice(iter_demo_documents(), 300))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(docs) + "\n")
    real = beam_pipeline._read_batches

    def without_last_batch(path, batch_chars, text_field):
        items = list(real(path, 20_000, text_field))
        yield from items[:-2] + items[-1:]  # the last batch gone; the "invalid" count kept

    monkeypatch.setattr(beam_pipeline, "_read_batches", without_last_batch)
    config = prepare.PrepareConfig(inputs=(str(corpus),), output=str(tmp_path / "prepared"), wordpiece_size=800,
                                   seq_len=64, validation_fraction=0.0, shards=2, progress=False)
    with pytest.raises(DataLost, match=r"WordPiece counting read [\d,]+ of the corpus's [\d,]+ documents"):
        beam_prepare.prepare(config)
    assert not (tmp_path / "prepared" / "vocab.txt").exists()
    assert not (tmp_path / "prepared" / "metadata.json").exists()
