"""The training loop on 8 virtual CPU devices: learning, sharding, exact resume, preemption.

Every run is the tiny config shrunk further (hidden 32, 32 tokens, vocabulary 128) on the
deterministic topic-model batches of `batches.SyntheticBatches`, so that a run compiles and
takes its steps in seconds.
"""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from pmi_jax import batches, checkpoints, flops, mlm_loss, train
from pmi_jax.formats import run_dir
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides
from pmi_jax.errors import UserInputError
from tests.damage import truncate_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["model.vocab_size=128", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
         "model.max_position_embeddings=32", "data.seq_len=32", "train.batch_size=16", "train.log_every_steps=1",
         "optimizer.warmup_steps=2", "optimizer.peak_learning_rate=3e-3"]


pytestmark = pytest.mark.usefixtures("xla_compilation_cache")


def _config(*overrides):
    return apply_overrides(load_config("tiny"), SMALL + list(overrides))


def _source(config):
    return batches.SyntheticBatches(config.model.vocab_size, config.data.seq_len, config.train.batch_size)


def _losses(workdir):
    records = run_dir.read_metrics(os.path.join(workdir, run_dir.TENSORBOARD_DIR))
    return [records[s]["loss"] for s in sorted(records)]


def _run(tmp_path, name, *overrides, devices=None):
    config = _config(*overrides)
    workdir = str(tmp_path / name)
    result = train.train(config, workdir, _source(config), devices=devices)
    return result, workdir


def test_loss_falls_on_structured_text(tmp_path):
    """Topic-model text: the context narrows a masked word from 123 words to a topic of 8, so
    the loss must fall well below the unigram entropy log(123) that counting alone reaches.
    (Measured: 4.84 over the first 3 steps, 4.01 over the last 10.)"""
    result, workdir = _run(tmp_path, "run", "train.num_steps=100", "optimizer.peak_learning_rate=1e-2",
                           "checkpoint.every_steps=0")
    assert result.status == "completed" and result.step == 100
    losses = _losses(workdir)
    assert len(losses) == 100
    unigram_entropy = np.log(128 - 5)
    assert np.mean(losses[:3]) > unigram_entropy - 0.1  # starts at chance
    assert np.mean(losses[-10:]) < unigram_entropy - 0.5, losses[-10:]


def test_loss_falls_on_real_prepared_text(tmp_path, demo_prepared_corpus):
    """English text through the whole real pipeline: vocab build, corpus prepare, the seqio
    PMI task, then training. The loss must fall from chance well into what word statistics give."""
    data_dir = demo_prepared_corpus
    corpus = batches.read_corpus_info(data_dir, "pmi", "train")
    config = batches.configure_for_corpus(_config("model.vocab_size=0", "data.seq_len=0", "train.num_steps=80",
                                                "model.max_position_embeddings=64",
                                                "optimizer.peak_learning_rate=1e-2", "checkpoint.every_steps=0",
                                                f"data.data_dir={data_dir}"), corpus)
    source = batches.TaskBatches(data_dir, "pmi", "train", config.data.seq_len, config.train.batch_size, seed=0)
    workdir = str(tmp_path / "run")
    train.train(config, workdir, source, corpus)
    losses = _losses(workdir)
    assert np.mean(losses[:3]) > np.log(config.model.vocab_size) - 1.0  # starts near chance
    assert np.mean(losses[-10:]) < np.mean(losses[:3]) - 1.0, (losses[:3], losses[-10:])
    assert checkpoints.restore_for_eval(workdir)[2]["vocab_sha256"] == corpus.vocab_sha256


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 12-step run on a (data=4, model=2) mesh, with dropout and checkpoints."""
    workdir = str(tmp_path_factory.mktemp("reference") / "run")
    config = _config(*REFERENCE)
    result = train.train(config, workdir, _source(config))
    assert result.status == "completed" and result.step == 12
    return workdir


REFERENCE = ["train.num_steps=12", "checkpoint.every_steps=4", "mesh.data=4", "mesh.model=2",
             "train.eval_every_steps=4", "train.eval_batches=2"]


def _validation(workdir):
    records = run_dir.read_metrics(os.path.join(workdir, run_dir.TENSORBOARD_DIR))
    return {s: (r["validation_loss"], r["validation_accuracy"]) for s, r in sorted(records.items())
            if "validation_loss" in r}


def test_data_4_model_2_mesh_gives_the_losses_of_one_device(tmp_path, reference):
    _, single = _run(tmp_path, "single", *REFERENCE, "mesh.data=1", "mesh.model=1", devices=jax.devices()[:1])
    assert len(_losses(single)) == 12
    np.testing.assert_allclose(_losses(reference), _losses(single), rtol=1e-5)


def test_fsdp_and_gradient_accumulation_give_the_full_batch_losses(tmp_path):
    """Accumulated micro-batch gradients are normalised by the whole batch's masked tokens,
    so without dropout they equal the one-batch gradients (up to summation order)."""
    no_dropout = ["model.dropout_rate=0", "model.attention_dropout_rate=0", "train.num_steps=4", "model.num_layers=1"]
    _, full = _run(tmp_path, "full", *no_dropout)
    _, accumulated = _run(tmp_path, "accumulated", *no_dropout, "optimizer.grad_accum_steps=2", "mesh.data=2",
                          "mesh.fsdp=4")
    np.testing.assert_allclose(_losses(full), _losses(accumulated), rtol=1e-5)


# A training process whose data turns slow (1 s a batch) from step `slow_from` on, so that a
# signal sent after it logs a step arrives long before the run could end by itself.
_SLOW_RUN = """
import json, sys, time
from pmi_jax import batches, train
from pmi_jax.config import load_config
from pmi_jax.config import apply_overrides

