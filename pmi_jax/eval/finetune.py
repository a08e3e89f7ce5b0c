"""Fine-tuning a pretrained encoder on one task, and the paper's protocol sweep over it.

One run: the task's head on the pretrained encoder, AdamW as in BERT fine-tuning (β 0.9/0.999,
ε 1e-6, weight decay 0.01 except biases and LayerNorm, gradients clipped at norm 1), the
learning rate rising linearly over the first 10% of steps and falling linearly to 0 at the
end; after every epoch the dev set is scored, and the run reports its best epoch (early
stopping on dev).

The protocol (Levine et al. 2021, following RoBERTa/SpanBERT): every batch size × learning
rate of the grid, `seeds` runs each; a configuration's result is the median over its seeds
of each run's best dev score; reported is the configuration with the best median.

All runs of a sweep share the encoded data and the compiled step functions: the head module,
the loss and the batch shape are the only static arguments, the learning rate is a traced scalar.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pmi_jax.config import ModelConfig
from pmi_jax.errors import UserInputError
from pmi_jax.eval import glue, race, squad
from pmi_jax.eval.heads import Encoded
from pmi_jax.model import BertEncoder
from pmi_jax.optimizer import weight_decay_mask

# Every task (GlueTask, SquadTask, RaceTask: frozen dataclasses) offers the same small surface:
#   name, epochs, max_seq_len, kind       the paper's defaults; kind in classification/span/choice
#   read(path, split), read_tfds(name, split, data_dir) -> examples   split in train/dev
#   encode(examples, wordpiece, max_seq_len) -> Encoded               model arrays + decoding info
#   head(config) -> nn.Module, loss -> fn(outputs, batch) -> [B]      the model side
#   evaluate(outputs, encoded) -> {metric: value, "score": ...}        ×100; "score" is maximised
TASKS: dict[str, Any] = {**glue.TASKS, "squad/v2.0": squad.SquadTask(), **race.TASKS}

WARMUP_FRACTION = 0.1
# BERT fine-tuning's AdamW; the learning rate is applied in the step (see _train_step).
_OPTIMIZER = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6),
                         optax.add_decayed_weights(0.01, mask=weight_decay_mask))


def get_task(name: str):
    if name not in TASKS:
        raise UserInputError(f"--task {name}: unknown task (choose from {', '.join(TASKS)})")
    return TASKS[name]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    batch_size: int
    learning_rate: float
    epochs: int
    seed: int
    eval_batch_size: int = 64


# ---- jitted pieces --------------------------------------------------------------------------
# Static: the head module (hashable, equal across tasks with the same head and config) and the
# loss function, so that e.g. all two-class GLUE tasks share one compiled step per batch shape.

@functools.partial(jax.jit, static_argnames=("model",))
def _init_head(rng, *, model):
    """The parameters above the encoder, initialised on a dummy encoder output."""
    hidden_1x1xD = jnp.zeros([1, 1, model.config.hidden_size], jnp.dtype(model.config.dtype))
    return nn.unbox(model.init({"params": rng}, hidden_1x1xD, deterministic=True, method="head"))["params"]


@functools.partial(jax.jit, static_argnames=("model", "loss"), donate_argnums=(0, 1))
def _train_step(params, opt_state, batch, weights_B, rng, learning_rate, *, model, loss):
    def loss_fn(p):
        outputs = model.apply({"params": p}, batch, deterministic=False, rngs={"dropout": rng})
        loss_B = loss(outputs, batch)
        return jnp.sum(loss_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)

    value, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = _OPTIMIZER.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - learning_rate * u, params, updates)
    return params, opt_state, value


@functools.partial(jax.jit, static_argnames=("model",))
def _predict(params, batch, *, model):
    return model.apply({"params": params}, batch, deterministic=True)


# ---- one run -----------------------------------------------------------------------------------

def learning_rate_at(step: int, peak: float, total_steps: int) -> float:
    """Linear warmup over the first 10% of `total_steps`, then linear decay to 0."""
    warmup = int(WARMUP_FRACTION * total_steps)
    if step < warmup:
        return peak * step / warmup
    return peak * max(total_steps - step, 0) / max(total_steps - warmup, 1)


def _take(arrays: dict[str, np.ndarray], index: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[index] for k, v in arrays.items()}


def _padded_batches(num_examples: int, batch_size: int, order: np.ndarray):
    """Index and weight arrays of fixed size; the last batch is topped up with weight-0 rows."""
    for begin in range(0, num_examples, batch_size):
        index = order[begin:begin + batch_size]
        weights = np.ones([batch_size], np.float32)
        if len(index) < batch_size:
            weights[len(index):] = 0.0
            index = np.concatenate([index, np.full([batch_size - len(index)], order[0])])
        yield index, weights


def predict(task, config: ModelConfig, params, encoded: Encoded, batch_size: int) -> dict[str, np.ndarray]:
    """The head's outputs for every example, stacked in example order."""
    n = len(next(iter(encoded.arrays.values())))
    parts = []
    for index, weights in _padded_batches(n, batch_size, np.arange(n)):
        outputs = _predict(params, _take(encoded.arrays, index), model=task.head(config))
        keep = int(weights.sum())
        parts.append({k: np.asarray(v)[:keep] for k, v in outputs.items()})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _shapes(tree):
    return jax.tree.map(lambda x: (tuple(x.shape), jnp.dtype(x.dtype)), tree)


