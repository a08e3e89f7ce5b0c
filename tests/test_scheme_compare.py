"""benchmarks/scheme_compare.py: the compact batch file decodes to the seqio tasks' exact batches, and
`run` (with TensorFlow made unimportable, as on the lent GPU machine) trains, scores and packs
results that `pmi-jax compare` reads (per-token unit perplexities of several training seeds, so
its tables carry seed-aware intervals), within the machine's limits on files brought back."""
import dataclasses
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from pmi_jax.model import BertForMaskedLM
from tests import eval_data, no_tensorflow, prepared_data

pytestmark = pytest.mark.usefixtures("xla_compilation_cache")

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
                           "--batch", "8", "--eval-batches", "2", "--output", out], capture_output=True, text=True, timeout=1800)
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
    # The trainer's validation batches (validation during training) are stored alike.
    assert info["eval_batches"] == 2
    for scheme in SCHEMES:
        expected = batches.TaskBatches(data, scheme, "train", 32, 8, 0).validation_batches(2, 8, 0, 1)
        stored = scheme_compare.ArrayBatches({}, scheme_compare.decode(
            npz, scheme + scheme_compare.VALIDATION, 2, 8, 32, info["special_ids"]))
        for got, batch in zip(stored.validation_batches(2, 8, 0, 1), expected, strict=True):
            for key in scheme_compare.KEYS:
                np.testing.assert_array_equal(got[key], batch[key], err_msg=f"{scheme} validation {key}")


def _partition(units_T):
    """Each unit's positions, in order of first position; special tokens (-1) left out."""
    return [tuple(np.flatnonzero(units_T == u)) for u in dict.fromkeys(units_T[units_T >= 0].tolist())]


def test_the_held_out_words_and_units_decode_to_the_corpus_partition(dumped):
    _, data, out = dumped
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import scheme_compare
    from pmi_jax.eval import perplexity

    npz = np.load(out)
    info = json.loads(npz["info"].tobytes())
    special = info["special_ids"]
    config = dataclasses.replace(eval_data.tiny_config(), vocab_size=info["vocab_size"])
    bert, params = BertForMaskedLM(config), eval_data.mlm_params(config, seed=1)
    assert info["unit_kinds"][0] == "word" and sorted(info["unit_kinds"][1:]) == ["naive_pmi", "pmi"]
    lengths = npz["validation/lengths"]
    for unit in info["unit_kinds"]:
        expected = list(perplexity.read_sequences(data, "validation", info["max_eval_sequences"], unit=unit))
        decoded = scheme_compare.decode_units(npz, unit, lengths)
        assert len(decoded) == len(expected) > 0
        for (ids, units), got in zip(expected, decoded):
            assert len(got) == len(ids)
            np.testing.assert_array_equal(got < 0, units < 0, err_msg=unit)
            assert _partition(got) == _partition(units), unit
        # Units of several tokens exist, so the test can tell a partition from one unit per token.
        assert any(len(p) > 1 for units in decoded for p in _partition(units)), unit
        # Two bits per token: the file stays compact.
        assert npz[f"validation/{unit}/starts"].nbytes == (lengths.sum() + 7) // 8
        # A model scores the file's units exactly as it scores the corpus's (`eval perplexity --unit`).
        validation = np.split(npz["validation/ids"].astype(np.int64), np.cumsum(lengths)[:-1])
        from_file, from_corpus = (
            perplexity.unit_perplexity(bert, params, pairs, seq_len=32, special_ids=list(special.values()),
                                       mask_id=special["mask"], pad_id=special["pad"], positions=3, seed=5)
            for pairs in (list(zip(validation, decoded)), expected))
        assert from_file.scores.digest() == from_corpus.scores.digest()
        np.testing.assert_array_equal(from_file.scores.nll_N, from_corpus.scores.nll_N)
        assert from_file.num_units == from_corpus.num_units < from_file.num_tokens


def test_units_that_are_not_contiguous_are_refused():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import scheme_compare

    with pytest.raises(ValueError, match="contiguous"):
        scheme_compare.encode_units([np.array([-1, 0, 1, 0, -1])])
    starts, none = scheme_compare.encode_units([np.array([-1, 3, 3, 7, -1]), np.array([-1, 7, 7, -1])])
    assert np.unpackbits(starts, count=9).tolist() == [1, 1, 0, 1, 1, 1, 1, 0, 1]
    assert np.unpackbits(none, count=9).tolist() == [1, 0, 0, 0, 1, 1, 0, 0, 1]


