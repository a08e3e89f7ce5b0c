"""The pretraining loop: sharded BERT MLM steps, checkpoints, metrics, preemption.

Batches come from `pmi_jax.batches`, the loss from `pmi_jax.mlm_loss`, the run directory's
names and records from `pmi_jax.formats.run_dir`. Step s always reads global batch s (gradient
accumulation scans micro-batches inside the step) and its dropout key is fold_in(rng, s), so a
resumed run repeats an uninterrupted one exactly. Every process runs this function and feeds
the rows its devices hold (`partitioning.host_batch_rows`); only process 0 writes metrics.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import shlex
import signal
import time
from typing import Any, Callable, Iterator, Protocol, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pmi_jax import checkpoints, flops, partitioning, paths, storage, tpu_attention
from pmi_jax.config import PALLAS_ATTENTION, ExperimentConfig, check_resumed_settings, to_dict
from pmi_jax.errors import UserInputError
from pmi_jax.formats import run_dir
from pmi_jax.model import BertForMaskedLM, for_platform
from pmi_jax.optimizer import global_norm, learning_rate_schedule, make_optimizer
from pmi_jax.batches import BatchSource, CorpusInfo
from pmi_jax.mlm_loss import check_predictions, mlm_loss_terms
from pmi_jax.progress import Progress


# --------------------------------------------------------------------------------------
# State and step
# --------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken = batches consumed
    params: Any
    opt_state: Any
    rng: jax.Array  # base dropout key's data (uint32[2] threefry, [4] rbg); step s uses fold_in(rng, s)

    def as_dict(self) -> dict:
        return {"step": self.step, "params": self.params, "opt_state": self.opt_state, "rng": self.rng}


def _dummy_inputs(seq_len: int):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return ids, jnp.ones_like(ids)


def prng_impl(name: str) -> str:
    """TrainConfig.prng_impl -> jax's implementation name."""
    return "threefry2x32" if name == "threefry" else name


def init_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, seq_len: int,
               impl: str = "threefry") -> TrainState:
    params_key, dropout_key = jax.random.split(jax.random.key(seed, impl=prng_impl(impl)))
    variables = model.init(params_key, *_dummy_inputs(seq_len), deterministic=True)
    params = nn.unbox(variables)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(dropout_key))


def state_shardings(model, tx, config: ExperimentConfig, mesh) -> tuple[TrainState, TrainState]:
    """(abstract state, its NamedShardings) from the logical names on the parameters."""
    seq_len = config.data.seq_len
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *_dummy_inputs(seq_len), deterministic=True))
    logical_specs = nn.get_partition_spec(boxed)["params"]
    param_shardings = partitioning.logical_to_sharding(logical_specs, mesh, config.mesh)
    abstract = jax.eval_shape(lambda: init_state(model, tx, config.train.seed, seq_len, config.train.prng_impl))
    partitioning.check_divisible(abstract.params, param_shardings, logical_specs)
    replicated = partitioning.replicated(mesh)
    # optax builds the optimiser state's structure by running `tx.init` (a few jnp.zeros);
    # traced under eval_shape it stays abstract, so this also works on a mesh of
    # compile-only devices (pmi_jax.compile_only), which cannot execute anything.
    found = {}

    def map_shardings():
        found["opt"] = optax.tree_map_params(tx, lambda _, s: s, abstract.opt_state, param_shardings,
                                             transform_non_params=lambda _: replicated)

    jax.eval_shape(map_shardings)
    opt_shardings = found["opt"]
    shardings = TrainState(step=replicated, params=param_shardings, opt_state=opt_shardings, rng=replicated)
    return abstract, shardings


