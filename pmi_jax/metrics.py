"""Training FLOPs, device peaks and model FLOPs utilisation (MFU); metric writing.

FLOPs of one training token of BERT, counting a multiply-add as 2 FLOPs and only matmuls
(embedding gathers, LayerNorm, softmax, GELU and the optimizer are ignored, as in
Kaplan et al. 2020 and the PaLM appendix B definition of MFU). With N layers, width D,
feed-forward F, sequence length T and vocabulary V, the forward pass per token costs

    per layer   Q, K, V projections          3 * 2*D*D
                attention output projection      2*D*D
                feed-forward in and out      2 * 2*D*F
                scores  q . k  (T keys)          2*T*D
                weighted sum of values (T)       2*T*D
    MLM head    transform                        2*D*D * P/T
                tied decoder                     2*D*V * P/T

The attention terms use all T keys for every query: BERT attention is bidirectional, so
nothing is halved as it would be for a causal mask. The MLM head runs on P of the T
positions of a sequence (the gathered masked positions, `ModelConfig.predictions`; P = T for
the full head), and only the FLOPs the model computes are counted. V is the true vocabulary:
the rows padded to `vocab_multiple` are computed but are not the model's work. Backward
costs twice the forward, so

    training FLOPs / token = 6 * (P_layers + (D*D + D*V) * P/T) + 12 * N * T * D,
    P_layers = N * (4*D*D + 2*D*F)

(the parameter count of the matmul weights, i.e. everything but the position and
token-type tables, biases and LayerNorms). MFU = achieved FLOPs/s divided by the summed
bf16 dense peak of the devices in use.
"""
from __future__ import annotations

import json
import logging
import os
import re

from pmi_jax.config import ModelConfig

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


def training_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Matmul FLOPs of forward + backward per token; see the module docstring."""
    d, f, v, n = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_layers
    head_share = config.predictions(seq_len) / seq_len
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


class MetricWriter:
    """Scalars to stdout, TensorBoard and `metrics.jsonl`, from process 0 only.

    The JSON-lines file is the machine-readable record (one object per logged step); a
    resumed run appends to it, so a step logged twice keeps its last value when read.
    TensorBoard's event files are written through TensorFlow; where it is not installed (a
    JAX-only accelerator image training from pre-masked batches) the run still logs to
    stdout and `metrics.jsonl` on local disk, and says once that it writes no event files.
    """

    def __init__(self, logdir: str, enabled: bool):
        self.logdir = logdir
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        jsonl = os.path.join(logdir, "metrics.jsonl") if "://" not in logdir else logdir.rstrip("/") + "/metrics.jsonl"
        if "://" not in jsonl:
            _drop_cut_line(jsonl)
        try:
            import tensorflow as tf
        except ImportError:
            if "://" in logdir:
                raise
            logging.warning("TensorFlow is not installed: no TensorBoard event files, metrics go to %s", jsonl)
            os.makedirs(logdir, exist_ok=True)
            self._jsonl = open(jsonl, "a")
            return
        tf.io.gfile.makedirs(logdir)
        self._tb = tf.summary.create_file_writer(logdir)
        self._jsonl = tf.io.gfile.GFile(jsonl, "a")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self._tb is not None:
            import tensorflow as tf

            with self._tb.as_default(step=step):
                for name, value in scalars.items():
                    if value is not None:
                        tf.summary.scalar(name, value)
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        print(f"step {step}  " + "  ".join(_format(k, v) for k, v in scalars.items() if v is not None), flush=True)

    def flush(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.flush()
            self._jsonl.flush()

    def close(self) -> None:
        if self.enabled:
            if self._tb is not None:
                self._tb.close()
            self._jsonl.close()


def _drop_cut_line(path: str) -> None:
    """A run killed mid-write leaves a last line without its newline; the resumed run appends to
    the file, so cut that partial line first, or it would fuse with the next record."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _format(name: str, value: float) -> str:
    if name in ("learning_rate",):
        return f"{name}={value:.3e}"
    if abs(value) >= 1000:
        return f"{name}={value:.0f}"
    return f"{name}={value:.4f}"


def parse_record(line: bytes, where: str) -> dict:
    """One metrics.jsonl line, checked: a JSON object with an integer step and a number (or null,
    a scalar not measured at that step) for every other field.

    `where` is FILE:LINE for the one-line error; a reader that plotted a string or crashed on
    binary bytes would hide which line of which run is damaged.
    """
    from pmi_jax.errors import UserInputError

    try:
        record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UserInputError(f"{where}: not a metrics line (a JSON object with a step)") from None
    if not isinstance(record, dict) or isinstance(record.get("step"), bool) or not isinstance(record.get("step"), int):
        raise UserInputError(f"{where}: not a metrics line (a JSON object with an integer step)")
    for name, value in record.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            raise UserInputError(f"{where}: {name} is {json.dumps(value)[:40]}, not a number")
    return record


def read_metrics(logdir: str) -> dict[int, dict]:
    """step -> the last record logged for it (a resumed run re-logs the steps it redid)."""
    import tensorflow as tf

    path = logdir.rstrip("/") + "/metrics.jsonl"
    records = {}
    with tf.io.gfile.GFile(path, "rb") as f:
        for number, line in enumerate(f.read().splitlines(), start=1):
            if line.strip():
                record = parse_record(line, f"{path}:{number}")
                records[record["step"]] = record
    return records