def test_a_file_over_the_size_limit_is_refused_with_the_steps_that_fit(dumped):
    root, data, _ = dumped
    out = str(root / "big.npz")
    proc = subprocess.run([sys.executable, SCRIPT, "dump", "--data", data, "--schemes", "random_token", "--steps", "2",
                           "--batch", "8", "--max-mib", "0.0001", "--output", out],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 2 and "about 0 steps fit" in proc.stderr and not os.path.exists(out), proc.stderr


def test_run_trains_seeds_scores_units_and_packs_what_compare_reads_without_tensorflow(dumped, no_tensorflow_path):
    root, _, out = dumped
    results = root / "out"
    probe = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path[:0] = [sys.argv[1]]; import tensorflow",
                            no_tensorflow_path], capture_output=True, text=True, timeout=600)
    assert probe.returncode != 0 and "No module named 'tensorflow'" in probe.stderr, probe.stderr
    units = ["token", "word", "pmi"]
    proc = subprocess.run(no_tensorflow.command(no_tensorflow_path, SCRIPT, "run", "--batches", out, "--config", "tiny",
                                              "--output", str(results), "--runs", str(root / "work"),
                                              "--seeds", "0", "1", "--unit", *units,
                                              "--eval-every", "2", "--positions", "4",
                                              "--set", "train.log_every_steps=1", "--set", "train.eval_every_steps=2"),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(os.listdir(results))
    assert files == sorted([f"{s}.tar.gz" for s in SCHEMES] + ["summary.json"])
    assert len(files) <= 8 and all(os.path.getsize(results / f) <= 16 * 2**20 for f in files)
    runs = root / "unpacked"
    for scheme in SCHEMES:
        with tarfile.open(results / f"{scheme}.tar.gz") as tar:
            assert sorted({m.name.split("/")[0] for m in tar.getmembers()}) == [f"{scheme}-seed0", f"{scheme}-seed1"]
            tar.extractall(runs)
    from pmi_jax.compare import runs as compare_runs

    names = [f"{s}-seed{seed}" for s in SCHEMES for seed in (0, 1)]
    read = {name: compare_runs.read_run(str(runs / name)) for name in names}
    for name, run in read.items():
        assert run.scheme == name.rsplit("-", 1)[0] and run.last_step == 4
        assert run.train_seed == int(name[-1])
        assert sorted(run.perplexity) == sorted(("validation", u) for u in units)
        for unit in units:
            results_by_step = run.perplexity[("validation", unit)]
            assert sorted(results_by_step) == [2, 4]
            for r in results_by_step.values():
                assert r["num_tokens"] > 0 and np.isfinite(r["perplexity"])
                assert len(r["scores"]["nll"]) == r["num_tokens"]
                np.testing.assert_allclose(np.exp(np.mean(r["scores"]["nll"])), r["perplexity"], rtol=1e-5)
                assert r["interval"]["mean_nll"][0] <= r["mean_nll"] <= r["interval"]["mean_nll"][1]
        assert sorted(run.training) == [1, 2, 3, 4]
        validated = [json.loads(line) for line in open(runs / name / "tensorboard" / "metrics.jsonl")]
        assert sorted(m["step"] for m in validated if "validation_loss" in m) == [2, 4]
        assert not any((runs / name / "checkpoints" / str(s) / "state").exists() for s in (2, 4))
    for unit in units:
        # Every run is scored on the same tokens (units drawn from the scoring seed alone) ...
        assert len({r.perplexity[("validation", unit)][4]["scored_set"] for r in read.values()}) == 1
    # ... units widen what is masked: the pmi unit kind scores units of several tokens.
    pmi = read["pmi-seed0"].perplexity[("validation", "pmi")][4]
    assert pmi["num_units"] < pmi["num_tokens"]
    # The two seeds of a scheme are different runs (train.seed varies init and dropout).
    first = read["pmi-seed0"].perplexity[("validation", "token")][4]["scores"]["nll"]
    second = read["pmi-seed1"].perplexity[("validation", "token")][4]["scores"]["nll"]
    assert not np.array_equal(first, second)
    summary = json.load(open(results / "summary.json"))
    assert sorted(summary["runs"]) == sorted(SCHEMES)
    assert all(sorted(k for k in v if k != "packed_bytes") == ["0", "1"] for v in summary["runs"].values())
    report_dir = root / "report"
    report = subprocess.run([sys.executable, "-c", "import sys; from pmi_jax.cli import main; sys.exit(main())",
                             "compare", *[str(runs / n) for n in names], "--output", str(report_dir)],
                            capture_output=True, text=True, timeout=900, env=dict(os.environ, PYTHONPATH=ROOT))
    assert report.returncode == 0, report.stdout + report.stderr
    text = "\n".join(open(report_dir / f).read() for f in os.listdir(report_dir) if f.endswith(".md"))
    assert "(seed-aware)" in text, text
    assert "no paired interval" not in text and "no interval could be computed" not in text, text
    assert "rerun `pmi-jax eval perplexity`" not in text, text
    for unit in units:
        assert unit in text


def test_cross_score_scores_each_checkpoint_on_every_schemes_validation_batches(dumped, no_tensorflow_path):
    """Issue 32's cross-scoring: a run's checkpoints on every scheme's validation batches; on
    its own scheme's batches the loss is the trainer's validation loss at that step."""
    root, _, out = dumped
    results, work = root / "cross_out", root / "cross_work"
    proc = subprocess.run(no_tensorflow.command(no_tensorflow_path, SCRIPT, "run", "--batches", out, "--config", "tiny",
                                              "--output", str(results), "--runs", str(work), "--schemes", "random_span",
                                              "--unit", "token", "--eval-every", "2", "--positions", "2",
                                              "--cross-score", "--set", "train.eval_every_steps=2"),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cross = json.load(open(results / "summary.json"))["runs"]["random_span"]["0"]["cross_scores"]
    assert sorted(cross) == ["2", "4"]
    validated = {m["step"]: m["validation_loss"] for m in map(json.loads, open(work / "random_span-seed0" / "tensorboard"
                                                                                 / "metrics.jsonl"))
                 if "validation_loss" in m}
    for step, scores in cross.items():
        assert sorted(scores) == sorted(SCHEMES)
        assert all(np.isfinite(v["loss"]) and v["tokens"] > 0 for v in scores.values())
        assert scores["random_span"]["loss"] == pytest.approx(validated[int(step)], rel=1e-4)
    assert len({round(v["loss"], 6) for v in cross["4"].values()}) > 1  # other masks, other losses


def test_run_refuses_a_unit_the_file_does_not_hold(dumped, no_tensorflow_path):
    root, _, out = dumped
    proc = subprocess.run(no_tensorflow.command(no_tensorflow_path, SCRIPT, "run", "--batches", out, "--config", "tiny",
                                              "--output", str(root / "refused"), "--unit", "frequency"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 2 and "--unit frequency" in proc.stderr and "naive_pmi" in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["run", "--config", "tiny"], ["cross-score", "RUN", "--step", "1"]])
def test_a_file_that_is_not_a_dump_is_refused_in_one_line(tmp_path, command, no_tensorflow_path):
    """--batches naming a text file (or nothing) is one line naming the flag, exit 2, no traceback."""
    text = tmp_path / "notes.txt"
    text.write_text("not a dump\n")
    for batches in (text, tmp_path / "missing.npz"):
        proc = subprocess.run(no_tensorflow.command(no_tensorflow_path, SCRIPT, *command, "--batches", str(batches),
                                                  "--output", str(tmp_path / "out")),
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"error: --batches {batches}: not a file `scheme_compare.py dump` wrote"
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def _run(no_tensorflow_path, batches_file, output, runs, *extra):
    proc = subprocess.run(no_tensorflow.command(
        no_tensorflow_path, SCRIPT, "run", "--batches", str(batches_file), "--config", "tiny", "--output", str(output),
        "--runs", str(runs), "--schemes", "pmi", "--seeds", "0", "--unit", "token", "--eval-every", "2",
        "--positions", "4", "--set", "train.log_every_steps=1", "--set", "train.eval_every_steps=2", *extra),
        capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _losses(workdir) -> dict:
    rows = [json.loads(line) for line in open(os.path.join(workdir, "tensorboard", "metrics.jsonl"))]
    return {(r["step"], k): r[k] for r in rows for k in ("loss", "validation_loss") if k in r}


def test_a_run_in_parts_equals_the_run_in_one_go(dumped, no_tensorflow_path, tmp_path):
    """Steps 0-1 and 2-3 dumped as two parts, trained by two `run` commands that share --runs
    (the second resumes from the first's newest checkpoint): the same batches, training and
    validation losses and scored NLLs as the 4-step file trained in one command."""
    _, data, whole = dumped
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import scheme_compare

    parts = [tmp_path / "part0.npz", tmp_path / "part1.npz"]
    for start, part in zip((0, 2), parts):
        proc = subprocess.run([sys.executable, SCRIPT, "dump", "--data", data, "--schemes", "pmi", "--steps", "2",
                               "--start-step", str(start), "--batch", "8", "--eval-batches", "2", "--output",
                               str(part)], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    one = np.load(whole)
    special = json.loads(one["info"].tobytes())["special_ids"]
    expected = scheme_compare.decode(one, "pmi", 4, 8, 32, special)
    for start, part in zip((0, 2), parts):
        got = scheme_compare.decode(np.load(part), "pmi", 2, 8, 32, special)
        for key in scheme_compare.KEYS:
            np.testing.assert_array_equal(got[key], expected[key][start:start + 2], err_msg=f"{key} from {start}")

    _run(no_tensorflow_path, whole, tmp_path / "one", tmp_path / "one_runs", "--steps", "4")
    _run(no_tensorflow_path, parts[0], tmp_path / "first", tmp_path / "parts_runs", "--total-steps", "4",
         "--keep-newest-state")
    kept = tmp_path / "parts_runs" / "pmi-seed0" / "checkpoints" / "2" / "state"
    assert kept.exists()  # for the next part to resume from, on the machine ...
    with tarfile.open(tmp_path / "first" / "pmi.tar.gz") as tar:  # ... but never packed
        assert not any("/state" in m.name for m in tar.getmembers())
    _run(no_tensorflow_path, parts[1], tmp_path / "second", tmp_path / "parts_runs", "--total-steps", "4")
    assert not kept.exists()

    in_one, in_parts = (str(tmp_path / d / "pmi-seed0") for d in ("one_runs", "parts_runs"))
    assert _losses(in_parts) == _losses(in_one) and len(_losses(in_one)) == 6  # 4 training + 2 validation
    from pmi_jax.formats import perplexity_result, run_dir

    for step in (2, 4):
        a, b = (perplexity_result.read(run_dir.perplexity_result_path(r, "validation", step))["scores"]["nll"]
                for r in (in_one, in_parts))
        np.testing.assert_array_equal(a, b)


def _train(data, scheme, workdir):
    """A real `pmi-jax train` run of 2 steps whose validation is the dump's 2 batches of 8."""
    proc = subprocess.run([sys.executable, "-c", "import sys; from pmi_jax.cli import main; sys.exit(main())",
                           "train", "--config", "tiny", "--data", data, "--scheme", scheme, "--workdir", str(workdir),
                           "--set", "train.num_steps=2", "--set", "train.batch_size=8", "--set", "train.eval_batches=2",
                           "--set", "train.eval_every_steps=2", "--set", "checkpoint.every_steps=2", "--no-progress"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cross_score_of_pmi_jax_train_runs_reproduces_their_validation_loss(dumped, tmp_path):
    """`cross-score` on `pmi-jax train` runs of the dumped corpus: per-sequence losses that sum to
    the trainer's own validation loss on the run's own scheme, every dumped scheme a column,
    every trained scheme a row."""
    _, data, out = dumped
    runs = [tmp_path / "random_token-seed0", tmp_path / "random_span-seed0"]
    for run, scheme in zip(runs, ["random_token", "random_span"]):
        _train(data, scheme, run)
    table = tmp_path / "cross.md"
    proc = subprocess.run([sys.executable, SCRIPT, "cross-score", *map(str, runs), "--batches", out, "--step", "2",
                           "--output", str(table)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    means = table.read_text().split("| scored on |")[0]  # the first table: trained scheme x scored scheme
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in means.splitlines()
            if line.startswith("| random_")}
    assert sorted(rows) == ["random_span", "random_token"]
    assert all(len(cells) == len(SCHEMES) for cells in rows.values())
    for run, scheme in zip(runs, ["random_token", "random_span"]):
        validated = [json.loads(line)["validation_loss"] for line in open(run / "tensorboard" / "metrics.jsonl")
                     if "validation_loss" in line]
        own = float(rows[scheme][SCHEMES.index(scheme)].split(" [")[0].strip("* "))
        assert own == pytest.approx(validated[-1], abs=1e-3)  # the table rounds to 3 decimals
