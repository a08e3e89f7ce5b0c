"""Validation during training: its share of training time at the defaults.

    python benchmarks/validation.py                          # tiny and small, CPU-sized batches
    python benchmarks/validation.py --sizes base --batch 32 --seq-len 512 --dtype bfloat16   # accelerator

Times the trainer's own jitted programs (`pmi_jax.train.build_program`): one training step
(`program.step`) and one validation batch (`program.validate`: the forward pass and the MLM
loss sums, no dropout, no gradient), on the same synthetic batch, alternating so that load
from other processes falls on both alike; medians over `--steps` after compilation and a
warm-up. The share of training time spent validating, every `eval_every` steps on
`eval_batches` batches of the training batch size:

    share = eval_batches * t_validate / (eval_every * t_step + eval_batches * t_validate)

It leaves out what happens once per run: compiling the validation program (printed) and
reading and masking the validation batches before step 1. Imports neither TensorFlow nor seqio.
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

from pmi_jax import batches, partitioning, train  # noqa: E402
from pmi_jax.config import TrainConfig, apply_overrides, load_config  # noqa: E402

VOCAB_SIZE = 30_522


def _timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    return out, time.perf_counter() - start


def measure(config, steps: int) -> tuple[float, float, float]:
    """(median step s, median validation batch s, validation compile s)."""
    mesh = partitioning.make_mesh(dataclasses.replace(config.mesh, data=-1, fsdp=1, model=1))
    source = batches.SyntheticBatches(config.model.vocab_size, config.data.seq_len, config.train.batch_size)
    with partitioning.activate(mesh, config.mesh):
        program = train.build_program(config, mesh)
        state = program.init()
        batch = partitioning.global_batch_from_host(source.global_batch(0), mesh, config.train.batch_size)
        held_out = partitioning.global_batch_from_host(source.validation_batches(1, config.train.batch_size, 0, 1)[0], mesh,
                                                       config.train.batch_size)
        _, compile_s = _timed(program.validate, state.params, held_out)
        _timed(program.validate, state.params, held_out)
        for _ in range(2):  # compile, then warm up
            (state, _), _ = _timed(program.step, state, batch)
        step_s, validate_s = [], []
        for _ in range(steps):
            (state, _), seconds = _timed(program.step, state, batch)
            step_s.append(seconds)
            _, seconds = _timed(program.validate, state.params, held_out)
            validate_s.append(seconds)
    return statistics.median(step_s), statistics.median(validate_s), compile_s


def main(argv=None) -> None:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], help="configs to benchmark")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step and per validation batch")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--dtype", default="float32", help="compute dtype")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (and validation batches)")
    parser.add_argument("--eval-every", type=int, nargs="+", default=[defaults.eval_every_steps, 100],
                        help=f"validation intervals to report (default: {defaults.eval_every_steps}, the default, and 100)")
    parser.add_argument("--eval-batches", type=int, default=defaults.eval_batches,
                        help=f"validation batches (default: {defaults.eval_batches}, the default)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"jax {jax.__version__}, {jax.device_count()} x {device.device_kind} ({jax.default_backend()}); "
          f"batch {args.batch}, seq {args.seq_len}, {args.dtype}, {args.eval_batches} validation batches")
    print(f"{'config':<6} {'step ms':>9} {'validate ms':>12} {'compile s':>10} "
          + " ".join(f"{'share @' + str(e):>12}" for e in args.eval_every))
    for size in args.sizes:
        config = apply_overrides(load_config(size), [
            f"model.vocab_size={VOCAB_SIZE}", f"data.seq_len={args.seq_len}", f"train.batch_size={args.batch}",
            f"model.dtype={args.dtype}", f"model.max_position_embeddings={max(args.seq_len, 512)}"])
        step_s, validate_s, compile_s = measure(config, args.steps)
        shares = [args.eval_batches * validate_s / (every * step_s + args.eval_batches * validate_s)
                  for every in args.eval_every]
        print(f"{size:<6} {1e3 * step_s:>9.1f} {1e3 * validate_s:>12.1f} {compile_s:>10.1f} "
              + " ".join(f"{100 * s:>11.2f}%" for s in shares), flush=True)


if __name__ == "__main__":
    main()