class Slow(batches.SyntheticBatches):
    def batches(self, start_step, shard_index, num_shards):
        for step, batch in enumerate(super().batches(start_step, shard_index, num_shards), start_step):
            if step >= int(sys.argv[3]):
                time.sleep(1)
            yield batch

config = apply_overrides(load_config("tiny"), json.loads(sys.argv[2]))
result = train.train(config, sys.argv[1], Slow(config.model.vocab_size, config.data.seq_len, config.train.batch_size))
print(result.status, result.step, flush=True)
"""


def _start(workdir, slow_from):
    return subprocess.Popen([sys.executable, "-c", _SLOW_RUN, workdir, json.dumps(SMALL + REFERENCE), str(slow_from)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)


def _wait_for_line(process, prefix):
    for line in iter(process.stdout.readline, ""):
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the process ended (status {process.wait()}) without printing {prefix!r}")


def test_sigkill_and_sigterm_then_resume_repeat_the_uninterrupted_losses_exactly(tmp_path, reference):
    workdir = str(tmp_path / "interrupted")
    committed = os.path.join(workdir, "checkpoints", "4", "commit_success.txt")
    # 1. SIGKILL after the checkpoint of step 4, while step 6 waits for its batch.
    process = _start(workdir, slow_from=5)
    try:
        _wait_for_line(process, "step 5 ")
        deadline = time.time() + 60
        while not os.path.exists(committed):
            assert time.time() < deadline, "no checkpoint at step 4"
            time.sleep(0.1)
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        process.kill()
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]

    # 2. Restart; SIGTERM (what a TPU preemption sends) after a step: checkpoint, exit 0.
    process = _start(workdir, slow_from=0)
    try:
        _wait_for_line(process, "step 6 ")
        process.send_signal(signal.SIGTERM)
        status, step = _wait_for_line(process, "preempted").split()
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
    step = int(step)
    assert 6 <= step < 12
    checkpointer = checkpoints.Checkpointer(workdir, _config().checkpoint, read_only=True)
    assert checkpointer.latest_step() == step and checkpointer.metadata(step)["data_position"] == step

    # 3. Resume to the end: every step's loss, and every validation, is bitwise the uninterrupted run's.
    config = _config(*REFERENCE)
    assert train.train(config, workdir, _source(config)).step == 12
    assert _losses(workdir) == _losses(reference)
    assert list(_validation(reference)) == [4, 8, 12]
    assert _validation(workdir) == _validation(reference)


@pytest.mark.parametrize("mask", ["hash", "bits16"])
def test_accelerator_dropout_masks_resume_exactly_and_do_not_depend_on_the_mesh(tmp_path, mask):
    """xla_cpu_variants=never, dropout_mask=hash (the GPU programs' dropout, `model._hashed_dropout`)
    or bits16 (`model._keep_mask16`, theirs until 2026-11-28) on CPU.
    4 steps on a (data=4, model=2) mesh, then the same run resumed from its step-2 checkpoint
    (step 4's removed, the metrics log emptied): steps 3 and 4 log bitwise the same losses. On
    one device the losses agree to 1e-5 (another summation order, the same masks: a mask that
    followed the sharding would move them by more than dropout's noise)."""
    import shutil

    overrides = ["model.xla_cpu_variants=never", f"model.dropout_mask={mask}", "train.num_steps=4",
                 "checkpoint.every_steps=2"]
    _, whole = _run(tmp_path, "whole", *overrides, "mesh.data=4", "mesh.model=2")
    resumed = str(tmp_path / "resumed")
    shutil.copytree(whole, resumed)
    shutil.rmtree(os.path.join(resumed, "checkpoints", "4"))
    os.remove(os.path.join(resumed, run_dir.TENSORBOARD_DIR, run_dir.METRICS_FILE))
    config = _config(*overrides, "mesh.data=4", "mesh.model=2")
    assert train.train(config, resumed, _source(config)).step == 4
    assert _losses(resumed) == _losses(whole)[2:]
    _, single = _run(tmp_path, "single", *overrides, "mesh.data=1", "mesh.model=1", devices=jax.devices()[:1])
    np.testing.assert_allclose(_losses(single), _losses(whole), rtol=1e-5)
    _, cpu_masks = _run(tmp_path, "cpu", "model.xla_cpu_variants=always", *overrides[2:], "mesh.data=1",
                        "mesh.model=1", devices=jax.devices()[:1])
    assert np.max(np.abs(np.array(_losses(cpu_masks)) - _losses(single))) > 1e-4  # other masks: the test sees them


def test_nan_loss_stops_with_the_step_and_keeps_only_good_checkpoints(tmp_path):
    config = _config("train.num_steps=30", "checkpoint.every_steps=1", "optimizer.peak_learning_rate=1e30",
                     "optimizer.grad_clip_norm=0", "optimizer.warmup_steps=1")
    workdir = str(tmp_path / "diverged")
    with pytest.raises(train.NonFiniteLoss, match=r"loss is (nan|inf|-inf) at step (\d+)") as error:
        train.train(config, workdir, _source(config))
    bad_step = int(str(error.value).split(" at step ")[1].split(";")[0])
    saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
    assert saved and max(saved) < bad_step
    assert all(np.isfinite(r["loss"]) for r in run_dir.read_metrics(os.path.join(workdir, "tensorboard")).values())


def test_checkpoint_loads_for_evaluation(reference):
    model_config, params, meta = checkpoints.restore_for_eval(reference)
    assert model_config == _config().model
    assert meta["step"] == 12 and meta["vocab_size"] == 128 and "vocab_sha256" in meta
    assert params["encoder"]["embed"]["word"]["embedding"].shape == (128, 32)
    step_8 = checkpoints.restore_for_eval(os.path.join(reference, "checkpoints", "8"))
    assert step_8[2]["step"] == 8
    assert not np.array_equal(step_8[1]["output_bias"], params["output_bias"])
    assert sorted(os.listdir(os.path.join(reference, "checkpoints"))) == ["12", "8"]  # keep=2


# ---------------------------------------------------------------- errors before compiling


def _fails_fast(tmp_path, *overrides, match):
    config = _config(*overrides)
    with pytest.raises(UserInputError, match=match):
        train.train(config, str(tmp_path / "w"), _source(config))
    assert not os.path.exists(tmp_path / "w" / "checkpoints")  # failed before setting anything up


def test_batch_not_divisible_by_the_data_axis(tmp_path):
    _fails_fast(tmp_path, "train.batch_size=12", match=r"batch_size=12 .*not divisible by the data axis.*8")


def test_mesh_that_does_not_match_the_devices(tmp_path):
    _fails_fast(tmp_path, "mesh.data=2", "mesh.model=3", match=r"mesh \(data=2, fsdp=1, model=3\) has 6 positions "
                                                                r"but there are 8 devices")
    _fails_fast(tmp_path, "mesh.model=3", match=r"8 is not divisible by 3")


def test_parameter_the_mesh_cannot_split(tmp_path):
    _fails_fast(tmp_path, "model.vocab_size=130", "model.vocab_multiple=1", "mesh.model=4",
                match=r"word/embedding \(130, 32\).*vocab")


def test_any_vocabulary_on_any_model_axis_gives_the_losses_of_one_device(tmp_path):
    """131 rows (a prime) split over the model axis only because they are padded to 256."""
    odd = ["model.vocab_size=131", "train.num_steps=4", "model.dropout_rate=0", "model.attention_dropout_rate=0"]
    _, sharded = _run(tmp_path, "sharded", *odd, "mesh.data=4", "mesh.model=2")
    _, single = _run(tmp_path, "single", *odd, "mesh.data=1", "mesh.model=1", devices=jax.devices()[:1])
    np.testing.assert_allclose(_losses(sharded), _losses(single), rtol=1e-5)


def test_rbg_randomness_gives_the_same_losses_on_every_mesh(tmp_path):
    rbg = ["train.prng_impl=rbg", "train.num_steps=3"]
    _, sharded = _run(tmp_path, "sharded", *rbg, "mesh.data=4", "mesh.model=2")
    _, single = _run(tmp_path, "single", *rbg, "mesh.data=1", "mesh.model=1", devices=jax.devices()[:1])
    np.testing.assert_allclose(_losses(sharded), _losses(single), rtol=1e-5)


# ---------------------------------------------------------------- the gathered MLM head


def _loss_terms(config, params, batch, deterministic):
    from pmi_jax.model import BertForMaskedLM

    denominator = max(float(batch["weights"].sum()), 1.0)
    return mlm_loss.mlm_loss_terms(BertForMaskedLM(config.model), params, batch, jax.random.key(5), denominator,
                                deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [True, False])
def test_gathered_head_gives_the_loss_and_accuracy_of_the_full_logits(deterministic):
    gathered = _config("data.seq_len=64", "model.max_position_embeddings=64")
    full = _config("data.seq_len=64", "model.max_position_embeddings=64", "model.max_predictions_per_seq=-1")
    assert gathered.model.predictions(64) == 12 and full.model.predictions(64) == 64
    from pmi_jax.model import BertForMaskedLM
    from pmi_jax.optimizer import make_optimizer

    state = train.init_state(BertForMaskedLM(gathered.model), make_optimizer(gathered.optimizer, 10), 0, 64)
    batch = batches.SyntheticBatches(128, 64, 16).global_batch(3)
    assert batch["weights"].sum(axis=1).max() > 0
    loss, accuracy = _loss_terms(gathered, state.params, batch, deterministic)
    full_loss, full_accuracy = _loss_terms(full, state.params, batch, deterministic)
    np.testing.assert_allclose(float(loss), float(full_loss), rtol=1e-5)
    np.testing.assert_allclose(float(accuracy), float(full_accuracy), rtol=1e-6)
    # Gradients too: the positions left out have weight 0.
    grads = jax.grad(lambda p, c: _loss_terms(c, p, batch, deterministic)[0])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7),
                 grads(state.params, gathered), grads(state.params, full))


def test_cross_entropy_is_optaxs_in_values_and_logit_gradients():
    """mlm_loss's cross-entropy (the target logit as a one-hot select, not a gather) gives optax's
    values bit for bit and its logit gradients to float32 rounding (1e-6 of the largest), padded
    vocabulary rows (-inf logits) included."""
    import jax.numpy as jnp
    import optax

    from pmi_jax.mlm_loss import _target_logits

    logits_BxPxV = jax.random.normal(jax.random.key(0), (3, 5, 40)) * 4
    logits_BxPxV = logits_BxPxV.at[..., 37:].set(-jnp.inf)
    targets_BxP = jax.random.randint(jax.random.key(1), (3, 5), 0, 37)
    weights_BxP = jax.random.uniform(jax.random.key(2), (3, 5))

    def ours(logits):
        return jnp.sum((jax.nn.logsumexp(logits, axis=-1) - _target_logits(logits, targets_BxP)) * weights_BxP)

    def reference(logits):
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, targets_BxP) * weights_BxP)

    np.testing.assert_array_equal(np.asarray(_target_logits(logits_BxPxV, targets_BxP)),
                                  np.asarray(jnp.take_along_axis(logits_BxPxV, targets_BxP[..., None], -1)[..., 0]))
    value, grad = jax.jit(jax.value_and_grad(ours))(logits_BxPxV)
    ref_value, ref_grad = jax.jit(jax.value_and_grad(reference))(logits_BxPxV)
    assert float(value) == float(ref_value)
    assert np.all(np.asarray(grad)[..., 37:] == 0)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref_grad), rtol=0, atol=1e-6)


