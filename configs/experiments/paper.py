"""The comparison at the paper's scale: BERT-base with its Table 5 pretraining hyper-parameters.

Levine et al. 2021 train BERT-base (12 layers, 768 wide, 12 heads, sequences of 512) with
batch 256 for 1M steps (2.4M for the longer runs), AdamW β 0.9/0.999, ε 1e-6, weight decay
0.01, peak learning rate 1e-4 after 10k warmup steps then linear decay, once per masking
scheme on one corpus. Their Figure 1 evaluates every 200K steps: a checkpoint is kept at each
(six of them, up to 1M), so that `eval finetune --steps all` can follow it.

    pmi-jax train --config configs/experiments/paper.py --data gs://B/prepared/wiki-bc --scheme pmi \
        --workdir gs://B/runs/paper-pmi
"""
import dataclasses

from pmi_jax.configs.base import get_config as base
from pmi_jax.config import CheckpointConfig, ExperimentConfig


def get_config() -> ExperimentConfig:
    config = base()
    return dataclasses.replace(config, checkpoint=CheckpointConfig(every_steps=200_000, keep=6),
                               train=dataclasses.replace(config.train, num_steps=1_000_000, seed=0))
