"""`pmi-jax compare` on runs made here: checkpoints and training metrics written by the trainer's
own writers, perplexity computed by `pmi-jax eval perplexity --steps all`, fine-tuning results
in the layout `eval finetune` writes; then the report's tables, plots and warnings."""
from __future__ import annotations

import dataclasses
import json
import os
import struct
import zlib

import numpy as np
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


def _make_run(workdir: str, data_dir: str, scheme: str, *, batch_size: int = 8, seed: int = 0, train_seed: int = 0,
              params=None, data: dict = {}, validation: bool = False) -> str:
    """A run as `pmi-jax train` leaves it: checkpoints with the run's config, and metrics.jsonl.

    Parameters: random with seed `seed + i` at the i-th checkpoint, or `params(model config, i)`."""
    from pmi_jax.formats import run_dir
    from pmi_jax.checkpoints import Checkpointer
    from pmi_jax.config import CheckpointConfig, DataConfig, ExperimentConfig, TrainConfig
    from pmi_jax.train import checkpoint_metadata

    model = dataclasses.replace(eval_data.tiny_config(), vocab_size=len(prepared_data.vocabulary()))
    config = ExperimentConfig(model=model, data=DataConfig(data_dir=data_dir, scheme=scheme, seq_len=32, **data),
                              train=TrainConfig(batch_size=batch_size, num_steps=STEPS[-1], seed=train_seed))
    checkpointer = Checkpointer(workdir, CheckpointConfig())
    for i, step in enumerate(STEPS):
        checkpointer.save(step, {"params": params(model, i) if params else eval_data.mlm_params(model, seed + i)},
                          checkpoint_metadata(config, None, step))
    checkpointer.wait()
    checkpointer.close()
    writer = run_dir.MetricWriter(os.path.join(workdir, run_dir.TENSORBOARD_DIR), enabled=True)
    for step in range(1, STEPS[-1] + 1):
        writer.write(step, {"loss": 5.0 - 0.3 * step - 0.1 * seed, "accuracy": 0.01 * step})
        if validation and step % 2 == 0:  # as the trainer writes it: a line of its own
            writer.write(step, {"validation_loss": 5.5 - 0.2 * step, "validation_accuracy": 0.01 * step,
                                "validation_seconds": 0.5})
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
                   "best": {"batch_size": 32, "learning_rate": 3e-5, "aggregate": {"accuracy": score, "score": score},
                            "seed_scores": [score - 2, score - 1, score, score + 1, score + 2]}}, f)


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
    assert "### Single-token perplexity" in report and "| scheme | seeds | step 2 | step 4 |" in report
    assert "### Fine-tuning (checkpoint protocol)" in report
    assert "| scheme | glue/rte (accuracy, step 4) |" in report
    assert "| pmi | **60.00 (median 60.00, 58.00–62.00, 5 seeds)** |" in report
    assert "| random_token | 52.00 (median 52.00, 50.00–54.00, 5 seeds) |" in report
    assert "differ only in their masking scheme" in report and "⚠" not in report
    # one training seed per scheme: the intervals cover the text only, and no perplexity winner is marked
    perplexities = {}
    for scheme, workdir in (("random_token", runs["token"]), ("pmi", runs["pmi"])):
        with open(os.path.join(workdir, "eval", "perplexity-validation-step4.json")) as f:
            perplexities[scheme] = json.load(f)["perplexity"]
    section = report.split("### Single-token perplexity")[1].split("###")[0]
    assert "**" not in section.replace("**pmi**", "")
    assert "one training seed, so these intervals cover the scored text only" in section
    assert f"| pmi | 1 | " in section and f"{perplexities['pmi']:.2f} [" in section
    assert "| random_token − pmi |" in section
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
    (lambda runs, tmp: (tmp / "empty").mkdir() or [str(tmp / "empty"), "--output", str(tmp / "r")],
     "no checkpoints/ directory"),
    (lambda runs, tmp: [str(tmp), "--output", str(tmp / "r")], "lies inside the input RUN_DIR "),
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


def test_report_has_the_papers_per_checkpoint_table(runs, tmp_path):
    """Tables 6-7's shape from `eval finetune --protocol checkpoint` results: a row per run, a column per step."""
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], runs["pmi"], "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    assert "### glue/rte per pretraining checkpoint (checkpoint protocol)" in report
    assert "| scheme | 2 | 4 |" in report
    assert "| random_token | 50.0 | 52.0 |" in report and "| pmi | 55.0 | 60.0 |" in report


def test_the_perplexity_table_names_its_test_set(runs, tmp_path):
    """Table 4's test set is named: the prepared corpus and split the runs were scored on."""
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], runs["pmi"], "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    with open(os.path.join(runs["token"], "eval", "perplexity-validation-step4.json")) as f:
        data = json.load(f)["data"]
    assert f"Single-token perplexity on the validation split of `{data}`" in report
    assert "scored on different corpora" not in report