def make_train_step(model, tx, config: ExperimentConfig, mesh, grouped_norm: bool = False) -> Callable:
    """(state, batch) -> (state, metrics); pure, to be jitted with shardings. `grouped_norm`: the
    metric's gradient norm as `tx` computes it (`optimizer.global_norm`), so XLA computes it once."""
    accum = config.optimizer.grad_accum_steps
    schedule = learning_rate_schedule(config.optimizer, config.train.num_steps)
    num_predictions = config.model.predictions(config.data.seq_len, config.data.highest_mask_rate)
    grad_fn = jax.value_and_grad(
        lambda p, b, r, d: mlm_loss_terms(model, p, b, r, d, deterministic=False, num_predictions=num_predictions),
        has_aux=True)
    micro_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, partitioning.BATCH_AXES))

    def to_micro_batches(x_BxL):
        # Row r goes to micro-batch r % accum, so every device keeps its own rows (no transfer).
        x_AxbxL = jnp.swapaxes(x_BxL.reshape(-1, accum, *x_BxL.shape[1:]), 0, 1)
        return jax.lax.with_sharding_constraint(x_AxbxL, micro_sharding)

    def accumulate(params, batch, rng, denominator):
        if accum == 1:
            return grad_fn(params, batch, rng, denominator)
        micro = jax.tree.map(to_micro_batches, batch)

        def body(carry, i):
            mb = jax.tree.map(lambda x: x[i], micro)
            terms = grad_fn(params, mb, jax.random.fold_in(rng, i), denominator)
            return jax.tree.map(jnp.add, carry, terms), None

        zeros = ((jnp.zeros(()), jnp.zeros(())), jax.tree.map(jnp.zeros_like, params))
        totals, _ = jax.lax.scan(body, zeros, jnp.arange(accum))
        return totals

    impl = prng_impl(config.train.prng_impl)

    def train_step(state: TrainState, batch):
        rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng, impl=impl), state.step)
        denominator = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
        (loss, accuracy), grads = accumulate(state.params, batch, rng, denominator)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                                  opt_state=opt_state)
        step_metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": global_norm(grads, grouped_norm),
                        "learning_rate": schedule(state.step)}
        return new_state, step_metrics

    return train_step


def make_validation_step(model, config: ExperimentConfig) -> Callable:
    """(params, batch) -> (summed loss, summed correct, masked tokens) of one batch, no dropout:
    sums, so that validation over several batches is the mean over all their masked tokens."""
    num_predictions = config.model.predictions(config.data.seq_len, config.data.highest_mask_rate)

    def validation_step(params, batch):
        loss, correct = mlm_loss_terms(model, params, batch, jax.random.key(0), 1.0, deterministic=True,
                                       num_predictions=num_predictions)
        return loss, correct, jnp.sum(batch["weights"])

    return validation_step


@dataclasses.dataclass(frozen=True)
class Program:
    """The sharded, jitted pieces of training for one config on one mesh."""

    abstract: TrainState  # shapes and dtypes
    shardings: TrainState  # a NamedSharding per leaf
    init: Callable[[], TrainState]
    step: Callable[[TrainState, dict], tuple[TrainState, dict]]  # donates its state argument
    validate: Callable[[Any, dict], tuple]  # (params, batch) -> sums, `make_validation_step`

    def restore_target(self) -> dict:
        """What Orbax restores into: the state's shapes, dtypes and shardings."""
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            self.abstract.as_dict(), self.shardings.as_dict())


def grouped_norm_applies(mesh, param_shardings) -> bool:
    """Whether the step takes the gradient norm in few kernels (`optimizer.global_norm`): in
    GPU programs, where each kernel launch costs, and only with every parameter replicated."""
    return (mesh.devices.flat[0].platform in ("gpu", "cuda")
            and all(s.is_fully_replicated for s in jax.tree.leaves(param_shardings)))


def build_program(config: ExperimentConfig, mesh) -> Program:
    """Call inside `partitioning.activate(mesh, ...)`: the model's constraints bind at trace time."""
    model = BertForMaskedLM(for_platform(config.model, mesh.devices.flat[0].platform))
    abstract, shardings = state_shardings(model, make_optimizer(config.optimizer, config.train.num_steps), config, mesh)
    grouped = grouped_norm_applies(mesh, shardings.params)
    tx = make_optimizer(config.optimizer, config.train.num_steps, grouped)
    init = jax.jit(lambda: init_state(model, tx, config.train.seed, config.data.seq_len, config.train.prng_impl),
                   out_shardings=shardings)
    step = jax.jit(make_train_step(model, tx, config, mesh, grouped),
                   in_shardings=(shardings, partitioning.batch_sharding(mesh)),
                   out_shardings=(shardings, partitioning.replicated(mesh)), donate_argnums=0)
    validate = jax.jit(make_validation_step(model, config),
                       in_shardings=(shardings.params, partitioning.batch_sharding(mesh)),
                       out_shardings=partitioning.replicated(mesh))
    return Program(abstract, shardings, init, step, validate)


