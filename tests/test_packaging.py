"""The wheel as a user installs it: only pmi_jax at the top of site-packages, every config inside,
and the commands working from a fresh virtual environment outside the checkout.

The wheel is built from a copy of the sources (the checkout stays clean); the fresh environment
gets its dependencies from this interpreter's site-packages through a .pth line (offline, fast),
while pmi_jax itself comes from the wheel only: the checkout is never on its path.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("setup.py", "pmi_jax", "preprocess", "configs")
# Installed name -> repository folder: the table of setup.py and pmi_jax/_source_tree.py.
SUBPACKAGES = {"pmi_jax/preprocess": "preprocess", "pmi_jax/configs": "configs"}


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{argv} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--disable-pip-version-check", "-q", "-w", str(dist), str(src)])
    (built,) = dist.glob("pmi_jax-*.whl")
    return built


def test_the_wheel_holds_only_the_project_at_its_top(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"pmi_jax", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, sorted(tops)


def test_every_config_and_stage_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"{installed}/{path.relative_to(ROOT / folder).as_posix()}"
                for installed, folder in SUBPACKAGES.items() for path in (ROOT / folder).rglob("*.py")}
    assert "pmi_jax/configs/experiments/paper.py" in expected and "pmi_jax/preprocess/vocab/build_vocab.py" in expected
    assert expected - names == set()


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """(bin folder, environment) of a fresh venv holding the wheel, run from outside the checkout."""
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)])
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # The dependencies: this interpreter's site-packages, appended after the venv's own (so the
    # wheel's pmi_jax comes first; .pth files there, e.g. an editable install's, are not run).
    pathlib.Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS", "PYTHONHOME")}
    env.update(PYTHONHASHSEED="0", TF_CPP_MIN_LOG_LEVEL="2")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q",
          str(wheel)], env=env, cwd=venv)
    found = _run([str(python), "-c", "import pmi_jax.preprocess, pmi_jax.configs; "
                  "print(pmi_jax.preprocess.__file__, pmi_jax.configs.__file__)"], env=env, cwd=venv).stdout
    assert found.count(str(venv)) == 2 and str(ROOT) not in found, found
    return venv / "bin", env


def test_help_runs_from_the_installed_wheel(installed, tmp_path):
    bin_dir, env = installed
    out = _run([str(bin_dir / "pmi-jax"), "--help"], env=env, cwd=tmp_path).stdout
    assert "vocab" in out and "train" in out


def test_a_named_experiment_config_trains_from_the_installed_wheel(installed, tmp_path):
    """`--config experiments/demo` is found inside the installed package: two steps on the toy corpus."""
    bin_dir, env = installed
    _run([str(bin_dir / "pmi-jax"), "train", "--config", "experiments/demo", "--data", "synthetic", "--scheme",
          "random_token", "--workdir", str(tmp_path / "run"), "--no-progress",
          "--set", "train.num_steps=2", "--set", "train.eval_every_steps=0", "--set", "model.vocab_size=128",
          "--set", "data.seq_len=32"], env=env, cwd=tmp_path)
    assert (tmp_path / "run" / "checkpoints" / "2").is_dir()


def test_vocab_build_runs_from_the_installed_wheel(installed, tmp_path):
    bin_dir, env = installed
    words = "the new york stock exchange opened in the morning and the los angeles times reported it".split()
    lines = [" ".join(words[i:] + words[:i]) + "." for i in range(len(words))]
    (tmp_path / "text.txt").write_text("\n\n".join(lines * 20) + "\n")
    _run([str(bin_dir / "pmi-jax"), "vocab", "build", "--input", str(tmp_path / "text.txt"), "--output",
          str(tmp_path / "vocab"), "--size", "50", "--min-count", "2", "--no-progress"], env=env, cwd=tmp_path)
    assert any((tmp_path / "vocab").iterdir())


def test_setup_and_the_checkout_map_the_same_folders():
    """setup.py's package_dir and pmi_jax/_source_tree.py name the same folders, so a checkout
    imports what the wheel installs."""
    import ast

    from pmi_jax import _source_tree

    tree = ast.parse((ROOT / "setup.py").read_text())
    (table,) = [ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PACKAGE_DIRS"]
    assert table == _source_tree.SUBPACKAGES == {k.replace("/", "."): v for k, v in SUBPACKAGES.items()}
