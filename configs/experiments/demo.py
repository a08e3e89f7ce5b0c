"""The comparison at demo scale: the `tiny` BERT (2 layers, 64 wide) for 300 steps on CPU.

A checkpoint every 100 steps, all three kept, so that every scheme can be evaluated at equal
steps (`pmi-jax eval perplexity --steps all`). Minutes per scheme on a laptop; at this size the
schemes' single-token perplexities differ by a few percent at most.

    pmi-jax train --config configs/experiments/demo.py --data demo/data --scheme pmi --workdir demo/runs/pmi
"""
import dataclasses

from pmi_jax.configs.tiny import get_config as tiny
from pmi_jax.config import CheckpointConfig, ExperimentConfig


def get_config() -> ExperimentConfig:
    config = tiny()
    return dataclasses.replace(config, checkpoint=CheckpointConfig(every_steps=100, keep=3),
                               train=dataclasses.replace(config.train, num_steps=300, seed=0))
