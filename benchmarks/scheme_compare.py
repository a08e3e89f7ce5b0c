"""Masking schemes compared on an accelerator that has no TensorFlow: quality per training step.

The masking runs in tf.data, and the lent GPU machines here carry JAX but not TensorFlow. So
the comparison runs in two halves, with the masked batches in between as one compact file:

    # here (TensorFlow): the exact batches each scheme's seqio task yields, plus held-out text
    python benchmarks/scheme_compare.py dump --data demo/data --schemes random_token random_span pmi \
        --steps 600 --batch 128 --output batches.npz
    # on the accelerator (JAX only): one run per scheme, the same config, seed and steps, a checkpoint
    # every --eval-every steps; then single-token perplexity of each checkpoint
    python benchmarks/scheme_compare.py train --batches batches.npz --config small --runs runs/
    # anywhere
    pmi-jax compare runs/* --output report/

Each run is a real `pmi_jax.train.train` run; only the batch source differs from `pmi-jax train`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KEYS = ("inputs", "targets", "weights", "input_mask")


def dump(args) -> None:
    from pmi_jax import train
    from pmi_jax.eval import perplexity

    out = {}
    for scheme in args.schemes:
        corpus = train.read_corpus_info(args.data, scheme, "train")
        source = train.TaskBatches(args.data, scheme, "train", corpus.seq_len, args.batch, args.seed)
        rows = {k: [] for k in KEYS}
        for step, batch in zip(range(args.steps), source.batches(0, 0, 1)):
            for k in KEYS:
                rows[k].append(batch[k])
        arrays = {k: np.stack(v) for k, v in rows.items()}  # [S, B, L]
        targets_N = arrays["targets"].reshape(-1, corpus.seq_len)
        unique_UxL, index_N = np.unique(targets_N, axis=0, return_inverse=True)
        changed = np.flatnonzero(arrays["inputs"].reshape(-1) != arrays["targets"].reshape(-1))
        out.update({f"{scheme}/sequences": unique_UxL.astype(np.uint16), f"{scheme}/index": index_N.astype(np.int32),
                    f"{scheme}/changed_at": changed.astype(np.uint32),
                    f"{scheme}/changed_to": arrays["inputs"].reshape(-1)[changed].astype(np.uint16),
                    f"{scheme}/weights": np.packbits(arrays["weights"].reshape(-1) > 0),
                    f"{scheme}/input_mask": np.packbits(arrays["input_mask"].reshape(-1) > 0)})
        print(f"{scheme}: {args.steps} steps x {args.batch} sequences ({len(unique_UxL)} distinct)", flush=True)
    validation = list(perplexity.read_sequences(args.data, "validation", args.max_eval_sequences))
    out["validation/lengths"] = np.array([len(s) for s in validation], np.int32)
    out["validation/ids"] = np.concatenate(validation).astype(np.uint16)
    info = dataclasses.asdict(corpus) | {"schemes": args.schemes, "steps": args.steps, "batch": args.batch,
                                         "seed": args.seed}
    from pmi_jax.formats import wordpiece_vocab
    from pmi_jax.storage import join
    tokens = wordpiece_vocab.read_vocab(join(args.data, "vocab.txt"))
    info["special_ids"] = wordpiece_vocab.special_ids(tokens)
    out["info"] = np.frombuffer(json.dumps(info).encode(), np.uint8)
    np.savez_compressed(args.output, **out)
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB)")


@dataclasses.dataclass
class ArrayBatches:
    """A BatchSource replaying dumped batches: step s is exactly what the seqio task gave at step s."""

    arrays: dict  # key -> [S, B, L]

    def batches(self, start_step, shard_index, num_shards):
        rows = self.arrays["inputs"].shape[1] // num_shards
        for step in range(start_step, self.arrays["inputs"].shape[0]):
            yield {k: v[step, shard_index * rows:(shard_index + 1) * rows] for k, v in self.arrays.items()}


def load_scheme(npz, scheme: str, steps: int, batch: int, seq_len: int) -> dict:
    shape = (steps, batch, seq_len)
    targets = npz[f"{scheme}/sequences"].astype(np.int32)[npz[f"{scheme}/index"]].reshape(-1)
    inputs = targets.copy()
    inputs[npz[f"{scheme}/changed_at"]] = npz[f"{scheme}/changed_to"]
    n = int(np.prod(shape))
    bits = {k: np.unpackbits(npz[f"{scheme}/{k}"])[:n] for k in ("weights", "input_mask")}
    return {"inputs": inputs.reshape(shape), "targets": targets.reshape(shape),
            "weights": bits["weights"].astype(np.float32).reshape(shape),
            "input_mask": bits["input_mask"].astype(np.int32).reshape(shape)}


def train_runs(args) -> None:
    import jax

    from pmi_jax import checkpoints, train
    from pmi_jax.config import load_config
    from pmi_jax.config import apply_overrides
    from pmi_jax.eval import perplexity
    from pmi_jax.model import BertForMaskedLM

    npz = np.load(args.batches)
    info = json.loads(npz["info"].tobytes())
    lengths = npz["validation/lengths"]
    validation = np.split(npz["validation/ids"].astype(np.int64), np.cumsum(lengths)[:-1])
    corpus = train.CorpusInfo(data_dir=info["data_dir"], seq_len=info["seq_len"], vocab_size=info["vocab_size"],
                              vocab_sha256=info["vocab_sha256"], units=tuple(info["units"]))
    special = info["special_ids"]
    summary = {"device": jax.devices()[0].device_kind, "runs": {}}
    for scheme in info["schemes"]:
        workdir = os.path.abspath(os.path.join(args.runs, scheme))
        arrays = load_scheme(npz, scheme, info["steps"], info["batch"], info["seq_len"])
        config = apply_overrides(load_config(args.config), [
            f"model.vocab_size={info['vocab_size']}", f"data.seq_len={info['seq_len']}", f"data.scheme={scheme}",
            f"data.data_dir={info['data_dir']}", f"train.batch_size={info['batch']}", f"data.seed={info['seed']}",
            f"train.num_steps={info['steps']}", f"checkpoint.every_steps={args.eval_every}",
            f"checkpoint.keep={info['steps'] // args.eval_every + 1}", *args.set])
        started = time.time()
        train.train(config, workdir, ArrayBatches(arrays), corpus)
        trained = time.time() - started
        for stop in range(args.eval_every, info["steps"] + 1, args.eval_every):
            model_config, params, _ = checkpoints.restore_for_eval(os.path.join(workdir, "checkpoints", str(stop)))
            result = perplexity.single_token_perplexity(
                BertForMaskedLM(model_config), params, validation, seq_len=info["seq_len"],
                special_ids=list(special.values()), mask_id=special["mask"], pad_id=special["pad"],
                positions=args.positions)
            record = {"step": stop, "split": "validation", "scheme": scheme, "perplexity": result.perplexity, "mean_nll": result.mean_nll,
                      "tokens": result.num_tokens, "sequences": result.num_sequences}
            os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
            with open(os.path.join(workdir, "eval", f"perplexity-validation-step{stop}.json"), "w") as f:
                json.dump(record, f, indent=2)
            summary["runs"].setdefault(scheme, []).append(record)
            print(f"{scheme:<13} step {stop:>6} perplexity {result.perplexity:9.3f} "
                  f"(training took {trained:.0f} s)", flush=True)
    with open(os.path.join(args.runs, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("dump", help="write each scheme's masked batches and held-out text to one .npz")
    p.add_argument("--data", required=True, help="prepared corpus (pmi-jax corpus prepare)")
    p.add_argument("--schemes", nargs="+", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-eval-sequences", type=int, default=400)
    p.add_argument("--output", required=True)
    p.set_defaults(func=dump)
    p = commands.add_parser("train", help="one training run per scheme from a dump, perplexity as it goes")
    p.add_argument("--batches", required=True)
    p.add_argument("--config", default="small")
    p.add_argument("--runs", required=True, help="directory for one run directory per scheme")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--positions", type=int, default=8, help="masked positions scored per held-out sequence")
    p.add_argument("--set", action="append", default=[], help="config override, as for pmi-jax train")
    p.set_defaults(func=train_runs)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
