"""The CPU comparison of issue 21 (docs/experiments.md, "The comparison on CPU"): a 4-layer,
128-wide BERT at sequence 128 on the installed-documentation corpus (about 9M words, 8K WordPiece).

Batch 16 for 4,000 steps (about 0.9 epochs of the corpus), the learning rate decayed to 0 at the
last step, a checkpoint every 1,000, all kept, so that every scheme is scored at equal steps. The
sizes are ours: six runs (two schemes, three seeds) train in about 90 minutes on 2 CPU cores, two
at a time, and the MLM loss falls far below the unigram level. `python3 dev.py effect` runs (or
finishes) the whole experiment.
"""
import dataclasses

from pmi_jax.configs.tiny import get_config as tiny
from pmi_jax.config import CheckpointConfig, OptimizerConfig


def get_config():
    config = tiny()
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
        optimizer=OptimizerConfig(peak_learning_rate=1e-3, warmup_steps=400, weight_decay=0.01),
        checkpoint=CheckpointConfig(every_steps=1000, keep=4),
        train=dataclasses.replace(config.train, batch_size=16, num_steps=4000, log_every_steps=100, seed=0),
    )