# --------------------------------------------------------------------------------------
# Validation (everything that can be checked before compiling)
# --------------------------------------------------------------------------------------


def validate(config: ExperimentConfig, mesh) -> None:
    for name in ("batch_size", "num_steps", "log_every_steps", "eval_batches"):
        if getattr(config.train, name) < 1:
            raise UserInputError(f"train.{name}={getattr(config.train, name)}: must be at least 1")
    if config.train.eval_every_steps < 0:
        raise UserInputError(f"train.eval_every_steps={config.train.eval_every_steps}: must be >= 0 (0: no validation)")
    batch, accum = config.train.batch_size, config.optimizer.grad_accum_steps
    split = partitioning.batch_axis_size(mesh)
    if accum < 1 or batch % accum:
        raise UserInputError(
            f"train.batch_size={batch} is not divisible by optimizer.grad_accum_steps={accum}")
    if (batch // accum) % split:
        raise UserInputError(
            f"train.batch_size={batch} (micro-batch {batch // accum}) is not divisible by the data axis of the mesh "
            f"(data x fsdp = {split})")
    if config.data.seq_len > config.model.max_position_embeddings:
        raise UserInputError(
            f"sequence length {config.data.seq_len} exceeds model.max_position_embeddings="
            f"{config.model.max_position_embeddings}")
    if config.model.attention in PALLAS_ATTENTION and mesh.devices.flat[0].platform == "tpu":
        _validate_tpu_attention(config)
    for_platform(config.model, mesh.devices.flat[0].platform)  # refuses the kernels a platform has not


def _validate_tpu_attention(config: ExperimentConfig) -> None:
    """The Mosaic kernel's limits that a run's settings can break (docs/tpu.md); it runs on each
    device's shard of the batch and heads (`model._on_each_shard`). The GPU kernel takes any length."""
    m = config.model
    try:
        tpu_attention.check_shapes((1, config.data.seq_len, m.num_heads, m.head_dim))
    except ValueError as e:
        raise UserInputError(f"data.seq_len={config.data.seq_len} with model.attention={config.model.attention}: {e}; "
                             "use model.attention=auto") from None


# --------------------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    status: str  # "completed" | "preempted" (SIGTERM) | "interrupted" (SIGINT)
    step: int
    logdir: str


class NonFiniteLoss(Exception):
    pass


class _Preemption:
    """SIGTERM or SIGINT (Ctrl-C) -> finish the current step, checkpoint, stop.

    One process: a Python signal handler sets a flag. Several: jax.distributed's preemption
    service (which owns SIGTERM there) makes every process agree on the step to stop at, so a
    SIGINT is passed to it as a SIGTERM to this process. `signal` names the first one received;
    later ones are the same request (the process group may get one twice: pmi_jax/cli/quiet.py).
    """

    def __init__(self):
        self.signal: str | None = None
        self._previous = {}
        signals = [signal.SIGINT] + ([signal.SIGTERM] if jax.process_count() == 1 else [])
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            logging.warning("%s received: checkpointing after the current step", self.signal)
            if jax.process_count() > 1 and signum == signal.SIGINT:
                os.kill(os.getpid(), signal.SIGTERM)  # the preemption service tells every process

    def reached(self, step: int) -> bool:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return self.requested

    def status(self) -> str:
        """The run's end: "interrupted" after a SIGINT here, else "preempted"."""
        return "interrupted" if self.signal == "SIGINT" else "preempted"

    def restore(self):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


class _MetricsLog:
    """Keeps per-step device metrics until the next flush, so logging never blocks a step."""

    def __init__(self, writer: run_dir.MetricWriter, config: ExperimentConfig, num_devices: int, peak: float | None):
        self.writer = writer
        self.pending: list[tuple[int, dict]] = []
        self.sequences_per_step = config.train.batch_size
        self.tokens_per_step = config.train.batch_size * config.data.seq_len
        self.flops_per_token = flops.training_flops_per_token(config.model, config.data.seq_len,
                                                              config.data.highest_mask_rate)
        self.num_devices = num_devices
        self.peak = peak
        self.clock: tuple[int, float] | None = None  # (step, time) of the last synchronisation

    def add(self, step: int, step_metrics: dict) -> None:
        self.pending.append((step, step_metrics))

    def start_clock(self, step: int) -> None:
        self.clock = (step, time.perf_counter())

    def pause(self, seconds: float) -> None:
        """Leave `seconds` (validation) out of the next throughput figures."""
        if self.clock is not None:
            self.clock = (self.clock[0], self.clock[1] + seconds)

    def write_validation(self, step: int, loss: float, accuracy: float, seconds: float) -> None:
        self.writer.write(step, {"validation_loss": loss, "validation_accuracy": accuracy,
                                 "validation_seconds": seconds})

    def flush(self) -> None:
        """Fetch pending metrics, stop on a non-finite loss, write the interval means."""
        if not self.pending:
            return
        fetched = [(s, jax.device_get(m)) for s, m in self.pending]
        self.pending = []
        for s, m in fetched:
            if not math.isfinite(float(m["loss"])):
                raise NonFiniteLoss(f"loss is {float(m['loss'])} at step {s}; stopping (the last checkpoint is "
                                    "the last good state)")
        last_step = fetched[-1][0]
        scalars = {k: float(np.mean([m[k] for _, m in fetched])) for k in ("loss", "accuracy", "grad_norm")}
        scalars["learning_rate"] = float(fetched[-1][1]["learning_rate"])
        now = time.perf_counter()
        if self.clock is not None and last_step > self.clock[0]:
            steps_per_s = (last_step - self.clock[0]) / (now - self.clock[1])
            tokens_per_s = steps_per_s * self.tokens_per_step
            scalars["sequences_per_s"] = steps_per_s * self.sequences_per_step
            scalars["tokens_per_s"] = tokens_per_s
            scalars["mfu"] = flops.mfu(self.flops_per_token, tokens_per_s, self.num_devices, self.peak)
        self.clock = (last_step, now)
        self.writer.write(last_step, scalars)


def checkpoint_metadata(config: ExperimentConfig, corpus: CorpusInfo | None, step: int) -> run_dir.CheckpointMetadata:
    """The record saved next to every checkpoint; evaluation checks the vocabulary hash."""
    return run_dir.CheckpointMetadata(
        step=step, data_position=step, model=to_dict(config.model), config=to_dict(config),
        data_dir=corpus.data_dir if corpus else config.data.data_dir, scheme=config.data.scheme,
        seq_len=config.data.seq_len, vocab_size=config.model.vocab_size,
        vocab_sha256=corpus.vocab_sha256 if corpus else None, jax_version=jax.__version__,
        process_count=jax.process_count())


def device_peak(config: ExperimentConfig) -> float | None:
    return config.train.peak_flops or flops.device_peak_flops(jax.devices()[0].device_kind)


def train(config: ExperimentConfig, workdir: str, source: BatchSource, corpus: CorpusInfo | None = None,
          devices=None, initial_params=None, progress: bool = False, allow_changed: tuple[str, ...] = ()) -> RunResult:
    """Train up to `train.num_steps`, resuming from the latest checkpoint in `workdir`.

    `initial_params` (host arrays shaped like the model's params, e.g. a transformers
    checkpoint from `pmi_jax.huggingface.initial_params`) replace the random initialisation of a
    run that starts at step 0; the optimizer state starts fresh. A resumed run ignores them.
    `devices` defaults to every device of every process. Raises UserInputError (before
    compiling anything) for a mesh or batch size that does not fit the devices, or a workdir
    holding another model; NonFiniteLoss on a NaN/inf loss. `progress`: draw a progress line
    on stderr (`pmi_jax.progress`; the CLI asks for it when stderr is a terminal).
    `allow_changed`: settings a resumed run may change (`resumed_settings`).
    """
    mesh = partitioning.make_mesh(config.mesh, devices)
    validate(config, mesh)
    workdir = paths.absolute(workdir)  # Orbax takes absolute paths only
    resume = checkpoints.plan_resume(workdir, config.model, corpus.vocab_sha256 if corpus else None,
                                     corpus.data_dir if corpus else config.data.data_dir)
    changes = resumed_settings(resume, config, allow_changed)
    start_step = resume.candidates[0] if resume.candidates else 0
    logdir = run_dir.logdir(workdir)
    is_main = jax.process_index() == 0
    if is_main:
        print(f"TensorBoard logs: {logdir}", flush=True)
        logging.info("mesh %s over %d devices (%d processes); starting at step %d", dict(mesh.shape),
                     mesh.devices.size, jax.process_count(), start_step)

    with partitioning.activate(mesh, config.mesh):
        program = build_program(config, mesh)
        restored = checkpoints.restore_newest(resume, program.restore_target())
        checkpointer = checkpoints.Checkpointer(workdir, config.checkpoint, changes=changes)
        if restored:
            start_step, state, saved = restored
            state = TrainState(**state)
            if saved.data_position != start_step:
                raise UserInputError(f"--workdir {workdir}: checkpoint {start_step} has data position "
                                     f"{saved.data_position}")
        else:
            start_step, state = 0, program.init()
            if initial_params is not None:
                state = state.replace(params=place_params(initial_params, program.shardings.params))

        writer = run_dir.MetricWriter(logdir, enabled=is_main)
        bar = Progress(config.train.num_steps, config.train.batch_size * config.data.seq_len,
                       enabled=progress and is_main)
        metrics = MetricsHook(_MetricsLog(writer, config, mesh.devices.size, device_peak(config)), bar, config,
                              start_step)
        checkpoint = CheckpointHook(checkpointer, metrics, config, corpus)
        validation = [ValidationHook.build(config, source, mesh, program, metrics)] if config.train.eval_every_steps else []
        preemption = _Preemption()
        hooks = [metrics, *validation, PreemptionHook(preemption, checkpoint), checkpoint]
        # A full disk's one-line error says how much room the run needs: a checkpoint's arrays.
        with storage.needs_space(sum(x.nbytes for x in jax.tree.leaves(state.as_dict()))):
            try:
                result = _loop(program.step, state, _global_batches(config, source, mesh, start_step), start_step,
                               hooks)
            finally:
                bar.close()
                try:
                    checkpointer.wait()
                    checkpointer.close()
                    writer.close()
                finally:
                    preemption.restore()  # after the last save: a signal meanwhile asks for what is under way
    if is_main:
        print(f"TensorBoard logs: {logdir}  (tensorboard --logdir {shlex.quote(logdir)})", flush=True)
    return dataclasses.replace(result, logdir=logdir)


def resumed_settings(resume: checkpoints.ResumePlan, config: ExperimentConfig,
                     allow_changed: tuple[str, ...]) -> tuple[dict, ...]:
    """A resumed run keeps its scheme, masking rate and schedule, seeds and corpus, unless the
    user allows a change by name; the changes, with their step, go into every checkpoint's
    metadata from then on (issue 33; docs/reliability.md). Checked before anything is written."""
    return checkpoints.resumed_changes(resume, to_dict(config), check_resumed_settings(allow_changed))


def place_params(params, shardings):
    """Host arrays that every process holds in full -> global arrays laid out by `shardings`.

    The optimizer state of `program.init()` stays: AdamW's moments and count start at zero
    whatever the parameters, so it is the fresh state of these parameters too.
    """
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]),
                        params, shardings)


