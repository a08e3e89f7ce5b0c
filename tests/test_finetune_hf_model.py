"""`eval finetune --hf-model`: a released transformers BERT fine-tuned with the paper's protocols
(its Table 3 fine-tunes SpanBERT and RoBERTa this way).

The released model is made here: a pmi-jax checkpoint exported with `pmi-jax export hf` (the
files transformers writes), and the same weights re-saved as transformers' BertModel saves them
(no "bert." prefix, no MLM head). Fine-tuning either must give exactly the numbers fine-tuning
the checkpoint itself gives: same encoder weights, same seeds, same data.
"""
import dataclasses
import json
import os
import shutil

import pytest

from pmi_jax.cli import main
from pmi_jax.formats import hf_checkpoint
from pmi_jax.storage import file_sha256
from tests import eval_data

SETTINGS = ["--task", "glue/rte", "--batch-sizes", "8", "--learning-rates", "1e-4", "--seeds", "2", "--epochs", "2",
            "--max-seq-len", "16"]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("released")
    data_dir = root / "english"
    data_dir.mkdir()
    vocab = eval_data.write_vocab(str(data_dir / "vocab.txt"))
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=eval_data.vocab_size())
    run = str(root / "run")
    eval_data.save_checkpoint(run, config, eval_data.mlm_params(config, 3), data_dir=str(data_dir),
                              vocab_sha256=file_sha256(vocab))
    exported = str(root / "hf")
    assert main(["export", "hf", "--checkpoint", run, "--output", exported]) == 0

    import safetensors.numpy

    bare = root / "bert_model"  # as BertModel.save_pretrained writes it
    bare.mkdir()
    for name in (hf_checkpoint.CONFIG_FILE, hf_checkpoint.VOCAB_FILE):
        shutil.copy(os.path.join(exported, name), bare / name)
    tensors = {k[len("bert."):]: v for k, v in hf_checkpoint.read_tensors(exported).items() if k.startswith("bert.")}
    safetensors.numpy.save_file(tensors, str(bare / hf_checkpoint.WEIGHTS_FILE), metadata={"format": "pt"})
    rows = [(a, "it was", y) for a, y in eval_data.sentiment(16)]
    data = eval_data.write_rte(str(root / "RTE"), rows, rows[:6])
    return {"run": run, "exported": exported, "bare": str(bare), "data": data, "root": root}


def _results(path):
    with open(os.path.join(path, "results.json")) as f:
        result = json.load(f)
    return [(c["batch_size"], c["learning_rate"], c["seed_scores"], c["aggregate"]) for c in result["configs"]], result


def test_a_released_model_fine_tunes_as_the_checkpoint_it_was_exported_from(released, tmp_path, capsys):
    assert main(["eval", "finetune", "--checkpoint", released["run"], "--data", released["data"], *SETTINGS,
                 "--output", str(tmp_path / "run")]) == 0
    reference, _ = _results(tmp_path / "run")
    for name in ("exported", "bare"):
        output = str(tmp_path / name)
        assert main(["eval", "finetune", "--hf-model", released[name], "--data", released["data"], *SETTINGS,
                     "--output", output]) == 0
        scores, result = _results(output)
        assert scores == reference, name
        assert result["hf_model"] == released[name] and result["step"] is None
        with open(os.path.join(output, "results.md")) as f:
            assert f.readline() == f"# glue/rte fine-tuning of the released model {released[name]}\n"
    assert f"glue/rte of {released['bare']} (sweep protocol): dev accuracy" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    ([], "--hf-model: pass --output"),
    (["--output", "{out}", "--steps", "all"], "--steps: a --hf-model has one set of weights"),
    (["--output", "{out}", "--checkpoint", "{run}"], "argument --checkpoint: not allowed with argument --hf-model"),
])
def test_hf_model_option_errors(released, tmp_path, capsys, argv, message):
    argv = [a.format(out=str(tmp_path / "out"), run=released["run"]) for a in argv]
    try:
        status = main(["eval", "finetune", "--hf-model", released["exported"], "--data", released["data"],
                       *SETTINGS, *argv])
    except SystemExit as e:  # argparse's own errors
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "out").exists()


def test_a_directory_without_a_vocabulary_is_refused(released, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(released["bare"], broken)
    os.remove(broken / hf_checkpoint.VOCAB_FILE)
    assert main(["eval", "finetune", "--hf-model", str(broken), "--data", released["data"], *SETTINGS,
                 "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--hf-model {broken}: no vocab.txt" in err and err.count("\n") == 1
