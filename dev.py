"""Set up pmi-jax in ./.venv and run the demo or the tests; needs nothing but Python 3.12.

Any Python 3 may run this script: it builds .venv with a Python 3.12 it finds (the one running it,
python3.12 on the PATH, or one installed by pyenv), since JAX >= 0.11 needs Python >= 3.12 and
constraints.txt is resolved for 3.12; without one it stops with one line saying so. A .venv
made with another Python is rebuilt.

    python3 dev.py demo    # the whole pipeline on a small offline corpus
    python3 dev.py test    # the test suite
    python3 dev.py effect [DIR] [--schemes S ...] [--steps N] [--seeds K] [--vocab-size V] [--validation-fraction F]   # the CPU scheme comparison (hours; rerun to finish it)

The virtual environment is rebuilt only when setup.py or constraints.txt change.
"""
import contextlib
import hashlib
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / "pmi-jax-install.sha256"
PYTHON_VERSION = (3, 12)  # the version constraints.txt is resolved for (JAX >= 0.11 needs >= 3.12)


def _install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("setup.py", "constraints.txt"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def _version_of(python: str) -> tuple | None:
    """(major, minor) of the interpreter at `python`, or None when it does not run (a pyenv shim
    for a version that is installed but not selected exits with an error)."""
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        return tuple(int(part) for part in out.stdout.split())
    except ValueError:
        return None


def find_python() -> str:
    """A Python of PYTHON_VERSION for .venv: this interpreter, python3.12 on PATH, or pyenv's."""
    name = "python%d.%d" % PYTHON_VERSION
    candidates = [sys.executable, shutil.which(name)]
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(map(str, pathlib.Path(pyenv_root).glob("versions/%d.%d.*/bin/%s" % (*PYTHON_VERSION, name))),
                         key=lambda path: [int(p) if p.isdigit() else 0 for p in path.split("/")[-3].split(".")],
                         reverse=True)  # the newest patch release first
    for python in candidates:
        if python and _version_of(python) == PYTHON_VERSION:
            return python
    sys.exit(f"dev.py: no Python {'.'.join(map(str, PYTHON_VERSION))} found ({name} on PATH or in "
             f"{pyenv_root}/versions); JAX needs >= 3.12: install it, e.g. `pyenv install 3.12`")


def run(*argv: str) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT)


def setup_venv() -> None:
    fingerprint = _install_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    python = BIN / "python"
    if python.exists() and _version_of(str(python)) != PYTHON_VERSION:
        print(f"removing {VENV}: its Python is not {'.'.join(map(str, PYTHON_VERSION))}", flush=True)
        shutil.rmtree(VENV)
    if not python.exists():
        base = find_python()
        print(f"creating {VENV} with {base}", flush=True)
        run(base, "-m", "venv", str(VENV))
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run(*pip, "-c", "constraints.txt", "-e", ".[dev,bench]")
    # libtpu in a folder of its own: the compile-only tests put it on their subprocesses' path, while
    # every other process stays CPU-only (with libtpu importable, JAX probes for a TPU at start-up).
    run(*pip, "--no-deps", "--upgrade", "--target", str(VENV / "libtpu"), "-c", "constraints.txt", "libtpu")
    # JAX's CUDA plugin likewise, for the GPU compile-only tests: no GPU needed, and of NVIDIA's
    # libraries only cuDNN, whose version JAX checks before it emits cuDNN attention (docs/gpu.md, "Compile-only").
    run(*pip, "--no-deps", "--upgrade", "--target", str(VENV / "cuda12"), "-c", "constraints.txt",
        "jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cudnn-cu12")
    STAMP.write_text(fingerprint)


