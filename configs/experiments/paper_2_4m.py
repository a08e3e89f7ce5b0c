"""The comparison at the paper's longer scale: BERT-base (Table 5) for 2.4M steps, batch 256.

Levine et al. 2021, §5.1: "increased the number of steps from 1M to 2.4M, while maintaining the
batch size and the pretraining corpus" (SpanBERT's setting); Figure 2, the 2.4M rows of Tables 2
and 8, and Tables 6-7's columns up to 2400K. The learning rate decays linearly to 0 over the
whole 2.4M steps (§4.1), so this is not `paper.py` with `--set train.num_steps=2400000` stopped
early: at 1M steps these models have seen a higher learning rate than the 1M-step models and
are, as §4.1 says, "not precisely comparable". A checkpoint every 200K steps, all twelve kept
(Tables 6-7 evaluate 200K ... 1000K, 1200K, 1600K, 2000K, 2400K).

    pmi-jax train --config configs/experiments/paper_2_4m.py --data gs://B/prepared/wiki-bc --scheme pmi \
        --workdir gs://B/runs/paper-2.4m-pmi
"""
import dataclasses

from pmi_jax.configs.experiments.paper import get_config as paper
from pmi_jax.config import CheckpointConfig, ExperimentConfig

NUM_STEPS = 2_400_000
EVERY = 200_000


def get_config() -> ExperimentConfig:
    config = paper()
    return dataclasses.replace(config, checkpoint=CheckpointConfig(every_steps=EVERY, keep=NUM_STEPS // EVERY),
                               train=dataclasses.replace(config.train, num_steps=NUM_STEPS))
