"""MlmFeatureConverter: masked-LM task examples -> fixed-length model features.

seqio's own `EncoderFeatureConverter` recomputes the loss weights as "position holds
[MASK]", which silently drops the 10% of selected tokens replaced by random ids and the 10%
left unchanged from the loss. This converter keeps the task's `weights` as produced and only
pads. Sequences are packed when the corpus is prepared, so there is no packing here.

Task features (length T <= L, possibly already padded with [PAD] = 0): inputs, targets
int32; weights float32.
Model features (length L, padded with 0): inputs, targets int32; weights float32;
input_mask int32 (1 on every real token, special tokens included; 0 on padding, i.e.
where targets hold [PAD], an id no real token has).
"""
from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

_Spec = seqio.FeatureConverter.FeatureSpec
PAD_ID = 0  # [PAD]: padding, never a real token
_CONVERT_BATCH = 256


class MlmFeatureConverter(seqio.FeatureConverter):
    TASK_FEATURES = {"inputs": _Spec(tf.int32), "targets": _Spec(tf.int32), "weights": _Spec(tf.float32)}
    MODEL_FEATURES = {**TASK_FEATURES, "input_mask": _Spec(tf.int32)}
    PACKING_FEATURE_DTYPES = {}

    def __init__(self, pack: bool = False, **kwargs):
        if pack:
            raise ValueError("MlmFeatureConverter does not pack: sequences are packed when the corpus is prepared")
        super().__init__(pack=False, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Pad (in batches, so no per-example function runs) and add `input_mask`."""
        length = self.get_model_feature_lengths(task_feature_lengths)["inputs"]
        shapes = {k: [length] if k in self.TASK_FEATURES else spec.shape for k, spec in ds.element_spec.items()}
        ds = ds.padded_batch(_CONVERT_BATCH, padded_shapes=shapes)

        def add_input_mask(batch):
            features = {k: batch[k] for k in self.TASK_FEATURES}
            return {**features, "input_mask": tf.cast(batch["targets"] != PAD_ID, tf.int32)}

        return ds.map(add_input_mask).unbatch()

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        lengths = {task_feature_lengths[k] for k in self.TASK_FEATURES}
        if len(lengths) != 1:
            raise ValueError(f"inputs, targets and weights need one length, got {dict(task_feature_lengths)}")
        (length,) = lengths
        return {k: length for k in self.MODEL_FEATURES}
