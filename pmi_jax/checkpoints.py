"""Orbax checkpoints of a training run, and loading one for evaluation.

Under `--workdir`: `checkpoints/<step>/state` (sharded arrays, OCDBT) and
`checkpoints/<step>/metadata` (pmi_jax.formats.run_dir). Orbax renames a step's directory when
complete, so a killed job leaves no half-written checkpoint; every process calls `save` and
`restore`. A damaged checkpoint is skipped: training falls back to the newest one that restores
and moves the skipped ones to `unreadable_checkpoints/<step>`, evaluation falls back without
moving (docs/reliability.md; why moved: docs/design.md, "Module notes", checkpoints.py).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import traceback
import warnings

import jax
import orbax.checkpoint as ocp
from etils import epath

from pmi_jax import paths
from pmi_jax.config import CheckpointConfig, ModelConfig, model_config_from_dict
from pmi_jax.errors import UserInputError
from pmi_jax.formats import run_dir
from pmi_jax.formats.run_dir import CheckpointMetadata

CHECKPOINT_DIR = run_dir.CHECKPOINT_DIR
UNREADABLE_DIR = "unreadable_checkpoints"
_ITEMS = ("state", "metadata")


def checkpoint_dir(workdir: str) -> str:
    return paths.absolute(workdir).rstrip("/") + "/" + CHECKPOINT_DIR


def step_directories(workdir: str) -> list[int]:
    """The steps that have a `checkpoints/<step>` directory, ascending; complete or not (Orbax's
    listing, `Checkpointer.all_steps`, is the one that knows which saves finished)."""
    root = epath.Path(checkpoint_dir(workdir))
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def drop_states(workdir: str) -> None:
    """Delete every checkpoint's `state` item (parameters and optimizer state), keeping its metadata.

    For a run directory that has to travel small, from a lent accelerator whose checkpoints
    cannot come back: `pmi-jax compare` reads only the metadata (config, step, scheme) beside
    the run's metrics and eval records; resuming or evaluating such a run is refused, as for
    any checkpoint whose state does not restore.
    """
    for step in step_directories(workdir):
        state = epath.Path(checkpoint_dir(workdir)) / str(step) / _ITEMS[0]
        if state.exists():
            state.rmtree()


class Checkpointer:
    """Saves every `every_steps` (plus forced saves at the end and on SIGTERM), keeps `keep`."""

    def __init__(self, workdir: str, config: CheckpointConfig, *, read_only: bool = False, changes: tuple = ()):
        """`changes`: the run's changed settings (`resumed_changes`), written into every metadata saved."""
        _no_replica_parallel_on_cpu()
        self.changes = tuple(changes)
        _quiet_orbax()
        options = ocp.CheckpointManagerOptions(max_to_keep=config.keep, create=not read_only,
                                               read_only=read_only, enable_async_checkpointing=True,
                                               cleanup_tmp_directories=not read_only)  # a killed save's leftovers
        self.every_steps = config.every_steps
        self._manager = ocp.CheckpointManager(epath.Path(checkpoint_dir(workdir)), options=options,
                                              item_names=_ITEMS)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every complete step, newest first."""
        return sorted(self._manager.all_steps(), reverse=True)

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(self, step: int, state, metadata: CheckpointMetadata | dict) -> None:
        """Start an asynchronous save; the previous one is finished first by Orbax."""
        record = metadata.to_json() if isinstance(metadata, CheckpointMetadata) else metadata
        if self.changes:
            record = {**record, "changes": [dict(c) for c in self.changes]}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(record)), force=True)

    def metadata(self, step: int) -> CheckpointMetadata:
        record = self._manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]
        return CheckpointMetadata.from_json(record)

    def restore(self, step: int, abstract_state):
        """Restore into the shapes, dtypes and shardings of `abstract_state`."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), metadata=ocp.args.JsonRestore()))
        return restored["state"], CheckpointMetadata.from_json(restored["metadata"])

    def restore_subtree(self, step: int, target: dict):
        """Restore only the leaves named in `target` (e.g. {"params": ...}) of the state."""
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
        return restored["state"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


# What Orbax says on every read-only CheckpointManager (ours read checkpoints, never write
# them): not news to a user, and "read only" reads as a fault of a writable directory.
_ORBAX_READ_ONLY_NARRATION = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


# A save that fails for want of space: the error reaches the command, which reports it in one
# line (pmi_jax.storage.write_errors); Orbax's background threads log it first, with tracebacks.
_WRITE_FAILURE = ("No space left on device", "[os_error_code='28']", "Read-only file system")


class _DropOrbaxNarration(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(_ORBAX_READ_ONLY_NARRATION):
            return False
        error = record.exc_info[1] if record.exc_info else None
        return not (error is not None and any(text in str(error) for text in _WRITE_FAILURE))


class _DropAbandonedReadTasks(logging.Filter):
    """asyncio's "... exception was never retrieved" for Orbax reads or writes left behind by a
    failed restore or save (as below, when they ran as tasks): the failure is reported once."""

    def filter(self, record: logging.LogRecord) -> bool:
        # "Task", "Future" or "_GatheringFuture exception was never retrieved", by what was left behind.
        if "exception was never retrieved" not in record.getMessage().split("\n", 1)[0]:
            return True
        error = record.exc_info[1] if record.exc_info else None
        frames = traceback.extract_tb(error.__traceback__) if error is not None else []
        # TensorStore's own errors ("... in OCDBT database ...") may arrive without Orbax frames.
        return not (any("orbax" in frame.filename for frame in frames)
                    or any(name in str(error) for name in ("TensorStore", "OCDBT")))


def _drop_abandoned_reads(unraisable, *, previous) -> None:
    """sys.unraisablehook: drop what Orbax's abandoned reads raise after a restore failed.

    A restore that fails on one array leaves the reads of the others as coroutines that no one
    awaits; each later raises its own copy of the error (or "Event loop is closed") into
    sys.unraisablehook, a traceback per array. The failure itself is already reported, once,
    by the restore's exception (named in the fallback's warning), so these are dropped.
    """
    code = getattr(unraisable.object, "cr_code", None)
    from_orbax = code is not None and "orbax" in code.co_filename
    loop_closed = isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(
        unraisable.exc_value)
    if not (from_orbax or loop_closed):
        previous(unraisable)


@functools.cache
def _quiet_orbax() -> None:
    """Once per process: the three filters above, and a fourth: a restore or save that failed
    (damaged checkpoint, full disk) leaves Orbax's other reads or writes as coroutines no one
    will await, and Python warns of each at exit ("coroutine '...' was never awaited"), after
    the command's own error line. The failure is reported already; pmi-jax runs no coroutines."""
    import sys

    logging.getLogger("absl").addFilter(_DropOrbaxNarration())
    logging.getLogger("asyncio").addFilter(_DropAbandonedReadTasks())
    sys.unraisablehook = functools.partial(_drop_abandoned_reads, previous=sys.unraisablehook)
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning)


@functools.cache
def _no_replica_parallel_on_cpu() -> None:
    """Save replicated arrays from one replica when the devices are CPUs.

    Once per process (hence the cache): Orbax's handler registry is global, and registering
    again for every Checkpointer would only replace the handler with an equal one and repeat
    Orbax's "overriding" warning.

    Orbax's replica-parallel save slices every replicated array across its replicas, which
    costs one XLA compilation per array shape; on accelerators that buys parallel
    device-to-host copies, on CPU (where the copy is a memcpy) it only costs seconds.
    """
    if jax.default_backend() == "cpu":
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True)


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A checkpoint that did not restore, and the first line of why."""

    step: int
    reason: str


def _reason(error: Exception) -> str:
    """The first line of the innermost cause: Orbax wraps TensorStore's precise error ("Error
    reading X ... not valid for value of size 10") in a generic one that prints a whole spec."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    first = lines[0].split(" See full TensorStore details")[0] if lines else ""
    return f"{type(error).__name__}: {first[:200]}"


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """What a run may resume from: checkpoints whose metadata reads (newest first), checked
    to hold this model on this vocabulary, and those whose metadata does not read."""

    workdir: str
    candidates: tuple[int, ...]
    unreadable: tuple[Unreadable, ...]
    newest: CheckpointMetadata | None = None  # the metadata of candidates[0]


