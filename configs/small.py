"""BERT-small-ish (4 layers, 512 wide, 8 heads): a single-accelerator ablation size."""
from pmi_jax.config import CheckpointConfig, DataConfig, ExperimentConfig, ModelConfig, OptimizerConfig, TrainConfig


def get_config() -> ExperimentConfig:
    return ExperimentConfig(
        model=ModelConfig(vocab_size=0, hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048,
                          max_position_embeddings=512),
        data=DataConfig(scheme="pmi", seq_len=128),
        optimizer=OptimizerConfig(peak_learning_rate=5e-4, warmup_steps=10_000),
        checkpoint=CheckpointConfig(every_steps=5_000, keep=3),
        train=TrainConfig(batch_size=256, num_steps=250_000, log_every_steps=100),
    )
