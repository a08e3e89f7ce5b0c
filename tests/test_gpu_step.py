"""benchmarks/gpu_step.py's CPU dry run: the GPU benchmark's code, variant processes, profile and JSON."""
import json
import os
import subprocess
import sys

from tests import no_tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cpu_dry_run_times_every_variant_profiles_and_needs_no_tensorflow(tmp_path):
    """Run as on the lent GPU machine: TensorFlow, seqio and tensorflow_text are not importable."""
    view = no_tensorflow.site_view(str(tmp_path / "site"))
    proc = subprocess.run(no_tensorflow.command(view, os.path.join(ROOT, "benchmarks", "gpu_step.py"), "--output",
                                                str(tmp_path / "out"), "--platform", "cpu", "--steps", "3",
                                                "--timed-s", "1", "--budget-s", "1500"),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(tmp_path / "out" / "gpu_step.json"))["results"]
    assert [r["variant"] for r in results] == ["attention-check", "tiny-64-paper", "tiny-32-attn0-sorted-tanh"], \
        proc.stdout
    check = results.pop(0)
    assert check["compared"] == "xla lengths vs xla mask" and check["agree_within_bf16"], check
    assert max(check["max_error_relative_to_max"].values()) == 0.0  # the two XLA forms compute the same
    for r in results:
        assert "error" not in r, r
        assert r["timed_steps"] >= 3 and r["ms_per_step"] > 0 and r["forbidden_modules"] == []
        assert r["tokens_per_s"] > 0
        assert r["mfu"] is None  # no known peak for a CPU
    paper, fast = results
    assert (paper["attention"], paper["embedding_grad"]) == ("written out (dropout)", "scatter")
    assert (fast["attention"], fast["embedding_grad"]) == ("xla", "sorted")
    assert fast["xla_flags"] == ["--xla_cpu_enable_fast_math=false"]
    profile = paper["profile"]["ms_per_step"]
    assert set(profile) == {"matmul", "attention", "scatter", "elementwise", "optimizer", "other"}
    # The step's matmuls and AdamW's update are found in the trace through the compiled HLO.
    assert profile["matmul"] > 0 and profile["optimizer"] > 0 and profile["elementwise"] > 0
    assert paper["profile"]["top_ops"] and "kernels ms/step" in proc.stdout


def test_a_spent_budget_skips_the_rest_and_still_writes_the_json(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_step.py"), "--output",
                           str(tmp_path), "--platform", "cpu", "--budget-s", "0"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(tmp_path / "gpu_step.json"))["results"]
    assert [r.get("skipped") for r in results] == ["budget spent"] * 3
