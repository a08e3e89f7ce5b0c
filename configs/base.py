"""BERT-base with the PMI-Masking paper's pretraining hyper-parameters (Levine et al. 2021, Table 5).

12 layers, 768 hidden, 12 heads, 3072 feed-forward, sequences of 512, dropout 0.1;
batch 256 for 1M steps, AdamW (β 0.9/0.999, ε 1e-6, weight decay 0.01), peak lr 1e-4
after 10k warmup steps, then linear decay to 0. bf16 compute with float32 parameters.
"""
from pmi_jax.config import (CheckpointConfig, DataConfig, ExperimentConfig, MeshConfig, ModelConfig,
                            OptimizerConfig, TrainConfig)


def get_config() -> ExperimentConfig:
    return ExperimentConfig(
        # vocab_size=0: the corpus's WordPiece vocabulary (the paper's is "30K", §4.1; BERT's uncased one has 30,522).
        model=ModelConfig(vocab_size=0, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
                          max_position_embeddings=512, dropout_rate=0.1, attention_dropout_rate=0.1,
                          dtype="bfloat16",
                          # Per-layer loop, no remat: compiled for v5p-8 it needs 23.9 GiB per chip where
                          # scanned layers (no remat) need 43.8 (benchmarks/README.md, "tpu compile").
                          scan_layers=False, remat="none"),
        data=DataConfig(scheme="pmi", seq_len=512),
        optimizer=OptimizerConfig(peak_learning_rate=1e-4, warmup_steps=10_000, b1=0.9, b2=0.999, eps=1e-6,
                                  weight_decay=0.01, grad_clip_norm=1.0, grad_accum_steps=1),
        mesh=MeshConfig(data=-1, fsdp=1, model=1),
        checkpoint=CheckpointConfig(every_steps=10_000, keep=3),
        train=TrainConfig(batch_size=256, num_steps=1_000_000, log_every_steps=100),
    )
