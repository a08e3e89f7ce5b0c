"""Commands print their own output and real warnings; `--verbose` adds the libraries' start-up lines.

The end-to-end tests run the real `pmi-jax` entry point in a subprocess (the quiet set-up is the
process's: stderr's file descriptor and logging), on a tiny vocabulary and a tiny prepared corpus.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest

from pmi_jax.cli import quiet
from pmi_jax.formats import masking_vocab
from tests import prepared_data

# The lines the issue names, as they appear on a CPU-only machine.
START_UP_LINES = ("Could not find cuda drivers", "failed call to cuInit", "Unable to initialize backend",
                  "absl::InitializeLog", "Type handler registry")
_ENTRY = "import sys; from pmi_jax.cli import main; sys.exit(main())"


def _pmi_jax(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell has it (conftest sets it for this process)
    try:
        done = subprocess.run([sys.executable, "-c", _ENTRY, *args], capture_output=True, text=True, timeout=600,
                              env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"pmi-jax {' '.join(args)} hung; output so far:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"pmi-jax {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _start_up_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(s in line for s in START_UP_LINES)]


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    vocab = root / "vocab"
    vocab.mkdir()
    masking_vocab.write_vocabulary(str(vocab), "new york\nice cream\n",
                                   "new york\t2\t9\t3.25\nice cream\t2\t7\t2.5\n", {"measure": "pmi"})
    data = root / "data"
    prepared_data.write_prepared_corpus(str(data), sequences={"train": 20, "validation": 4}, seq_len=32)
    return str(vocab), str(data)


@pytest.mark.parametrize("command", ["vocab show", "data show"])
def test_commands_hide_start_up_lines_and_verbose_shows_them(tiny_inputs, command):
    vocab, data = tiny_inputs
    args = {"vocab show": ["vocab", "show", vocab], "data show": ["data", "show", "--data", data, "--scheme", "pmi"]}
    quiet_run = _pmi_jax(*args[command])
    verbose_run = _pmi_jax("--verbose", *args[command])
    assert quiet_run.stdout == verbose_run.stdout
    assert quiet_run.stdout.strip(), "the command's own output is shown"
    assert _start_up_lines(quiet_run.stderr) == [], quiet_run.stderr
    assert [line for line in quiet_run.stderr.splitlines() if quiet.is_noise(line.encode())] == []
    # On a machine where TensorFlow finds no CUDA driver (every CPU-only machine) it says so at
    # start-up, and --verbose must let that through.
    if not os.path.exists("/proc/driver/nvidia"):
        assert _start_up_lines(verbose_run.stderr), verbose_run.stderr


def _filtered(*writes: bytes) -> bytes:
    """What `_filter_loop` passes on when the given chunks are written to it."""
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    thread = threading.Thread(target=quiet._filter_loop, args=(read_in, write_out))
    thread.start()
    for chunk in writes:
        os.write(write_in, chunk)
    os.close(write_in)
    thread.join(timeout=60)
    assert not thread.is_alive()
    os.close(write_out)
    with os.fdopen(read_out, "rb") as f:
        out = f.read()
    os.close(read_in)
    return out


def test_stderr_filter_drops_start_up_chatter_and_keeps_the_rest():
    noise = (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
             b"I0000 00:00:1795386550.013694   19438 cudart_stub.cc:31] Could not find cuda drivers on your "
             b"machine, GPU will not be used.\n"
             b"E0000 00:00:1795386272.491676   14073 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA "
             b"error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
             b"I0000 00:00:1.5   7 local_rendezvous.cc:405] Local rendezvous is aborting\n")
    kept = (b"wrote 50 pmi examples to out.jsonl\n"
            b"E0000 00:00:1.5   7 some_kernel.cc:12] Out of memory while allocating 3 GiB\n"
            b"F0000 00:00:1.5   7 check.cc:1] Check failed: x > 0\n"
            b"Traceback (most recent call last):\n")
    assert _filtered(noise[:50], noise[50:] + kept[:20], kept[20:]) == kept
    # A progress bar redraws with \r and no newline: it is passed on without waiting for one.
    assert _filtered(b"\rshards: 1/4", b"\rshards: 2/4") == b"\rshards: 1/4\rshards: 2/4"
    assert _filtered(b"no newline at the end") == b"no newline at the end"


def _passes(name: str, level: int, message: str) -> bool:
    return quiet._QuietFilter().filter(logging.LogRecord(name, level, __file__, 1, message, (), None))


def test_logging_filter_keeps_own_messages_and_real_warnings():
    assert _passes("root", logging.INFO, "3-gram counts spilled to disk 1 times")
    assert _passes("pmi_jax.train", logging.INFO, "step 100")
    assert _passes("pmi_jax.preprocess.corpus.prepare", logging.INFO, "shard 3 done")
    assert _passes("absl", logging.WARNING, "a checkpoint could not be deleted")
    assert not _passes("jax._src.xla_bridge", logging.INFO, "Unable to initialize backend 'tpu': not found")
    assert not _passes("jax._src.xla_bridge", logging.WARNING,
                       "An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed.")
    assert not _passes("absl", logging.WARNING, 'Type handler registry type "Array" overriding array')
    assert not _passes("absl", logging.INFO, "Checkpoint manager created")


def test_filter_outlives_signals_to_the_process_group():
    """SIGINT / SIGTERM go to the whole group: the command may catch them and still print."""
    code = (
        "import os, signal, sys\n"
        "from pmi_jax.cli import quiet\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"
        "signal.signal(signal.SIGINT, lambda *a: None)\n"
        "f = quiet.filter_stderr()\n"
        "os.killpg(os.getpgrp(), signal.SIGTERM)\n"
        "os.killpg(os.getpgrp(), signal.SIGINT)\n"
        "import time; time.sleep(0.5)\n"
        "sys.stderr.write('I0000 00:00:1.5   7 cudart_stub.cc:31] Could not find cuda drivers\\n')\n"
        "sys.stderr.write('checkpoint saved at step 7\\n')\n"
        "f.close()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "checkpoint saved at step 7\n"


def test_commands_that_read_checkpoints_hide_orbaxs_read_only_narration(tmp_path, caplog, monkeypatch):
    """eval, compare and export open checkpoints read-only; Orbax then warns that it changes the
    options of a read-only manager, which is routine, not something for the user to act on."""
    import numpy as np

    from pmi_jax import checkpoints
    from pmi_jax.config import CheckpointConfig

    absl_logger = logging.getLogger("absl")
    # From absl's default; an earlier in-process command of the test session may have quieted it.
    monkeypatch.setattr(absl_logger, "level", logging.NOTSET)  # restored after the test
    writer = checkpoints.Checkpointer(str(tmp_path), CheckpointConfig(every_steps=1, keep=2))
    writer.save(1, {"w": np.arange(4.0)}, {"step": 1})
    writer.wait()
    writer.close()

    def read_only_warnings() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            checkpoints.Checkpointer(str(tmp_path), CheckpointConfig(), read_only=True).close()
        return [r.getMessage() for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING]

    # pmi_jax.checkpoints drops Orbax's narration of read-only managers (a resumed `train` opens
    # one too), and these commands keep absl to errors besides.
    assert read_only_warnings() == []
    quiet.quiet_checkpoint_reads()
    assert read_only_warnings() == []
