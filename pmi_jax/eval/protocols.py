"""The fine-tuning protocols' settings: `FinetuneConfig` and the paper's two presets.

Standard library only, so that `pmi-jax eval finetune --help` and config parsing answer
before JAX is imported; the protocols themselves run in `pmi_jax.eval.finetune`.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Mapping, Sequence

from pmi_jax.config import OptimizerConfig, apply_overrides
from pmi_jax.errors import UserInputError

PROTOCOLS = ("sweep", "checkpoint")
# How a configuration's seeds are summarised, per protocol.
_AGGREGATE = {"sweep": "median", "checkpoint": "mean of the middle three (best and worst seed dropped)"}


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Everything a fine-tuning evaluation chooses; `--set field=value` edits any field.

    The grid, the seeds and the epochs are Levine et al. 2021, §4.2 (and the captions of its
    Tables 6-7 for the per-checkpoint protocol). `epochs` 0 and `max_seq_len` 0 mean the task's
    defaults: §4.2's 3 epochs for GLUE, 10 for RTE and STS-B, 4 for SQuAD 2.0 and RACE; 128/384/512
    tokens (our choice: the paper gives no length). The optimizer fields and the warmup are our
    choice (BERT's fine-tuning AdamW, the pretraining schedule's shape): the paper names none.
    Each field's source: docs/experiments.md, "Where each fine-tuning setting comes from".
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


# The paper's two protocols (Levine et al. 2021):
#   sweep       §4.2: batch sizes {16, 32} × learning rates {1, 2, 3, 5}e-5, five seeds each, the
#               best median dev score; epochs per task (the task's `epochs`).
#   checkpoint  §4.2 and the captions of Tables 6-7: batch 32, learning rate 3e-5, five seeds, the
#               mean of the middle three, "4 epochs without early stopping". The paper runs it on
#               SQuAD 2.0 and RACE only, whose §4.2 epochs are that 4: the preset keeps the task's
#               epochs, so on a GLUE task (our extension) it runs the sweep's 3 (10 RTE, STS-B).
PROTOCOL_DEFAULTS = {
    "sweep": FinetuneConfig(),
    "checkpoint": FinetuneConfig(protocol="checkpoint", batch_sizes=(32,), learning_rates=(3e-5,)),
}


def finetune_settings(protocol: str, flags: Mapping[str, Any] = {}, overrides: Sequence[str] = ()) -> FinetuneConfig:
    """The protocol's preset, then the fields `flags` set (None: not given), then `--set`
    FIELD=VALUE `overrides`, in that order: what `eval finetune` runs, without argparse."""
    config = dataclasses.replace(PROTOCOL_DEFAULTS[protocol], **{k: v for k, v in flags.items() if v is not None})
    config = apply_overrides(config, list(overrides))
    if config.protocol != protocol:
        raise UserInputError(f"--set protocol={config.protocol}: choose the protocol with --protocol")
    return config
