"""Fine-tuning a pretrained encoder on one task, and the paper's two protocols over it.

One run: the task's head, AdamW as in BERT fine-tuning with `pmi_jax.optimizer`'s schedule, dev
(and test) scored after every epoch; these are our choices (the paper names none). Protocols of
Levine et al. 2021 (`FinetuneConfig.protocol`): `sweep` (§4.2; Tables 2-3, 8), best dev epoch per
run (§4.2's early stopping), median over seeds, best median; `checkpoint` (§4.2, captions of
Tables 6-7; Table 1, Figures 1-2), batch 32, lr 3e-5, last epoch, mean of the middle three of 5
seeds. Selection by `task.selection_metric`: GLUE Table 8's caption, SQuAD 2.0 F1 (Tables 1, 6),
RACE accuracy (Tables 2, 3, 7). Sources: docs/experiments.md; details: docs/design.md, "Module
notes", finetune.py.
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

from pmi_jax.config import ModelConfig, OptimizerConfig
from pmi_jax.errors import UserInputError
from pmi_jax.eval import glue, race, squad
from pmi_jax.eval.heads import Encoded
from pmi_jax.eval.protocols import FinetuneConfig
from pmi_jax.model import BertEncoder
from pmi_jax.optimizer import adamw, learning_rate_schedule

# Every task (GlueTask, SquadTask, RaceTask: frozen dataclasses) offers the same small surface:
#   name, epochs, max_seq_len, kind       the paper's defaults; kind in classification/span/choice
#   selection_metric                      the paper's metric for the task: picks epochs and configs
#   read(path, split), read_tfds(name, split, data_dir) -> examples   split in train/dev/test
#   encode(examples, wordpiece, max_seq_len) -> Encoded               model arrays + decoding info
#   head(config) -> nn.Module, loss -> fn(outputs, batch) -> [B]      the model side
#   evaluate(outputs, encoded) -> {metric: value, "score": ...}        ×100; "score" is maximised
#   write_predictions(outputs, encoded, directory) -> [files]          test predictions, leaderboard format
TASKS: dict[str, Any] = {**glue.TASKS, "squad/v2.0": squad.SquadTask(), **race.TASKS}

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


@functools.cache
def _optimizer(config: OptimizerConfig):
    """Pretraining's clip + AdamW (`pmi_jax.optimizer.adamw`) at learning rate 1: the step
    scales the update by the run's learning rate. Cached, so that equal settings give the
    same (hashable) object and share compiled steps."""
    return adamw(config, learning_rate=1.0)


def optimizer_for(config: FinetuneConfig):
    return _optimizer(OptimizerConfig(b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
                                      grad_clip_norm=config.grad_clip_norm))


def learning_rate_schedule_for(config: FinetuneConfig, peak: float, total_steps: int):
    """The pretraining schedule (`pmi_jax.optimizer`) with warmup over `warmup_fraction` of the run."""
    warmup = int(config.warmup_fraction * total_steps)
    return learning_rate_schedule(OptimizerConfig(peak_learning_rate=peak, warmup_steps=warmup), total_steps)


# ---- jitted pieces --------------------------------------------------------------------------
# Static: the head module (hashable, equal across tasks with the same head and config) and the
# loss function, so that e.g. all two-class GLUE tasks share one compiled step per batch shape.

@functools.partial(jax.jit, static_argnames=("model",))
def _init_head(rng, *, model):
    """The parameters above the encoder, initialised on a dummy encoder output."""
    hidden_1x1xD = jnp.zeros([1, 1, model.config.hidden_size], jnp.dtype(model.config.dtype))
    return nn.unbox(model.init({"params": rng}, hidden_1x1xD, deterministic=True, method="head"))["params"]


@functools.partial(jax.jit, static_argnames=("model", "loss", "optimizer"), donate_argnums=(0, 1))
def _train_step(params, opt_state, batch, weights_B, rng, learning_rate, *, model, loss, optimizer):
    def loss_fn(p):
        outputs = model.apply({"params": p}, batch, deterministic=False, rngs={"dropout": rng})
        loss_B = loss(outputs, batch)
        return jnp.sum(loss_B * weights_B) / jnp.maximum(jnp.sum(weights_B), 1.0)

    value, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)  # -(AdamW direction): learning rate 1
    params = jax.tree.map(lambda p, u: p + learning_rate * u, params, updates)
    return params, opt_state, value


@functools.partial(jax.jit, static_argnames=("model",))
def _predict(params, batch, *, model):
    return model.apply({"params": params}, batch, deterministic=True)


# ---- one run -----------------------------------------------------------------------------------

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


def finetune_run(task, config: ModelConfig, encoder_params, train: Encoded, dev: Encoded, run: RunConfig,
                 finetune: FinetuneConfig = FinetuneConfig(), test: Encoded | None = None) -> dict:
    """Train for `run.epochs`, scoring dev (and test) after each; returns per-epoch metrics and
    the selected epoch: the best dev score (sweep) or the last epoch (checkpoint protocol).

    With `test`, the selected epoch's test outputs are kept under "test_outputs" (arrays, not
    for JSON) and, when the test set has labels, its metrics under each epoch's "test".
    """
    n = len(train.arrays["input_ids"])
    steps_per_epoch = math.ceil(n / run.batch_size)
    total_steps = steps_per_epoch * run.epochs
    schedule = learning_rate_schedule_for(finetune, run.learning_rate, total_steps)
    optimizer = optimizer_for(finetune)
    model = task.head(config)
    params = initial_params(task, config, encoder_params, run.seed)
    opt_state = optimizer.init(params)
    shuffle = np.random.default_rng(run.seed)
    dropout_key = jax.random.key(run.seed + 1)
    step, epochs, selected, test_outputs = 0, [], None, None
    for epoch in range(1, run.epochs + 1):
        losses = []
        for index, weights in _padded_batches(n, run.batch_size, shuffle.permutation(n)):
            lr = np.float32(schedule(step))
            params, opt_state, loss = _train_step(params, opt_state, _take(train.arrays, index), weights,
                                                  jax.random.fold_in(dropout_key, step), lr,
                                                  model=model, loss=task.loss, optimizer=optimizer)
            losses.append(loss)
            step += 1
        dev_metrics = task.evaluate(predict(task, config, params, dev, run.eval_batch_size), dev)
        record = {"epoch": epoch, "train_loss": float(np.mean(jax.device_get(losses))), **dev_metrics}
        outputs = predict(task, config, params, test, run.eval_batch_size) if test is not None else None
        if outputs is not None and task.has_labels(test):
            record["test"] = _scores(task.evaluate(outputs, test))
        epochs.append(record)
        # sweep: the first best epoch (early stopping on dev); checkpoint: the last epoch.
        if selected is None or finetune.protocol == "checkpoint" or record["score"] > selected["score"]:
            selected, test_outputs = record, outputs
        logging.info("%s bs=%d lr=%g seed=%d epoch %d/%d: train loss %.4f, dev %s %.2f", task.name,
                     run.batch_size, run.learning_rate, run.seed, epoch, run.epochs, record["train_loss"],
                     task.selection_metric, dev_metrics["score"])
    result = {**dataclasses.asdict(run), "epochs": epochs, "selected_epoch": selected["epoch"],
              "selected": {k: v for k, v in selected.items() if k not in ("epoch", "train_loss")}}
    if test is not None:
        result["test_outputs"] = test_outputs
    return result


def _scores(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))}


# ---- the protocols -----------------------------------------------------------------------------

def kept_seeds(scores: list[float], protocol: str) -> list[int]:
    """Indices of the runs a configuration's result is the mean of, ordered by score.

    sweep: the median run (the two middle runs for an even number of seeds, whose mean is the
    median). checkpoint: all but the best and the worst run, i.e. the middle three of five.
    Ties are broken by seed, so the choice is deterministic.
    """
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    n = len(order)
    if protocol == "sweep":
        return order[(n - 1) // 2:n // 2 + 1]
    return order[1:-1] if n >= 3 else order


def _mean_over(runs: list[dict], key) -> dict:
    names = [m for m, v in key(runs[0]).items() if isinstance(v, (int, float))]
    return {m: float(np.mean([key(r)[m] for r in runs])) for m in names}


def evaluate_checkpoint(task, config: ModelConfig, encoder_params, train: Encoded, dev: Encoded,
                        finetune: FinetuneConfig, test: Encoded | None = None) -> dict:
    """Every (batch size, learning rate) × `seeds` seeds under the protocol; the best configuration.

    A configuration's "aggregate" is each metric's mean over its `kept_seeds` runs (selected by
    the task's selection metric), and "test" the same runs' test metrics when the test set has
    labels. The best configuration is the first, in grid order, with the highest aggregate score.
    """
    start = time.time()
    epochs = finetune.epochs_for(task)
    runs, configs, test_outputs = [], [], {}
    for batch_size in finetune.batch_sizes:
        for learning_rate in finetune.learning_rates:
            group = [finetune_run(task, config, encoder_params, train, dev,
                                  RunConfig(batch_size, learning_rate, epochs, seed, finetune.eval_batch_size),
                                  finetune, test)
                     for seed in range(finetune.seeds)]
            scores = [r["selected"]["score"] for r in group]
            kept = kept_seeds(scores, finetune.protocol)
            entry = {"batch_size": batch_size, "learning_rate": learning_rate,
                     "aggregate": _mean_over([group[i] for i in kept], lambda r: r["selected"]),
                     "seed_scores": scores, "kept_seeds": kept}
            selected_test = [group[i]["epochs"][group[i]["selected_epoch"] - 1].get("test") for i in kept]
            if all(selected_test):
                entry["test"] = _mean_over(selected_test, lambda t: t)
            # Leaderboard predictions come from one run: the median one (the lower of two middles).
            median_seed = kept_seeds(scores, "sweep")[0]
            entry["prediction_seed"] = median_seed
            for r in group:
                outputs = r.pop("test_outputs", None)
                if outputs is not None and r["seed"] == median_seed:
                    test_outputs[(batch_size, learning_rate)] = outputs
            runs.extend(group)
            configs.append(entry)
    best = max(configs, key=lambda c: c["aggregate"]["score"])  # first in grid order on ties
    result = {"task": task.name, "metric": task.selection_metric,
              "protocol": {**dataclasses.asdict(finetune), "epochs": epochs, "aggregate": finetune.aggregate,
                           "selection": ("each run's best dev epoch" if finetune.protocol == "sweep"
                                         else "each run's last epoch (no early stopping)")},
              "best": best, "configs": configs, "runs": runs, "seconds": round(time.time() - start, 1)}
    if test is not None:
        result["test_outputs"] = test_outputs[(best["batch_size"], best["learning_rate"])]
    return result


def markdown_report(result: dict, title: str) -> str:
    """The evaluation as a Markdown table: one row per configuration, the best one in bold.

    Scores only: counts and thresholds (SQuAD's `total`, `best_f1_thresh`, ...) stay in the JSON.
    """
    protocol = result["protocol"]
    metric_names = [m for m in result["best"]["aggregate"]
                    if m != "score" and not m.endswith(("total", "_thresh"))] + ["score"]
    lines = [f"# {title}", "",
             f"{result['task']}, {protocol['protocol']} protocol: {protocol['aggregate']} over {protocol['seeds']} "
             f"seeds of {protocol['selection']} ({protocol['epochs']} epochs); score = dev {result['metric']}; "
             "metrics ×100.", "",
             "| batch size | learning rate | " + " | ".join(metric_names) + " | scores per seed |",
             "|" + "---|" * (len(metric_names) + 3)]
    for c in result["configs"]:
        cells = [str(c["batch_size"]), f"{c['learning_rate']:g}", *(f"{c['aggregate'][m]:.2f}" for m in metric_names),
                 ", ".join(f"{s:.2f}" for s in c["seed_scores"])]
        if c is result["best"] or c == result["best"]:
            cells = [f"**{x}**" for x in cells]
        lines.append("| " + " | ".join(cells) + " |")
    best = result["best"]
    lines += ["", f"Best: dev {result['metric']} **{best['aggregate']['score']:.2f}** (batch size "
                  f"{best['batch_size']}, learning rate {best['learning_rate']:g}): "
                  + ", ".join(f"{m} {best['aggregate'][m]:.2f}" for m in metric_names if m != "score")]
    if "test" in best:
        lines.append("Test (same runs): " + ", ".join(f"{m} {v:.2f}" for m, v in best["test"].items()
                                                      if not m.endswith(("total", "_thresh"))))
    return "\n".join(lines + [""])
