"""pmi_jax.checkpoints on its own: listing, saving and restoring, resume planning, falling back.

Every checkpoint here is a real Orbax save of a small state (a 1-layer, 16-wide BERT's
parameters and a step counter) into tmp_path, written once per module and copied for each
test that damages it; the trainer's end-to-end resume and evaluation tests are in
tests/test_train.py.
"""
import dataclasses
import logging
import os
import re
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmi_jax import checkpoints
from pmi_jax.config import CheckpointConfig, ModelConfig, to_dict
from pmi_jax.errors import UserInputError
from pmi_jax.formats.run_dir import CheckpointMetadata
from pmi_jax.model import BertForMaskedLM
from tests.damage import truncate_files

MODEL = ModelConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                    max_position_embeddings=16, vocab_multiple=8)
VOCAB_SHA256 = "a1" * 32
DATA_DIR = "/corpora/original"
STEPS = (2, 4, 6)


def _params(step):
    """The model's real initial parameters, drawn from a key of the step: every step differs."""
    ids = jnp.zeros((1, 4), jnp.int32)
    return nn.unbox(BertForMaskedLM(MODEL).init(jax.random.key(step), ids, ids, deterministic=True))["params"]


def _state(step):
    return {"step": jnp.asarray(step, jnp.int32), "params": _params(step)}


def _metadata(step, model=MODEL, vocab_sha256=VOCAB_SHA256, data_dir=DATA_DIR):
    return {"step": step, "data_position": step, "model": to_dict(model), "data_dir": data_dir, "scheme": "pmi",
            "vocab_size": model.vocab_size, "vocab_sha256": vocab_sha256}


def _save(workdir, steps, *, keep=10, **metadata):
    checkpointer = checkpoints.Checkpointer(str(workdir), CheckpointConfig(every_steps=2, keep=keep))
    for step in steps:
        checkpointer.save(step, _state(step), _metadata(step, **metadata))
    checkpointer.wait()
    checkpointer.close()


def _target():
    """Where restore_newest puts a state: its shapes and dtypes on the first device."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), _state(0))


def _assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def _truncate(directory, *, only=None):
    assert truncate_files(directory, only=only), f"nothing to truncate under {directory}"


def _files(directory):
    """Every file under `directory`, relative to it."""
    return {os.path.relpath(os.path.join(root, name), directory) for root, _, names in os.walk(directory)
            for name in names}


def _listing(path):
    return sorted(os.listdir(path)) if os.path.exists(path) else None


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A workdir with complete checkpoints of steps 2, 4 and 6."""
    workdir = tmp_path_factory.mktemp("saved") / "run"
    _save(workdir, STEPS)
    return str(workdir)


@pytest.fixture
def run_copy(saved_run, tmp_path):
    """A copy of `saved_run` that a test may damage."""
    workdir = str(tmp_path / "run")
    shutil.copytree(saved_run, workdir)
    return workdir


# ---------------------------------------------------------------- listing


def test_checkpoint_dir_is_absolute_for_a_relative_workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert checkpoints.checkpoint_dir("runs/a/") == str(tmp_path / "runs" / "a" / "checkpoints")
    assert checkpoints.checkpoint_dir("gs://bucket/run/") == "gs://bucket/run/checkpoints"


def test_step_directories_ascending_digits_only(tmp_path, monkeypatch):
    assert checkpoints.step_directories(str(tmp_path / "missing")) == []
    root = tmp_path / "run" / "checkpoints"
    for name in ("10", "9", "100", "16.orbax-checkpoint-tmp", "latest", "-3"):
        (root / name).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert checkpoints.step_directories("run") == [9, 10, 100]


# ---------------------------------------------------------------- Checkpointer