def _vocab_source(metadata: CheckpointMetadata) -> str:
    if metadata.vocab_sha256 is None:
        return "the synthetic corpus (no vocab.txt)"
    return f"vocab.txt of {metadata.data_dir}"


def plan_resume(workdir: str, model_config: ModelConfig, vocab_sha256: str | None, data_dir: str) -> ResumePlan:
    """Check, before anything is compiled or created, that `workdir` holds this model trained on
    this vocabulary (`vocab_sha256` of `data_dir`'s vocab.txt, None for synthetic data).

    A vocabulary of the same size with other tokens (a permuted vocab.txt) fits the model's
    shapes exactly, so only the hash tells the two apart.
    """
    plan = ResumePlan(workdir, (), ())
    if not epath.Path(checkpoint_dir(workdir)).exists():
        return plan
    checkpointer = Checkpointer(workdir, CheckpointConfig(), read_only=True)
    candidates, unreadable, newest = [], [], None
    for step in checkpointer.all_steps():
        try:
            saved = checkpointer.metadata(step)
            saved_model = model_config_from_dict(saved.model)
        except Exception as e:  # noqa: BLE001 - any damage: try the next older checkpoint
            unreadable.append(Unreadable(step, f"metadata: {_reason(e)}"))
            continue
        if saved_model != model_config:
            fields = [k for k in saved_model.__dataclass_fields__ if getattr(saved_model, k) != getattr(model_config, k)]
            differences = ", ".join(f"{k}: {getattr(saved_model, k)!r} in the checkpoint vs "
                                    f"{getattr(model_config, k)!r} now" for k in fields)
            flags = " ".join(f"--set model.{k}={getattr(saved_model, k)}" for k in fields)
            raise UserInputError(
                f"--workdir {workdir} holds a checkpoint (step {step}) of a different model ({differences}); "
                f"to resume it: {flags}; else use a new workdir")
        if saved.vocab_sha256 != vocab_sha256:
            now = f"vocab.txt of {data_dir}" if vocab_sha256 else "the synthetic corpus (no vocab.txt)"
            raise UserInputError(
                f"--workdir {workdir}: checkpoint step {step} was trained on {_vocab_source(saved)} "
                f"(sha256 {str(saved.vocab_sha256)[:12]}) but this run reads {now} "
                f"(sha256 {str(vocab_sha256)[:12]}): another vocabulary; use the original corpus or a new workdir")
        if not candidates:
            newest = saved
        candidates.append(step)
    checkpointer.close()
    return ResumePlan(workdir, tuple(candidates), tuple(unreadable), newest)


