"""`pmi-jax eval` end to end on a checkpoint written as the trainer writes it, and its input errors."""
import dataclasses
import json
import os

import pytest

from pmi_jax.cli import main
from pmi_jax.storage import file_sha256
from tests import eval_data, prepared_data


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("corpus"))
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 4, "validation": 6},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    return data_dir


def _checkpoint(workdir, vocab_size, data_dir, vocab_sha256):
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=vocab_size)
    return eval_data.save_checkpoint(workdir, config, eval_data.mlm_params(config), data_dir=data_dir,
                                     vocab_sha256=vocab_sha256)


@pytest.fixture(scope="module")
def corpus_checkpoint(tmp_path_factory, corpus):
    return _checkpoint(str(tmp_path_factory.mktemp("run")), len(prepared_data.vocabulary()), corpus,
                       file_sha256(os.path.join(corpus, "vocab.txt")))


@pytest.fixture(scope="module")
def glue_checkpoint(tmp_path_factory):
    """A checkpoint trained on a corpus whose vocabulary is the toy English one."""
    data_dir = tmp_path_factory.mktemp("english")
    vocab = eval_data.write_vocab(str(data_dir / "vocab.txt"))
    return _checkpoint(str(tmp_path_factory.mktemp("run")), eval_data.vocab_size(), str(data_dir), file_sha256(vocab))


def test_perplexity_command(corpus_checkpoint, tmp_path, capsys):
    output = str(tmp_path / "ppl.json")
    assert main(["eval", "perplexity", "--checkpoint", corpus_checkpoint, "--positions", "4", "--output", output]) == 0
    printed = capsys.readouterr().out
    with open(output) as f:
        result = json.load(f)
    assert result["num_tokens"] == 4 * result["num_sequences"] and result["step"] == 7
    assert f"single-token perplexity {result['perplexity']:.3f} [95% " in printed
    assert result["unit"] == "token" and len(result["scores"]["nll"]) == result["num_tokens"]
    assert result["interval"]["perplexity"][0] < result["perplexity"] < result["interval"]["perplexity"][1]


