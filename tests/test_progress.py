"""The training progress line: what it says, and that it appears only on a terminal.

The end-to-end tests run `pmi-jax train` on the synthetic corpus in a subprocess whose stderr
is a pseudo-terminal (the progress line is drawn), a pipe (it is not) or a pseudo-terminal
with --no-progress (it is not); the log lines on stdout are the same in all three.
"""
from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys

import pytest

from pmi_jax.progress import Progress, duration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["-c", "import sys; from pmi_jax.cli import main; sys.exit(main(sys.argv[1:]))",
         "train", "--config", "tiny", "--data", "synthetic",
         "--set", "model.vocab_size=128", "--set", "model.hidden_size=32", "--set", "model.num_heads=2",
         "--set", "model.intermediate_size=64", "--set", "model.num_layers=1", "--set", "data.seq_len=32",
         "--set", "model.max_position_embeddings=32", "--set", "train.batch_size=8", "--set", "train.num_steps=8",
         "--set", "train.log_every_steps=4", "--set", "checkpoint.every_steps=0",
         "--set", "train.eval_every_steps=4", "--set", "train.eval_batches=1"]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_line_gives_step_rates_and_the_time_left():
    clock, out = Clock(), io.StringIO()
    bar = Progress(1000, 4096, enabled=True, stream=out, clock=clock, min_interval_s=0.5)
    bar.update(1)
    assert out.getvalue().endswith("step 1/1000 (0%)  compiling...")
    bar.start(1)
    clock.now += 10.0
    bar.update(41)  # 40 steps in 10 s: 4 steps/s, 16,384 tokens/s, 959 steps left: 3m59.75s
    assert out.getvalue().endswith("step 41/1000 (4%)  4.00 steps/s  16,384 tokens/s  ETA 4m00s")
    written = len(out.getvalue())
    clock.now += 0.1
    bar.update(42)  # within min_interval_s of the last drawing: not redrawn
    assert len(out.getvalue()) == written
    bar.clear()
    assert out.getvalue().endswith("\r\x1b[K")
    clock.now += 0.1
    bar.update(43)  # a cleared line is redrawn at once: 42 steps in 10.2 s, 957 left
    assert out.getvalue().endswith("step 43/1000 (4%)  4.12 steps/s  16,866 tokens/s  ETA 3m52s")
    assert [duration(s) for s in (0, 59.4, 61, 3725, 90061)] == ["0s", "59s", "1m01s", "1h02m05s", "25h01m01s"]


def test_a_disabled_line_writes_nothing():
    out = io.StringIO()
    bar = Progress(10, 1, enabled=False, stream=out)
    bar.start(1)
    for step in range(1, 11):
        bar.update(step)
    bar.close()
    assert out.getvalue() == ""


def _env():
    return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}


def _train_with_terminal_stderr(workdir, *extra) -> tuple[int, str, str]:
    """(exit status, stdout, what reached the terminal) of `pmi-jax train` with stderr on a pty."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, *TRAIN, "--workdir", workdir, *extra], stdout=subprocess.PIPE,
                               stderr=slave, cwd=ROOT, env=_env())
    os.close(slave)
    terminal = b""
    while True:  # drain the pty while the process runs (a full pty buffer would block it)
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        elif process.poll() is not None:
            break
    os.close(master)
    stdout = process.stdout.read().decode()
    return process.wait(timeout=600), stdout, terminal.decode(errors="replace")


def _log_steps(stdout: str) -> list[int]:
    return [int(s) for s in re.findall(r"^step (\d+)  loss=", stdout, re.M)]


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_on_a_terminal_unless_no_progress(tmp_path, quiet):
    status, stdout, terminal = _train_with_terminal_stderr(str(tmp_path / "run"), *(["--no-progress"] if quiet else []))
    assert status == 0, stdout + terminal
    assert _log_steps(stdout) == [4, 8], stdout  # the log lines go on as ever
    drawn = re.findall(r"step (\d+)/8 \(\d+%\)  [\d.]+ steps/s  [\d,]+ tokens/s  ETA \w+", terminal)
    if quiet:
        assert not drawn and "steps/s" not in terminal, terminal
    else:
        assert drawn and int(drawn[-1]) == 8, terminal
        assert "\r\x1b[K" in terminal


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    process = subprocess.run([sys.executable, *TRAIN, "--workdir", str(tmp_path / "run")], capture_output=True,
                             text=True, cwd=ROOT, env=_env(), timeout=600)
    assert process.returncode == 0, process.stdout + process.stderr
    assert _log_steps(process.stdout) == [4, 8]
    assert "ETA" not in process.stderr and "steps/s" not in process.stderr and "\r" not in process.stderr
