"""slurm/pretrain.sbatch: valid bash, one task per GPU, and the exact command its dry run prints
is one that `pmi-jax train`'s parser accepts, with the user's arguments passed through."""
import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

from pmi_jax.cli import build_parser

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "slurm" / "pretrain.sbatch"


def _run(env_extra, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("DATA", "WORKDIR", "CONFIG", "SCHEME", "PMI_JAX")}
    return subprocess.run(["bash", str(SCRIPT), *args], env={**env, **env_extra}, capture_output=True, text=True,
                          timeout=60)


def test_script_parses_and_launches_one_process_per_gpu():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", SCRIPT.read_text(), re.M))
    # jax.distributed.initialize() under SLURM gives each process the GPU of its SLURM_LOCALID.
    assert directives["ntasks-per-node"] == directives["gpus-per-node"]
    assert directives["signal"].startswith("TERM@")  # the trainer checkpoints on SIGTERM


def test_dry_run_prints_the_srun_command_that_pmi_jax_train_accepts():
    proc = _run({"DRY_RUN": "1", "DATA": "/shared/prepared corpus", "WORKDIR": "/shared/runs/base-pmi",
                 "PMI_JAX": "/opt/venv/bin/pmi-jax"}, "--set", "train.batch_size=512", "model.attention_dropout_rate=0")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[:3] == ["srun", "--kill-on-bad-exit=1", "--cpu-bind=none"]
    assert argv[3] == "/opt/venv/bin/pmi-jax"
    args = build_parser().parse_args(argv[4:])
    assert (args.config, args.data, args.scheme, args.workdir) == (
        "base", "/shared/prepared corpus", "pmi", "/shared/runs/base-pmi")
    assert args.overrides == ["train.batch_size=512"]
    assert args.positional_overrides == ["model.attention_dropout_rate=0"]


def test_missing_data_or_workdir_is_refused_by_name():
    proc = _run({"DRY_RUN": "1", "WORKDIR": "/w"})
    assert proc.returncode != 0 and "DATA" in proc.stderr
    proc = _run({"DRY_RUN": "1", "DATA": "/d"})
    assert proc.returncode != 0 and "WORKDIR" in proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_is_clean():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