def test_a_batch_with_more_masked_positions_than_the_head_gathers_is_an_error():
    config = _config()  # 32 tokens: the head gathers 8 (15% rounded up to a multiple of 4)
    assert config.model.predictions(32) == 8
    for step in range(20):  # the synthetic batches keep to the masking budget, floor(15%)
        weights = batches.SyntheticBatches(128, 32, 16).global_batch(step)["weights"]
        assert weights.sum(axis=1).max() <= 4
        mlm_loss.check_predictions(weights, config, step)
    weights = np.zeros((2, 32), np.float32)
    weights[1, :9] = 1.0
    with pytest.raises(UserInputError, match=r"step 7 has a sequence with 9 masked positions, more than the MLM "
                                             r"head's 8"):
        mlm_loss.check_predictions(weights, config, 7)


def test_workdir_holding_another_model(reference):
    config = _config(*REFERENCE, "model.num_layers=3")
    with pytest.raises(UserInputError, match=r"holds a checkpoint \(step 12\) of a different model "
                                             r"\(num_layers: 2 in the checkpoint vs 3 now\)"):
        train.train(config, reference, _source(config))


def test_scheme_the_corpus_was_not_prepared_for(demo_prepared_corpus):
    data_dir = demo_prepared_corpus  # prepared with pmi units only
    assert batches.read_corpus_info(data_dir, "pmi", "train").seq_len == 64
    for scheme in ("whole_word", "random_span", "random_token"):
        batches.read_corpus_info(data_dir, scheme, "train")
    with pytest.raises(UserInputError, match="naive_pmi"):
        batches.read_corpus_info(data_dir, "naive_pmi", "train")