def _setting(config: dict, name: str):
    section, key = name.split(".")
    return config.get(section, {}).get(key)


def resumed_changes(plan: ResumePlan, config: dict, allowed: tuple[str, ...] = ()) -> tuple[dict, ...]:
    """The run's record of changed settings once it resumes from `plan` with `config` (to_dict).

    Every setting of RESUMED_SETTINGS must be what the newest checkpoint recorded, or be
    `allowed` (`train --allow-changed`), in which case the change and the step it takes effect
    are appended to the record the checkpoint carried; otherwise a one-line UserInputError names
    the setting, both values and the way to allow it. A checkpoint of a version that saved no
    config is not compared.
    """
    from pmi_jax.config import RESUMED_SETTINGS

    saved = plan.newest
    if saved is None:
        return ()
    history = tuple(saved.changes)
    step = plan.candidates[0]
    for name in RESUMED_SETTINGS:
        before, now = _setting(saved.config, name), _setting(config, name)
        if before is None or before == now:
            continue
        if name not in allowed:
            raise UserInputError(f"--workdir {plan.workdir}: checkpoint step {step} was trained with {name}="
                                 f"{before!r}, this run gives {now!r}; resume with the run's own setting, or pass "
                                 f"--allow-changed {name} to change it from step {step} (recorded in the run)")
        logging.warning("--workdir %s: %s changes from %r to %r at step %d (--allow-changed; recorded in the "
                        "checkpoints' metadata, shown by `pmi-jax compare`)", plan.workdir, name, before, now, step)
        history += ({"setting": name, "from": before, "to": now, "step": step},)
    return history


def restore_newest(plan: ResumePlan, target: dict) -> tuple[int, dict, dict] | None:
    """(step, state, metadata) of the newest candidate that restores into `target`, or None
    when the workdir holds no checkpoint. Every checkpoint skipped on the way is moved to
    `unreadable_checkpoints/`, with a warning; if none restores, UserInputError.
    """
    if not plan.candidates and not plan.unreadable:
        return None
    unreadable = list(plan.unreadable)
    restored = None
    checkpointer = Checkpointer(plan.workdir, CheckpointConfig(), read_only=True)
    for step in plan.candidates:
        try:
            state, metadata = checkpointer.restore(step, target)
        except Exception as e:  # noqa: BLE001 - any damage: try the next older checkpoint
            unreadable.append(Unreadable(step, f"state: {_reason(e)}"))
            continue
        restored = step, state, metadata
        break
    checkpointer.close()
    if restored is None:
        details = "; ".join(f"step {u.step}: {u.reason}" for u in unreadable)
        raise UserInputError(f"--workdir {plan.workdir}: no checkpoint restores ({details}); move "
                             f"{checkpoint_dir(plan.workdir)} aside to start over")
    _set_aside(plan.workdir, unreadable, restored[0])
    return restored


