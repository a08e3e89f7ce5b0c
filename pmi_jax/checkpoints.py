"""Orbax checkpoints of a training run, and loading one for evaluation.

Layout under `--workdir` (local or gs://):

    checkpoints/<step>/state      params, opt_state, step, rng  (sharded arrays, OCDBT)
    checkpoints/<step>/metadata   JSON: experiment config, model config, data position,
                                  data_dir, scheme, vocab_size, vocab_sha256
    tensorboard/                  event files and metrics.jsonl (pmi_jax.metrics)

Orbax writes each step into a temporary directory and renames it when complete, so a
killed job never leaves a half-written checkpoint that a restart would pick up. Every
process calls `save` and `restore` (each writes/reads its own shards).
"""
from __future__ import annotations

import functools
import os

import jax
import orbax.checkpoint as ocp
from etils import epath

from pmi_jax.config import CheckpointConfig, ModelConfig, model_config_from_dict
from pmi_jax.errors import UserInputError

CHECKPOINT_DIR = "checkpoints"
_ITEMS = ("state", "metadata")


def checkpoint_dir(workdir: str) -> str:
    return workdir.rstrip("/") + "/" + CHECKPOINT_DIR


class Checkpointer:
    """Saves every `every_steps` (plus forced saves at the end and on SIGTERM), keeps `keep`."""

    def __init__(self, workdir: str, config: CheckpointConfig, *, read_only: bool = False):
        _no_replica_parallel_on_cpu()
        options = ocp.CheckpointManagerOptions(max_to_keep=config.keep, create=not read_only,
                                               read_only=read_only, enable_async_checkpointing=True)
        self.every_steps = config.every_steps
        self._manager = ocp.CheckpointManager(epath.Path(checkpoint_dir(workdir)), options=options,
                                              item_names=_ITEMS)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(self, step: int, state, metadata: dict) -> None:
        """Start an asynchronous save; the previous one is finished first by Orbax."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)), force=True)

    def metadata(self, step: int) -> dict:
        return self._manager.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))["metadata"]

    def restore(self, step: int, abstract_state):
        """Restore into the shapes, dtypes and shardings of `abstract_state`."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), metadata=ocp.args.JsonRestore()))
        return restored["state"], restored["metadata"]

    def restore_subtree(self, step: int, target: dict):
        """Restore only the leaves named in `target` (e.g. {"params": ...}) of the state."""
        restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
        return restored["state"]

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


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


def check_compatible(workdir: str, model_config: ModelConfig) -> int | None:
    """The latest step in `workdir`, after checking it holds this very model (else raise)."""
    path = epath.Path(checkpoint_dir(workdir))
    if not path.exists():
        return None
    checkpointer = Checkpointer(workdir, CheckpointConfig(), read_only=True)
    step = checkpointer.latest_step()
    if step is None:
        return None
    saved = model_config_from_dict(checkpointer.metadata(step)["model"])
    if saved != model_config:
        differences = ", ".join(
            f"{k}: {getattr(saved, k)!r} in the checkpoint vs {getattr(model_config, k)!r} now"
            for k in saved.__dataclass_fields__ if getattr(saved, k) != getattr(model_config, k))
        raise UserInputError(
            f"--workdir {workdir} holds a checkpoint (step {step}) of a different model ({differences}); "
            "use a new workdir")
    return step


def _locate(workdir_or_step_dir: str) -> tuple[str, int]:
    """(workdir, step) for a run directory (latest step) or one `checkpoints/<step>` directory."""
    path = workdir_or_step_dir.rstrip("/")
    name = os.path.basename(path)
    parent = os.path.dirname(path)
    if name.isdigit() and os.path.basename(parent) == CHECKPOINT_DIR:
        return os.path.dirname(parent), int(name)
    if name == CHECKPOINT_DIR:
        path = parent
    if not epath.Path(checkpoint_dir(path)).exists():
        raise UserInputError(f"{workdir_or_step_dir}: no {CHECKPOINT_DIR}/ directory: not a pmi-jax training workdir")
    step = Checkpointer(path, CheckpointConfig(), read_only=True).latest_step()
    if step is None:
        raise UserInputError(f"{workdir_or_step_dir}: holds no complete checkpoint")
    return path, step


def restore_for_eval(workdir_or_step_dir: str):
    """(ModelConfig, params, metadata) of a checkpoint, parameters only, on the default device.

    `workdir_or_step_dir` is a training `--workdir` (its latest checkpoint is used) or one
    `…/checkpoints/<step>` directory. `params` is the BertForMaskedLM "params" tree (encoder
    under params["encoder"]); the optimizer state is not read. `metadata` holds at least
    step, data_dir, vocab_sha256, vocab_size and scheme.
    """
    from pmi_jax.model import BertForMaskedLM

    workdir, step = _locate(workdir_or_step_dir)
    checkpointer = Checkpointer(workdir, CheckpointConfig(), read_only=True)
    metadata = checkpointer.metadata(step)
    model_config = model_config_from_dict(metadata["model"])
    abstract_params = abstract_model_params(BertForMaskedLM(model_config))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                                     abstract_params)}
    params = checkpointer.restore_subtree(step, target)["params"]
    checkpointer.close()
    return model_config, params, metadata


def abstract_model_params(model):
    """Shapes and dtypes of the model's "params" (no computation, no boxes)."""
    import flax.linen as nn
    import jax.numpy as jnp

    ids = jnp.zeros((1, 1), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, deterministic=True))
    return nn.unbox(variables)["params"]
