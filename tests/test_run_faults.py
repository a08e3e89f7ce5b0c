"""Hostile inputs and faults for the commands that read or write a training run (`train`, `eval`,
`compare`, `export`, `data`).

Each case ends with exit 0 and the right result, or exit 2 and one line on stderr naming the
input; and each checks what is on disk afterwards: nothing a user had is lost.
docs/reliability.md lists the promises and names these tests.
"""
import hashlib
import json
import os
import pathlib
import shutil

import subprocess

import pytest

from pmi_jax.cli import main
from tests import prepared_data
from tests.damage import one_line_error as _one_line_error
from tests.damage import tmpfs as _tmpfs

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=1",
         "model.max_position_embeddings=32", "train.batch_size=8", "train.log_every_steps=1",
         "checkpoint.every_steps=1", "optimizer.warmup_steps=1"]


def _sets(*overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def _train_args(data_dir, workdir, *overrides):
    return ["train", "--config", "tiny", "--data", str(data_dir), "--workdir", str(workdir), "--scheme",
            "whole_word", *_sets(*SMALL, *overrides)]


def _tree_digest(directory) -> dict[str, str]:
    """{relative path: sha256} of every file under `directory`: what 'nothing changed' compares."""
    root = pathlib.Path(directory)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("corpus") / "data"
    prepared_data.write_prepared_corpus(str(data_dir), sequences={"train": 40, "validation": 6},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    return data_dir


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """A 2-step run with checkpoints at steps 1 and 2 and a perplexity evaluation."""
    workdir = tmp_path_factory.mktemp("run") / "run"
    assert main(_train_args(corpus, workdir, "train.num_steps=2")) == 0
    assert main(["eval", "perplexity", "--checkpoint", str(workdir), "--max-sequences", "2", "--positions",
                 "2"]) == 0
    return workdir


@pytest.fixture
def run_copy(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


# ---------------------------------------------------------------------------------------------
# 1. One rule for outputs: no output may hold an input or a run.

def test_no_output_may_replace_a_run_or_an_input(run, corpus, tmp_path, capsys):
    from pmi_jax.formats import run_dir

    # A run is recognised by what `train` wrote, under the names of formats/run_dir.py (the one definition).
    assert run_dir.is_run(str(run)) and not run_dir.is_run(str(corpus))
    assert {run_dir.CHECKPOINT_DIR, run_dir.TENSORBOARD_DIR} <= set(os.listdir(run))
    other = tmp_path / "other"
    shutil.copytree(run, other)
    before = {d: _tree_digest(d) for d in (run, other, corpus)}
    cases = [
        (["export", "hf", "--checkpoint", str(run), "--output", str(run), "--overwrite"],
         f"--output {run}: is the input --checkpoint {run}"),
        (["export", "hf", "--checkpoint", str(run), "--output", str(other), "--overwrite"],
         f"--output {other}: holds the training run {other}"),
        (["export", "hf", "--checkpoint", str(run), "--output", str(tmp_path), "--overwrite"],
         f"--output {tmp_path}: holds the training run {other}"),
        (["export", "hf", "--checkpoint", str(run), "--output", str(corpus), "--overwrite"],
         f"--output {corpus}: is the input the checkpoint's corpus {corpus}"),
        (["compare", str(run), "--output", str(run), "--overwrite"], f"--output {run}: is the input RUN_DIR {run}"),
        (["compare", str(run), "--output", str(other)], f"--output {other}: holds the training run {other}"),
        (["eval", "finetune", "--checkpoint", str(run), "--task", "glue/rte", "--data", str(tmp_path / "glue"),
          "--output", str(run), "--overwrite"], f"--output {run}: is the input --checkpoint {run}"),
        (["eval", "perplexity", "--checkpoint", str(run), "--output",
          str(run / "tensorboard" / "metrics.jsonl"), "--overwrite"],
         f"lies inside the records of the training run {run}"),
        (["compare", str(other), "--output", str(run / "eval"), "--overwrite"],
         f"is the results folder of the training run {run}"),
        (["eval", "perplexity", "--checkpoint", str(other), "--output", str(run / "checkpoints" / "new.json")],
         f"lies inside the records of the training run {run}"),
        (["data", "dump", "--data", str(corpus), "--scheme", "whole_word", "--num", "1", "--output",
          str(corpus / "metadata.json"), "--overwrite"], f"lies inside the input --data {corpus}"),
        (["demo-corpus", "--output", str(other), "--overwrite"], f"holds the training run {other}"),
        (["vocab", "build", "--input", str(corpus / "vocab.txt"), "--output", str(other), "--overwrite"],
         f"holds the training run {other}"),
    ]
    for argv, message in cases:
        _one_line_error(capsys, main(argv), message)
    assert {d: _tree_digest(d) for d in (run, other, corpus)} == before
    # An output of the user's own inside a run may be replaced: an export kept beside the checkpoints.
    for extra in ([], ["--overwrite"]):
        assert main(["export", "hf", "--checkpoint", str(other), "--output", str(other / "hf"), *extra]) == 0
    assert (other / "hf" / "model.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# 2. Imports are checked: every tensor of `train --init-from` fits its config and vocabulary.

@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    output = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", "hf", "--checkpoint", str(run), "--output", str(output)]) == 0
    return output


def _changed_export(exported, copy, change):
    """A copy of the export whose tensors are {name: array} -> change(tensors)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(exported, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    save_file(change(tensors), str(copy / "model.safetensors"))
    return copy


def _fewer_rows(tensors):
    for name in ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"):
        tensors[name] = tensors[name][:-3]
    return tensors


def _integer_bias(tensors):
    for name in ("cls.predictions.bias", "cls.predictions.decoder.bias"):
        tensors[name] = tensors[name].astype("int32")
    return tensors


def _narrow_query(tensors):
    name = "bert.encoder.layer.0.attention.self.query.weight"
    tensors[name] = tensors[name][:, :16]
    return tensors


@pytest.mark.parametrize("change, message", [
    (_fewer_rows, "tensor bert.embeddings.word_embeddings.weight has shape [{rows}, 32], but config.json and "
                  "vocab.txt ({vocab} tokens) make it [{vocab}, 32]"),
    (_integer_bias, "tensor cls.predictions.bias has dtype int32"),
    (_narrow_query, "tensor bert.encoder.layer.0.attention.self.query.weight has shape [32, 16]"),
])
def test_init_from_tensors_must_fit_the_config_and_vocabulary(corpus, exported, tmp_path, capsys, change, message):
    vocab = len((exported / "vocab.txt").read_text().splitlines())
    broken = _changed_export(exported, tmp_path / "hf", change)
    before = _tree_digest(broken)
    status = main(_train_args(corpus, tmp_path / "new", "train.num_steps=1") + ["--init-from", str(broken)])
    _one_line_error(capsys, status, str(broken / "model.safetensors"), message.format(rows=vocab - 3, vocab=vocab))
    assert not (tmp_path / "new").exists() and _tree_digest(broken) == before


def _string_hidden_size(directory):
    config = json.loads((directory / "config.json").read_text())
    config["hidden_size"] = str(config["hidden_size"])
    (directory / "config.json").write_text(json.dumps(config))


def _truncated_index(directory):
    (directory / "model.safetensors").rename(directory / "model-00001-of-00001.safetensors")
    index = json.dumps({"weight_map": {"cls.predictions.bias": "model-00001-of-00001.safetensors"}})
    (directory / "model.safetensors.index.json").write_text(index[:len(index) // 2])


def _index_naming_a_missing_file(directory):
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))


@pytest.mark.parametrize("damage, message", [
    (_string_hidden_size, "config.json: 'hidden_size' is \"32\"; expected a positive integer"),
    (_truncated_index, "model.safetensors.index.json: not valid JSON"),
    (_index_naming_a_missing_file, "model.safetensors.index.json: names gone.safetensors, which is not in its "
                                   "directory"),
])
def test_a_damaged_transformers_directory_is_one_line(corpus, exported, tmp_path, capsys, damage, message):
    broken = tmp_path / "hf"
    shutil.copytree(exported, broken)
    damage(broken)
    status = main(_train_args(corpus, tmp_path / "new", "train.num_steps=1") + ["--init-from", str(broken)])
    _one_line_error(capsys, status, message)
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------
# 5. Inputs are validated: metrics and perplexity files by field and type, config files.

def _append(path, data: bytes):
    with open(path, "ab") as f:
        f.write(data)


@pytest.mark.parametrize("damage, message", [
    (lambda run: _append(run / "tensorboard" / "metrics.jsonl", b'{"step": 3, "loss": "abc"}\n'),
     'metrics.jsonl:{line}: loss is "abc", not a number'),
    (lambda run: _append(run / "tensorboard" / "metrics.jsonl", b"\x00\xff\xfe binary\n"),
     "metrics.jsonl:{line}: not a metrics line"),
    (lambda run: _append(run / "tensorboard" / "metrics.jsonl", b'{"step": "3", "loss": 1.0}\n'),
     "metrics.jsonl:{line}: not a metrics line (a JSON object with an integer step)"),
    (lambda run: (run / "eval" / "perplexity-validation-step2.json").write_text('{"perplexity": "12", "step": 2}'),
     'perplexity-validation-step2.json: not an `eval perplexity` result (perplexity is "12", expected a number)'),
    (lambda run: (run / "eval" / "perplexity-validation-step2.json").write_bytes(b"\xff\xfe\x00binary"),
     "perplexity-validation-step2.json: not JSON"),
])
def test_compare_checks_every_field_it_reads(run_copy, tmp_path, capsys, damage, message):
    line = len((run_copy / "tensorboard" / "metrics.jsonl").read_bytes().splitlines()) + 1  # the appended one
    message = message.replace("{line}", str(line))
    damage(run_copy)
    before = _tree_digest(run_copy)
    _one_line_error(capsys, main(["compare", str(run_copy), "--output", str(tmp_path / "report")]), message)
    assert not (tmp_path / "report").exists() and _tree_digest(run_copy) == before


def test_export_checks_the_perplexity_file_it_quotes(run, tmp_path, capsys):
    result = json.loads((run / "eval" / "perplexity-validation-step2.json").read_text())
    for field, value, expected in (("perplexity", "12.5", "a number"), ("num_tokens", 2.5, "an integer"),
                                   ("step", True, "an integer")):
        bad = tmp_path / f"{field}.json"
        bad.write_text(json.dumps({**result, field: value}))
        status = main(["export", "hf", "--checkpoint", str(run), "--output", str(tmp_path / "hf"), "--perplexity",
                       str(bad)])
        _one_line_error(capsys, status, f"--perplexity {bad}: not an `eval perplexity` result ({field} is "
                                        f"{json.dumps(value)}, expected {expected})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["num_tokens.json", "perplexity.json", "step.json"]


@pytest.mark.parametrize("source, message", [
    ("def get_config(:\n    pass\n", "bad.py:1: invalid syntax"),
    ("import os\n\ndef get_config():\n    return undefined_name\n",
     "bad.py:4: NameError: name 'undefined_name' is not defined"),
    ("import no_such_module_here\n", "bad.py:1: ModuleNotFoundError: No module named 'no_such_module_here'"),
])
def test_a_config_file_that_does_not_run_is_one_line(corpus, tmp_path, capsys, source, message):
    config = tmp_path / "bad.py"
    config.write_text(source)
    argv = _train_args(corpus, tmp_path / "new")
    argv[argv.index("tiny")] = str(config)
    _one_line_error(capsys, main(argv), f"--config {config}: {config}:", message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py"]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_rate_that_is_not_a_finite_number_is_one_line(corpus, tmp_path, capsys, value):
    """Issue 33 case 9: every float flag of every command is checked in one place (cli/io_flags.py)."""
    for argv, option in ((["data", "show", "--data", str(corpus), "--scheme", "whole_word", "--mask-rate", value],
                          "--mask-rate"),
                         (["data", "dump", "--data", str(corpus), "--scheme", "whole_word", "--num", "1",
                           "--mask-rate", value, "--output", str(tmp_path / "d.jsonl")], "--mask-rate"),
                         (["corpus", "prepare", "--input", str(corpus / "vocab.txt"), "--output",
                           str(tmp_path / "c"), "--validation-fraction", value], "--validation-fraction"),
                         (["vocab", "build", "--input", str(corpus / "vocab.txt"), "--output", str(tmp_path / "v"),
                           "--shares", f"0.5,{value}"], "--shares")):
        _one_line_error(capsys, main(argv), f"{option} {float(value)}: not a finite number")
    _one_line_error(capsys, main(_train_args(corpus, tmp_path / "w", "data.mask_rate=1e999")), "not a finite number")
    assert sorted(os.listdir(tmp_path)) == []


def test_compare_split_names_the_splits_the_runs_were_scored_on(run, tmp_path, capsys):
    """Issue 33 case 10."""
    before = _tree_digest(run)
    _one_line_error(capsys, main(["compare", str(run), "--output", str(tmp_path / "r"), "--split", "train"]),
                    "--split train: no run was scored on it (`eval perplexity --split train`); scored splits: "
                    "validation")
    _one_line_error(capsys, main(["compare", str(run), "--output", str(tmp_path / "r"), "--split", "../x"]),
                    "--split ../x: a corpus split, one of train, validation")
    assert _tree_digest(run) == before and not (tmp_path / "r").exists()


def test_a_bad_hf_model_is_named_by_the_option_given(tmp_path, capsys):
    """Issue 33 case 14: the message names --hf-model, the flag the user typed, not --init-from."""
    bad = tmp_path / "bert"
    bad.mkdir()
    argv = ["eval", "finetune", "--hf-model", str(bad), "--task", "glue/rte", "--data", str(tmp_path / "glue"),
            "--output", str(tmp_path / "out")]
    message = _one_line_error(capsys, main(argv), f"--hf-model {bad}: no config.json")
    assert "--init-from" not in message
    (bad / "config.json").write_text(json.dumps({"vocab_size": 5, "hidden_size": 8, "num_hidden_layers": 1,
                                                 "num_attention_heads": 2, "intermediate_size": 16,
                                                 "max_position_embeddings": 16}))
    (bad / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    message = _one_line_error(capsys, main(argv), f"--hf-model {bad}: no model.safetensors")
    assert "--init-from" not in message and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# 7. Signals reach the trainer, whichever of the command's processes receives them.

_PROGRAM = "import sys; from pmi_jax.cli import main; sys.argv[0] = 'pmi-jax'; sys.exit(main())"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


# Ctrl-C itself: the command line runs with a new terminal as its controlling terminal, and ^C
# typed there reaches its whole process group from the terminal (not from a kill).
_ON_A_TERMINAL = "import fcntl, os, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); " + _PROGRAM


@pytest.mark.parametrize("signame, receiver", [("SIGTERM", "command"), ("SIGTERM", "stderr filter"),
                                               ("SIGINT", "command"), ("SIGINT", "stderr filter"),
                                               ("SIGINT", "Ctrl-C at the terminal")])
def test_a_signal_to_any_process_of_train_checkpoints_and_stops(tmp_path, signame, receiver):
    """`pmi-jax train` runs as two processes (the command, and the fork that filters its stderr,
    under the same command line); `pkill -n pmi-jax` signals the newest, the filter. SIGTERM
    ends with a checkpoint and exit 0; SIGINT (`kill -INT`, or Ctrl-C, which reaches both
    processes) with a checkpoint and exit 130. Either is received once."""
    import pty
    import signal
    import subprocess
    import sys

    workdir = tmp_path / "run dir"  # a space: the tensorboard hint must quote it
    argv = ["train", "--config", "tiny", "--data", "synthetic", "--workdir", str(workdir),
            *_sets("model.vocab_size=128", *SMALL, "data.seq_len=32", "checkpoint.every_steps=1000",
                   "train.num_steps=100000")]
    terminal, stdin = pty.openpty() if receiver.startswith("Ctrl-C") else (None, subprocess.DEVNULL)
    process = subprocess.Popen([sys.executable, "-c", _ON_A_TERMINAL if terminal else _PROGRAM, *argv],
                               stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        lines = []
        for line in iter(process.stdout.readline, ""):
            lines.append(line)
            if line.startswith("step 2 "):
                break
        assert lines and lines[-1].startswith("step 2 "), "".join(lines) + process.stderr.read()
        (stderr_filter,) = _children(process.pid)
        if terminal:
            os.write(terminal, b"\x03")
        else:
            os.kill(process.pid if receiver == "command" else stderr_filter, getattr(signal, signame))
        out, err = process.communicate(timeout=600)
    finally:
        process.kill()
        if terminal:
            os.close(terminal)
            os.close(stdin)
    assert process.returncode == (0 if signame == "SIGTERM" else 130), err[-3000:]
    assert "tensorboard --logdir '" + str(workdir / "tensorboard") + "'" in "".join(lines) + out
    stopped = "preempted" if signame == "SIGTERM" else "interrupted"
    last = err.splitlines()[-1]
    assert last.startswith(f"pmi-jax train: {stopped} at step ") and last.endswith(
        "; checkpoint saved, rerun the same command to resume"), err[-3000:]
    step = int(last.split(" at step ")[1].split(";")[0])
    assert 2 <= step < 100000 and os.listdir(workdir / "checkpoints") == [str(step)]
    assert err.count(f"{signame} received") == 1 and err.count("received:") == 1, err


_COUNT_INTERRUPTS = """
import fcntl, os, signal, sys, termios, time
from pmi_jax.cli import quiet
if sys.argv[1] == "terminal":
    os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0)
stderr_filter = quiet.filter_stderr()
received = []
signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
print(stderr_filter.pid, flush=True)
while len(received) < 1:
    time.sleep(0.05)
time.sleep(3)  # a copy passed on by the filter would arrive meanwhile
print(len(received), flush=True)
stderr_filter.close()
"""


@pytest.mark.parametrize("sender", ["terminal", "kill to the filter"])
def test_an_interrupt_reaches_the_command_once(sender):
    """Ctrl-C reaches both processes from the terminal: the filter does not pass it on, so the
    command gets one (a second could cut short what the first started, such as cleaning up).
    A `kill -INT` to the filter alone is passed on."""
    import pty
    import signal
    import subprocess
    import sys

    terminal, stdin = pty.openpty() if sender == "terminal" else (None, subprocess.DEVNULL)
    process = subprocess.Popen([sys.executable, "-c", _COUNT_INTERRUPTS, sender], stdin=stdin,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        stderr_filter = int(process.stdout.readline())
        if terminal:
            os.write(terminal, b"\x03")
        else:
            os.kill(stderr_filter, signal.SIGINT)
        out, err = process.communicate(timeout=300)
    finally:
        process.kill()
        if terminal:
            os.close(terminal)
            os.close(stdin)
    assert process.returncode == 0 and out.split() == ["1"], (out, err)


# ---------------------------------------------------------------------------------------------
# 6. Quiet, truthful fallbacks: one warning that names what was skipped and what is used.

def _program(argv, **kwargs):
    """`pmi-jax ARGV` as the installed program runs it (its stderr filtered, logging configured)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", _PROGRAM, *map(str, argv)], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), **kwargs)


def _damage_state(run, step):
    """Cut every data file of a checkpoint's arrays to 10 bytes (a bad disk, a truncated copy)."""
    data = run / "checkpoints" / str(step) / "state" / "ocdbt.process_0" / "d"
    files = list(data.iterdir())
    assert files
    for path in files:
        os.truncate(path, 10)


def _assert_quiet(stderr: str):
    for noise in ("Traceback", "Event loop is closed", "read only", "read_only", "TensorStore"):
        assert noise not in stderr, stderr[-3000:]


def test_a_damaged_checkpoint_is_one_warning_naming_it_and_the_step_used(run_copy, corpus, tmp_path):
    _damage_state(run_copy, 2)
    evaluated = _program(["eval", "perplexity", "--checkpoint", run_copy, "--max-sequences", "1", "--positions", "1",
                          "--output", tmp_path / "p.json"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    _assert_quiet(evaluated.stderr)
    (warning,) = [line for line in evaluated.stderr.splitlines() if "WARNING" in line]
    assert f"skipped checkpoint 2 of {run_copy} (ValueError: OUT_OF_RANGE: Error reading" in warning
    assert warning.endswith("; evaluating step 1"), warning
    assert json.loads((tmp_path / "p.json").read_text())["step"] == 1

    resumed = _program(_train_args(corpus, run_copy, "train.num_steps=3"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_quiet(resumed.stderr)
    (warning,) = [line for line in resumed.stderr.splitlines() if "WARNING" in line]
    assert "skipped checkpoint 2 (state: ValueError: OUT_OF_RANGE" in warning
    assert warning.endswith(f"moved to {run_copy / 'unreadable_checkpoints' / '2'}; resuming from step 1"), warning
    assert "3" in os.listdir(run_copy / "checkpoints")
    assert os.listdir(run_copy / "unreadable_checkpoints") == ["2"]


def test_when_no_checkpoint_restores_the_error_is_the_last_line(run_copy, corpus):
    for step in (1, 2):
        _damage_state(run_copy, step)
    before = _tree_digest(run_copy)
    for argv in (_train_args(corpus, run_copy, "train.num_steps=3"),
                 ["eval", "perplexity", "--checkpoint", run_copy, "--max-sequences", "1"]):
        result = _program(argv)
        assert result.returncode == 2, result.stderr[-3000:]
        _assert_quiet(result.stderr)
        last = result.stderr.splitlines()[-1]
        assert last.startswith("pmi-jax ") and "no checkpoint restores (step 2: " in last, result.stderr
        assert "; step 1: " in last and last.count("ValueError: OUT_OF_RANGE: Error reading") == 2, last
        assert not any("WARNING" in line for line in result.stderr.splitlines()), result.stderr
    assert _tree_digest(run_copy) == before


def test_compare_falls_back_when_the_newest_metadata_is_missing(run_copy, tmp_path):
    (run_copy / "checkpoints" / "2" / "metadata" / "metadata").unlink()
    result = _program(["compare", run_copy, "--output", tmp_path / "report"])
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_quiet(result.stderr)
    (warning,) = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert f"{run_copy}: skipped the metadata of checkpoint step 2: " in warning and warning.endswith("using step 1")
    assert (tmp_path / "report" / "report.md").exists()


@pytest.mark.parametrize("change, given, setting, before, now", [
    (["--scheme", "random_token"], [], "data.scheme", "'whole_word'", "'random_token'"),
    ([], ["data.mask_rate=0.3"], "data.mask_rate", "0.15", "0.3"),
    ([], ["data.mask_rate_schedule=linear"], "data.mask_rate_schedule", "'constant'", "'linear'"),
    ([], ["data.seed=1"], "data.seed", "0", "1"),
    ([], ["train.seed=7"], "train.seed", "0", "7"),
])
def test_a_resumed_run_keeps_its_settings(run_copy, corpus, capsys, change, given, setting, before, now):
    """Issue 33 cases 4-5: another scheme, rate, schedule or seed is one line naming the setting
    and both values, and nothing in the run changes."""
    digest = _tree_digest(run_copy)
    argv = _train_args(corpus, run_copy, "train.num_steps=3", *given)
    if change:
        argv[argv.index("whole_word")] = change[1]
    _one_line_error(capsys, main(argv), f"--workdir {run_copy}: checkpoint step 2 was trained with {setting}="
                    f"{before}, this run gives {now}; resume with the run's own setting, or pass --allow-changed "
                    f"{setting} to change it from step 2 (recorded in the run)")
    assert _tree_digest(run_copy) == digest


def test_resuming_on_another_corpus_is_refused_unless_allowed(run_copy, corpus, tmp_path, capsys):
    other = tmp_path / "other corpus"
    shutil.copytree(corpus, other)
    digest = _tree_digest(run_copy)
    _one_line_error(capsys, main(_train_args(other, run_copy, "train.num_steps=3")),
                    f"was trained with data.data_dir='{corpus}', this run gives '{other}'")
    assert _tree_digest(run_copy) == digest
    assert main(_train_args(other, run_copy, "train.num_steps=3") + ["--allow-changed", "data.data_dir"]) == 0


def test_an_allowed_change_is_recorded_with_its_step_and_compare_flags_it(run_copy, corpus, tmp_path, capsys):
    from pmi_jax.compare.runs import read_run

    _one_line_error(capsys, main(_train_args(corpus, run_copy, "train.num_steps=3") + ["--allow-changed", "rate"]),
                    "--allow-changed rate: not a setting a resumed run keeps; one of data.scheme, data.mask_rate")
    argv = _train_args(corpus, run_copy, "train.num_steps=4", "data.mask_rate=0.3")
    assert main(argv + ["--allow-changed", "data.mask_rate"]) == 0
    change = {"setting": "data.mask_rate", "from": 0.15, "to": 0.3, "step": 2}
    assert read_run(str(run_copy)).changes == (change,)
    metadata = json.loads((run_copy / "checkpoints" / "3" / "metadata" / "metadata").read_text())
    assert metadata["changes"] == [change] and metadata["config"]["data"]["mask_rate"] == 0.3
    # Resumed again with the new rate: no new change, the record is kept.
    assert main(_train_args(corpus, run_copy, "train.num_steps=5", "data.mask_rate=0.3")) == 0
    assert read_run(str(run_copy)).changes == (change,)
    capsys.readouterr()
    report_dir = tmp_path / "report"
    assert main(["compare", str(run_copy), "--output", str(report_dir)]) == 0
    assert ("run (whole_word): data.mask_rate changed from 0.15 to 0.3 at step 2 (resumed with --allow-changed)"
            in (report_dir / "report.md").read_text())


def test_a_workdir_that_cannot_be_written_is_one_line(corpus, tmp_path, capsys):
    (tmp_path / "file").write_text("keep")
    _one_line_error(capsys, main(_train_args(corpus, tmp_path / "file", "train.num_steps=1")),
                    f"--workdir {tmp_path / 'file'}: {tmp_path / 'file'} is a file; name a directory")
    _one_line_error(capsys, main(_train_args(corpus, tmp_path / "file" / "run", "train.num_steps=1")),
                    f"{tmp_path / 'file'} is a file")
    assert (tmp_path / "file").read_text() == "keep"
    with _tmpfs(tmp_path / "ro", "ro,size=1m") as read_only:
        _one_line_error(capsys, main(_train_args(corpus, read_only, "train.num_steps=1")),
                        f"--workdir {read_only}: cannot write in {read_only} (Read-only file system)")


def test_eval_perplexity_checks_that_it_can_file_its_result_before_computing(run, tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", "size=4m") as mount:
        copy = mount / "run"
        shutil.copytree(run, copy)
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        before = _tree_digest(copy)
        _one_line_error(capsys, main(["eval", "perplexity", "--checkpoint", str(copy)]),
                        f"--checkpoint {copy}: its results folder {copy / 'eval'}: cannot write in {copy / 'eval'} "
                        "(Read-only file system)")
        assert _tree_digest(copy) == before


def _fill(directory, leave: int = 0):
    """Fill the filesystem of `directory` until `leave` bytes (or fewer) are free."""
    import contextlib

    with contextlib.suppress(OSError), open(directory / "filler", "wb") as f:
        while shutil.disk_usage(directory).free > leave:
            f.write(b"x" * 4096)
            f.flush()


def test_a_full_disk_during_training_is_one_line_and_the_run_resumes(tmp_path):
    argv = ["train", "--config", "tiny", "--data", "synthetic",
            *_sets("model.vocab_size=128", *SMALL, "data.seq_len=32", "checkpoint.keep=100", "train.num_steps=50")]
    with _tmpfs(tmp_path / "disk", "size=1m") as disk:
        workdir = disk / "run"
        result = _program([*argv, "--workdir", workdir])
        assert result.returncode == 2, result.stderr[-3000:]
        _assert_quiet(result.stderr)
        last = result.stderr.splitlines()[-1]
        # The path named is the file or folder whose write failed: inside the workdir, or the workdir itself.
        assert last.startswith(f"pmi-jax train: error: --workdir {workdir}: cannot write {workdir}"), last
        assert "(No space left on device; needs about " in last and last.endswith("; make room and rerun the same "
                                                                                  "command"), last
        saved = sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit())
        assert saved and saved[-1] < 50
        # The space needed is a checkpoint's: within a factor of two of a complete one on disk.
        needed, stated = _stated_need(last)
        checkpoint = _size(workdir / "checkpoints" / str(saved[-1]))
        assert stated == "about" and checkpoint / 2 <= needed <= 2 * checkpoint, (last, checkpoint)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        resumed = _program([*argv, "--workdir", workdir])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"starting at step {saved[-1]}" in resumed.stderr


def _stated_need(message: str) -> tuple[float, str]:
    """(bytes, "about" or "at least") of a full-disk message's "needs about 1.2 MiB"."""
    import re

    match = re.search(r"; needs (about|at least) ([\d.]+) (KiB|MiB), ([\d.]+) (KiB|MiB) free on ", message)
    assert match, message
    return float(match.group(2)) * {"KiB": 2**10, "MiB": 2**20}[match.group(3)], match.group(1)


def _size(path) -> int:
    path = pathlib.Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("command, kind", [("export", "about"), ("data dump", "about"),
                                           ("eval perplexity", "at least"), ("compare", "at least")])
def test_a_full_disk_for_other_outputs_is_one_line(run_copy, corpus, tmp_path, capsys, command, kind):
    """The message names the output, the space left and the space needed: the weights' bytes
    (export), the dump's lines so far scaled to --num (data dump), or what the output had taken
    plus the file being written when the disk filled (at least: eval perplexity, compare)."""
    run = run_copy

    def argv(output):
        return list(map(str, {
            "export": ["export", "hf", "--checkpoint", run, "--output", output],
            "data dump": ["data", "dump", "--data", corpus, "--scheme", "whole_word", "--num", "200",
                          "--output", output],
            "eval perplexity": ["eval", "perplexity", "--checkpoint", run, "--max-sequences", "1",
                                "--positions", "1", "--output", output],
            "compare": ["compare", run, "--output", output]}[command]))

    with _tmpfs(tmp_path / "disk", "size=256k") as disk:
        _fill(disk)
        output = disk / "out"
        err = _one_line_error(capsys, main(argv(output)), f"--output {output}: cannot write",
                              "No space left on device; needs ", "; make room and rerun the same command")
        assert sorted(os.listdir(disk)) == ["filler"]
    needed, stated = _stated_need(err)
    assert stated == kind, err
    # Where there is room, the same command writes an output of about that size (at least it, for a lower bound).
    assert main(argv(tmp_path / "room")) == 0
    written = _size(tmp_path / "room")
    assert 0 < needed <= 1.1 * written if kind == "at least" else 0.5 * written <= needed <= 1.5 * written, (
        err, written)