def initial_params(task, config: ModelConfig, encoder_params, seed: int):
    """A fresh head (seeded) on top of the pretrained encoder."""
    encoder_params = nn.unbox(encoder_params)
    expected = jax.eval_shape(lambda: nn.unbox(BertEncoder(config).init(
        jax.random.key(0), jnp.zeros([1, 1], jnp.int32), jnp.ones([1, 1], jnp.int32), deterministic=True))["params"])
    if _shapes(expected) != _shapes(encoder_params):
        raise UserInputError("the checkpoint's encoder parameters do not match its own model config")
    # A copy: the train step donates its parameters, and the pretrained ones serve every run.
    return {**_init_head(jax.random.key(seed), model=task.head(config)),
            "encoder": jax.tree.map(lambda x: jnp.array(x, copy=True), encoder_params)}


def finetune_run(task, config: ModelConfig, encoder_params, train: Encoded, dev: Encoded, run: RunConfig) -> dict:
    """Train for `run.epochs`, scoring dev after each; returns per-epoch metrics and the best."""
    n = len(train.arrays["input_ids"])
    steps_per_epoch = math.ceil(n / run.batch_size)
    total_steps = steps_per_epoch * run.epochs
    model = task.head(config)
    params = initial_params(task, config, encoder_params, run.seed)
    opt_state = _OPTIMIZER.init(params)
    shuffle = np.random.default_rng(run.seed)
    dropout_key = jax.random.key(run.seed + 1)
    step, epochs = 0, []
    for epoch in range(1, run.epochs + 1):
        losses = []
        for index, weights in _padded_batches(n, run.batch_size, shuffle.permutation(n)):
            lr = np.float32(learning_rate_at(step, run.learning_rate, total_steps))
            params, opt_state, loss = _train_step(params, opt_state, _take(train.arrays, index), weights,
                                                  jax.random.fold_in(dropout_key, step), lr,
                                                  model=model, loss=task.loss)
            losses.append(loss)
            step += 1
        dev_metrics = task.evaluate(predict(task, config, params, dev, run.eval_batch_size), dev)
        epochs.append({"epoch": epoch, "train_loss": float(np.mean(jax.device_get(losses))), **dev_metrics})
        logging.info("%s bs=%d lr=%g seed=%d epoch %d/%d: train loss %.4f, dev score %.2f", task.name,
                     run.batch_size, run.learning_rate, run.seed, epoch, run.epochs, epochs[-1]["train_loss"],
                     dev_metrics["score"])
    best = max(epochs, key=lambda e: e["score"])  # first best epoch on ties
    return {**dataclasses.asdict(run), "epochs": epochs, "best_epoch": best["epoch"],
            "best": {k: v for k, v in best.items() if k not in ("epoch", "train_loss")}}


# ---- the protocol ------------------------------------------------------------------------------

def sweep(task, config: ModelConfig, encoder_params, train: Encoded, dev: Encoded, *, batch_sizes, learning_rates,
          seeds: int, epochs: int, eval_batch_size: int = 64) -> dict:
    """Every (batch size, learning rate) × `seeds` seeds; the configuration with the best median."""
    start = time.time()
    runs, configs = [], []
    for batch_size in batch_sizes:
        for learning_rate in learning_rates:
            group = [finetune_run(task, config, encoder_params, train, dev,
                                  RunConfig(batch_size, learning_rate, epochs, seed, eval_batch_size))
                     for seed in range(seeds)]
            runs.extend(group)
            metric_names = list(group[0]["best"])
            configs.append({"batch_size": batch_size, "learning_rate": learning_rate,
                            "median": {m: float(np.median([r["best"][m] for r in group])) for m in metric_names},
                            "seed_scores": [r["best"]["score"] for r in group]})
    best = max(configs, key=lambda c: c["median"]["score"])  # first in grid order on ties
    return {"task": task.name,
            "protocol": {"batch_sizes": list(batch_sizes), "learning_rates": list(learning_rates), "seeds": seeds,
                         "epochs": epochs, "warmup_fraction": WARMUP_FRACTION, "weight_decay": 0.01,
                         "selection": "median over seeds of each run's best dev epoch; best median"},
            "best": best, "configs": configs, "runs": runs, "seconds": round(time.time() - start, 1)}


def markdown_report(result: dict, title: str) -> str:
    """The sweep as a Markdown table: one row per configuration, the best one in bold.

    Scores only: counts and thresholds (SQuAD's `total`, `best_f1_thresh`, ...) stay in the JSON.
    """
    metric_names = [m for m in result["best"]["median"]
                    if m != "score" and not m.endswith(("total", "_thresh"))] + ["score"]
    lines = [f"# {title}", "",
             f"{result['task']}: median over {result['protocol']['seeds']} seeds of each run's best dev epoch "
             f"({result['protocol']['epochs']} epochs); metrics ×100.", "",
             "| batch size | learning rate | " + " | ".join(f"median {m}" for m in metric_names)
             + " | scores per seed |",
             "|" + "---|" * (len(metric_names) + 3)]
    for c in result["configs"]:
        cells = [str(c["batch_size"]), f"{c['learning_rate']:g}", *(f"{c['median'][m]:.2f}" for m in metric_names),
                 ", ".join(f"{s:.2f}" for s in c["seed_scores"])]
        if c is result["best"] or c == result["best"]:
            cells = [f"**{x}**" for x in cells]
        lines.append("| " + " | ".join(cells) + " |")
    best = result["best"]
    lines += ["", f"Best median: **{best['median']['score']:.2f}** (batch size {best['batch_size']}, "
                  f"learning rate {best['learning_rate']:g}): "
                  + ", ".join(f"{m} {best['median'][m]:.2f}" for m in metric_names if m != "score"), ""]
    return "\n".join(lines)