def _set_aside(workdir: str, unreadable: list[Unreadable], resumed: int) -> None:
    """Move unreadable steps out of checkpoints/ (process 0; the others wait for it)."""
    if not unreadable:
        return
    root = paths.absolute(workdir).rstrip("/") + "/" + UNREADABLE_DIR
    if jax.process_index() == 0:
        for u in unreadable:
            source = epath.Path(checkpoint_dir(workdir)) / str(u.step)
            destination = epath.Path(root) / str(u.step)
            if destination.exists():
                destination.rmtree()
            destination.parent.mkdir(parents=True, exist_ok=True)
            source.rename(destination)
            logging.warning("skipped checkpoint %d (%s): moved to %s; resuming from step %d", u.step, u.reason,
                            destination, resumed)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("pmi_jax.checkpoints: unreadable checkpoints set aside")


def _locate(workdir_or_step_dir: str) -> tuple[str, list[int]]:
    """(workdir, steps to try, newest first): every complete step of a run directory, or the one
    step of a `checkpoints/<step>` directory."""
    path = paths.absolute(workdir_or_step_dir).rstrip("/")
    name = os.path.basename(path)
    parent = os.path.dirname(path)
    if name.isdigit() and os.path.basename(parent) == CHECKPOINT_DIR:
        if not epath.Path(path).exists():
            raise UserInputError(f"{workdir_or_step_dir}: no such checkpoint")
        return os.path.dirname(parent), [int(name)]
    if name == CHECKPOINT_DIR:
        path = parent
    if not epath.Path(checkpoint_dir(path)).exists():
        raise UserInputError(f"{workdir_or_step_dir}: no {CHECKPOINT_DIR}/ directory: not a pmi-jax training workdir")
    steps = Checkpointer(path, CheckpointConfig(), read_only=True).all_steps()
    if not steps:
        raise UserInputError(f"{workdir_or_step_dir}: holds no complete checkpoint")
    return path, steps


def restore_for_eval(workdir_or_step_dir: str):
    """(ModelConfig, params, metadata) of a checkpoint, parameters only, on the default device.

    `workdir_or_step_dir` is a training `--workdir` (its newest checkpoint that restores is
    used; each newer one that does not is named in a warning) or one `…/checkpoints/<step>`
    directory (that one, or a UserInputError). `params` is the BertForMaskedLM "params" tree
    (encoder under params["encoder"]); the optimizer state is not read. `metadata` is the
    checkpoint's CheckpointMetadata (pmi_jax.formats.run_dir). The config takes the XLA paths
    where training took a Pallas kernel (`model.for_evaluation`).
    """
    workdir, steps = _locate(workdir_or_step_dir)
    checkpointer = Checkpointer(workdir, CheckpointConfig(), read_only=True)
    unreadable = []
    try:
        for step in steps:
            try:
                model_config, params, metadata = _restore_params(checkpointer, step)
            except Exception as e:  # noqa: BLE001 - any damage: try the next older checkpoint
                unreadable.append(Unreadable(step, _reason(e)))
                continue
            for u in unreadable:
                logging.warning("skipped checkpoint %d of %s (%s); evaluating step %d", u.step, workdir, u.reason, step)
            return model_config, params, metadata
    finally:
        checkpointer.close()
    details = "; ".join(f"step {u.step}: {u.reason}" for u in unreadable)
    raise UserInputError(f"{workdir_or_step_dir}: no checkpoint restores ({details})")


def _restore_params(checkpointer: Checkpointer, step: int):
    from pmi_jax.model import BertForMaskedLM, for_evaluation

    metadata = checkpointer.metadata(step)
    model_config = for_evaluation(model_config_from_dict(metadata.model))
    abstract_params = abstract_model_params(BertForMaskedLM(model_config))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                                     abstract_params)}
    return model_config, checkpointer.restore_subtree(step, target)["params"], metadata


def abstract_model_params(model):
    """Shapes and dtypes of the model's "params" (no computation, no boxes)."""
    import flax.linen as nn
    import jax.numpy as jnp

    ids = jnp.zeros((1, 1), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, deterministic=True))
    return nn.unbox(variables)["params"]