def test_save_then_restore_gives_the_arrays_and_metadata_back(saved_run):
    checkpointer = checkpoints.Checkpointer(saved_run, CheckpointConfig(), read_only=True)
    try:
        assert checkpointer.all_steps() == [6, 4, 2]
        assert checkpointer.latest_step() == 6
        assert checkpointer.metadata(4) == CheckpointMetadata.from_json(_metadata(4))
        state, metadata = checkpointer.restore(4, _target())
        _assert_trees_equal(state, _state(4))
        assert metadata == CheckpointMetadata.from_json(_metadata(4))
        assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_state(6))))
    finally:
        checkpointer.close()
    # A Checkpointer of its own: Orbax binds the "state" item to the first handler that reads or
    # writes it, and a partial restore needs another one than `restore`'s.
    checkpointer = checkpoints.Checkpointer(saved_run, CheckpointConfig(), read_only=True)
    try:
        params = checkpointer.restore_subtree(2, {"params": _target()["params"]})
    finally:
        checkpointer.close()
    assert set(params) == {"params"}
    _assert_trees_equal(params["params"], _params(2))
    assert checkpoints.step_directories(saved_run) == [2, 4, 6]


def test_keep_deletes_all_but_the_newest(tmp_path):
    _save(tmp_path / "run", (1, 2, 3, 4), keep=2)
    assert checkpoints.step_directories(str(tmp_path / "run")) == [3, 4]
    checkpointer = checkpoints.Checkpointer(str(tmp_path / "run"), CheckpointConfig(), read_only=True)
    assert checkpointer.all_steps() == [4, 3]
    checkpointer.close()


def test_due_every_n_steps_and_never_for_zero(tmp_path):
    every_4 = checkpoints.Checkpointer(str(tmp_path / "a"), CheckpointConfig(every_steps=4))
    assert [s for s in range(1, 13) if every_4.due(s)] == [4, 8, 12]
    never = checkpoints.Checkpointer(str(tmp_path / "b"), CheckpointConfig(every_steps=0))
    assert not any(never.due(s) for s in range(0, 13))
    every_4.close(), never.close()


# ---------------------------------------------------------------- plan_resume


def test_plan_for_a_fresh_workdir_is_empty_and_creates_nothing(tmp_path):
    plan = checkpoints.plan_resume(str(tmp_path / "new"), MODEL, VOCAB_SHA256, DATA_DIR)
    assert plan == checkpoints.ResumePlan(str(tmp_path / "new"), (), ())
    assert not (tmp_path / "new").exists()
    assert checkpoints.restore_newest(plan, _target()) is None


def test_plan_lists_every_step_newest_first(saved_run):
    plan = checkpoints.plan_resume(saved_run, MODEL, VOCAB_SHA256, "/elsewhere/same/vocab")
    assert plan.candidates == (6, 4, 2) and plan.unreadable == ()


def test_plan_refuses_another_vocabulary_naming_both(saved_run):
    other = "b2" * 32
    with pytest.raises(UserInputError) as error:
        checkpoints.plan_resume(saved_run, MODEL, other, "/corpora/permuted")
    message = str(error.value)
    assert "\n" not in message
    assert (f"checkpoint step 6 was trained on vocab.txt of {DATA_DIR} (sha256 {VOCAB_SHA256[:12]}) but this run "
            f"reads vocab.txt of /corpora/permuted (sha256 {other[:12]}): another vocabulary") in message
    with pytest.raises(UserInputError, match=r"but this run reads the synthetic corpus \(no vocab.txt\) "
                                             r"\(sha256 None\)"):
        checkpoints.plan_resume(saved_run, MODEL, None, "")


def test_plan_refuses_a_synthetic_run_for_a_corpus(tmp_path):
    _save(tmp_path / "run", (1,), vocab_sha256=None, data_dir="")
    with pytest.raises(UserInputError, match=r"step 1 was trained on the synthetic corpus \(no vocab.txt\) \(sha256 "
                                             rf"None\) but this run reads vocab.txt of {DATA_DIR} "):
        checkpoints.plan_resume(str(tmp_path / "run"), MODEL, VOCAB_SHA256, DATA_DIR)
    assert checkpoints.plan_resume(str(tmp_path / "run"), MODEL, None, "").candidates == (1,)


def test_plan_refuses_another_model_naming_the_fields(saved_run):
    wider = dataclasses.replace(MODEL, hidden_size=32, intermediate_size=64)
    with pytest.raises(UserInputError) as error:
        checkpoints.plan_resume(saved_run, wider, VOCAB_SHA256, DATA_DIR)
    assert str(error.value) == (f"--workdir {saved_run} holds a checkpoint (step 6) of a different model "
                                "(hidden_size: 16 in the checkpoint vs 32 now, intermediate_size: 32 in the checkpoint "
                                "vs 64 now); to resume it: --set model.hidden_size=16 --set model.intermediate_size=32; "
                                "else use a new workdir")


