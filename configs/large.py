"""BERT-large (24 layers, 1024 hidden, 16 heads, 4096 feed-forward), the paper's schedule.

FSDP over all devices by default: its AdamW state (~4 GB) is split instead of replicated.
"""
from pmi_jax.config import (CheckpointConfig, DataConfig, ExperimentConfig, MeshConfig, ModelConfig,
                            OptimizerConfig, TrainConfig)


def get_config() -> ExperimentConfig:
    return ExperimentConfig(
        # vocab_size=0: the corpus's WordPiece vocabulary (30,522 entries in the paper).
        model=ModelConfig(vocab_size=0, hidden_size=1024, num_layers=24, num_heads=16,
                          intermediate_size=4096, max_position_embeddings=512, dtype="bfloat16",
                          # Scanned layers (compile time flat in depth), remat dots_saveable: 6.1 GiB per
                          # v5e chip at batch 256 on v5e-16 (benchmarks/README.md, "tpu compile").
                          scan_layers=True, remat="dots_saveable"),
        data=DataConfig(scheme="pmi", seq_len=512),
        optimizer=OptimizerConfig(peak_learning_rate=1e-4, warmup_steps=10_000, eps=1e-6, weight_decay=0.01),
        mesh=MeshConfig(data=1, fsdp=-1, model=1),
        checkpoint=CheckpointConfig(every_steps=10_000, keep=3),
        train=TrainConfig(batch_size=256, num_steps=1_000_000, log_every_steps=100),
    )