# ---------------------------------------------------------------- config and metrics


def test_overrides_parse_by_field_type():
    config = _config("optimizer.peak_learning_rate=1", "train.num_steps=1e6", "model.dtype=bfloat16",
                     "mesh.rules=[['batch', 'data'], ['vocab', None]]")
    assert config.optimizer.peak_learning_rate == 1.0 and isinstance(config.optimizer.peak_learning_rate, float)
    assert config.train.num_steps == 1_000_000 and config.model.dtype == "bfloat16"
    assert config.mesh.rules == (("batch", "data"), ("vocab", None))
    for bad, match in [("model.num_layer=2", "no field 'num_layer'"), ("train.batch_size=8.5", "not a valid int"),
                       ("model=2", "is a section"), ("model.dtype=float16", "expected 'float32' or 'bfloat16'"),
                       ("num_steps", "expected FIELD=VALUE")]:
        with pytest.raises(UserInputError, match=match):
            _config(bad)


def test_device_peaks_and_mfu():
    assert flops.device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert flops.device_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert flops.device_peak_flops("NVIDIA H200") == 989e12
    assert flops.device_peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert flops.device_peak_flops("TPU v4") == 275e12
    assert flops.device_peak_flops("TPU v5 lite") == 197e12
    assert flops.device_peak_flops("TPU v5") == 459e12
    assert flops.device_peak_flops("TPU v5p") == 459e12
    assert flops.device_peak_flops("TPU v6 lite") == 918e12
    assert flops.device_peak_flops("cpu") is None
    # BERT-base at 512 tokens: 6 x 109.0M matmul weights + 12 x 12 x 512 x 768 attention.
    base = dataclasses.replace(load_config("base").model, vocab_size=30522, max_predictions_per_seq=-1)
    per_token = flops.training_flops_per_token(base, 512)
    assert per_token == 6 * 108_965_376 + 12 * 12 * 512 * 768
    # The gathered head runs the transform and decoder on 80 of the 512 positions.
    gathered = dataclasses.replace(base, max_predictions_per_seq=0)
    head = 768 * 768 + 768 * 30522
    assert flops.training_flops_per_token(gathered, 512) == pytest.approx(per_token - 6 * head * (1 - 80 / 512))
    assert flops.mfu(per_token, 1e6, 8, 989e12) == pytest.approx(per_token * 1e6 / (8 * 989e12))
    assert flops.mfu(per_token, 1e6, 8, None) is None