# --------------------------------------------------------------------------------------
# Hooks: what runs after each step, in the order the loop is given them
# --------------------------------------------------------------------------------------


class Hook(Protocol):
    def __call__(self, step: int, state: TrainState, step_metrics: dict) -> str | None:
        """Runs after optimizer step `step`; returning a status ("preempted", ...) ends the run there."""


class MetricsHook:
    """Per-step metrics kept on the device and written every `train.log_every_steps`; the progress line."""

    def __init__(self, log: _MetricsLog, bar: Progress, config: ExperimentConfig, start_step: int):
        self.log, self.bar, self.config, self.start_step = log, bar, config, start_step

    def __call__(self, step: int, state: TrainState, step_metrics: dict) -> None:
        self.log.add(step, step_metrics)
        if step == self.start_step + 1:  # the first step compiled: time from here on
            jax.block_until_ready(step_metrics)
            self.log.start_clock(step)
            self.bar.start(step)
        self.bar.update(step)
        if step % self.config.train.log_every_steps == 0 or step == self.config.train.num_steps:
            self.flush()

    def flush(self) -> None:
        """Write what is pending; raises NonFiniteLoss on a non-finite loss."""
        self.bar.clear()
        self.log.flush()

    def write_validation(self, step: int, loss: float, accuracy: float, seconds: float) -> None:
        self.log.pause(seconds)
        self.bar.clear()
        self.log.write_validation(step, loss, accuracy, seconds)


