"""Single-token perplexity throughput: scored tokens per second, three ways on the same model.

    python benchmarks/eval_perplexity.py [--config tiny] [--seq-len 128] [--vocab-size 30522]
                                         [--sequences 8] [--batch-size 64]

On random sequences (ids 5..V-1, [CLS] ... [SEP], full length) and a randomly initialised
BertForMaskedLM of the given config:
  ours        `pmi_jax.eval.perplexity.single_token_perplexity`: masked copies batched
              `--batch-size` at a time into one jitted pass, MLM head at the masked
              position only;
  full-head   the same batches, but the model's own forward (logits at every position,
              B·L·V), then the masked position picked: what batching alone buys;
  per-token   one jitted forward per scored token (batch 1, full logits), driven from
              Python: the straightforward implementation.
All three must agree on the perplexity (checked to 1e-4 relative). Timings exclude
compilation (each contender scores one warm-up sequence first).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pmi_jax.eval import perplexity  # noqa: E402
from pmi_jax.model import BertForMaskedLM  # noqa: E402

PAD, UNK, CLS, SEP, MASK = range(5)


def _sequences(n: int, seq_len: int, vocab_size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[CLS], rng.integers(5, vocab_size, seq_len - 2), [SEP]]) for _ in range(n)]


def _ours(model, params, sequences, seq_len, batch_size):
    result = perplexity.single_token_perplexity(model, params, sequences, seq_len=seq_len,
                                                special_ids=range(5), mask_id=MASK, pad_id=PAD,
                                                batch_size=batch_size)
    return result.mean_nll * result.num_tokens, result.num_tokens


def _full_head(model, params, sequences, seq_len, batch_size):
    @jax.jit
    def nll(ids_BxL, positions_B, targets_B):
        logits_BxLxV = model.apply({"params": params}, ids_BxL, (ids_BxL != PAD).astype(jnp.int32),
                                   deterministic=True)
        logits_BxV = jnp.take_along_axis(logits_BxLxV, positions_B[:, None, None], axis=1)[:, 0]
        return -jnp.take_along_axis(jax.nn.log_softmax(logits_BxV), targets_B[:, None], axis=-1)[:, 0]

    copies = perplexity._masked_copies(sequences, seq_len=seq_len, special_ids=range(5), mask_id=MASK,
                                       pad_id=PAD, positions=None, seed=0)
    total, count = 0.0, 0
    for ids, pos, tgt, w, _ in perplexity._batches(copies, batch_size, PAD):  # token units: one position a row
        total += float(np.sum(np.asarray(nll(ids, pos[:, 0], tgt[:, 0]), np.float64) * w[:, 0]))
        count += int(w[:, 0].sum())
    return total, count


def _per_token(model, params, sequences, seq_len, batch_size):
    del batch_size

    @jax.jit
    def nll(ids_1xL, position, target):
        logits_1xLxV = model.apply({"params": params}, ids_1xL, (ids_1xL != PAD).astype(jnp.int32),
                                   deterministic=True)
        return -jax.nn.log_softmax(logits_1xLxV[0, position])[target]

    total, count = 0.0, 0
    for ids_T in sequences:
        for position in range(1, len(ids_T) - 1):
            ids_1xL = np.full([1, seq_len], PAD, np.int32)
            ids_1xL[0, :len(ids_T)] = ids_T
            ids_1xL[0, position] = MASK
            total += float(nll(ids_1xL, position, int(ids_T[position])))
            count += 1
    return total, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny", help="model size from configs/ (tiny, small, base, large)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--sequences", type=int, default=8, help="sequences scored per contender")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--skip", default="", help="comma-separated contenders to leave out (e.g. per-token)")
    args = parser.parse_args()

    config = importlib.import_module(f"configs.{args.config}").get_config().model
    config = dataclasses.replace(config, vocab_size=args.vocab_size, max_position_embeddings=args.seq_len)
    model = BertForMaskedLM(config)
    ids = jnp.zeros([1, args.seq_len], jnp.int32)
    params = nn.unbox(jax.jit(lambda k: model.init(k, ids, ids, deterministic=True))(jax.random.key(0)))["params"]
    warmup = _sequences(1, args.seq_len, args.vocab_size, seed=1)
    sequences = _sequences(args.sequences, args.seq_len, args.vocab_size)
    print(f"device {jax.devices()[0].device_kind}, config {args.config} ({config.num_layers} layers, "
          f"{config.hidden_size} hidden, {config.dtype}), vocab {args.vocab_size}, seq_len {args.seq_len}, "
          f"batch {args.batch_size}")
    reference = None
    for name, fn in (("ours", _ours), ("full-head", _full_head), ("per-token", _per_token)):
        if name in args.skip.split(","):
            continue
        fn(model, params, warmup, args.seq_len, args.batch_size)  # compile
        start = time.perf_counter()
        total, count = fn(model, params, sequences, args.seq_len, args.batch_size)
        seconds = time.perf_counter() - start
        ppl = float(np.exp(total / count))
        reference = reference or ppl
        assert abs(ppl / reference - 1) < 1e-4, (name, ppl, reference)
        print(f"{name:10s} {count:7d} tokens {seconds:8.2f} s {count / seconds:10.1f} tokens/s  ppl {ppl:.2f}")


if __name__ == "__main__":
    main()
