"""Fine-tuning heads on the pretrained encoder, and their losses.

Each head owns a `BertEncoder` named `encoder`, so a checkpoint's `params["encoder"]` drops in
unchanged and only the head starts from random. Heads follow BERT's fine-tuning recipes
(Devlin et al. 2019): pooled [CLS] (dense + tanh, freshly initialised: no next-sentence
pretraining trained it), start/end logits per token, one logit per option. Heads take the
batch dict and return float32 outputs; their `head` method initialises only the new parameters.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax

from pmi_jax.model import BertEncoder, ModelConfig


class Encoded(NamedTuple):
    """A task's examples as model arrays (leading axis N) plus what its metrics need back."""

    arrays: dict[str, np.ndarray]
    info: Any


def _dense(config: ModelConfig, features: int, name: str) -> nn.Dense:
    return nn.Dense(features, kernel_init=nn.initializers.normal(config.initializer_range), name=name)


class _Pooler(nn.Module):
    """[CLS] hidden state -> dense + tanh -> dropout: BERT's sentence representation."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden_BxLxD, *, deterministic: bool):
        pooled_BxD = jnp.tanh(_dense(self.config, self.config.hidden_size, "dense")(hidden_BxLxD[:, 0]))
        return nn.Dropout(self.config.dropout_rate)(pooled_BxD.astype(jnp.float32), deterministic=deterministic)


def _encode(encoder: BertEncoder, batch, *, deterministic: bool):
    return encoder(batch["input_ids"], batch["input_mask"], batch["token_type_ids"], deterministic=deterministic)


class SequenceClassifier(nn.Module):
    """Classification (num_outputs = classes) or regression (num_outputs = 1) of a text or pair."""

    config: ModelConfig
    num_outputs: int

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.pooler = _Pooler(self.config)
        self.output = _dense(self.config, self.num_outputs, "output")

    def __call__(self, batch, *, deterministic: bool):
        hidden_BxLxD = _encode(self.encoder, batch, deterministic=deterministic)
        return {"logits": self.head(hidden_BxLxD, deterministic=deterministic)}

    def head(self, hidden_BxLxD, *, deterministic: bool):
        """Everything above the encoder: logits [B, num_outputs]."""
        return self.output(self.pooler(hidden_BxLxD, deterministic=deterministic))


class SpanExtractor(nn.Module):
    """Start and end logits per token (SQuAD); [CLS] at position 0 stands for "no answer"."""

    config: ModelConfig

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.output = _dense(self.config, 2, "output")

    def __call__(self, batch, *, deterministic: bool):
        logits_BxLx2 = self.head(_encode(self.encoder, batch, deterministic=deterministic),
                                 deterministic=deterministic)
        return {"start_logits": logits_BxLx2[..., 0], "end_logits": logits_BxLx2[..., 1]}

    def head(self, hidden_BxLxD, *, deterministic: bool):
        """Everything above the encoder: (start, end) logits [B, L, 2]."""
        del deterministic  # no dropout above the encoder, as in BERT's SQuAD head
        return self.output(hidden_BxLxD.astype(jnp.float32))


class MultipleChoice(nn.Module):
    """One score per option: each (context, option) pair is encoded alone; softmax over options."""

    config: ModelConfig

    def setup(self):
        self.encoder = BertEncoder(self.config)
        self.pooler = _Pooler(self.config)
        self.output = _dense(self.config, 1, "output")

    def __call__(self, batch, *, deterministic: bool):
        b, c, length = batch["input_ids"].shape
        flat = {k: batch[k].reshape(b * c, length) for k in ("input_ids", "input_mask", "token_type_ids")}
        hidden_BCxLxD = _encode(self.encoder, flat, deterministic=deterministic)
        return {"logits": self.head(hidden_BCxLxD, deterministic=deterministic).reshape(b, c)}

    def head(self, hidden_BCxLxD, *, deterministic: bool):
        """Everything above the encoder: one score per encoded option [B·C]."""
        return self.output(self.pooler(hidden_BCxLxD, deterministic=deterministic))[:, 0]


# ---- per-example losses [B] ------------------------------------------------------------------

def classification_loss(outputs, batch):
    """Cross-entropy of the class (or option) logits."""
    return optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["label"])


def regression_loss(outputs, batch):
    """Squared error of the single output against the score (STS-B)."""
    return jnp.square(outputs["logits"][:, 0] - batch["label"])


def span_loss(outputs, batch):
    """Mean of the start and end cross-entropies, as in BERT's SQuAD fine-tuning."""
    start = optax.softmax_cross_entropy_with_integer_labels(outputs["start_logits"], batch["start_position"])
    end = optax.softmax_cross_entropy_with_integer_labels(outputs["end_logits"], batch["end_position"])
    return 0.5 * (start + end)