# ---------------------------------------------------------------- paths, vocabulary, damaged checkpoints


def _sets(*overrides):
    return [arg for o in overrides for arg in ("--set", o)]


CORPUS_RUN = [o for o in SMALL if not o.startswith("model.vocab_size")] + [
    "model.vocab_size=0", "model.num_layers=1", "train.num_steps=2", "checkpoint.every_steps=0"]


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory):
    """`pmi-jax train` on a prepared corpus, both paths given relative to a working directory
    that is neither the corpus's nor the run's parent: (corpus dir, run dir), both absolute."""
    from pmi_jax.cli import main
    from tests.prepared_data import write_prepared_corpus

    root = tmp_path_factory.mktemp("relative")
    corpus = root / "corpus"
    write_prepared_corpus(str(corpus), sequences={"train": 40, "validation": 6}, shards={"train": 1, "validation": 1},
                          seq_len=32)
    (root / "cwd").mkdir()
    previous = os.getcwd()
    os.chdir(root / "cwd")
    try:
        assert main(["train", "--config", "tiny", "--data", "../corpus", "--workdir", "runs/rel", "--scheme",
                     "whole_word", *_sets(*CORPUS_RUN)]) == 0
    finally:
        os.chdir(previous)
    return str(corpus), str(root / "cwd" / "runs" / "rel")


def test_relative_paths_train_and_evaluate_from_anywhere(corpus_run, tmp_path, monkeypatch, capsys):
    """Orbax refuses relative paths; the run records absolute ones, so `eval` run from another
    directory finds the corpus the checkpoint was trained on."""
    from pmi_jax.cli import main

    corpus, run = corpus_run
    assert os.listdir(os.path.join(run, "checkpoints")) == ["2"]
    metadata = checkpoints.restore_for_eval(run)[2]
    assert metadata["data_dir"] == corpus and metadata["config"]["data"]["data_dir"] == corpus
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["eval", "perplexity", "--checkpoint", os.path.relpath(run, elsewhere), "--positions", "2",
                 "--output", "ppl.json"]) == 0
    with open(elsewhere / "ppl.json") as f:
        result = json.load(f)
    assert result["data"] == corpus and result["checkpoint"] == run and result["step"] == 2


