"""Two processes on localhost through jax.distributed train exactly like one process.

Each process owns 4 of the 8 CPU devices and feeds only its own rows of every global batch
(`jax.make_array_from_process_local_data`); gradients cross processes through XLA's CPU
collectives (gloo). The losses must equal those of one process with all 8 devices.
"""
import os
import socket
import subprocess
import sys

import numpy as np

from pmi_jax import metrics, train
from pmi_jax.cli.train import load_config
from pmi_jax.config import apply_overrides

OVERRIDES = ["model.vocab_size=128", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
             "model.num_layers=1", "model.max_position_embeddings=32", "data.seq_len=32", "train.batch_size=16",
             "train.num_steps=4", "train.log_every_steps=1", "optimizer.warmup_steps=2", "mesh.data=4",
             "mesh.model=2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _losses(workdir):
    records = metrics.read_metrics(os.path.join(workdir, train.TENSORBOARD_DIR))
    return [records[s]["loss"] for s in sorted(records)]


def test_two_processes_give_the_losses_of_one(tmp_path):
    config = apply_overrides(load_config("tiny"), OVERRIDES)
    single = str(tmp_path / "single")
    train.train(config, single, train.SyntheticBatches(128, 32, 16))

    workdir = str(tmp_path / "distributed")
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    cli = os.path.join(os.path.dirname(sys.executable), "pmi-jax")
    sets = [arg for o in OVERRIDES for arg in ("--set", o)]
    processes = [
        subprocess.Popen([cli, "train", "--config", "tiny", "--data", "synthetic", "--workdir", workdir, *sets,
                          "--coordinator-address", f"localhost:{port}", "--num-processes", "2", "--process-id",
                          str(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in processes]
    finally:
        for p in processes:
            p.kill()
    for p, out in zip(processes, outputs):
        assert p.returncode == 0, out[-3000:]
    assert "step 4 " in outputs[0] and "step 4 " not in outputs[1]  # metrics from process 0 only
    np.testing.assert_allclose(_losses(workdir), _losses(single), rtol=1e-6)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]
