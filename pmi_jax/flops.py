"""Training FLOPs, device peaks and model FLOPs utilisation (MFU).

Only matmuls count, a multiply-add as 2 FLOPs (Kaplan et al. 2020; PaLM appendix B's MFU):

    training FLOPs / token = 6 * (P_layers + (D*D + D*V) * P/T) + 12 * N * T * D,
    P_layers = N * (4*D*D + 2*D*F)

with N layers, width D, feed-forward F, length T, true vocabulary V, and P of the T positions
through the MLM head. MFU = achieved FLOPs/s over the summed bf16 dense peak of the devices.
The per-term derivation: docs/design.md, "Module notes", flops.py.
"""
from __future__ import annotations

import re

from pmi_jax.config import MASK_RATE, ModelConfig

# Dense bf16 peak per chip/GPU, FLOP/s, from the vendors' data sheets.
# Matched in order against jax's `device_kind` (lower-cased).
PEAK_BF16_FLOPS = (
    (r"v6 ?lite|v6e", 918e12),  # TPU v6e (Trillium)
    (r"v5 ?lite|v5e", 197e12),  # TPU v5e
    (r"v5p|tpu v5$", 459e12),  # TPU v5p reports "TPU v5"
    (r"tpu v4", 275e12),
    (r"h200", 989e12),
    (r"h100.*pcie", 756e12),
    (r"h100", 989e12),  # SXM / HBM3: 989 TFLOP/s dense bf16 (the data sheet's 1,979 is with sparsity)
    (r"a100", 312e12),
)


def training_flops_per_token(config: ModelConfig, seq_len: int, mask_rate: float = MASK_RATE) -> float:
    """Matmul FLOPs of forward + backward per token; see the module docstring. `mask_rate`: the
    highest masking rate of the run, which sets how many positions the head gathers."""
    d, f, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_layers
    head_share = config.predictions(seq_len, mask_rate) / seq_len
    return 6.0 * (n * (4 * d * d + 2 * d * f) + (d * d + d * v) * head_share) + 12.0 * n * seq_len * d


def device_peak_flops(device_kind: str) -> float | None:
    """Peak dense bf16 FLOP/s of one device, or None for a kind not in the table (CPUs)."""
    kind = device_kind.lower()
    for pattern, peak in PEAK_BF16_FLOPS:
        if re.search(pattern, kind):
            return peak
    return None


def mfu(flops_per_token: float, tokens_per_second: float, num_devices: int, peak_per_device: float | None):
    if not peak_per_device:
        return None
    return flops_per_token * tokens_per_second / (num_devices * peak_per_device)