def _permuted_copy(corpus, destination):
    """The corpus with the non-special lines of its vocab.txt reversed: same size, other tokens."""
    import shutil

    shutil.copytree(corpus, destination)
    path = os.path.join(destination, "vocab.txt")
    with open(path) as f:
        lines = f.read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[:5] + lines[5:][::-1]) + "\n")
    return str(destination)


def test_resume_refuses_a_vocabulary_of_the_same_size_with_other_tokens(corpus_run, tmp_path, capsys):
    from pmi_jax.cli import main

    corpus, run = corpus_run
    other = _permuted_copy(corpus, tmp_path / "permuted")
    assert main(["train", "--config", "tiny", "--data", other, "--workdir", run, "--scheme", "whole_word",
                 *_sets(*CORPUS_RUN, "train.num_steps=4")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another vocabulary" in err, err
    assert f"vocab.txt of {corpus} (sha256 " in err and f"vocab.txt of {other} (sha256 " in err
    assert os.listdir(os.path.join(run, "checkpoints")) == ["2"]  # nothing trained, nothing saved


def test_damaged_latest_checkpoint_falls_back_to_the_newest_that_restores(tmp_path, reference, caplog):
    """Step 12's arrays truncated: the run resumes from step 8, moves 12 aside, and steps 9-12
    repeat the uninterrupted run's losses exactly; evaluation falls back the same way."""
    import shutil

    workdir = str(tmp_path / "damaged")
    shutil.copytree(reference, workdir)
    truncate_files(os.path.join(workdir, "checkpoints", "12", "state"), only=None)
    assert checkpoints.restore_for_eval(workdir)[2]["step"] == 8
    assert "skipped checkpoint 12" in caplog.text
    with pytest.raises(UserInputError, match=r"checkpoints/12: no checkpoint restores \(step 12: "):
        checkpoints.restore_for_eval(os.path.join(workdir, "checkpoints", "12"))

    caplog.clear()
    killed_save = os.path.join(workdir, "checkpoints", "16.orbax-checkpoint-tmp")  # what a kill during a save leaves
    os.makedirs(os.path.join(killed_save, "state"))
    config = _config(*REFERENCE)
    assert train.train(config, workdir, _source(config)).step == 12
    assert not os.path.exists(killed_save)
    assert re.search(r"skipped checkpoint 12 \(state: .*\): moved to .*unreadable_checkpoints/12; resuming from "
                     r"step 8", caplog.text), caplog.text
    assert os.listdir(os.path.join(workdir, "unreadable_checkpoints")) == ["12"]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "8"]
    assert _losses(workdir) == _losses(reference)
    assert checkpoints.restore_for_eval(workdir)[2]["step"] == 12


def test_no_checkpoint_restores_is_a_one_line_error(tmp_path, reference):
    import shutil

    workdir = str(tmp_path / "ruined")
    shutil.copytree(reference, workdir)
    truncate_files(os.path.join(workdir, "checkpoints", "12", "state"))
    truncate_files(os.path.join(workdir, "checkpoints", "8"), only="metadata")
    config = _config(*REFERENCE)
    with pytest.raises(UserInputError) as error:
        train.train(config, workdir, _source(config))
    message = str(error.value)
    assert "\n" not in message and "no checkpoint restores (step 8: metadata: JSONDecodeError" in message
    assert "step 12: state: " in message
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "8"]  # nothing moved or written
    with pytest.raises(UserInputError, match="no checkpoint restores"):
        checkpoints.restore_for_eval(workdir)


