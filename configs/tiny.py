"""A 2-layer, 64-wide BERT for CPU tests and the demo: trains in minutes on a laptop.

Vocabulary size and sequence length come from the prepared corpus (0 = take from data).
"""
from pmi_jax.config import (CheckpointConfig, DataConfig, ExperimentConfig, MeshConfig, ModelConfig,
                            OptimizerConfig, TrainConfig)


def get_config() -> ExperimentConfig:
    return ExperimentConfig(
        model=ModelConfig(vocab_size=0, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                          max_position_embeddings=512, dropout_rate=0.1, attention_dropout_rate=0.1),
        data=DataConfig(scheme="pmi", seq_len=0),
        optimizer=OptimizerConfig(peak_learning_rate=1e-3, warmup_steps=20, weight_decay=0.01),
        mesh=MeshConfig(data=-1, fsdp=1, model=1),
        checkpoint=CheckpointConfig(every_steps=100, keep=2),
        train=TrainConfig(batch_size=16, num_steps=300, log_every_steps=25),
    )
