"""`pmi-jax compare` on runs made here: checkpoints and training metrics written by the trainer's
own writers, perplexity computed by `pmi-jax eval perplexity --steps all`, fine-tuning results
in the layout `eval finetune` writes; then the report's tables, plots and warnings."""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib

import pytest

from pmi_jax.cli import main
from tests import eval_data, prepared_data

STEPS = (2, 4)


def _png_size(path: str) -> tuple[int, int]:
    """Width and height of a PNG after checking its signature and every chunk's CRC."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    offset, chunks = 8, []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path}: bad CRC in {kind!r}"
        chunks.append(kind)
        offset += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    return struct.unpack(">II", data[16:24])


def _make_run(workdir: str, data_dir: str, scheme: str, *, batch_size: int = 8, seed: int = 0) -> str:
    """A run as `pmi-jax train` leaves it: checkpoints with the run's config, and metrics.jsonl."""
    from pmi_jax.formats import run_dir
    from pmi_jax.checkpoints import Checkpointer
    from pmi_jax.config import CheckpointConfig, DataConfig, ExperimentConfig, TrainConfig
    from pmi_jax.train import TENSORBOARD_DIR, checkpoint_metadata

    model = dataclasses.replace(eval_data.tiny_config(), vocab_size=len(prepared_data.vocabulary()))
    config = ExperimentConfig(model=model, data=DataConfig(data_dir=data_dir, scheme=scheme, seq_len=32),
                              train=TrainConfig(batch_size=batch_size, num_steps=STEPS[-1]))
    checkpointer = Checkpointer(workdir, CheckpointConfig())
    for i, step in enumerate(STEPS):
        checkpointer.save(step, {"params": eval_data.mlm_params(model, seed + i)},
                          checkpoint_metadata(config, None, step))
    checkpointer.wait()
    checkpointer.close()
    writer = run_dir.MetricWriter(os.path.join(workdir, TENSORBOARD_DIR), enabled=True)
    for step in range(1, STEPS[-1] + 1):
        writer.write(step, {"loss": 5.0 - 0.3 * step - 0.1 * seed, "accuracy": 0.01 * step})
    writer.close()
    return workdir


def _finetune_result(workdir: str, scheme: str, step: int, score: float) -> None:
    """A per-checkpoint result in the place and shape `eval finetune` writes it."""
    folder = os.path.join(workdir, "eval", f"glue-rte-checkpoint-step{step}")
    os.makedirs(folder)
    protocol = {"protocol": "checkpoint", "batch_sizes": [32], "learning_rates": [3e-5], "seeds": 5, "epochs": 4,
                "aggregate": "mean of the middle three (best and worst seed dropped)",
                "selection": "each run's last epoch (no early stopping)"}
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump({"task": "glue/rte", "metric": "accuracy", "protocol": protocol, "step": step, "scheme": scheme,
                   "best": {"batch_size": 32, "learning_rate": 3e-5, "aggregate": {"accuracy": score,
                                                                                   "score": score}}}, f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    data_dir = str(root / "data")
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 4, "validation": 6},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    made = {}
    for name, scheme, extra in (("token", "random_token", {}), ("pmi", "pmi", {"seed": 5}),
                                ("odd", "random_span", {"batch_size": 16, "seed": 9})):
        workdir = _make_run(str(root / name), data_dir, scheme, **extra)
        assert main(["eval", "perplexity", "--checkpoint", workdir, "--steps", "all", "--positions", "4"]) == 0
        for step, score in zip(STEPS, (55.0, 60.0) if scheme == "pmi" else (50.0, 52.0)):
            _finetune_result(workdir, scheme, step, score)
        made[name] = workdir
    return made


def test_report_tables_plots_and_best_marks(runs, tmp_path, capsys):
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], runs["pmi"], "--output", output]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    assert "### Single-token perplexity" in report and "| scheme | step 2 | step 4 |" in report
    assert "### Fine-tuning (checkpoint protocol)" in report
    assert "| scheme | glue/rte (accuracy, step 4) |" in report
    assert "| pmi | **60.00** |" in report and "| random_token | 52.00 |" in report
    assert "differ only in their masking scheme" in report and "⚠" not in report
    perplexities = {}
    for scheme, workdir in (("random_token", runs["token"]), ("pmi", runs["pmi"])):
        with open(os.path.join(workdir, "eval", "perplexity-validation-step4.json")) as f:
            perplexities[scheme] = json.load(f)["perplexity"]
    best = min(perplexities, key=perplexities.get)
    assert any(line.startswith(f"| {best} |") and line.endswith(f"**{perplexities[best]:.2f}** |")
               for line in report.splitlines())
    for name in ("mlm_loss.png", "perplexity.png", "glue-rte-checkpoint.png"):
        width, height = _png_size(os.path.join(output, name))
        assert width > 300 and height > 200
        assert f"![{name}]({name})" in report and name in printed
    assert sorted(os.listdir(output)) == ["glue-rte-checkpoint.png", "mlm_loss.png", "perplexity.png", "report.md"]


def test_a_run_differing_in_more_than_the_scheme_is_flagged(runs, tmp_path, capsys):
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], runs["pmi"], runs["odd"], "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    assert "⚠ These runs differ in more than the masking scheme" in report
    assert "odd (random_span): train.batch_size = 16, but token (random_token) has 8" in report
    assert "warning: the runs differ in more than the scheme" in capsys.readouterr().out


def test_scheme_colours_agree_across_plots():
    from pmi_jax.compare.plots import scheme_colour
    from pmi_jax.config import SCHEMES

    colours = [scheme_colour(s) for s in SCHEMES]
    assert len(set(colours)) == len(SCHEMES) and scheme_colour("pmi") == colours[SCHEMES.index("pmi")]


@pytest.mark.parametrize("make_args, message", [
    (lambda runs, tmp: [str(tmp / "nothing"), "--output", str(tmp / "r")], "no such run directory"),
    (lambda runs, tmp: [str(tmp), "--output", str(tmp / "r")], "no checkpoints/ directory"),
    (lambda runs, tmp: [runs["token"], runs["token"], "--output", str(tmp / "r")], "a run is named twice"),
    (lambda runs, tmp: [runs["token"], "--output", runs["pmi"]], "holds the training run"),  # never replaced
])
def test_input_errors_are_one_line_and_write_nothing(runs, tmp_path, capsys, make_args, message):
    assert main(["compare", *make_args(runs, tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "r")


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = capsys.readouterr().out
    assert "--output" in text and "--overwrite" in text and "RUN_DIR" in text


def test_unreadable_metrics_line_is_an_input_error(runs, tmp_path, capsys):
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(runs["token"], copy)
    with open(os.path.join(copy, "tensorboard", "metrics.jsonl"), "a") as f:
        f.write("not json\n")
    assert main(["compare", copy, runs["pmi"], "--output", str(tmp_path / "r")]) == 2
    assert "metrics.jsonl:5: not a metrics line" in capsys.readouterr().err
