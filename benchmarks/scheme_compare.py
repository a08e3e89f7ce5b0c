"""Masking schemes compared on a lent accelerator that has no TensorFlow: one file in, one command there.

The masking runs in tf.data, and the lent GPU machines carry JAX but not TensorFlow, no network,
at most 64 MiB of the working tree in, and at most 8 files of 16 MiB out (no checkpoints). So:

    # here (TensorFlow): every scheme's exact masked batches and the held-out text, in one compact file
    python benchmarks/scheme_compare.py dump --data corpus/data \
        --schemes random_token random_span naive_pmi pmi --steps 2000 --batch 128 --output batches.npz
    # on the accelerator, one command: train each scheme, score its checkpoints, pack the results
    python benchmarks/scheme_compare.py run --batches batches.npz --config small --output "$OUT" \
        --eval-every 500 --set model.dtype=bfloat16
    # back here: unpack and compare
    for f in out/*.tar.gz; do tar -xzf "$f" -C runs/; done
    pmi-jax compare runs/* --output report/

`dump` stores, for each scheme, what its seqio task yields at steps 0..S-1 (`batches.TaskBatches`,
the trainer's own source) in a form that decodes to the same arrays bit for bit (tested):
the distinct token sequences once for all schemes (uint16), each scheme's sequence order, its
masked positions as bits, a 2-bit action per masked position ([MASK], random, unchanged) and
the random replacements' ids; `input_mask` is `targets != [PAD]`, as MlmFeatureConverter
defines it. About 3 KB per step of 128 x 128 tokens per scheme before compression. `dump`
refuses to write a file over `--max-mib` and says how many steps fit.

`run` trains one real `pmi_jax.train.train` run per scheme from the file (only the batch source
differs from `pmi-jax train`), a checkpoint every `--eval-every` steps; scores every checkpoint
with single-token perplexity on the file's held-out sequences (`pmi_jax.eval.perplexity`,
written as `pmi-jax eval perplexity` writes it); then deletes the checkpoints' parameters
(`checkpoints.drop_states`: their metadata stays, which `compare` reads) and packs the run
directory into OUTPUT/<scheme>.tar.gz, one scheme at a time, so that a command stopped by its
time limit keeps the schemes it finished. OUTPUT/summary.json lists the perplexities and timings.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tarfile
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KEYS = ("inputs", "targets", "weights", "input_mask")
FORMAT = 2
MAX_OUTPUT_FILE = 16 * 2**20  # what one file brought back from the lent machine may weigh


# --------------------------------------------------------------------------------------
# The compact batch file
# --------------------------------------------------------------------------------------


def _rows(a_NxL: np.ndarray) -> np.ndarray:
    """Each row as one opaque value, so np.unique works on rows in one pass."""
    a = np.ascontiguousarray(a_NxL.astype(np.uint16))
    return a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1])))[:, 0]


def encode(batches: dict[str, dict[str, np.ndarray]], special_ids: dict[str, int]) -> dict[str, np.ndarray]:
    """scheme -> {key: [S, B, L]} -> the file's arrays (see the module docstring)."""
    mask_id, pad_id = special_ids["mask"], special_ids["pad"]
    seq_len = next(iter(batches.values()))["targets"].shape[-1]
    all_rows = np.concatenate([_rows(b["targets"].reshape(-1, seq_len)) for b in batches.values()])
    table, inverse = np.unique(all_rows, return_inverse=True)
    starts = np.cumsum([0] + [b["targets"].size // seq_len for b in batches.values()])
    out = {"sequences": np.frombuffer(table.tobytes(), np.uint16).reshape(-1, seq_len)}
    indices = {}
    for i, (scheme, b) in enumerate(batches.items()):
        targets, inputs, weights = (b[k].reshape(-1) for k in ("targets", "inputs", "weights"))
        if targets.max() >= 2**16:
            raise ValueError("token ids above 65535 do not fit the file's uint16")
        if not np.array_equal(b["input_mask"].reshape(-1) != 0, targets != pad_id):
            raise ValueError(f"{scheme}: input_mask is not targets != [PAD]")
        selected = weights > 0
        if np.any(inputs[~selected] != targets[~selected]):
            raise ValueError(f"{scheme}: inputs differ from targets outside the masked positions")
        at = inputs[selected]
        is_mask = (at == mask_id) & (at != targets[selected])
        is_random = (at != targets[selected]) & ~is_mask
        index = inverse.reshape(-1)[starts[i]:starts[i + 1]].astype(np.int32)
        same = next((name for name, other in indices.items() if np.array_equal(other, index)), None)
        if same is None:
            indices[scheme] = index
            out[f"{scheme}/index"] = index
        else:
            out[f"{scheme}/index_of"] = np.frombuffer(same.encode(), np.uint8)
        out[f"{scheme}/selected"] = np.packbits(selected)
        out[f"{scheme}/is_mask"] = np.packbits(is_mask)
        out[f"{scheme}/is_random"] = np.packbits(is_random)
        out[f"{scheme}/random_to"] = at[is_random].astype(np.uint16)
        out[f"{scheme}/weights_value"] = np.unique(weights[selected]).astype(np.float32)
    return out


def decode(npz, scheme: str, steps: int, batch: int, seq_len: int, special_ids: dict[str, int]) -> dict:
    """The arrays of one scheme, [S, B, L], exactly as `encode` got them."""
    shape = (steps, batch, seq_len)
    n = int(np.prod(shape))
    key = f"{scheme}/index" if f"{scheme}/index" in npz else f"{npz[f'{scheme}/index_of'].tobytes().decode()}/index"
    targets = npz["sequences"].astype(np.int32)[npz[key]].reshape(-1)
    selected = np.unpackbits(npz[f"{scheme}/selected"], count=n).astype(bool)
    positions = np.flatnonzero(selected)
    is_mask = np.unpackbits(npz[f"{scheme}/is_mask"], count=len(positions)).astype(bool)
    is_random = np.unpackbits(npz[f"{scheme}/is_random"], count=len(positions)).astype(bool)
    inputs = targets.copy()
    inputs[positions[is_mask]] = special_ids["mask"]
    inputs[positions[is_random]] = npz[f"{scheme}/random_to"]
    values = npz[f"{scheme}/weights_value"]
    if len(values) > 1:
        raise ValueError(f"{scheme}: weights other than 0 and one value are not in this format")
    weights = np.where(selected, values[0] if len(values) else 1.0, 0.0).astype(np.float32)
    return {"inputs": inputs.reshape(shape), "targets": targets.reshape(shape), "weights": weights.reshape(shape),
            "input_mask": (targets != special_ids["pad"]).astype(np.int32).reshape(shape)}


def dump(args) -> None:
    from pmi_jax import batches as batch_sources
    from pmi_jax import storage
    from pmi_jax.errors import UserInputError
    from pmi_jax.eval import perplexity
    from pmi_jax.formats import wordpiece_vocab

    tokens = wordpiece_vocab.read_vocab(storage.join(args.data, "vocab.txt"))
    special = wordpiece_vocab.special_ids(tokens)
    batches = {}
    for scheme in args.schemes:
        corpus = batch_sources.read_corpus_info(args.data, scheme, "train")
        source = batch_sources.TaskBatches(args.data, scheme, "train", corpus.seq_len, args.batch, args.seed)
        rows = {k: [] for k in KEYS}
        for _, batch in zip(range(args.steps), source.batches(0, 0, 1)):
            for k in KEYS:
                rows[k].append(batch[k])
        batches[scheme] = {k: np.stack(v) for k, v in rows.items()}  # [S, B, L]
        print(f"{scheme}: {args.steps} steps x {args.batch} sequences", flush=True)
    out = encode(batches, special)
    validation = list(perplexity.read_sequences(args.data, "validation", args.max_eval_sequences))
    out["validation/lengths"] = np.array([len(s) for s in validation], np.int32)
    out["validation/ids"] = np.concatenate(validation).astype(np.uint16)
    info = dataclasses.asdict(corpus) | {"format": FORMAT, "schemes": args.schemes, "steps": args.steps,
                                         "batch": args.batch, "seed": args.seed, "special_ids": special}
    out["info"] = np.frombuffer(json.dumps(info).encode(), np.uint8)
    tmp = args.output + ".tmp.npz"
    np.savez_compressed(tmp, **out)
    size = os.path.getsize(tmp)
    if size > args.max_mib * 2**20:
        os.remove(tmp)
        fit = int(args.steps * args.max_mib * 2**20 / size)
        raise UserInputError(f"--steps {args.steps}: the file would be {size / 2**20:.1f} MiB, over --max-mib "
                             f"{args.max_mib}; about {fit} steps fit")
    os.replace(tmp, args.output)
    print(f"wrote {args.output} ({size / 2**20:.1f} MiB: {len(out['sequences'])} distinct sequences, "
          f"{len(validation)} held-out)")


@dataclasses.dataclass
class ArrayBatches:
    """A BatchSource replaying dumped batches: step s is exactly what the seqio task gave at step s."""

    arrays: dict  # key -> [S, B, L]

    def batches(self, start_step, shard_index, num_shards):
        rows = self.arrays["inputs"].shape[1] // num_shards
        for step in range(start_step, self.arrays["inputs"].shape[0]):
            yield {k: v[step, shard_index * rows:(shard_index + 1) * rows] for k, v in self.arrays.items()}


# --------------------------------------------------------------------------------------
# Train, score and pack (on the accelerator)
# --------------------------------------------------------------------------------------


def score_checkpoint(step_dir: str, validation, info: dict, positions) -> dict:
    """Single-token perplexity of one checkpoint, computed and recorded as `pmi-jax eval perplexity`
    does (`pmi_jax.eval.run_eval.perplexity_of_checkpoints`, which reads the held-out text from the
    prepared corpus with TensorFlow; here it comes from the file)."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import perplexity
    from pmi_jax.formats import run_dir
    from pmi_jax.model import BertForMaskedLM

    special = info["special_ids"]
    model_config, params, metadata = checkpoints.restore_for_eval(step_dir)
    result = perplexity.single_token_perplexity(
        BertForMaskedLM(model_config), params, validation, seq_len=info["seq_len"],
        special_ids=list(special.values()), mask_id=special["mask"], pad_id=special["pad"], positions=positions)
    report = {"checkpoint": step_dir, "step": metadata.step, "scheme": metadata.scheme,
              "data": info["data_dir"], "split": "validation", "positions": str(positions) if positions else "all",
              "seed": 0, "max_sequences": len(validation), "perplexity": result.perplexity,
              "mean_nll": result.mean_nll, "num_tokens": result.num_tokens, "num_sequences": result.num_sequences}
    run = run_dir.run_dir_of(step_dir)
    storage.gfile.makedirs(run_dir.eval_dir(run))
    with storage.atomic_file(run_dir.perplexity_result_path(run, "validation", metadata.step)) as f:
        f.write(json.dumps(report, indent=2) + "\n")
    return report


def _pack(workdir: str, path: str) -> int:
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(workdir, arcname=os.path.basename(workdir))
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    return size


def run(args) -> None:
    import jax

    from pmi_jax import checkpoints, storage, train
    from pmi_jax.batches import CorpusInfo
    from pmi_jax.config import apply_overrides, load_config

    npz = np.load(args.batches)
    info = json.loads(npz["info"].tobytes())
    if info.get("format") != FORMAT:
        raise SystemExit(f"{args.batches}: format {info.get('format')}, this script reads {FORMAT}: dump it again")
    lengths = npz["validation/lengths"]
    validation = np.split(npz["validation/ids"].astype(np.int64), np.cumsum(lengths)[:-1])
    corpus = CorpusInfo(data_dir=info["data_dir"], seq_len=info["seq_len"], vocab_size=info["vocab_size"],
                              vocab_sha256=info["vocab_sha256"], units=tuple(info["units"]))
    steps = min(args.steps or info["steps"], info["steps"])
    os.makedirs(args.output, exist_ok=True)
    runs_dir = args.runs or tempfile.mkdtemp(prefix="scheme_compare_")
    summary = {"device": jax.devices()[0].device_kind, "devices": jax.device_count(), "jax": jax.__version__,
               "config": args.config, "steps": steps, "batch": info["batch"], "overrides": args.set, "runs": {}}
    schemes = args.schemes or info["schemes"]
    for scheme in schemes:
        workdir = os.path.abspath(os.path.join(runs_dir, scheme))
        arrays = decode(npz, scheme, info["steps"], info["batch"], info["seq_len"], info["special_ids"])
        config = apply_overrides(load_config(args.config), [
            f"model.vocab_size={info['vocab_size']}", f"data.seq_len={info['seq_len']}", f"data.scheme={scheme}",
            f"data.data_dir={info['data_dir']}", f"train.batch_size={info['batch']}", f"data.seed={info['seed']}",
            f"train.num_steps={steps}", f"checkpoint.every_steps={args.eval_every}",
            f"checkpoint.keep={steps // args.eval_every + 1}", *args.set])
        started = time.time()
        train.train(config, workdir, ArrayBatches(arrays), corpus)
        trained = time.time() - started
        records = []
        for step in checkpoints.Checkpointer(workdir, config.checkpoint, read_only=True).all_steps()[::-1]:
            record = score_checkpoint(os.path.join(checkpoints.checkpoint_dir(workdir), str(step)), validation,
                                      info, args.positions)
            records.append(record)
            print(f"{scheme:<13} step {step:>6} perplexity {record['perplexity']:9.3f}", flush=True)
        checkpoints.drop_states(workdir)
        size = _pack(workdir, os.path.join(args.output, f"{scheme}.tar.gz"))
        if size > MAX_OUTPUT_FILE:
            print(f"warning: {scheme}.tar.gz is {size / 2**20:.1f} MiB, over the 16 MiB a file may bring back",
                  flush=True)
        summary["runs"][scheme] = {"train_s": round(trained, 1), "score_s": round(time.time() - started - trained, 1),
                                   "packed_bytes": size, "perplexity": {r["step"]: r["perplexity"] for r in records}}
        with storage.atomic_file(os.path.join(args.output, "summary.json")) as f:
            f.write(json.dumps(summary, indent=2) + "\n")
        print(f"{scheme}: trained {steps} steps in {trained:.0f} s; packed {size / 2**10:.0f} KiB", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("dump", help="write each scheme's masked batches and held-out text to one compact .npz")
    p.add_argument("--data", required=True, help="prepared corpus (pmi-jax corpus prepare)")
    p.add_argument("--schemes", nargs="+", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-eval-sequences", type=int, default=400)
    p.add_argument("--max-mib", type=float, default=60.0, help="refuse a file larger than this (MiB)")
    p.add_argument("--output", required=True)
    p.set_defaults(func=dump)
    p = commands.add_parser("run", help="train every scheme of a dump, score its checkpoints, pack the results")
    p.add_argument("--batches", required=True)
    p.add_argument("--config", default="small")
    p.add_argument("--output", required=True, help="directory for <scheme>.tar.gz and summary.json")
    p.add_argument("--runs", default=None, help="where the run directories are made (default: a temporary one)")
    p.add_argument("--schemes", nargs="*", default=None, help="a subset of the dumped schemes (default: all)")
    p.add_argument("--steps", type=int, default=None, help="train fewer steps than dumped")
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--positions", type=int, default=8, help="masked positions scored per held-out sequence")
    p.add_argument("--set", action="append", default=[], help="config override, as for pmi-jax train")
    p.set_defaults(func=run)
    args = parser.parse_args(argv)
    from pmi_jax.errors import UserInputError

    try:
        args.func(args)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
