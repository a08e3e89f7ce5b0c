"""Two processes on localhost through jax.distributed train exactly like one process.

Each process owns 4 of the 8 CPU devices and feeds only its own rows of every global batch
(`jax.make_array_from_process_local_data`); gradients cross processes through XLA's CPU
collectives (gloo). The losses must equal those of one process with all 8 devices.
"""
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from pmi_jax import batches, train
from pmi_jax.formats import run_dir
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides

OVERRIDES = ["model.vocab_size=128", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
             "model.num_layers=1", "model.max_position_embeddings=32", "data.seq_len=32", "train.batch_size=16",
             "train.num_steps=4", "train.log_every_steps=1", "optimizer.warmup_steps=2", "mesh.data=4",
             "mesh.model=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# Two processes that each import JAX and compile the step share a loaded 2-core machine with
# everything else: minutes are normal there. A hung process (a peer died, a barrier never met)
# is killed at the deadline and the test fails with both processes' output.
PROCESS_TIMEOUT_S = 1200


def _wait_all(processes, logs, timeout_s, expected=None):
    """Wait for every process; fail with all their output, after killing the rest, as soon as
    one exits with an error (its peers would wait for it forever) or the deadline passes.
    `expected`: each process's exit status, where not all are 0."""
    expected = expected or [0] * len(processes)
    deadline = time.monotonic() + timeout_s
    problem = None
    try:
        while problem is None and any(p.poll() is None for p in processes):
            if any(p.poll() not in (None, status) for p, status in zip(processes, expected)):
                problem = "a process failed"
            elif time.monotonic() > deadline:
                problem = f"processes still running after {timeout_s} s"
            else:
                time.sleep(0.5)
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    if problem is None and [p.returncode for p in processes] == expected:
        return [log.read_text() for log in logs]
    tails = "\n".join(f"--- process {i} (exit {p.returncode}):\n{log.read_text()[-3000:]}"
                      for i, (p, log) in enumerate(zip(processes, logs)))
    pytest.fail(f"{problem or 'a process failed'}; all killed:\n{tails}")


def _wait_for_text(log, text, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{log} never showed {text!r}"
        time.sleep(0.2)


def test_a_hung_or_failed_process_fails_the_test_with_every_output(tmp_path):
    """The harness itself: a process that never ends, or one that fails while its peer waits
    for it, ends the test with both outputs instead of hanging the suite."""
    scripts = ["print('waiting for my peer', flush=True); import time; time.sleep(600)",
               "print('I give up', flush=True); raise SystemExit(3)"]
    logs = [tmp_path / f"p{i}.log" for i in range(2)]
    processes = []
    for script, log in zip(scripts, logs):
        with open(log, "w") as out:
            processes.append(subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT))
    _wait_for_text(logs[0], "waiting for my peer")  # started, however loaded the machine
    with pytest.raises(pytest.fail.Exception) as failure:
        _wait_all(processes, logs, timeout_s=300)
    message = str(failure.value)
    assert "waiting for my peer" in message and "I give up" in message and "(exit 3)" in message
    assert all(p.poll() is not None for p in processes)

    logs = logs[:1]
    with open(logs[0], "w") as out:
        processes = [subprocess.Popen([sys.executable, "-c", scripts[0]], stdout=out, stderr=subprocess.STDOUT)]
    _wait_for_text(logs[0], "waiting for my peer")
    with pytest.raises(pytest.fail.Exception, match=r"still running after 2 s(.|\n)*waiting for my peer"):
        _wait_all(processes, logs, timeout_s=2)


def _losses(workdir):
    records = run_dir.read_metrics(os.path.join(workdir, run_dir.TENSORBOARD_DIR))
    return [records[s]["loss"] for s in sorted(records)]


def test_two_processes_give_the_losses_of_one(tmp_path):
    config = apply_overrides(load_config("tiny"), OVERRIDES)
    single = str(tmp_path / "single")
    train.train(config, single, batches.SyntheticBatches(128, 32, 16))

    workdir = str(tmp_path / "distributed")
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    cli = os.path.join(os.path.dirname(sys.executable), "pmi-jax")
    sets = [arg for o in OVERRIDES for arg in ("--set", o)]
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    processes = []
    for i, log in enumerate(logs):
        with open(log, "w") as out:  # a file, not a pipe: readable after a kill, never blocks the child
            processes.append(subprocess.Popen(
                [cli, "train", "--config", "tiny", "--data", "synthetic", "--workdir", workdir, *sets,
                 "--coordinator-address", f"localhost:{port}", "--num-processes", "2", "--process-id", str(i)],
                env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
    outputs = _wait_all(processes, logs, PROCESS_TIMEOUT_S)  # exit 0 each, or the test fails with both outputs
    assert "step 4 " in outputs[0] and "step 4 " not in outputs[1]  # metrics from process 0 only
    np.testing.assert_allclose(_losses(workdir), _losses(single), rtol=1e-6)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the stderr filter a `pmi-jax` command forks)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if parent == pid:
            found.append(int(entry))
    return found


# `pmi-jax ARGS` as the installed program runs it (stderr filtered through a forked process),
# from this checkout (PYTHONPATH), not from whichever copy the virtual environment installed.
_PROGRAM = "import sys; from pmi_jax.cli import main; sys.argv[0] = 'pmi-jax'; sys.exit(main())"


def _start_two(workdir, logs, *overrides):
    """Both processes of a 2-process `pmi-jax train` run on the synthetic corpus, their output in `logs`."""
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=os.pathsep.join(sys.path))
    sets = [arg for o in [*OVERRIDES, *overrides] for arg in ("--set", o)]
    processes = []
    for i, log in enumerate(logs):
        with open(log, "w") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-c", _PROGRAM, "train", "--config", "tiny", "--data", "synthetic", "--workdir",
                 str(workdir), *sets, "--coordinator-address", f"localhost:{port}", "--num-processes", "2",
                 "--process-id", str(i)], env=env, stdout=out, stderr=subprocess.STDOUT, text=True))
    return processes