class Stages:
    """Wall-clock and CPU seconds (of the commands, which run as child processes) per demo stage."""

    def __init__(self):
        self.rows: list[tuple[str, float, float]] = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        wall, cpu = time.perf_counter(), self._children_cpu()
        yield
        self.rows.append((name, time.perf_counter() - wall, self._children_cpu() - cpu))

    @staticmethod
    def _children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def print(self) -> None:
        print("\nThe demo's stages (wall-clock s, CPU s of its commands):", flush=True)
        for name, wall, cpu in self.rows + [("total", sum(r[1] for r in self.rows), sum(r[2] for r in self.rows))]:
            print(f"  {name:<28} {wall:7.1f} {cpu:8.1f}", flush=True)


def demo() -> None:
    """The README's main command: each step is a plain `pmi-jax` call a user could type."""
    cli = str(BIN / "pmi-jax")
    out = ROOT / "demo"
    stage = Stages()
    # One compilation shared by the runs: the train step and the scorer are the same programs for
    # every scheme and seed, so the commands after the first load them from JAX's persistent cache.
    os.environ.update(JAX_COMPILATION_CACHE_DIR=str(out / "jax_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    with stage("demo corpus"):
        run(cli, "demo-corpus", "--output", str(out / "text"), "--overwrite")
    with stage("vocab build"):
        run(cli, "vocab", "build", "--input", str(out / "text" / "*.txt"), "--output", str(out / "vocab"),
            "--size", "20000", "--min-count", "5", "--overwrite")
    # The `show` commands only print, and a command's start-up (Python, JAX, TensorFlow) costs
    # seconds: each runs beside a command that leaves a core free, its output printed after.
    with stage("corpus prepare, shows"):
        run_beside([cli, "corpus", "prepare", "--input", str(out / "text" / "*.txt"), "--output", str(out / "data"),
                    "--units", f"pmi={out / 'vocab'}", "--seq-len", "128", "--workers", "2", "--overwrite"],
                   [cli, "vocab", "show", str(out / "vocab"), "--top", "8"])
        run_beside([cli, "corpus", "show", str(out / "data"), "--num", "2", "--units", "pmi"],
                   [cli, "data", "show", "--data", str(out / "data"), "--scheme", "pmi", "--num", "1"])
    # The paper's comparison in miniature (docs/experiments.md): two schemes, two training seeds
    # each, same corpus and config, a checkpoint every 100 steps, perplexity at each with one
    # token, one whole word and one pmi unit masked at a time on every validation token, `compare`.
    # A run keeps about one core busy: the two seeds of a scheme train side by side, then are scored
    # side by side (each command's outputs are what it writes alone); `eval` scores the three unit
    # kinds of a checkpoint in one pass (one restore, each masked copy through the encoder once).
    runs = []
    for scheme in ("random_token", "pmi"):
        pair = [out / "runs" / f"{scheme}-seed{seed}" for seed in (0, 1)]
        for run_dir in pair:
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time, not a resumed one
        with stage(f"train {scheme} (2 seeds)"):
            run_together(*([cli, "train", "--config", str(ROOT / "configs" / "experiments" / "demo.py"), "--data",
                            str(out / "data"), "--scheme", scheme, "--workdir", str(run_dir), "--set",
                            f"train.seed={seed}", "--no-progress"] for seed, run_dir in enumerate(pair)))
        with stage(f"eval {scheme} (2 seeds)"):
            run_together(*([cli, "eval", "perplexity", "--checkpoint", str(run_dir), "--steps", "all", "--unit",
                            "token", "--unit", "word", "--unit", "pmi"] for run_dir in pair))
        runs += map(str, pair)
    with stage("compare"):
        run(cli, "compare", *runs, "--output", str(out / "report"), "--overwrite")
    print(f"\nThe comparison: {out / 'report' / 'report.md'}, plots beside it "
          f"({', '.join(p.name for p in sorted((out / 'report').glob('*.png')))})", flush=True)
    stage.print()


def run_beside(main: list[str], side: list[str]) -> None:
    """Run `side` while `main` runs; `side`'s output is held and printed after `main`'s."""
    print("+", " ".join(side), "(beside the next command)", flush=True)
    beside = subprocess.Popen(side, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run(*main)
    finally:
        output = beside.communicate()[0]
    print(output, end="", flush=True)
    if beside.returncode:
        raise subprocess.CalledProcessError(beside.returncode, side)


EFFECT_SCHEMES = ("random_token", "pmi")  # the default; --schemes may add random_span and naive_pmi
EFFECT_CHOICES = ("random_token", "random_span", "naive_pmi", "pmi")  # Table 4's four
EFFECT_SEEDS = (0, 1, 2)
EFFECT_UNITS = ("token", "word", "pmi")
EFFECT_POSITIONS = "8"  # units scored per validation sequence and unit kind (docs/experiments.md)
# Scoring costs a forward pass per unit: the middle and last checkpoints, where training's
# validation loss (every 1,000 steps, every run) shows the rest of the curve.


def run_together(*commands: list[str]) -> None:
    """Run commands side by side and wait for all: one training run keeps about one core busy."""
    procs = []
    for argv in commands:
        print("+", " ".join(argv), flush=True)
        procs.append(subprocess.Popen(argv, cwd=ROOT))
    codes = [proc.wait() for proc in procs]
    for argv, code in zip(commands, codes):
        if code:
            raise subprocess.CalledProcessError(code, argv)


def effect(root: str, schemes: tuple[str, ...] = EFFECT_SCHEMES, steps: int | None = None,
           seeds: tuple[int, ...] = EFFECT_SEEDS, vocab_size: int = 30000, validation: float = 0.01) -> None:
    """The CPU comparison of docs/experiments.md ("The comparison on CPU"), resumable step by step.

    Every step is a plain `pmi-jax` call and each is skipped or resumed when its output is
    already there: rerun the same command after an interruption to finish what is missing.
    Two runs train side by side (a run keeps about one of two cores busy), seed after seed, so
    that a partial experiment still compares the schemes on equal seeds. With naive_pmi the
    corpus carries a second unit set (a naive-pmi vocabulary): that is another prepared corpus,
    so it and every run on it live in DIR/data+naive_pmi and DIR/runs+naive_pmi, apart from the
    default's DIR/data and DIR/runs (`compare` compares runs of one corpus only).
    `steps` shortens every run (the schedule's warm-up a tenth of it, a checkpoint at its half
    and end, as in the config's 4,000): a comparison that fits a shared machine's hour, in a DIR
    of its own, since a run resumed under another schedule is refused. A DIR/text written
    beforehand is the corpus (e.g. `pmi-jax demo-corpus` without --installed, with a smaller
    `vocab_size`: on a small corpus every frequent n-gram fits 30,000 and pmi and naive_pmi
    would get the same units; and a larger `validation` share, so that the scored text is not
    a few dozen sequences).
    """
    cli = str(BIN / "pmi-jax")
    out = pathlib.Path(root).resolve()
    config = ROOT / "configs" / "experiments" / "cpu_effect.py"
    final_step = str(steps) if steps else subprocess.run(
        [str(BIN / "python"), "-c", "import runpy, sys; "
         "print(runpy.run_path(sys.argv[1])['get_config']().train.num_steps)", str(config)],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    shorter = [arg for setting in (f"train.num_steps={steps}", f"optimizer.warmup_steps={steps // 10}",
                                   f"checkpoint.every_steps={steps // 2}") for arg in ("--set", setting)] if steps else []
    if not (out / "text").is_dir():
        run(cli, "demo-corpus", "--installed", "--output", str(out / "text"))
    naive = "naive_pmi" in schemes
    vocabs = {"pmi": ("vocab_pmi", "pmi"), **({"naive_pmi": ("vocab_naive_pmi", "naive-pmi")} if naive else {})}
    for unit_set, (name, measure) in vocabs.items():
        if not (out / name).is_dir():
            run(cli, "vocab", "build", "--input", str(out / "text" / "*.txt"), "--output", str(out / name),
                "--size", str(vocab_size), "--measure", measure, "--no-progress")
    suffix = "+naive_pmi" if naive else ""
    data = out / f"data{suffix}"
    run(cli, "corpus", "prepare", "--input", str(out / "text" / "*.txt"), "--output", str(data),
        *[arg for unit_set, (name, _) in vocabs.items() for arg in ("--units", f"{unit_set}={out / name}")],
        "--seq-len", "128", "--wordpiece-size", "8000", "--validation-fraction", str(validation), "--no-progress")
    pending, runs = [], []
    for seed in seeds:
        for scheme in schemes:
            run_dir = out / f"runs{suffix}" / f"{scheme}-seed{seed}"
            runs.append(str(run_dir))
            if not (run_dir / "checkpoints" / final_step).is_dir():
                pending.append([cli, "train", "--config", str(config), "--data", str(data), "--scheme",
                                scheme, "--workdir", str(run_dir), "--set", f"train.seed={seed}",
                                "--set", f"data.seed={seed}", *shorter, "--no-progress"])
    for pair in (pending[i:i + 2] for i in range(0, len(pending), 2)):
        run_together(*pair)
    units = [arg for unit in (*EFFECT_UNITS, *(["naive_pmi"] if naive else [])) for arg in ("--unit", unit)]
    scored_steps = f"{int(final_step) // 2},{final_step}"
    for pair in (runs[i:i + 2] for i in range(0, len(runs), 2)):
        run_together(*([cli, "eval", "perplexity", "--checkpoint", run_dir, "--steps", scored_steps, *units,
                        "--positions", EFFECT_POSITIONS, "--skip-existing"] for run_dir in pair))
    run(cli, "compare", *runs, "--output", str(out / f"report{suffix}"), "--overwrite")
    print(f"\nThe comparison: {out / f'report{suffix}' / 'report.md'}", flush=True)


def _effect_args(argv: list[str]) -> tuple[str, tuple[str, ...], int | None, tuple[int, ...], int, float]:
    """effect [DIR] [--schemes S ...] [--steps N] [--seeds K] [--vocab-size V] [--validation-fraction F]:
    the schemes in Table 4's order, whatever order they are given; seeds 0..K-1."""
    import argparse

    parser = argparse.ArgumentParser(prog="dev.py effect")
    parser.add_argument("dir", nargs="?", default=str(ROOT / "effect"))
    parser.add_argument("--schemes", nargs="+", choices=EFFECT_CHOICES, default=list(EFFECT_SCHEMES))
    parser.add_argument("--steps", type=int, default=None,
                        help="train this many steps instead of the config's 4,000 (at least 20, even)")
    parser.add_argument("--seeds", type=int, default=len(EFFECT_SEEDS), help="training seeds per scheme")
    parser.add_argument("--vocab-size", type=int, default=30000, help="n-grams per masking vocabulary")
    parser.add_argument("--validation-fraction", type=float, default=0.01, help="documents held out")
    args = parser.parse_args(argv)
    if args.steps is not None and (args.steps < 20 or args.steps % 2):
        parser.error(f"--steps {args.steps}: give an even number of at least 20 (checkpoints at its half and end)")
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: give at least 1")
    return (args.dir, tuple(s for s in EFFECT_CHOICES if s in args.schemes), args.steps, tuple(range(args.seeds)),
            args.vocab_size, args.validation_fraction)


def test(pytest_args: list[str]) -> None:
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = [str(BIN / "python"), "-m", "pytest", *(pytest_args or ["tests"])]
    print("+", " ".join(cmd), flush=True)
    sys.exit(subprocess.run(cmd, cwd=ROOT, env=env).returncode)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("setup", "demo", "test", "effect"):
        sys.exit(__doc__)
    setup_venv()
    if sys.argv[1] == "demo":
        demo()
    elif sys.argv[1] == "test":
        test(sys.argv[2:])
    elif sys.argv[1] == "effect":
        effect(*_effect_args(sys.argv[2:]))


if __name__ == "__main__":
    main()