def test_perplexity_refuses_a_corpus_with_another_vocabulary(tmp_path, corpus_checkpoint, capsys):
    other = str(tmp_path / "other")
    prepared_data.write_prepared_corpus(other, sequences={"train": 2, "validation": 2},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    with open(os.path.join(other, "vocab.txt"), "a") as f:
        f.write("extra\n")
    with open(os.path.join(other, "metadata.json")) as f:
        metadata = json.load(f)
    metadata["wordpiece"]["size"] += 1  # a consistent corpus, on another vocabulary
    with open(os.path.join(other, "metadata.json"), "w") as f:
        json.dump(metadata, f)
    assert main(["eval", "perplexity", "--checkpoint", corpus_checkpoint, "--data", other]) == 2
    err = capsys.readouterr().err
    assert f"--data {other}: its vocab.txt is not the vocabulary checkpoint" in err and err.count("\n") == 1


def test_finetune_command_writes_json_and_markdown(glue_checkpoint, tmp_path, capsys):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(16)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows[:4])
    output = str(tmp_path / "results")
    assert main(["eval", "finetune", "--checkpoint", glue_checkpoint, "--task", "glue/rte", "--data", data,
                 "--batch-sizes", "8", "--learning-rates", "1e-4,2e-4", "--seeds", "2", "--epochs", "1",
                 "--max-seq-len", "16", "--output", output]) == 0
    with open(os.path.join(output, "results.json")) as f:
        result = json.load(f)
    assert result["task"] == "glue/rte" and len(result["runs"]) == 4 and result["max_seq_len"] == 16
    assert result["metric"] == "accuracy" and result["protocol"]["protocol"] == "sweep"
    assert result["best"]["aggregate"]["score"] == max(c["aggregate"]["score"] for c in result["configs"])
    with open(os.path.join(output, "results.md")) as f:
        assert "| batch size | learning rate | accuracy | score | scores per seed |" in f.read()
    assert "glue/rte step 7 (sweep protocol): dev accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--task", "glue/rtee", "--data", "x"], "--task glue/rtee: unknown task (choose from glue/cola"),
    (["--task", "squad/v2.0", "--data", "{nowhere}"], "expected a folder holding train-v2.0.json"),
    (["--task", "race", "--data", "{glue}"], "not a RACE folder (expected train/high/"),
    (["--task", "glue/sst2", "--data", "{glue}"], "header lacks column(s) sentence"),
    (["--task", "glue/rte", "--data", "{glue}", "--learning-rates", "fast"], "--learning-rates 'fast'"),
    (["--task", "glue/rte", "--tfds", "no_such_set/rte", "--tfds-data-dir", "{nowhere}"],
     "--tfds no_such_set/rte: Dataset no_such_set not found"),
])
def test_finetune_input_errors_are_one_line(glue_checkpoint, tmp_path, capsys, argv, message):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(2)]
    glue_dir = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows)
    argv = [a.format(glue=glue_dir, nowhere=str(tmp_path / "nowhere")) for a in argv]
    assert main(["eval", "finetune", "--checkpoint", glue_checkpoint, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_finetune_refuses_a_vocabulary_the_checkpoint_was_not_trained_with(corpus_checkpoint, corpus, tmp_path,
                                                                          capsys):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(2)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows)
    vocab = eval_data.write_vocab(str(tmp_path / "vocab.txt"))
    assert main(["eval", "finetune", "--checkpoint", corpus_checkpoint, "--task", "glue/rte", "--data", data,
                 "--vocab", vocab]) == 2
    err = capsys.readouterr().err
    assert f"--vocab {vocab} is not the vocabulary checkpoint" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A run directory with checkpoints at steps 7 and 9, as training leaves them."""
    data_dir = tmp_path_factory.mktemp("english2")
    vocab = eval_data.write_vocab(str(data_dir / "vocab.txt"))
    workdir = str(tmp_path_factory.mktemp("run2"))
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=eval_data.vocab_size())
    for step, seed in ((7, 0), (9, 1)):
        eval_data.save_checkpoint(workdir, config, eval_data.mlm_params(config, seed), data_dir=str(data_dir),
                                  vocab_sha256=file_sha256(vocab), step=step)
    return workdir


def test_checkpoint_protocol_over_every_step_with_test_predictions(two_step_run, tmp_path, capsys):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(16)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows[:4])
    eval_data.write_tsv(os.path.join(data, "test.tsv"), ["index", "sentence1", "sentence2"],
                        [[100 + i, a, b] for i, (a, b, _) in enumerate(rows[:5])])
    assert main(["eval", "finetune", "--checkpoint", two_step_run, "--steps", "all", "--task", "glue/rte",
                 "--data", data, "--test-data", data, "--protocol", "checkpoint", "--set", "seeds=3",
                 "--set", "epochs=2", "--set", "batch_sizes=(8,)", "--max-seq-len", "16"]) == 0
    printed = capsys.readouterr().out
    for step in (7, 9):
        output = os.path.join(two_step_run, "eval", f"glue-rte-checkpoint-step{step}")
        with open(os.path.join(output, "results.json")) as f:
            result = json.load(f)
        assert result["step"] == step and result["protocol"]["protocol"] == "checkpoint"
        assert result["protocol"]["batch_sizes"] == [8] and result["protocol"]["learning_rates"] == [3e-5]
        assert all(r["selected_epoch"] == 2 for r in result["runs"]) and len(result["runs"]) == 3
        with open(os.path.join(output, "RTE.tsv")) as f:
            lines = f.read().splitlines()
        assert lines[0] == "index\tprediction" and [x.split("\t")[0] for x in lines[1:]] == [
            str(100 + i) for i in range(5)]
        assert {x.split("\t")[1] for x in lines[1:]} <= {"entailment", "not_entailment"}
        assert result["test_predictions"] == [os.path.join(output, "RTE.tsv")]
        assert f"glue/rte step {step} (checkpoint protocol)" in printed


@pytest.mark.parametrize("argv, message", [
    (["--steps", "8"], "--steps 8: no checkpoint at step 8"),
    (["--set", "seeds=0"], "seeds=0: must be at least 1"),
    (["--set", "batch_size=3"], "FinetuneConfig has no field 'batch_size'"),
    (["--set", "protocol=checkpoint"], "choose the protocol with --protocol"),
])
def test_finetune_config_errors_are_one_line(two_step_run, tmp_path, capsys, argv, message):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(2)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows)
    assert main(["eval", "finetune", "--checkpoint", two_step_run, "--task", "glue/rte", "--data", data, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_existing_outputs_need_overwrite(corpus_checkpoint, glue_checkpoint, tmp_path, capsys):
    output = tmp_path / "ppl.json"
    output.write_text("keep\n")
    perplexity = ["eval", "perplexity", "--checkpoint", corpus_checkpoint, "--positions", "1", "--output", str(output)]
    assert main(perplexity) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists (pass --overwrite" in err and output.read_text() == "keep\n"
    assert main(perplexity + ["--overwrite"]) == 0
    assert json.loads(output.read_text())["step"] == 7

    rows = [(a, "it was", y) for a, y in eval_data.sentiment(4)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows)
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.json").write_text("{}\n")
    finetune = ["eval", "finetune", "--checkpoint", glue_checkpoint, "--task", "glue/rte", "--data", data,
                "--batch-sizes", "4", "--learning-rates", "1e-4", "--seeds", "1", "--epochs", "1", "--max-seq-len", "16",
                "--output", str(results)]
    assert main(finetune) == 2
    assert "already exists (pass --overwrite" in capsys.readouterr().err
    assert (results / "results.json").read_text() == "{}\n"
    assert main(finetune + ["--overwrite"]) == 0
    assert sorted(os.listdir(results)) == ["results.json", "results.md"]
    assert json.loads((results / "results.json").read_text())["task"] == "glue/rte"
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temporaries left


def test_binary_glue_file_is_a_one_line_error(glue_checkpoint, tmp_path, capsys):
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(2)]
    data = eval_data.write_rte(str(tmp_path / "RTE"), rows, rows)
    for name, content in (("utf8", bytes(range(256)) * 64), ("nul", b"index\tsentence1\x00\n" * 8)):
        with open(os.path.join(data, "train.tsv"), "wb") as f:
            f.write(content)
        output = tmp_path / f"out-{name}"
        assert main(["eval", "finetune", "--checkpoint", glue_checkpoint, "--task", "glue/rte", "--data", data,
                     "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "train.tsv: not a" in err and "text TSV" in err, err
        assert not output.exists()


def test_evaluation_skips_a_damaged_latest_checkpoint(corpus, tmp_path, capsys, caplog):
    import shutil

    workdir = str(tmp_path / "run")
    sha = file_sha256(os.path.join(corpus, "vocab.txt"))
    _checkpoint(workdir, len(prepared_data.vocabulary()), corpus, sha)  # step 7
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=len(prepared_data.vocabulary()))
    eval_data.save_checkpoint(workdir, config, eval_data.mlm_params(config), data_dir=corpus, vocab_sha256=sha,
                              step=9)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "9", "state", "ocdbt.process_0"))
    assert main(["eval", "perplexity", "--checkpoint", workdir, "--positions", "1"]) == 0
    assert "checkpoint step 7" in capsys.readouterr().out
    assert "skipped checkpoint 9" in caplog.text
    assert main(["eval", "perplexity", "--checkpoint", os.path.join(workdir, "checkpoints", "9")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint restores (step 9: " in err


def test_perplexity_on_an_out_of_domain_corpus_prepared_with_the_runs_vocabulary(tmp_path, corpus,
                                                                                  corpus_checkpoint, capsys):
    """The paper's Table 4 scores held-out OpenWebText, not the training corpus: text prepared
    with the run's vocab.txt (`corpus prepare --wordpiece`, no held-out fraction) is scored with
    --data and --split train (docs/experiments.md, "Table 4 on an out-of-domain test set")."""
    words = [w for w in prepared_data.vocabulary()[5:] if not w.startswith("##")]
    text = "\n\n".join(" ".join(words[(7 * d + i) % len(words)] for i in range(40)) for d in range(12))
    (tmp_path / "owt.txt").write_text(text + "\n")
    test_set = str(tmp_path / "owt_test")
    assert main(["corpus", "prepare", "--input", str(tmp_path / "owt.txt"), "--output", test_set, "--seq-len", "32",
                 "--wordpiece", os.path.join(corpus, "vocab.txt"), "--validation-fraction", "0", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", "perplexity", "--checkpoint", corpus_checkpoint, "--data", test_set, "--split", "train",
                 "--max-sequences", "5"]) == 0
    with open(os.path.join(corpus_checkpoint, "eval", "perplexity-train-step7.json")) as f:
        result = json.load(f)
    assert result["data"] == test_set and result["split"] == "train" and result["num_sequences"] == 5
    from pmi_jax.formats import prepared_corpus
    import tensorflow as tf

    prepared = prepared_corpus.PreparedCorpus(test_set)
    records = list(tf.data.TFRecordDataset(prepared.files("train")).take(5).as_numpy_iterator())
    special = list(prepared.special_ids.values())
    content = sum(int(sum(i not in special for i in prepared_corpus.decode_example(r)["input_ids"])) for r in records)
    assert result["num_tokens"] == content > 5 * 20  # every non-special token of the five sequences
    assert result["perplexity"] > 1.0
