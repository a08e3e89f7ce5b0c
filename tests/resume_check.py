"""The exact-resume check of the in-kernel dropout masks (test_fused_attention, test_fused_layer_norm):
a tiny trainer run with the kernel interpreted on CPU, 4 steps uninterrupted, then the same run
resumed from its step-2 checkpoint (step 4's removed, the metrics log emptied), must log steps 3
and 4 with bitwise the same losses: the masks follow the step's dropout key, which the
checkpoint carries."""
import os
import shutil

import jax

from pmi_jax import batches, train
from pmi_jax.config import apply_overrides, load_config
from pmi_jax.formats import run_dir

TINY = ("model.vocab_size=128", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.max_position_embeddings=32", "data.seq_len=32", "train.batch_size=4", "train.log_every_steps=1",
        "train.num_steps=4", "checkpoint.every_steps=2", "mesh.data=1", "mesh.model=1")


def _losses(workdir):
    records = run_dir.read_metrics(os.path.join(workdir, run_dir.TENSORBOARD_DIR))
    return {s: r["loss"] for s, r in sorted(records.items()) if "loss" in r}


def assert_resumes_to_the_same_losses(tmp_path, *overrides):
    config = apply_overrides(load_config("tiny"), [*TINY, *overrides])
    source = batches.SyntheticBatches(config.model.vocab_size, config.data.seq_len, config.train.batch_size)
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    assert train.train(config, whole, source, devices=jax.devices()[:1]).step == 4
    shutil.copytree(whole, resumed)
    shutil.rmtree(os.path.join(resumed, "checkpoints", "4"))
    os.remove(os.path.join(resumed, run_dir.TENSORBOARD_DIR, run_dir.METRICS_FILE))
    assert train.train(config, resumed, source, devices=jax.devices()[:1]).step == 4
    assert _losses(resumed) == {s: loss for s, loss in _losses(whole).items() if s > 2}
    assert len(_losses(resumed)) == 2
