"""Library code leaves process-wide state as it found it: csv's field limit, Orbax's handler registry.

(glibc's malloc thresholds: tests/test_malloc_thresholds.py.)
"""
import csv
import importlib
import subprocess
import sys
import textwrap

from tests import eval_data


def test_importing_glue_leaves_csv_field_limit_alone():
    code = textwrap.dedent("""
        import csv
        before = csv.field_size_limit()
        import pmi_jax.eval.glue
        print(before, csv.field_size_limit())
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == after


def test_glue_reads_a_long_field_and_restores_csv_field_limit(tmp_path):
    glue = importlib.import_module("pmi_jax.eval.glue")
    before = csv.field_size_limit()
    long_sentence = "word " * (before // 5 + 1000)  # longer than csv's limit before the read
    eval_data.write_tsv(str(tmp_path / "SST-2" / "train.tsv"), ["sentence", "label"], [[long_sentence, "1"]])
    examples = glue.TASKS["glue/sst2"].read(str(tmp_path / "SST-2"), "train")
    assert [e.text_a for e in examples] == [long_sentence]
    assert csv.field_size_limit() == before


def test_checkpointers_register_orbax_array_handler_once(tmp_path):
    import jax
    import orbax.checkpoint as ocp

    from pmi_jax.checkpoints import Checkpointer
    from pmi_jax.config import CheckpointConfig

    first = Checkpointer(str(tmp_path / "a"), CheckpointConfig())
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    second = Checkpointer(str(tmp_path / "b"), CheckpointConfig())
    assert ocp.type_handlers.get_type_handler(jax.Array) is handler
    first.close()
    second.close()