def test_zero_batch_size_is_refused_before_anything_is_created(tmp_path, capsys):
    from pmi_jax.cli import main

    workdir = tmp_path / "w"
    assert main(["train", "--config", "tiny", "--data", "synthetic", "--workdir", str(workdir),
                 *_sets(*SMALL, "train.batch_size=0")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.batch_size=0: must be at least 1" in err
    assert not workdir.exists()


# ---------------------------------------------------------------- masking rate, validation


def test_validation_is_the_mlm_loss_of_the_fixed_batches_at_its_steps(reference):
    """Logged every train.eval_every_steps (and at the end), to metrics.jsonl and TensorBoard;
    recomputed here from the checkpoint of that step on the source's validation batches."""
    import tensorflow as tf
    from pmi_jax.model import BertForMaskedLM

    config = _config(*REFERENCE)
    source = _source(config)
    first, again = source.validation_batches(2, 16, 0, 1), source.validation_batches(2, 16, 0, 1)
    for a, b in zip(first, again, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])  # the same masks every time
    assert not np.array_equal(first[0]["targets"], source.global_batch(0)["targets"])  # held out from training
    _, params, _ = checkpoints.restore_for_eval(os.path.join(reference, "checkpoints", "8"))
    model = BertForMaskedLM(config.model)
    sums = np.zeros(3)
    for batch in first:
        loss, correct = mlm_loss.mlm_loss_terms(model, params, batch, jax.random.key(0), 1.0, deterministic=True)
        sums += [float(loss), float(correct), batch["weights"].sum()]
    loss, accuracy = _validation(reference)[8]
    np.testing.assert_allclose([loss, accuracy], [sums[0] / sums[2], sums[1] / sums[2]], rtol=1e-5)
    assert loss < np.log(128 - 5)  # it has learned something by step 8

    tagged = {}
    logdir = os.path.join(reference, run_dir.TENSORBOARD_DIR)
    for name in os.listdir(logdir):
        if name.startswith("events."):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(logdir, name)):
                for value in event.summary.value:
                    if value.tag == "validation_loss":
                        tagged[event.step] = float(tf.make_ndarray(value.tensor))
    assert sorted(tagged) == [4, 8, 12]
    np.testing.assert_allclose(tagged[8], loss, rtol=1e-6)


def test_head_gathers_for_the_highest_rate_and_synthetic_batches_keep_to_the_rate():
    config = _config("data.mask_rate=0.3", "data.mask_rate_schedule=linear", "data.mask_rate_end=0.15")
    assert config.model.predictions(32, config.data.highest_mask_rate) == 12  # 30% of 32 is 9.6 -> 10 -> 12
    source = dataclasses.replace(_source(config), mask_rate=0.4)
    for step in range(10):
        weights = source.global_batch(step)["weights"]
        assert weights.sum(axis=1).max() <= 0.4 * 30  # floor(40%) of at most 30 words
    mlm_loss.check_predictions(source.global_batch(0)["weights"], _config("data.mask_rate=0.4"), 0)
    with pytest.raises(UserInputError, match=r"more than the MLM head's 8"):
        mlm_loss.check_predictions(np.ones((1, 32), np.float32), _config(), 3)