def test_compare_split_shows_another_scored_split(runs, tmp_path):
    """`compare --split train`: the tables of a second scored split (e.g. an out-of-domain test corpus)."""
    import shutil

    copies = []
    for name in ("token", "pmi"):
        copy = str(tmp_path / name)
        shutil.copytree(runs[name], copy)
        assert main(["eval", "perplexity", "--checkpoint", copy, "--steps", "4", "--split", "train",
                     "--positions", "3"]) == 0
        copies.append(copy)
    (tmp_path / "default").mkdir()
    (tmp_path / "train").mkdir()
    default, train = _report(tmp_path / "default", *copies), _report(tmp_path / "train", *copies, "--split", "train")
    assert "perplexity on the validation split" in default and "on the train split" not in default
    assert "Single-token perplexity on the train split of `" in train and "validation split" not in train
    assert "| step 4 |" in train and "| step 2 |" not in train  # only step 4 was scored on train


def test_a_released_models_results_sit_beside_the_runs(runs, tmp_path, capsys):
    """`compare --released DIR`: an `eval finetune --hf-model` output (no step) in the paper's Table 3 shape."""
    released = tmp_path / "bert-base-uncased-rte"
    released.mkdir()
    protocol = {"protocol": "checkpoint", "batch_sizes": [32], "learning_rates": [3e-5], "seeds": 5, "epochs": 10,
                "aggregate": "mean of the middle three", "selection": "each run's last epoch (no early stopping)"}
    (released / "results.json").write_text(json.dumps({
        "task": "glue/rte", "metric": "accuracy", "protocol": protocol, "step": None, "hf_model": "/m/bert-base",
        "best": {"batch_size": 32, "learning_rate": 3e-5, "aggregate": {"accuracy": 58.0, "score": 58.0}}}))
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], runs["pmi"], "--released", str(released), "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    assert "### Released checkpoints beside the runs" in report
    assert "| bert-base (released) | 58.0/– |" in report and "| pmi | 60.0/– |" in report
    (released / "results.json").write_text(json.dumps({"task": "glue/rte"}))
    assert main(["compare", runs["token"], "--released", str(released), "--output", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "not an `eval finetune --hf-model` result (needs task, hf_model, protocol and best.aggregate)" in err
    assert not os.path.exists(tmp_path / "r2")


def _shifted(seed: int, beta: float, log_unigram):
    """Random parameters of `seed` with the output bias moved by beta·log(unigram frequency): the same
    gain for every seed, so beta plays the scheme and `seed` the training seed."""
    def params(model, i):
        p = dict(eval_data.mlm_params(model, seed))
        p["output_bias"] = p["output_bias"] + beta * log_unigram[:len(p["output_bias"])]
        return p
    return params


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory):
    """Two training seeds of random_token (parameters of seed 0 and 1) and of pmi with the same seeds'
    parameters plus a small (0.005) or a large (1.0) shift toward the unigram distribution; every run
    scored with `--unit token --unit word --unit pmi`."""
    import numpy as np

    root = tmp_path_factory.mktemp("seeds")
    data_dir = str(root / "data")
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 4, "validation": 10},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    tokens = np.concatenate([s["input_ids"] for s in prepared_data.read_prepared_split(data_dir, "validation")])
    counts = np.bincount(tokens, minlength=1024) + 1.0
    log_unigram = np.log(counts / counts.sum())
    made = {}
    for name, scheme, seed, beta in (("token0", "random_token", 0, 0.0), ("token1", "random_token", 1, 0.0),
                                     ("near0", "pmi", 0, 0.005), ("near1", "pmi", 1, 0.005),
                                     ("far0", "pmi", 0, 1.0), ("far1", "pmi", 1, 1.0)):
        workdir = _make_run(str(root / name), data_dir, scheme, train_seed=seed,
                            params=_shifted(seed, beta, log_unigram))
        assert main(["eval", "perplexity", "--checkpoint", workdir, "--steps", "4", "--unit", "token", "--unit",
                     "word", "--unit", "pmi"]) == 0
        made[name] = workdir
    return made