def test_plan_sets_unreadable_metadata_apart(run_copy):
    _truncate(os.path.join(run_copy, "checkpoints", "6"), only="metadata")
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    assert plan.candidates == (4, 2)
    assert [u.step for u in plan.unreadable] == [6]
    assert plan.unreadable[0].reason.startswith("metadata: JSONDecodeError: ")


# ---------------------------------------------------------------- restore_newest


# Orbax's failed read of the deleted files leaves a callback for an event loop it has closed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_damaged_newest_falls_back_and_is_moved_aside(saved_run, run_copy, caplog):
    """Step 6's array data files deleted (its JSON metadata intact): the plan still offers it,
    the restore falls back to step 4's arrays, and step 6 moves whole to unreadable_checkpoints/."""
    state_dir = os.path.join(run_copy, "checkpoints", "6", "state")
    data_files = [os.path.join(root, name) for root, _, names in os.walk(state_dir) if os.path.basename(root) == "d"
                  for name in names]
    assert data_files
    for path in data_files:
        os.remove(path)
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    assert plan.candidates == (6, 4, 2) and plan.unreadable == ()
    with caplog.at_level(logging.WARNING):
        step, state, metadata = checkpoints.restore_newest(plan, _target())
    assert step == 4 and metadata == CheckpointMetadata.from_json(_metadata(4))
    _assert_trees_equal(state, _state(4))
    assert _listing(os.path.join(run_copy, "checkpoints")) == ["2", "4"]
    assert _listing(os.path.join(run_copy, "unreadable_checkpoints")) == ["6"]
    deleted = {os.path.relpath(p, os.path.dirname(state_dir)) for p in data_files}
    assert _files(os.path.join(run_copy, "unreadable_checkpoints", "6")) == _files(
        os.path.join(saved_run, "checkpoints", "6")) - deleted
    aside = re.escape(os.path.join(run_copy, "unreadable_checkpoints", "6"))
    assert re.search(rf"skipped checkpoint 6 \(state: \w+: .*\): moved to {aside};"
                     r" resuming from step 4", caplog.text), caplog.text
    assert checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR).candidates == (4, 2)


def test_unreadable_metadata_is_moved_aside_too(run_copy):
    _truncate(os.path.join(run_copy, "checkpoints", "6"), only="metadata")
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    assert checkpoints.restore_newest(plan, _target())[0] == 4
    assert _listing(os.path.join(run_copy, "unreadable_checkpoints")) == ["6"]
    assert _listing(os.path.join(run_copy, "checkpoints")) == ["2", "4"]


def test_an_older_unreadable_checkpoint_is_set_aside_while_resuming_from_the_newest(run_copy):
    _truncate(os.path.join(run_copy, "checkpoints", "2"), only="metadata")
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    assert plan.candidates == (6, 4) and [u.step for u in plan.unreadable] == [2]
    assert checkpoints.restore_newest(plan, _target())[0] == 6
    assert _listing(os.path.join(run_copy, "checkpoints")) == ["4", "6"]
    assert _listing(os.path.join(run_copy, "unreadable_checkpoints")) == ["2"]


def test_a_second_damage_of_the_same_step_replaces_the_one_set_aside(run_copy):
    aside = os.path.join(run_copy, "unreadable_checkpoints", "6")
    os.makedirs(aside)
    with open(os.path.join(aside, "left_from_before"), "w") as f:
        f.write("an earlier step 6 that did not restore")
    _truncate(os.path.join(run_copy, "checkpoints", "6", "state"))
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    assert checkpoints.restore_newest(plan, _target())[0] == 4
    assert "left_from_before" not in os.listdir(aside) and "state" in os.listdir(aside)


