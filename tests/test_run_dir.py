"""The metrics log a resumed run appends to stays one JSON object per line."""
import json

from pmi_jax.formats import run_dir


def test_a_line_cut_by_a_kill_is_dropped_before_the_resumed_run_appends(tmp_path):
    logdir = tmp_path / "tensorboard"
    logdir.mkdir()
    (logdir / "metrics.jsonl").write_text('{"step": 10, "loss": 5.0}\n{"step": 20, "lo')  # killed mid-write
    writer = run_dir.MetricWriter(str(logdir), enabled=True)
    writer.write(20, {"loss": 4.5})
    writer.close()
    lines = (logdir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 10, "loss": 5.0}, {"step": 20, "loss": 4.5}]
    assert run_dir.read_metrics(str(logdir))[20]["loss"] == 4.5


def test_checkpoint_metadata_of_an_older_version_loads():
    """A checkpoint saved before the record had config, seq_len and the versions still reads."""
    old = {"step": 7, "model": {"num_layers": 2}, "data_dir": "/d", "scheme": "pmi", "vocab_size": 40,
           "vocab_sha256": "ab" * 32, "a_key_of_another_version": 1}
    metadata = run_dir.CheckpointMetadata.from_json(old)
    assert (metadata.step, metadata.data_dir, metadata.vocab_sha256, metadata.model) == (7, "/d", "ab" * 32,
                                                                                          {"num_layers": 2})
    assert metadata.config == {} and metadata.seq_len is None and metadata.data_position is None
    assert metadata.run_scheme == "pmi" and metadata["step"] == 7 and metadata.get("seq_len", 0) == 0


def test_checkpoint_metadata_is_written_with_the_keys_of_every_version():
    """The JSON keys and their order are those `train` wrote before the record was typed, so a
    checkpoint's metadata file is byte-identical."""
    metadata = run_dir.CheckpointMetadata(step=3, data_position=3, model={}, config={"data": {"scheme": "pmi"}},
                                          data_dir="/d", scheme=None, seq_len=8, vocab_size=40, vocab_sha256=None,
                                          jax_version="0", process_count=1)
    assert list(metadata.to_json()) == ["step", "data_position", "model", "config", "data_dir", "scheme", "seq_len",
                                        "vocab_size", "vocab_sha256", "jax_version", "process_count"]
    assert run_dir.CheckpointMetadata.from_json(metadata.to_json()) == metadata
    assert metadata.run_scheme == "pmi"
    change = {"setting": "data.mask_rate", "from": 0.15, "to": 0.3, "step": 2}
    changed = run_dir.CheckpointMetadata.from_json({**metadata.to_json(), "changes": [change]})
    assert changed.changes == (change,) and list(changed.to_json())[-1] == "changes"


def test_eval_result_names():
    run = "/runs/a"
    assert run_dir.run_dir_of("/runs/a/checkpoints/200") == run and run_dir.run_dir_of("/runs/a/") == run
    assert run_dir.perplexity_result_path(run, "validation", 200) == "/runs/a/eval/perplexity-validation-step200.json"
    assert run_dir.finetune_result_dir(run, "glue/rte", "checkpoint", 200) == "/runs/a/eval/glue-rte-checkpoint-step200"
    assert run_dir.metrics_path(run) == "/runs/a/tensorboard/metrics.jsonl"


def test_vocabulary_for_checks_the_recorded_hash(tmp_path):
    import hashlib

    import pytest

    from pmi_jax.errors import UserInputError

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    sha = hashlib.sha256(vocab.read_bytes()).hexdigest()
    metadata = run_dir.CheckpointMetadata(step=1, data_dir=str(tmp_path), vocab_sha256=sha)
    assert run_dir.vocabulary_for(metadata, "ck", 6) == str(vocab)
    other = tmp_path / "other.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    with pytest.raises(UserInputError, match=f"--vocab {other} is not the vocabulary checkpoint ck was trained"):
        run_dir.vocabulary_for(metadata, "ck", 6, vocab=str(other))
    with pytest.raises(UserInputError, match="has 6 tokens, checkpoint ck has vocab_size 7"):
        run_dir.vocabulary_for(metadata, "ck", 7)
    with pytest.raises(UserInputError, match="records no corpus; pass --vocab"):
        run_dir.vocabulary_for(run_dir.CheckpointMetadata(step=1), "ck", 6)
