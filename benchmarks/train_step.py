"""Training-step throughput of pmi-jax's BERT, its full-logit head, and transformers' FlaxBertForMaskedLM.

    python benchmarks/train_step.py                       # tiny and base, CPU-sized batches
    python benchmarks/train_step.py --sizes tiny --batch 8 --seq-len 128 512   # the gathered head's gain on CPU
    python benchmarks/train_step.py --sizes base --batch 32 --seq-len 512 --dtype bfloat16   # accelerator

All contenders run the same thing: one jitted step of MLM loss, gradient, and the same optax
AdamW chain, on the same synthetic batch (15% of the words masked, within BERT's budget),
with the same model sizes, dropout on. `pmi-jax` is the trainer's own step (configs/<size>.py:
the MLM head on the gathered masked positions only); `pmi-jax-full` is the same step with
the head on every position (`model.max_predictions_per_seq=-1`), i.e. what the gathered head
saves; `transformers` is FlaxBertForMaskedLM (full logits), skipped where transformers has no
Flax models (5.x) or is not installed. Reported per size, length and contender: median step
time over `--steps` timed steps (after compilation and one warm-up step; the contenders'
steps alternate so that load from other processes falls on all alike), tokens/s, achieved
TFLOP/s and model FLOPs utilisation, both from `pmi_jax.flops` counting the FLOPs each
contender computes (bidirectional attention, nothing halved; the full-logit contenders'
decoder at every position). MFU needs a known device peak (H100: 989 TFLOP/s dense bf16) or
--peak-flops. pmi-jax runs on a mesh over all local devices; transformers on one. Imports
neither TensorFlow nor seqio.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from pmi_jax import batches, flops, partitioning, train  # noqa: E402
from pmi_jax.config import load_config  # noqa: E402
from pmi_jax.optimizer import make_optimizer  # noqa: E402

VOCAB_SIZE = 30_522


class Runner:
    """A jitted step and its carried state; `tick` times one step."""

    def __init__(self, step, carry, batch):
        self.step, self.carry, self.batch = step, carry, batch
        for _ in range(2):  # compile, then one warm-up step
            self.tick()

    def tick(self) -> float:
        start = time.perf_counter()
        self.carry, out = self.step(self.carry, self.batch)
        jax.block_until_ready(out)
        return time.perf_counter() - start


def pmi_jax_runner(config, batch) -> Runner:
    mesh = partitioning.make_mesh(dataclasses.replace(config.mesh, data=-1, fsdp=1, model=1))
    with partitioning.activate(mesh, config.mesh):
        program = train.build_program(config, mesh)
        global_batch = partitioning.global_batch_from_host(batch, mesh, config.train.batch_size)
        return Runner(program.step, program.init(), global_batch)


def transformers_runner(config, batch) -> Runner:
    import transformers

    m = config.model
    hf_config = transformers.BertConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                                        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                                        intermediate_size=m.intermediate_size,
                                        max_position_embeddings=m.max_position_embeddings,
                                        hidden_dropout_prob=m.dropout_rate,
                                        attention_probs_dropout_prob=m.attention_dropout_rate)
    model = transformers.FlaxBertForMaskedLM(hf_config, dtype=jnp.dtype(m.dtype), seed=0)
    tx = make_optimizer(config.optimizer, config.train.num_steps)

    def loss_fn(params, batch, rng):
        logits = model(batch["inputs"], attention_mask=batch["input_mask"], params=params, dropout_rng=rng,
                       train=True).logits.astype(jnp.float32)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return jnp.sum(xent * batch["weights"]) / jnp.maximum(jnp.sum(batch["weights"]), 1.0)

    def step(carry, batch):
        params, opt_state, count = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(jax.random.PRNGKey(1), count))
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, count + 1), loss

    params = model.params
    carry = (params, tx.init(params), jnp.zeros((), jnp.int32))
    return Runner(jax.jit(step, donate_argnums=0), carry, jax.device_put(batch))


def contender_config(config, name: str):
    """The config a contender computes with: the full head for the full-logit contenders."""
    if name == "pmi-jax":
        return config
    return dataclasses.replace(config, model=dataclasses.replace(config.model, max_predictions_per_seq=-1))


CONTENDERS = ("pmi-jax", "pmi-jax-full", "transformers")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "base"], help="configs to benchmark")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per step (default: 32 for tiny, 4 for base on CPU; 256/32 on accelerators)")
    parser.add_argument("--seq-len", type=int, nargs="+", default=None,
                        help="tokens per sequence, one or more (default 128 on CPU, 512 else)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after compilation and warm-up")
    parser.add_argument("--dtype", default=None, help="compute dtype (default: float32 on CPU, bfloat16 else)")
    parser.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s of one device, for MFU")
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS,
                        help="what to run (default: all)")
    parser.add_argument("--skip-transformers", action="store_true", help="leave out transformers")
    args = parser.parse_args(argv)

    on_cpu = jax.default_backend() == "cpu"
    device = jax.devices()[0]
    peak = args.peak_flops or flops.device_peak_flops(device.device_kind)
    print(f"jax {jax.__version__}, devices: {jax.device_count()} x {device.device_kind} ({jax.default_backend()}), "
          + (f"peak {peak / 1e12:.0f} TFLOP/s per device (dense bf16)" if peak else
             "peak unknown: MFU not reported (pass --peak-flops)"))
    print(f"{'config':<6} {'impl':<13} {'batch':>5} {'seq':>4} {'dtype':<8} {'step ms':>9} {'tokens/s':>10} "
          f"{'TFLOP/s':>8} {'MFU':>6}")
    contenders = [c for c in args.contenders if not (args.skip_transformers and c == "transformers")]
    for size in args.sizes:
        for seq_len in args.seq_len or [128 if on_cpu else 512]:
            run_size(size, seq_len, args, contenders, on_cpu, peak)


def run_size(size, seq_len, args, contenders, on_cpu, peak) -> None:
    base = load_config(size)
    batch_size = args.batch or ((32 if size == "tiny" else 4) if on_cpu else (256 if size == "tiny" else 32))
    dtype = args.dtype or ("float32" if on_cpu else "bfloat16")
    config = dataclasses.replace(
        base, model=dataclasses.replace(base.model, vocab_size=VOCAB_SIZE, dtype=dtype,
                                        max_position_embeddings=max(base.model.max_position_embeddings, seq_len)),
        data=dataclasses.replace(base.data, seq_len=seq_len),
        train=dataclasses.replace(base.train, batch_size=batch_size))
    batch = batches.SyntheticBatches(VOCAB_SIZE, seq_len, batch_size).global_batch(0)
    built, times = {}, {}
    for name in contenders:
        try:
            if name == "transformers":
                built[name] = (transformers_runner(contender_config(config, name), batch), 1)
            else:
                built[name] = (pmi_jax_runner(contender_config(config, name), batch), jax.device_count())
        except (ImportError, AttributeError) as e:  # no transformers, or 5.x without Flax models
            print(f"{size:<6} {name:<13} skipped: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
    for _ in range(args.steps):  # interleaved, so that load from elsewhere hits all alike
        for name, (runner, _) in built.items():
            times.setdefault(name, []).append(runner.tick())
    for name, (_, num_devices) in built.items():
        flops_per_token = flops.training_flops_per_token(contender_config(config, name).model, seq_len)
        step_s = statistics.median(times[name])
        tokens_per_s = batch_size * seq_len / step_s
        tflops = flops_per_token * tokens_per_s / num_devices / 1e12
        utilisation = flops.mfu(flops_per_token, tokens_per_s, num_devices, peak)
        mfu = f"{100 * utilisation:5.1f}%" if utilisation is not None else "   n/a"
        print(f"{size:<6} {name:<13} {batch_size:>5} {seq_len:>4} {dtype:<8} {1000 * step_s:>9.1f} "
              f"{tokens_per_s:>10.0f} {tflops:>8.3f} {mfu:>6}", flush=True)
    del built


if __name__ == "__main__":
    main()