def test_no_checkpoint_restores_is_a_one_line_error_and_moves_nothing(run_copy):
    for step in STEPS[1:]:
        _truncate(os.path.join(run_copy, "checkpoints", str(step), "state"))
    _truncate(os.path.join(run_copy, "checkpoints", "2"), only="metadata")
    plan = checkpoints.plan_resume(run_copy, MODEL, VOCAB_SHA256, DATA_DIR)
    with pytest.raises(UserInputError) as error:
        checkpoints.restore_newest(plan, _target())
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"--workdir {run_copy}: no checkpoint restores (step 2: metadata: JSONDecodeError")
    assert "; step 6: state: " in message and "; step 4: state: " in message
    assert message.endswith(f"move {run_copy}/checkpoints aside to start over")
    assert _listing(os.path.join(run_copy, "checkpoints")) == ["2", "4", "6"]
    assert not os.path.exists(os.path.join(run_copy, "unreadable_checkpoints"))


# ---------------------------------------------------------------- restore_for_eval


def test_eval_restores_the_newest_params_of_a_workdir(saved_run, monkeypatch):
    model_config, params, metadata = checkpoints.restore_for_eval(saved_run)
    assert model_config == MODEL and metadata == CheckpointMetadata.from_json(_metadata(6))
    _assert_trees_equal(params, _params(6))
    assert {a.sharding for a in jax.tree.leaves(params)} == {jax.sharding.SingleDeviceSharding(jax.devices()[0])}
    monkeypatch.chdir(os.path.dirname(saved_run))
    assert checkpoints.restore_for_eval("run/checkpoints/")[2]["step"] == 6  # the checkpoints/ directory itself


def test_eval_restores_a_named_step_directory(saved_run, monkeypatch):
    monkeypatch.chdir(saved_run)
    model_config, params, metadata = checkpoints.restore_for_eval("checkpoints/2")
    assert model_config == MODEL and metadata == CheckpointMetadata.from_json(_metadata(2))
    _assert_trees_equal(params, _params(2))


def test_eval_falls_back_past_a_damaged_newest_without_moving_it(run_copy, caplog):
    _truncate(os.path.join(run_copy, "checkpoints", "6", "state"))
    with caplog.at_level(logging.WARNING):
        _, params, metadata = checkpoints.restore_for_eval(run_copy)
    assert metadata["step"] == 4
    _assert_trees_equal(params, _params(4))
    assert f"skipped checkpoint 6 of {run_copy}" in caplog.text and "evaluating step 4" in caplog.text
    assert _listing(os.path.join(run_copy, "checkpoints")) == ["2", "4", "6"]
    assert not os.path.exists(os.path.join(run_copy, "unreadable_checkpoints"))


def test_eval_of_a_damaged_named_step_is_a_one_line_error(run_copy):
    step_dir = os.path.join(run_copy, "checkpoints", "6")
    _truncate(os.path.join(step_dir, "state"))
    with pytest.raises(UserInputError) as error:
        checkpoints.restore_for_eval(step_dir)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{step_dir}: no checkpoint restores (step 6: ")


@pytest.mark.parametrize("where, expected", [
    ("run/checkpoints/8", "no such checkpoint"),
    ("run/other", "no checkpoints/ directory: not a pmi-jax training workdir"),
    ("empty", "holds no complete checkpoint"),
])
def test_eval_of_something_that_is_no_checkpoint(run_copy, tmp_path, where, expected):
    os.makedirs(tmp_path / "empty" / "checkpoints" / "9.orbax-checkpoint-tmp")
    os.makedirs(tmp_path / "run" / "other")
    with pytest.raises(UserInputError, match=f"^{tmp_path / where}: {expected}$"):
        checkpoints.restore_for_eval(str(tmp_path / where))


def test_an_abandoned_orbax_read_task_is_not_logged_and_other_task_errors_are(caplog):
    """asyncio's "Task exception was never retrieved" for a read a failed restore left behind is dropped
    (the restore's own error is reported once); the same message for any other error still shows."""
    import asyncio
    import gc

    from pmi_jax import checkpoints as ckpt

    ckpt._quiet_orbax()

    def leave_a_failed_task(error: Exception) -> None:
        async def main():
            async def read():
                raise error
            task = asyncio.ensure_future(read())
            await asyncio.sleep(0.01)
            del task
        asyncio.run(main())
        gc.collect()

    with caplog.at_level("ERROR", logger="asyncio"):
        leave_a_failed_task(Exception("Encountered error while reading array index. See full TensorStore details"))
        assert "never retrieved" not in caplog.text
        leave_a_failed_task(ValueError("unrelated"))
        assert "Task exception was never retrieved" in caplog.text and "unrelated" in caplog.text