def test_training_validation_masks_at_the_fixed_rate_whatever_the_training_rate(demo_prepared_corpus):
    def source(**rates):
        return batches.TaskBatches(demo_prepared_corpus, "pmi", "train", 64, 16, seed=3, num_steps=10, **rates)

    fixed = source().validation_batches(3, 16, 0, 1)
    for other in (source(mask_rate=0.4), source(mask_rate=0.3, mask_rate_schedule="linear", mask_rate_end=0.15)):
        for a, b in zip(fixed, other.validation_batches(3, 16, 0, 1), strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
    selected = sum(b["weights"].sum() for b in fixed)
    real = sum((b["input_mask"].sum(axis=1) - 2).sum() for b in fixed)  # at least [CLS] and [SEP] are special
    assert 0.13 < selected / real <= 0.15
    at_30 = source(eval_mask_rate=0.3).validation_batches(1, 16, 0, 1)[0]["weights"].sum()
    assert at_30 > 1.8 * fixed[0]["weights"].sum()


class _Interrupted(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class _StopsAt(batches.TaskBatches):
    stop_at: int = 0

    def batches(self, start_step, shard_index, num_shards):
        for step, batch in enumerate(super().batches(start_step, shard_index, num_shards), start_step):
            if step == self.stop_at:
                raise _Interrupted(step)
            yield batch


def test_a_rate_schedule_resumes_exactly_on_a_prepared_corpus(tmp_path, demo_prepared_corpus):
    """Linear 40% -> 10% over 8 steps through the seqio pipeline: a run stopped after its step-4
    checkpoint and resumed logs bitwise the uninterrupted run's losses and validation."""
    corpus = batches.read_corpus_info(demo_prepared_corpus, "pmi", "train")
    config = batches.configure_for_corpus(_config(
        "model.vocab_size=0", "data.seq_len=0", "model.max_position_embeddings=64", "model.num_layers=1",
        "train.num_steps=8", "checkpoint.every_steps=4", "train.eval_every_steps=4", "train.eval_batches=1",
        "data.mask_rate=0.4", "data.mask_rate_schedule=linear", "data.mask_rate_end=0.1",
        f"data.data_dir={demo_prepared_corpus}"), corpus)
    assert config.model.predictions(64, config.data.highest_mask_rate) == 28
    source = batches.TaskBatches.from_config(config)
    whole = str(tmp_path / "whole")
    train.train(config, whole, source, corpus)
    stopped = str(tmp_path / "stopped")
    with pytest.raises(_Interrupted):
        train.train(config, stopped, _StopsAt(**dataclasses.asdict(source), stop_at=6), corpus)
    assert sorted(os.listdir(os.path.join(stopped, "checkpoints"))) == ["4"]
    assert train.train(config, stopped, source, corpus).step == 8
    assert _losses(stopped) == _losses(whole) and len(_losses(whole)) == 8
    assert _validation(stopped) == _validation(whole) and list(_validation(whole)) == [4, 8]


def test_a_corpus_without_a_validation_split_trains_without_validation(tmp_path, caplog):
    """The default train.eval_every_steps on a corpus prepared with --validation-fraction 0: a warning
    naming the corpus, and the run's config records validation off (it used to stop the run)."""
    from pmi_jax import experiment
    from tests import prepared_data

    data_dir = str(tmp_path / "data")
    prepared_data.write_prepared_corpus(data_dir, sequences={"train": 4}, shards={"train": 1}, seq_len=32)
    with caplog.at_level("WARNING"):
        resolved = experiment.resolve_run(experiment.RunSpec("tiny", data=data_dir, scheme="random_token"))
    assert resolved.config.train.eval_every_steps == 0 and not resolved.corpus.has_validation
    assert f"--data {data_dir} has no validation split: no validation during training" in caplog.text
    with_split = str(tmp_path / "with_split")
    prepared_data.write_prepared_corpus(with_split, sequences={"train": 4, "validation": 2},
                                        shards={"train": 1, "validation": 1}, seq_len=32)
    kept = experiment.resolve_run(experiment.RunSpec("tiny", data=with_split, scheme="random_token"))
    assert kept.config.train.eval_every_steps == load_config("tiny").train.eval_every_steps > 0


def test_the_loop_calls_its_hooks_in_order_after_every_step_and_the_first_status_ends_it():
    """train._loop's seam: each hook sees (step, state after the step, that step's metrics), in the
    order given; a hook that returns a status ends the run at that step and later hooks do not run."""
    calls = []

    def step_fn(state, batch):
        return state + batch, {"loss": float(state + batch)}

    def recorder(name, stop_at=None):
        def hook(step, state, step_metrics):
            calls.append((name, step, state, step_metrics["loss"]))
            return "preempted" if step == stop_at else None
        return hook

    result = train._loop(step_fn, 0, iter([1, 2, 3, 4, 5]), 10, [recorder("a"), recorder("b", stop_at=12),
                                                                    recorder("c")])
    assert (result.status, result.step) == ("preempted", 12)
    assert calls == [("a", 11, 1, 1.0), ("b", 11, 1, 1.0), ("c", 11, 1, 1.0),
                     ("a", 12, 3, 3.0), ("b", 12, 3, 3.0)]
    finished = train._loop(step_fn, 0, iter([1, 2]), 0, [recorder("a")])
    assert (finished.status, finished.step) == ("completed", 2)


def test_the_grouped_gradient_norm_gives_the_same_step():
    """The GPU step's gradient norm (small leaves in one kernel, `train.grouped_norm_applies`)
    against optax's, on CPU: the same loss, a grad_norm metric within float32 rounding, and the
    same clipped AdamW step (clipping active: a norm limit below the gradient's norm), two steps."""
    import jax.numpy as jnp

    from pmi_jax import partitioning
    from pmi_jax.model import BertForMaskedLM
    from pmi_jax.optimizer import make_optimizer

    config = _config("data.seq_len=64", "model.max_position_embeddings=64", "optimizer.grad_clip_norm=0.01",
                     "optimizer.warmup_steps=1")
    mesh = partitioning.make_mesh(config.mesh, jax.devices()[:1])
    assert not train.grouped_norm_applies(mesh, None)  # a CPU program keeps optax's
    model = BertForMaskedLM(config.model)
    batch = batches.SyntheticBatches(config.model.vocab_size, 64, config.train.batch_size).global_batch(1)
    out = {}
    with partitioning.activate(mesh, config.mesh):
        for grouped in (False, True):
            tx = make_optimizer(config.optimizer, config.train.num_steps, grouped)
            step = jax.jit(train.make_train_step(model, tx, config, mesh, grouped))
            state, _ = step(train.init_state(model, tx, 0, 64), batch)  # AdamW's first step: learning rate 0
            out[grouped] = step(state, batch)
    (plain, plain_metrics), (grouped, grouped_metrics) = out[False], out[True]
    assert float(plain_metrics["loss"]) == float(grouped_metrics["loss"])
    assert float(plain_metrics["grad_norm"]) > 0.01
    np.testing.assert_allclose(float(grouped_metrics["grad_norm"]), float(plain_metrics["grad_norm"]), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8), grouped.params, plain.params)
    initial = train.init_state(model, tx, 0, 64).params
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), plain.params, initial)
    assert min(jax.tree.leaves(moved)) > 0  # every parameter took a step