def _report(tmp_path, *workdirs) -> str:
    output = str(tmp_path / "report")
    assert main(["compare", *workdirs, "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        return f.read()


def _mean_nll(workdir, name="perplexity-validation-step4.json"):
    with open(os.path.join(workdir, "eval", name)) as f:
        return json.load(f)["mean_nll"]


def test_seeds_that_differ_more_than_the_schemes_mark_no_winner(seed_runs, tmp_path):
    from pmi_jax import intervals
    from pmi_jax.formats import perplexity_result

    token = [_mean_nll(seed_runs[n]) for n in ("token0", "token1")]
    near = [_mean_nll(seed_runs[n]) for n in ("near0", "near1")]
    gap = abs(sum(token) / 2 - sum(near) / 2)
    assert abs(token[0] - token[1]) > gap and abs(near[0] - near[1]) > gap  # the premise, measured
    # On the scored text alone the (consistent) gap is clear: a text-only interval would call it.
    scores = [perplexity_result.read(os.path.join(seed_runs[n], "eval", "perplexity-validation-step4.json"))["scores"]
              for n in ("token0", "token1", "near0", "near1")]
    _, _, counts_S = intervals.per_sequence(scores[0]["sequence"], scores[0]["nll"])
    sums = [intervals.per_sequence(s["sequence"], s["nll"])[1] for s in scores]
    text_only = intervals.compare_schemes({"a": (sums[0] + sums[1])[None] / 2, "b": (sums[2] + sums[3])[None] / 2},
                                          counts_S)
    assert text_only.differences[0].interval.excludes_zero
    report = _report(tmp_path, *(seed_runs[n] for n in ("token0", "token1", "near0", "near1")))
    assert "random_token: 2 (0, 1); pmi: 2 (0, 1)" in report
    for title in ("Single-token perplexity", "Whole-word perplexity", "Perplexity with `pmi` units masked whole"):
        section = report.split(f"### {title}\n")[1].split("###")[0]
        assert "this scale does not separate the schemes" in section, section
        assert "**" not in section and "; seeds 0.0" in section


def test_a_clear_difference_is_marked(seed_runs, tmp_path):
    report = _report(tmp_path, *(seed_runs[n] for n in ("token0", "token1", "far0", "far1")))
    for title in ("Single-token perplexity", "Whole-word perplexity", "Perplexity with `pmi` units masked whole",
                  "Whole-word perplexity, words of two or more WordPieces only"):
        section = report.split(f"### {title}\n")[1].split("###")[0]
        assert "**pmi** is lowest and its difference from every other scheme excludes 0" in section, section
        assert any(line.startswith("| pmi | 2 | **") for line in section.splitlines())
        assert "| random_token − pmi | +" in section and " ✓; seeds " in section
    for name in ("perplexity.png", "perplexity-word.png", "perplexity-pmi.png", "perplexity-word-multi.png"):
        assert _png_size(str(tmp_path / "report" / name))[0] > 300


def test_runs_scored_on_other_tokens_are_not_paired(seed_runs, tmp_path):
    import shutil

    copy = str(tmp_path / "resampled")
    shutil.copytree(seed_runs["far0"], copy)
    assert main(["eval", "perplexity", "--checkpoint", copy, "--steps", "4", "--seed", "9", "--positions", "3"]) == 0
    report = _report(tmp_path, seed_runs["token0"], copy)
    assert "the runs were scored on different tokens" in report and "No scheme is marked best" in report


def test_overlapping_finetuning_seed_ranges_mark_no_best():
    from pmi_jax.compare.report import Table

    table = Table("t", "n", ["glue/rte"], [("a", [60.0]), ("b", [58.0])], lower_is_better=False,
                  seed_scores=[("a", [[55.0, 60.0, 65.0]]), ("b", [[57.0, 58.0, 59.0]])])
    text = table.markdown()
    assert "**" not in text and "⚠ The best score's range over fine-tuning seeds overlaps" in text
    apart = Table("t", "n", ["glue/rte"], [("a", [60.0]), ("b", [50.0])], lower_is_better=False,
                  seed_scores=[("a", [[59.0, 60.0, 61.0]]), ("b", [[49.0, 50.0, 51.0]])])
    assert "| a | **60.00 (median 60.00, 59.00–61.00, 3 seeds)** |" in apart.markdown()


def test_validation_loss_and_the_masking_rate_join_the_comparison(runs, tmp_path, capsys):
    data_dir = os.path.join(os.path.dirname(runs["token"]), "data")
    rate30 = _make_run(str(tmp_path / "rate30"), data_dir, "pmi", data={"mask_rate": 0.3}, validation=True)
    decay = _make_run(str(tmp_path / "decay"), data_dir, "whole_word", validation=True, data={
        "mask_rate": 0.3, "mask_rate_schedule": "linear", "mask_rate_end": 0.15})
    output = str(tmp_path / "report")
    assert main(["compare", runs["token"], rate30, decay, "--output", output]) == 0
    with open(os.path.join(output, "report.md")) as f:
        report = f.read()
    assert "| rate30 | pmi | 0.3 |" in report and "| decay | whole_word | 0.3 → 0.15 linear |" in report
    assert "| token | random_token | 0.15 |" in report
    assert "rate30 (pmi): data.mask_rate = 0.3, but token (random_token) has 0.15" in report
    assert "decay (whole_word): data.mask_rate_schedule = 'linear', but token (random_token) has 'constant'" in report
    width, height = _png_size(os.path.join(output, "validation_loss.png"))
    assert width > 300 and height > 200 and "![validation_loss.png](validation_loss.png)" in report
    from pmi_jax.compare.runs import read_run

    run = read_run(rate30)
    assert run.training[2]["loss"] == pytest.approx(4.4) and run.training[2]["validation_loss"] == pytest.approx(5.1)
    assert "validation_loss" not in run.training[3]