@pytest.mark.parametrize("signame, receiver", [("SIGTERM", "stderr filter"), ("SIGINT", "command")])
def test_a_signal_to_one_process_checkpoints_every_process(tmp_path, signame, receiver):
    """A scheduler (or `pkill -n pmi-jax`) signals one process of a run: here process 1, through
    its stderr filter (which passes the signal on) or directly. jax.distributed's preemption
    service tells process 0; both stop at the same step and save that one checkpoint together
    (on this CPU mesh process 0's devices hold a whole replica, so it writes every array).
    SIGTERM: both exit 0, and the same command resumes from the checkpoint. SIGINT, which
    process 1 hands to the service as a SIGTERM: process 1 exits 130, process 0 exits 0."""
    import signal

    workdir = tmp_path / "distributed"
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    processes = _start_two(workdir, logs, "train.num_steps=100000", "checkpoint.every_steps=1000")
    try:
        _wait_for_text(logs[0], "step 2 ", timeout_s=PROCESS_TIMEOUT_S)
        (stderr_filter,) = _children(processes[1].pid)
        os.kill(stderr_filter if receiver == "stderr filter" else processes[1].pid, getattr(signal, signame))
    except BaseException:
        for p in processes:
            p.kill()
        raise
    interrupted = signame == "SIGINT"
    outputs = _wait_all(processes, logs, PROCESS_TIMEOUT_S, expected=[0, 130 if interrupted else 0])
    ends = ["preempted", "interrupted" if interrupted else "preempted"]
    steps = [int(out.split(f"pmi-jax train: {end} at step ")[1].split(";")[0]) for out, end in zip(outputs, ends)]
    assert steps[0] == steps[1] and 2 <= steps[0] < 100000, outputs
    assert all(f"{end}: saved checkpoint at step {steps[0]}" in out for out, end in zip(outputs, ends)), outputs
    # (A SIGTERM is taken by the preemption service itself; a SIGINT first by the trainer, which says so.)
    assert not interrupted or "SIGINT received" in outputs[1], outputs[1]
    assert os.listdir(workdir / "checkpoints") == [str(steps[0])]
    assert "commit_success.txt" in os.listdir(workdir / "checkpoints" / str(steps[0]) / "state")
    if interrupted:
        return
    # The checkpoint is whole: both processes resume from it and finish one more step.
    processes = _start_two(workdir, logs, f"train.num_steps={steps[0] + 1}")
    outputs = _wait_all(processes, logs, PROCESS_TIMEOUT_S)
    assert f"starting at step {steps[0]}" in outputs[0] and f"step {steps[0] + 1} " in outputs[0], outputs[0]
    assert sorted(os.listdir(workdir / "checkpoints")) == sorted([str(steps[0]), str(steps[0] + 1)])
