"""gcs/ cloud tooling: every script's --help and --dry-run, the exact commands it would run,
quoting of hostile values, and a real (non-dry) run against a stand-in `gcloud`.

The stand-in `gcloud` (written below) records each argv and acts like the real one where a
script depends on the effect: `storage cp/cat/objects describe` work on a local folder that
plays the bucket, and `compute tpus tpu-vm ssh --command C` runs C with bash in a fake home
directory once per worker, so the remote command string is executed by a real shell.
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GCS = ROOT / "gcs"
SCRIPTS = sorted(p.name for p in GCS.glob("*.sh") if p.name != "common.sh")
STEPS = ["create_bucket.sh", "upload_corpus.sh", "create_tpu.sh", "install.sh", "run_all.sh",
         "follow_logs.sh", "relaunch.sh", "delete_tpu.sh"]

SETTINGS = {
    "PROJECT": "my-project",
    "REGION": "us-central2",
    "ZONE": "us-central2-b",
    "BUCKET": "my-bucket",
    "TPU_NAME": "pmi-v4-32",
    "ACCELERATOR_TYPE": "v4-32",
    "RUNTIME_VERSION": "tpu-ubuntu2204-base",
    "RUN_NAME": "bert-base-pmi",
}
TRAIN = ["pmi-jax", "train", "--config", "base", "--data", "gs://my-bucket/prepared/owt",
         "--scheme", "pmi", "--workdir", "gs://my-bucket/runs/bert-base-pmi"]


def write_env(path: pathlib.Path, **overrides: str) -> pathlib.Path:
    values = {**SETTINGS, **overrides}
    quoted = {k: f'"{v}"' if "'" in v else f"'{v}'" for k, v in values.items()}
    path.write_text("".join(f"{key}={value}\n" for key, value in quoted.items()))
    return path


@pytest.fixture
def env_file(tmp_path):
    return write_env(tmp_path / "env")


def run_script(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(GCS / name), *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=ROOT)


def dry_run(name: str, env_file: pathlib.Path, *args: str) -> list[list[str]]:
    """The argv of each command the script prints, parsed as a shell would."""
    result = run_script(name, "--env", str(env_file), "--dry-run", *args)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines()]


def option(argv: list[str], name: str) -> str:
    values = [a[len(name) + 1:] for a in argv if a.startswith(name + "=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def remote_words(argv: list[str]) -> list[str]:
    """The words of the command string an ssh call runs on the workers."""
    return shlex.split(option(argv, "--command"))


def after_double_dash(words: list[str]) -> list[str]:
    return words[words.index("--") + 1:]


# --- every script ---------------------------------------------------------------------------

def test_every_issue_step_has_a_script():
    assert set(STEPS) <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_explains_the_script_without_a_settings_file(name):
    result = run_script(name, "--help", env={**os.environ, "PMI_JAX_GCS_ENV": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: gcs/{name}")
    assert "--dry-run" in result.stdout


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck", path=f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run([shellcheck, *sorted(str(p) for p in GCS.glob("*.sh"))],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the commands each step runs ----------------------------------------------------------

def test_create_bucket(env_file):
    assert dry_run("create_bucket.sh", env_file) == [[
        "gcloud", "storage", "buckets", "create", "gs://my-bucket", "--project=my-project",
        "--location=us-central2", "--uniform-bucket-level-access"]]


def test_upload_corpus_copies_recursively_into_the_named_folder(env_file, tmp_path):
    (tmp_path / "wiki").mkdir()
    (tmp_path / "books.txt").write_text("a\n")
    [argv] = dry_run("upload_corpus.sh", env_file, "--name", "wiki-books", str(tmp_path / "wiki"),
                     str(tmp_path / "books.txt"))
    assert argv == ["gcloud", "storage", "cp", "--recursive", str(tmp_path / "wiki"),
                    str(tmp_path / "books.txt"), "gs://my-bucket/corpora/wiki-books/"]


def test_upload_corpus_refuses_a_missing_path(env_file, tmp_path):
    result = run_script("upload_corpus.sh", "--env", str(env_file), "--dry-run", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "nope: no such file or directory" in result.stderr


@pytest.mark.parametrize("accelerator", ["v4-8", "v4-32"])
def test_create_tpu_single_host_and_pod_slice(tmp_path, accelerator):
    env = write_env(tmp_path / "env", ACCELERATOR_TYPE=accelerator)
    [argv] = dry_run("create_tpu.sh", env)
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pmi-v4-32"]
    assert option(argv, "--accelerator-type") == accelerator
    assert option(argv, "--version") == "tpu-ubuntu2204-base"
    assert option(argv, "--zone") == "us-central2-b"
    assert option(argv, "--project") == "my-project"
    assert "--spot" not in argv and "--preemptible" not in argv


@pytest.mark.parametrize("setting, flag, expected", [
    ("spot", None, "--spot"), ("preemptible", None, "--preemptible"),
    ("on-demand", "--spot", "--spot"), ("spot", "--on-demand", None)])
def test_create_tpu_capacity_from_settings_or_flag(tmp_path, setting, flag, expected):
    env = write_env(tmp_path / "env", PROVISIONING=setting)
    [argv] = dry_run("create_tpu.sh", env, *([flag] if flag else []))
    assert [a for a in argv if a in ("--spot", "--preemptible")] == ([expected] if expected else [])


def test_install_ships_the_checkout_and_pip_installs_with_constraints_on_every_worker(env_file):
    archive, scp, ssh = dry_run("install.sh", env_file)
    assert archive[:4] == ["git", "-C", str(ROOT), "archive"] and archive[-1] == "HEAD"
    tarball = option(archive, "--output")
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert scp[5:7] == [tarball, "pmi-v4-32:pmi-jax-src.tar.gz"]
    assert option(scp, "--worker") == "all" and option(ssh, "--worker") == "all"
    steps = " ".join(remote_words(ssh)).split(" && ")
    assert "sudo add-apt-repository -y ppa:deadsnakes/ppa" in steps
    assert "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.12 python3.12-venv" in steps
    assert "python3.12 -m venv .venv" in steps
    assert "tar -xzf pmi-jax-src.tar.gz -C pmi-jax" in steps
    assert ".venv/bin/pip install --quiet -c constraints.txt -e .[tpu]" in steps


def test_install_from_a_repository_url(tmp_path):
    env = write_env(tmp_path / "env", REPO_URL="https://example.org/pmi-jax.git", REPO_REF="v1.0")
    [ssh] = dry_run("install.sh", env)
    steps = " ".join(remote_words(ssh)).split(" && ")
    assert "git clone --quiet https://example.org/pmi-jax.git pmi-jax" in steps
    assert "git -C pmi-jax checkout --quiet v1.0" in steps


def test_run_all_starts_the_same_command_on_every_worker_detached(env_file):
    [argv] = dry_run("run_all.sh", env_file, "--", *TRAIN)
    assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pmi-v4-32"]
    assert option(argv, "--worker") == "all"
    words = remote_words(argv)
    assert words[:3] == ["cd", "pmi-jax", "&&"]
    assert words[3:5] == ["nohup", "setsid"] and words[-1] == "&"
    assert words[words.index("--log-uri") + 1] == "gs://my-bucket/logs/bert-base-pmi"
    assert after_double_dash(words)[:len(TRAIN)] == TRAIN


def test_run_all_foreground_on_one_worker(env_file):
    [argv] = dry_run("run_all.sh", env_file, "--worker", "0", "--foreground", "--run", "smoke",
                     "--", "python", "-c", "import jax; print(jax.device_count())")
    assert option(argv, "--worker") == "0"
    words = remote_words(argv)
    assert "nohup" not in words and words[-1] != "&"
    assert words[words.index("--log-uri") + 1] == "gs://my-bucket/logs/smoke"
    assert after_double_dash(words) == ["python", "-c", "import jax; print(jax.device_count())"]


def test_follow_logs_reads_the_bucket_copy_or_tails_live(env_file):
    describe, cat = dry_run("follow_logs.sh", env_file, "--worker", "2")
    uri = "gs://my-bucket/logs/bert-base-pmi/worker-2.log"
    assert describe == ["gcloud", "storage", "objects", "describe", uri, "--format=value(size)"]
    assert cat == ["gcloud", "storage", "cat", "--range=0-", uri]
    [ssh] = dry_run("follow_logs.sh", env_file, "--live", "--run", "smoke")
    assert option(ssh, "--worker") == "0"
    assert remote_words(ssh) == ["tail", "-n", "200", "-F", "pmi-jax-logs/smoke/worker-0.log"]


def test_delete_tpu(env_file):
    assert dry_run("delete_tpu.sh", env_file) == [[
        "gcloud", "compute", "tpus", "tpu-vm", "delete", "pmi-v4-32", "--project=my-project",
        "--zone=us-central2-b", "--quiet"]]


def test_worker_run_dry_run_names_the_log_by_worker_index(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "TPU_WORKER_ID": "2"}
    result = run_script("worker_run.sh", "--dry-run", "--log-uri", "gs://b/logs/r", "--",
                        "pmi-jax", "train", "--workdir", "gs://b/w", env=env)
    assert result.returncode == 0, result.stderr
    fetch, command, upload = (shlex.split(line) for line in result.stdout.splitlines())
    local_log = f"{tmp_path}/pmi-jax-logs/r/worker-2.log"
    assert fetch == ["gcloud", "storage", "cp", "--quiet", "gs://b/logs/r/worker-2.log", local_log]
    assert command == ["pmi-jax", "train", "--workdir", "gs://b/w"]
    assert upload == ["gcloud", "storage", "cp", "--quiet", local_log, "gs://b/logs/r/worker-2.log"]


# --- relaunch after preemption ----------------------------------------------------------------

def command_kinds(commands: list[list[str]]) -> list[str]:
    kinds = []
    for argv in commands:
        if argv[0] == "git":
            kinds.append("archive")
        elif argv[3] == "tpu-vm" and argv[4] == "ssh":
            kinds.append("run" if "gcs/worker_run.sh" in remote_words(argv) else "install")
        else:
            kinds.append(argv[4])  # describe, delete, create, scp
    return kinds


def test_relaunch_after_preemption_recreates_installs_and_resumes_the_same_command(env_file):
    commands = dry_run("relaunch.sh", env_file, "--state", "PREEMPTED", "--spot", "--", *TRAIN)
    assert command_kinds(commands) == ["delete", "create", "archive", "scp", "install", "run"]
    assert "--spot" in commands[1]
    words = remote_words(commands[-1])
    resumed = after_double_dash(words)[:len(TRAIN)]
    assert resumed == TRAIN  # the same --workdir: the trainer resumes from its last checkpoint
    assert resumed[resumed.index("--workdir") + 1] == "gs://my-bucket/runs/bert-base-pmi"
    assert option(commands[-1], "--worker") == "all"


def test_relaunch_dry_run_queries_the_state_then_assumes_preemption(env_file):
    commands = dry_run("relaunch.sh", env_file, "--", *TRAIN)
    assert command_kinds(commands)[:3] == ["describe", "delete", "create"]
    assert option(commands[0], "--format") == "value(state)"


@pytest.mark.parametrize("state, kinds", [
    ("READY", ["run"]), ("NOT_FOUND", ["create", "archive", "scp", "install", "run"])])
def test_relaunch_other_states(env_file, state, kinds):
    commands = dry_run("relaunch.sh", env_file, "--state", state, "--run", "r2", "--", *TRAIN)
    assert command_kinds(commands) == kinds
    assert "gs://my-bucket/logs/r2" in remote_words(commands[-1])


@pytest.mark.parametrize("args, message", [
    (["--state", "CREATING"], "is CREATING"),
    (["--state", "READY", "--", "pmi-jax", "train", "--config", "base"], "has no --workdir"),
    (["--state", "READY", "--", "pmi-jax", "train", "--workdir", "/tmp/run"], "must be a gs:// URL"),
])
def test_relaunch_refuses_what_cannot_resume(env_file, args, message):
    if "--" not in args:
        args = [*args, "--", *TRAIN]
    result = run_script("relaunch.sh", "--env", str(env_file), "--dry-run", *args)
    assert result.returncode == 2
    assert message in result.stderr


# --- settings file and quoting ----------------------------------------------------------------

HOSTILE = "my bucket;$(touch {marker})`touch {marker}`"


def test_hostile_values_are_printed_literally_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    bucket, tpu = HOSTILE.format(marker=marker), "tpu 'one' two"
    env = write_env(tmp_path / "env", BUCKET=bucket, TPU_NAME=tpu)
    [argv] = dry_run("create_bucket.sh", env)
    assert argv[4] == f"gs://{bucket}"
    for name in ("create_tpu.sh", "delete_tpu.sh"):
        [argv] = dry_run(name, env)
        assert argv[5] == tpu
    [argv] = dry_run("run_all.sh", env, "--", *TRAIN)
    assert argv[5] == tpu
    words = remote_words(argv)
    assert words[words.index("--log-uri") + 1] == f"gs://{bucket}/logs/bert-base-pmi"
    _, cat = dry_run("follow_logs.sh", env)
    assert cat[-1] == f"gs://{bucket}/logs/bert-base-pmi/worker-0.log"
    commands = dry_run("relaunch.sh", env, "--", *TRAIN)
    assert all(tpu in argv or f"{tpu}:pmi-jax-src.tar.gz" in argv for argv in commands if argv[0] == "gcloud")
    assert not marker.exists()


def test_settings_file_is_read_literally(tmp_path):
    env = tmp_path / "env"
    env.write_text(textwrap.dedent("""\
        # a comment
        PROJECT="p"   # trailing comment
        export ZONE='z'
        REGION=r
        BUCKET="$HOME/b"
        """))
    [argv] = dry_run("create_bucket.sh", env)
    assert argv[4] == "gs://$HOME/b"
    assert option(argv, "--location") == "r" and option(argv, "--project") == "p"


@pytest.mark.parametrize("line, message", [
    ("API_KEY='x'", "unknown setting API_KEY"),
    ("BUCKET=two words", "must be quoted"),
    ("PROVISIONING='cheap'", "expected on-demand, spot or preemptible"),
    ("REMOTE_DIR='../home'", "expected a plain directory name"),
    ("not a setting", "expected KEY=\"value\""),
])
def test_bad_settings_are_refused_with_the_line(tmp_path, line, message):
    env = write_env(tmp_path / "env")
    env.write_text(env.read_text() + line + "\n")
    result = run_script("create_bucket.sh", "--env", str(env), "--dry-run")
    assert result.returncode == 2
    assert message in result.stderr and result.stdout == ""


def test_missing_settings_file_says_what_to_do(tmp_path):
    result = run_script("create_bucket.sh", "--env", str(tmp_path / "absent"), "--dry-run")
    assert result.returncode == 2
    assert "gcs/env.example" in result.stderr


def test_env_example_is_a_valid_settings_file_without_secrets():
    text = (GCS / "env.example").read_text()
    assert not any(word in text.upper() for word in ("PASSWORD", "TOKEN", "API_KEY", "SECRET="))
    [argv] = dry_run("create_tpu.sh", GCS / "env.example")
    assert option(argv, "--accelerator-type") == "v4-32"


# --- a real run against the stand-in gcloud -----------------------------------------------------

FAKE_GCLOUD = r'''
import json, os, pathlib, subprocess, sys

args = sys.argv[1:]
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
bucket_root = pathlib.Path(os.environ["FAKE_BUCKETS"])

def local(uri):
    return bucket_root / uri[len("gs://"):] if uri.startswith("gs://") else pathlib.Path(uri)

positional = [a for a in args if not a.startswith("-")]
if positional[:2] == ["storage", "cp"]:
    src, dst = local(positional[2]), local(positional[3])
    if not src.exists():
        sys.exit(1)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
elif positional[:3] == ["storage", "objects", "describe"]:
    path = local(positional[3])
    if not path.exists():
        sys.exit(1)
    print(path.stat().st_size)
elif positional[:2] == ["storage", "cat"]:
    start = int(next(a for a in args if a.startswith("--range="))[len("--range="):].rstrip("-"))
    sys.stdout.buffer.write(local(positional[2]).read_bytes()[start:])
elif positional[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    workers = range(int(os.environ["FAKE_WORKERS"])) if opts["worker"] == "all" else [int(opts["worker"])]
    for worker in workers:
        env = {**os.environ, "TPU_WORKER_ID": str(worker)}
        status = subprocess.run(["bash", "-c", opts["command"]], cwd=os.environ["HOME"], env=env).returncode
        if status:
            sys.exit(status)
'''


@pytest.fixture
def fake_cloud(tmp_path):
    """PATH with the stand-in gcloud, a home whose pmi-jax/ is this checkout, a local bucket."""
    bin_dir, home, buckets = tmp_path / "bin", tmp_path / "home", tmp_path / "buckets"
    for d in (bin_dir, home, buckets):
        d.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f"#!{sys.executable}\n{FAKE_GCLOUD}")
    gcloud.chmod(0o755)
    (home / "pmi-jax").symlink_to(ROOT)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home),
           "FAKE_GCLOUD_LOG": str(tmp_path / "gcloud.jsonl"), "FAKE_BUCKETS": str(buckets),
           "FAKE_WORKERS": "2"}
    env.pop("TPU_WORKER_ID", None)
    return env


def recorded(env) -> list[list[str]]:
    path = pathlib.Path(env["FAKE_GCLOUD_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_real_run_executes_exactly_the_printed_commands(tmp_path, fake_cloud):
    env_file = write_env(tmp_path / "env", TPU_NAME="tpu 'one' two")
    printed = dry_run("create_tpu.sh", env_file, "--spot")
    result = run_script("create_tpu.sh", "--env", str(env_file), "--spot", env=fake_cloud)
    assert result.returncode == 0, result.stderr
    assert [["gcloud", *argv] for argv in recorded(fake_cloud)] == printed


def test_run_all_on_two_workers_delivers_arguments_verbatim_and_logs_to_the_bucket(tmp_path, fake_cloud):
    marker = tmp_path / "pwned"
    bucket = HOSTILE.format(marker=marker)
    env_file = write_env(tmp_path / "env", BUCKET=bucket)
    hostile_arg = f"x y;$(touch {marker}) 'q' \"d\" $HOME"
    program = "import sys; print('ARGS', sys.argv[1:])"
    result = run_script("run_all.sh", "--env", str(env_file), "--foreground", "--run", "smoke", "--",
                        sys.executable, "-c", program, hostile_arg, env=fake_cloud)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    expected = f"ARGS {[hostile_arg]!r}"
    for worker in (0, 1):
        local_log = pathlib.Path(fake_cloud["HOME"]) / "pmi-jax-logs" / "smoke" / f"worker-{worker}.log"
        bucket_log = pathlib.Path(fake_cloud["FAKE_BUCKETS"]) / bucket / "logs" / "smoke" / f"worker-{worker}.log"
        assert expected in local_log.read_text().splitlines()
        assert bucket_log.read_text() == local_log.read_text()
        assert bucket_log.read_text().rstrip().endswith("exit status 0")

    follow = run_script("follow_logs.sh", "--env", str(env_file), "--run", "smoke", "--worker", "1",
                        "--once", env=fake_cloud)
    assert follow.returncode == 0, follow.stderr
    assert expected in follow.stdout.splitlines()


def test_worker_run_passes_on_the_exit_status_and_continues_the_bucket_log(tmp_path, fake_cloud):
    env_file = write_env(tmp_path / "env")
    failing = ["--", sys.executable, "-c", "print('first launch'); raise SystemExit(3)"]
    result = run_script("run_all.sh", "--env", str(env_file), "--foreground", "--worker", "0",
                        "--run", "r", *failing, env=fake_cloud)
    assert result.returncode == 3
    # A relaunch on a fresh VM (empty home) starts from the bucket's copy of the log.
    shutil.rmtree(pathlib.Path(fake_cloud["HOME"]) / "pmi-jax-logs")
    result = run_script("run_all.sh", "--env", str(env_file), "--foreground", "--worker", "0",
                        "--run", "r", "--", sys.executable, "-c", "print('second launch')", env=fake_cloud)
    assert result.returncode == 0, result.stderr
    text = (pathlib.Path(fake_cloud["FAKE_BUCKETS"]) / "my-bucket" / "logs" / "r" / "worker-0.log").read_text()
    assert text.index("first launch") < text.index("exit status 3") < text.index("second launch")
