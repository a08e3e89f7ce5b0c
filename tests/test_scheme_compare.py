"""benchmarks/scheme_compare.py: the compact batch file decodes to the seqio tasks' exact batches, and
`run` (with TensorFlow made unimportable, as on the lent GPU machine) trains, scores and packs
results that `pmi-jax compare` reads, within the machine's limits on files brought back."""
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests import no_tensorflow, prepared_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "scheme_compare.py")
SCHEMES = ["random_token", "random_span", "naive_pmi", "pmi"]

@pytest.fixture(scope="module")
def no_tensorflow_path(tmp_path_factory):
    return no_tensorflow.site_view(str(tmp_path_factory.mktemp("site_without_tf")))


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    root = tmp_path_factory.mktemp("scheme_compare")
    data = str(root / "data")
    prepared_data.write_prepared_corpus(data, sequences={"train": 60, "validation": 6}, seq_len=32,
                                        unit_names=("pmi", "naive_pmi"))
    out = str(root / "batches.npz")
    proc = subprocess.run([sys.executable, SCRIPT, "dump", "--data", data, "--schemes", *SCHEMES, "--steps", "4",
                           "--batch", "8", "--output", out], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root, data, out


def test_the_file_decodes_to_the_tasks_batches_exactly(dumped):
    _, data, out = dumped
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import scheme_compare
    from pmi_jax import batches

    npz = np.load(out)
    info = json.loads(npz["info"].tobytes())
    assert info["format"] == scheme_compare.FORMAT and info["schemes"] == SCHEMES
    for scheme in SCHEMES:
        source = batches.TaskBatches(data, scheme, "train", 32, 8, 0)
        expected = [b for _, b in zip(range(4), source.batches(0, 0, 1))]
        decoded = scheme_compare.decode(npz, scheme, 4, 8, 32, info["special_ids"])
        for step, batch in enumerate(expected):
            for key in scheme_compare.KEYS:
                np.testing.assert_array_equal(decoded[key][step], batch[key], err_msg=f"{scheme} {key} step {step}")
                assert decoded[key].dtype == batch[key].dtype
    # The sequences are stored once for all schemes; each scheme's order is stored or referenced.
    assert npz["sequences"].dtype == np.uint16 and npz["sequences"].shape[1] == 32
    assert all(f"{s}/index" in npz or f"{s}/index_of" in npz for s in SCHEMES)


def test_a_file_over_the_size_limit_is_refused_with_the_steps_that_fit(dumped):
    root, data, _ = dumped
    out = str(root / "big.npz")
    proc = subprocess.run([sys.executable, SCRIPT, "dump", "--data", data, "--schemes", "random_token", "--steps", "2",
                           "--batch", "8", "--max-mib", "0.0001", "--output", out],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 2 and "about 0 steps fit" in proc.stderr and not os.path.exists(out), proc.stderr


def test_run_trains_scores_and_packs_what_compare_reads_without_tensorflow(dumped, no_tensorflow_path):
    root, _, out = dumped
    results = root / "out"
    probe = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path[:0] = [sys.argv[1]]; import tensorflow",
                            no_tensorflow_path], capture_output=True, text=True, timeout=600)
    assert probe.returncode != 0 and "No module named 'tensorflow'" in probe.stderr, probe.stderr
    proc = subprocess.run(no_tensorflow.command(no_tensorflow_path, SCRIPT, "run", "--batches", out, "--config", "tiny",
                                              "--output", str(results), "--runs", str(root / "work"),
                                              "--eval-every", "2", "--positions", "4",
                                              "--set", "train.log_every_steps=1"),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(os.listdir(results))
    assert files == sorted([f"{s}.tar.gz" for s in SCHEMES] + ["summary.json"])
    assert len(files) <= 8 and all(os.path.getsize(results / f) <= 16 * 2**20 for f in files)
    runs = root / "unpacked"
    for scheme in SCHEMES:
        with tarfile.open(results / f"{scheme}.tar.gz") as tar:
            tar.extractall(runs)
    from pmi_jax.compare import runs as compare_runs

    for scheme in SCHEMES:
        run = compare_runs.read_run(str(runs / scheme))
        assert run.scheme == scheme and run.last_step == 4
        assert sorted(run.perplexity["validation"]) == [2, 4]
        assert all(r["num_tokens"] > 0 and np.isfinite(r["perplexity"]) for r in run.perplexity["validation"].values())
        assert sorted(run.training) == [1, 2, 3, 4]
        assert not any((runs / scheme / "checkpoints" / str(s) / "state").exists() for s in (2, 4))
    summary = json.load(open(results / "summary.json"))
    assert sorted(summary["runs"]) == sorted(SCHEMES)
    report = subprocess.run([sys.executable, "-c", "import sys; from pmi_jax.cli import main; sys.exit(main())", "compare", *[str(runs / s) for s in SCHEMES],
                             "--output", str(root / "report")], capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.returncode == 0, report.stdout + report.stderr