@dataclasses.dataclass
class ValidationHook:
    """The fixed validation batches, on the devices, scored every `train.eval_every_steps` and at the end."""

    batches: list[dict]  # global arrays
    step: Callable
    config: ExperimentConfig
    metrics: MetricsHook

    @classmethod
    def build(cls, config: ExperimentConfig, source: BatchSource, mesh, program: Program,
              metrics: MetricsHook) -> "ValidationHook":
        """Batches of the micro-batch size (train.batch_size / optimizer.grad_accum_steps): what
        fits a training step's memory fits a validation forward pass."""
        batch = config.train.batch_size // config.optimizer.grad_accum_steps
        start, stop = partitioning.host_batch_rows(mesh, batch)
        local = source.validation_batches(config.train.eval_batches, batch, start // (stop - start),
                                          batch // (stop - start))
        for rows in local:
            check_predictions(rows["weights"], config, 0)
        return cls([partitioning.global_batch_from_host(rows, mesh, batch) for rows in local], program.validate,
                   config, metrics)

    def due(self, step: int) -> bool:
        return step % self.config.train.eval_every_steps == 0 or step == self.config.train.num_steps

    def run(self, params) -> tuple[float, float]:
        """(loss, accuracy): means over every masked token of the batches."""
        sums = [self.step(params, batch) for batch in self.batches]
        loss, correct, tokens = (float(np.sum(np.asarray(jax.device_get(x), np.float64))) for x in zip(*sums))
        return loss / max(tokens, 1.0), correct / max(tokens, 1.0)

    def __call__(self, step: int, state: TrainState, step_metrics: dict) -> None:
        if self.due(step):
            began = time.perf_counter()
            loss, accuracy = self.run(state.params)
            self.metrics.write_validation(step, loss, accuracy, time.perf_counter() - began)


@dataclasses.dataclass
class CheckpointHook:
    """Saves every `checkpoint.every_steps` and at the end, after writing the pending metrics (so that
    a non-finite loss stops the run before a bad state is saved)."""

    checkpointer: checkpoints.Checkpointer
    metrics: MetricsHook
    config: ExperimentConfig
    corpus: CorpusInfo | None

    def save(self, step: int, state: TrainState) -> None:
        self.metrics.flush()
        self.checkpointer.save(step, state.as_dict(), checkpoint_metadata(self.config, self.corpus, step))

    def __call__(self, step: int, state: TrainState, step_metrics: dict) -> None:
        if self.checkpointer.due(step) or step == self.config.train.num_steps:
            self.save(step, state)


@dataclasses.dataclass
class PreemptionHook:
    """A SIGTERM or SIGINT received (every process agreeing on the step): checkpoint and stop."""

    preemption: _Preemption
    checkpoint: CheckpointHook

    def __call__(self, step: int, state: TrainState, step_metrics: dict) -> str | None:
        if not self.preemption.reached(step):
            return None
        self.checkpoint.save(step, state)
        logging.warning("%s: saved checkpoint at step %d", self.preemption.status(), step)
        return self.preemption.status()


# --------------------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------------------


def _global_batches(config: ExperimentConfig, source: BatchSource, mesh, start_step: int) -> Iterator[dict]:
    """Global batch s for each step s from `start_step`, from the rows this process holds."""
    global_batch = config.train.batch_size
    start, stop = partitioning.host_batch_rows(mesh, global_batch)
    local_batches = source.batches(start_step, start // (stop - start), global_batch // (stop - start))
    for step in range(start_step, config.train.num_steps):
        try:
            local_batch = next(local_batches)
        except StopIteration:
            raise UserInputError(f"--data {config.data.data_dir}: ran out of batches at step {step}")
        check_predictions(local_batch["weights"], config, step)
        yield partitioning.global_batch_from_host(local_batch, mesh, global_batch)


def _loop(step_fn: Callable, state: TrainState, batches: Iterator[dict], start_step: int,
          hooks: Sequence[Hook]) -> RunResult:
    """One step per batch, every hook after each (in order); the first hook to return a status ends it."""
    step = start_step
    for batch in batches:
        state, step_metrics = step_fn(state, batch)
        step += 1
        for hook in hooks:
            status = hook(step, state, step_metrics)
            if status is not None:
                return RunResult(status, step, "")
    return RunResult("completed", step, "")
