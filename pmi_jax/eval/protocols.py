"""The fine-tuning protocols' settings: `FinetuneConfig` and the paper's two presets.

Standard library only, so that `pmi-jax eval finetune --help` and config parsing answer
before JAX is imported; the protocols themselves run in `pmi_jax.eval.finetune`.
"""
from __future__ import annotations

import dataclasses

from pmi_jax.config import OptimizerConfig
from pmi_jax.errors import UserInputError

PROTOCOLS = ("sweep", "checkpoint")
# How a configuration's seeds are summarised, per protocol.
_AGGREGATE = {"sweep": "median", "checkpoint": "mean of the middle three (best and worst seed dropped)"}


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Everything a fine-tuning evaluation chooses; `--set field=value` edits any field.

    `epochs` 0 and `max_seq_len` 0 mean the task's defaults (3 epochs for GLUE, 10 for RTE and
    STS-B, 4 for SQuAD and RACE; 128/384/512 tokens). The optimizer fields are BERT's
    fine-tuning AdamW; the schedule is the pretraining one. Which defaults the paper states and
    which are our choices: docs/experiments.md, "Where each fine-tuning setting comes from".
    """

    protocol: str = "sweep"
    batch_sizes: tuple = (16, 32)
    learning_rates: tuple = (1e-5, 2e-5, 3e-5, 5e-5)
    seeds: int = 5
    epochs: int = 0
    max_seq_len: int = 0
    eval_batch_size: int = 64
    warmup_fraction: float = 0.1
    # BERT's AdamW, as in pretraining: the defaults are pretraining's (`pmi_jax.config`).
    b1: float = OptimizerConfig.b1
    b2: float = OptimizerConfig.b2
    eps: float = OptimizerConfig.eps
    weight_decay: float = OptimizerConfig.weight_decay
    grad_clip_norm: float = OptimizerConfig.grad_clip_norm

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise UserInputError(f"protocol={self.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
        for name in ("batch_sizes", "learning_rates"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in values):
                raise UserInputError(f"{name}={values!r}: expected a non-empty tuple of positive numbers")
        if any(not isinstance(b, int) for b in self.batch_sizes):
            raise UserInputError(f"batch_sizes={self.batch_sizes!r}: expected whole numbers")
        for name in ("seeds", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise UserInputError(f"{name}={getattr(self, name)}: must be at least 1")
        for name in ("epochs", "max_seq_len"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{name}={getattr(self, name)}: must be positive (0: the task's default)")
        if not 0 <= self.warmup_fraction < 1:
            raise UserInputError(f"warmup_fraction={self.warmup_fraction}: expected a fraction in [0, 1)")

    def epochs_for(self, task) -> int:
        return self.epochs or task.epochs

    @property
    def aggregate(self) -> str:
        return _AGGREGATE[self.protocol]


# The per-checkpoint protocol's fixed setting, attributed to Levine et al. 2021, §4.2: one setting
# for every task, so a task's own default epochs (10 for RTE and STS-B) do not apply. Neither it
# nor any per-task exception could be checked against the paper's text (docs/experiments.md says
# what could); `--set` changes any field for a task that needs one.
PROTOCOL_DEFAULTS = {
    "sweep": FinetuneConfig(),
    "checkpoint": FinetuneConfig(protocol="checkpoint", batch_sizes=(32,), learning_rates=(3e-5,), epochs=4),
}
