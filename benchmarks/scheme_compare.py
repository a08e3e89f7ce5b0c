"""Masking schemes compared on a lent accelerator that has no TensorFlow: one file in, one command there.

The masking runs in tf.data, and the lent GPU machines carry JAX but not TensorFlow, no network,
at most 64 MiB of the working tree in, and at most 8 files of 16 MiB out (no checkpoints). So:

    # here (TensorFlow): every scheme's exact masked batches and the held-out text, in one compact file
    python benchmarks/scheme_compare.py dump --data corpus/data \
        --schemes random_token random_span naive_pmi pmi --steps 2000 --batch 128 --output batches.npz
    # on the accelerator, one command: train each scheme and seed, score its checkpoints, pack the results
    python benchmarks/scheme_compare.py run --batches batches.npz --config small --output "$OUT" \
        --seeds 0 1 2 --unit token word pmi --eval-every 500 --set model.dtype=bfloat16
    # back here: unpack and compare
    for f in out/*.tar.gz; do tar -xzf "$f" -C runs/; done
    pmi-jax compare runs/* --output report/

`dump` stores, for each scheme, what its seqio task yields at steps 0..S-1 (`batches.TaskBatches`,
the trainer's own source) in a form that decodes to the same arrays bit for bit (tested):
the distinct token sequences once for all schemes (uint16), each scheme's sequence order, its
masked positions as bits, a 2-bit action per masked position ([MASK], random, unchanged) and
the random replacements' ids; `input_mask` is `targets != [PAD]`, as MlmFeatureConverter
defines it. Each scheme's `--eval-batches` validation batches (what `pmi-jax train` validates
on, `train.eval_every_steps`) are stored the same way, under `<scheme>.validation`. The held-out sequences come with their `word_ids` and every `units_NAME` as two bits
per token (a unit starts here; no unit, i.e. a special token), which keep each sequence's
partition into units exactly (checked when writing: every unit is one contiguous run). About 3 KB per step of 128 x 128 tokens per scheme before compression. `dump`
refuses to write a file over `--max-mib` and says how many steps fit.

`run` trains one real `pmi_jax.train.train` run per scheme and `--seeds` value (train.seed:
parameter init and dropout; every seed of a scheme replays the same dumped batches, so data
order and masks vary only with `dump --seed`), a checkpoint every `--eval-every` steps; scores
every checkpoint with each `--unit` on the file's held-out sequences through the library's
`pmi_jax.eval.perplexity.score_report`, written where and as `pmi-jax eval perplexity` writes
it (per-token NLLs included, so `compare` gives the same seed-aware intervals as for CPU runs);
then deletes the checkpoints' parameters (`checkpoints.drop_states`: their metadata stays, which
`compare` reads) and packs the run directories RUNS/<scheme>-seed<N> of each scheme into
OUTPUT/<scheme>.tar.gz, repacked after each seed, so that a command stopped by its time limit
keeps the runs it finished. OUTPUT/summary.json lists the perplexities and timings; with
`--cross-score`, also each checkpoint's MLM loss on every dumped scheme's validation batches
(issue 32: is a scheme best on its own masks?).
`cross-score RUN ... --batches F --step N` does the same for `pmi-jax train` runs of the dumped
corpus (`dump --steps 1 --eval-batches 1 --batch V` holds the V validation sequences' masks of
every scheme), a markdown table with the seed-aware intervals of `pmi_jax.intervals`.

A run longer than one file goes in parts (benchmarks/README.md, "scheme_compare in parts"):
`dump --start-step K` writes steps K.., and `run --total-steps T --runs DIR --keep-newest-state`
trains to the part's end with a T-step schedule, keeping the newest checkpoint's state in DIR
for the next part's command to resume from; the last part leaves out --keep-newest-state.
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
FORMAT = 3
TOKEN = "token"
VALIDATION = ".validation"  # the name suffix of a scheme's validation batches in the file
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


def encode_units(units: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence unit ids (-1: none) -> two packed bits per token: a unit starts here; no unit.

    Only the partition into units matters to scoring (a unit is named by its first position), so
    the ids themselves are not kept; the partition is, exactly, when every unit is one contiguous
    run of tokens (raised otherwise)."""
    flat_T = np.concatenate(units).astype(np.int64)
    first_T = np.zeros(len(flat_T), bool)
    first_T[np.cumsum([0] + [len(u) for u in units[:-1]])] = True
    starts_T = first_T | np.r_[True, flat_T[1:] != flat_T[:-1]]
    none_T = flat_T < 0
    sequence_T = np.cumsum(first_T)
    distinct = len(np.unique(np.stack([sequence_T, flat_T])[:, ~none_T], axis=1).T)
    if distinct != int(np.sum(starts_T & ~none_T)):
        raise ValueError("a unit of the held-out sequences is not one contiguous run of tokens")
    return np.packbits(starts_T), np.packbits(none_T)


def decode_units(npz, unit: str, lengths: np.ndarray) -> list[np.ndarray]:
    """The per-sequence unit ids of `encode_units`, renumbered (same partition, same -1s)."""
    n = int(lengths.sum())
    starts_T = np.unpackbits(npz[f"validation/{unit}/starts"], count=n).astype(bool)
    none_T = np.unpackbits(npz[f"validation/{unit}/none"], count=n).astype(bool)
    ids_T = np.where(none_T, -1, np.cumsum(starts_T) - 1)
    return np.split(ids_T, np.cumsum(lengths)[:-1])


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
        if args.eval_batches and not corpus.has_validation:
            raise UserInputError(f"--data {args.data}: no validation split for --eval-batches {args.eval_batches} "
                                 "(prepare the corpus with --validation-fraction above 0, or pass --eval-batches 0)")
        source = batch_sources.TaskBatches(args.data, scheme, "train", corpus.seq_len, args.batch, args.seed)
        rows = {k: [] for k in KEYS}
        for _, batch in zip(range(args.steps), source.batches(args.start_step, 0, 1)):
            for k in KEYS:
                rows[k].append(batch[k])
        batches[scheme] = {k: np.stack(v) for k, v in rows.items()}  # [S, B, L]
        if args.eval_batches:  # the trainer's validation batches (train.eval_every_steps), stored alike
            held = source.validation_batches(args.eval_batches, args.batch, 0, 1)
            batches[scheme + VALIDATION] = {k: np.stack([b[k] for b in held]) for k in KEYS}
        print(f"{scheme}: steps {args.start_step}..{args.start_step + args.steps - 1} x {args.batch} sequences",
              flush=True)
    out = encode(batches, special)
    validation = list(perplexity.read_sequences(args.data, "validation", args.max_eval_sequences))
    out["validation/lengths"] = np.array([len(s) for s in validation], np.int32)
    out["validation/ids"] = np.concatenate(validation).astype(np.uint16)
    unit_kinds = [perplexity.WORD, *corpus.units]
    for unit in unit_kinds:
        pairs = list(perplexity.read_sequences(args.data, "validation", args.max_eval_sequences, unit=unit))
        if not all(np.array_equal(ids, v) for (ids, _), v in zip(pairs, validation)):
            raise ValueError(f"{unit}: the held-out sequences read differently")
        out[f"validation/{unit}/starts"], out[f"validation/{unit}/none"] = encode_units([u for _, u in pairs])
    info = dataclasses.asdict(corpus) | {"format": FORMAT, "schemes": args.schemes, "steps": args.steps,
                                         "batch": args.batch, "seed": args.seed, "special_ids": special,
                                         "start_step": args.start_step,
                                         "unit_kinds": unit_kinds, "max_eval_sequences": args.max_eval_sequences,
                                         "eval_batches": args.eval_batches}
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


class PartEnd(Exception):
    """The trainer asked for a step past this part of the dump (`run --total-steps`)."""


@dataclasses.dataclass
class ArrayBatches:
    """A BatchSource replaying dumped batches: step s is exactly what the seqio task gave at step s."""

    arrays: dict  # key -> [S, B, L]: steps first_step .. first_step + S - 1
    validation: dict | None = None  # key -> [eval_batches, B, L]: TaskBatches.validation_batches, dumped
    first_step: int = 0  # a dump in parts: the step its first batch is (dump --start-step)

    def batches(self, start_step, shard_index, num_shards):
        from pmi_jax.errors import UserInputError

        if start_step < self.first_step:
            raise UserInputError(f"the run is at step {start_step} and this part of the dump starts at step "
                                 f"{self.first_step}: run the earlier part first, with the same --runs")
        rows = self.arrays["inputs"].shape[1] // num_shards
        end = self.first_step + self.arrays["inputs"].shape[0]
        for step in range(start_step, end):
            yield {k: v[step - self.first_step, shard_index * rows:(shard_index + 1) * rows]
                   for k, v in self.arrays.items()}
        raise PartEnd(end)  # asked for more: the trainer stops here, its checkpoint at `end` saved

    def validation_batches(self, count, batch_size, shard_index, num_shards):
        from pmi_jax.errors import UserInputError

        stored = (0, 0) if self.validation is None else self.validation["inputs"].shape[:2]
        if count > stored[0] or batch_size != stored[1]:
            raise UserInputError(f"validation during training wants {count} batches of {batch_size}; the file holds "
                                 f"{stored[0]} of {stored[1]} (dump --eval-batches, or --set train.eval_every_steps=0)")
        rows = batch_size // num_shards
        return [{k: v[i, shard_index * rows:(shard_index + 1) * rows] for k, v in self.validation.items()}
                for i in range(count)]


# --------------------------------------------------------------------------------------
# Train, score and pack (on the accelerator)
# --------------------------------------------------------------------------------------


def open_dump(path: str) -> tuple:
    """(the npz, its info) of a `dump` file this script reads; one line for anything else."""
    import zipfile

    from pmi_jax.errors import UserInputError

    try:
        npz = np.load(path)
        info = json.loads(npz["info"].tobytes())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, AttributeError):
        raise UserInputError(f"--batches {path}: not a file `scheme_compare.py dump` wrote") from None
    if info.get("format") != FORMAT:
        raise UserInputError(f"--batches {path}: format {info.get('format')}, this script reads {FORMAT}: dump it again")
    return npz, info


def score_checkpoint(step_dir: str, held_out: dict, info: dict, args) -> list[dict]:
    """Every `--unit` perplexity of one checkpoint, computed and written as `pmi-jax eval perplexity
    --unit U` does (`pmi_jax.eval.run_eval.perplexity_of_checkpoints`, which reads the held-out text
    from the prepared corpus with TensorFlow; here it comes from the file)."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import perplexity
    from pmi_jax.formats import perplexity_result, run_dir

    config, params, metadata = checkpoints.restore_for_eval(step_dir)
    run = run_dir.run_dir_of(step_dir)
    storage.gfile.makedirs(run_dir.eval_dir(run))
    reports = []
    for unit in args.unit:
        report = perplexity.score_report(
            config, params, metadata, step_dir, held_out[unit], seq_len=info["seq_len"],
            special_ids=info["special_ids"], data_dir=info["data_dir"], split="validation", unit=unit,
            positions=args.positions, seed=args.score_seed, max_sequences=info["max_eval_sequences"],
            batch_size=args.score_batch, spacing=args.spacing)
        perplexity_result.write(run_dir.perplexity_result_path(run, "validation", metadata.step, unit), report)
        reports.append(report)
    return reports


def sequence_scores(model_config, params, config, validation_sets: dict) -> dict:
    """{scheme: (NLL sum [N], correct [N], masked tokens [N])} per validation sequence: one
    checkpoint's MLM loss (no dropout) on every scheme's validation batches, the trainer's own
    validation step (`make_validation_step`) on each sequence alone, so that `pmi_jax.intervals`
    can resample sequences.

    Issue 32: a scheme's runs scored on every scheme's masks show whether a scheme is best on its
    own masks (random_span on its spans) while last on single tokens.
    """
    import jax

    from pmi_jax.model import BertForMaskedLM, for_platform
    from pmi_jax.train import make_validation_step

    model = BertForMaskedLM(for_platform(model_config, jax.devices()[0].platform))
    one = make_validation_step(model, config)
    step = jax.jit(jax.vmap(lambda p, row: one(p, jax.tree.map(lambda x: x[None], row)), in_axes=(None, 0)))
    scores = {}
    for scheme, arrays in validation_sets.items():
        sums = [step(params, {k: v[i] for k, v in arrays.items()}) for i in range(arrays["inputs"].shape[0])]
        scores[scheme] = tuple(np.concatenate([np.asarray(jax.device_get(x), np.float64) for x in column])
                               for column in zip(*sums))
    return scores


def cross_scores(step_dir: str, config, validation_sets: dict) -> dict:
    """{scheme: {"loss", "accuracy", "tokens"}}: `sequence_scores` summed over the sequences."""
    from pmi_jax import checkpoints

    model_config, params, _ = checkpoints.restore_for_eval(step_dir)
    scores = {}
    for scheme, (loss_N, correct_N, tokens_N) in sequence_scores(model_config, params, config, validation_sets).items():
        tokens = float(tokens_N.sum())
        scores[scheme] = {"loss": loss_N.sum() / max(tokens, 1.0), "accuracy": correct_N.sum() / max(tokens, 1.0),
                          "tokens": tokens}
    return scores


def cross_score(args) -> None:
    """`pmi-jax train` runs of one corpus, each checkpoint at --step scored on every dumped scheme's
    validation batches (`dump --steps 1 --eval-batches N` of the same corpus): mean MLM loss per
    trained scheme and scored scheme, and per scored scheme every pair of trained schemes with
    the seed-aware interval of `pmi_jax.intervals` (the same masked sequences for every run)."""
    from pmi_jax import checkpoints, intervals, storage
    from pmi_jax.config import DataConfig, ExperimentConfig
    from pmi_jax.errors import UserInputError

    npz, info = open_dump(args.batches)
    if not info.get("eval_batches"):
        raise UserInputError(f"{args.batches}: a dump without validation batches: dump it again with --eval-batches "
                             "above 0")
    sets = {s: decode(npz, s + VALIDATION, info["eval_batches"], info["batch"], info["seq_len"], info["special_ids"])
            for s in info["schemes"]}
    sums, counts, seeds = {s: {} for s in sets}, {}, {}
    for run in args.runs:
        step_dir = os.path.join(checkpoints.checkpoint_dir(run), str(args.step))
        model_config, params, metadata = checkpoints.restore_for_eval(step_dir)
        if metadata.vocab_sha256 != info["vocab_sha256"]:
            raise UserInputError(f"{run}: trained on another corpus than {args.batches} ({metadata.data_dir}); "
                                 "dump the corpus the runs trained on")
        rates = {k: v for k, v in metadata.config.get("data", {}).items()
                 if k in ("mask_rate", "mask_rate_schedule", "mask_rate_end", "eval_mask_rate")}
        config = ExperimentConfig(model=model_config, data=DataConfig(seq_len=metadata.seq_len, **rates))
        for scored, (loss_N, _, tokens_N) in sequence_scores(model_config, params, config, sets).items():
            sums[scored].setdefault(metadata.scheme, []).append(loss_N)
            counts[scored] = tokens_N
        seeds.setdefault(metadata.scheme, []).append(metadata.config.get("train", {}).get("seed"))
        print(f"{run}: step {args.step} scored on " + ", ".join(sets), flush=True)
    trained = [s for s in sets if s in seeds] + [s for s in seeds if s not in sets]
    tables = {scored: intervals.compare_schemes({t: np.stack(sums[scored][t]) for t in trained}, counts[scored])
              for scored in sets}
    lines = [f"# Cross-scoring at step {args.step}", "",
             f"Runs: {len(args.runs)} ({', '.join(f'{t}: seeds {seeds[t]}' for t in trained)}). Each run's checkpoint "
             f"scored (MLM loss, no dropout, nats per masked token) on every scheme's {info['eval_batches']} "
             f"validation batches of {info['batch']} sequences from `{args.batches}` (masked as `pmi-jax train` "
             f"validates, with data seed {info['seed']}), the same masked sequences for every run. Cell: mean over the trained scheme's seeds, "
             "95% seed-aware interval (`pmi_jax.intervals`: paired bootstrap over sequences plus each scheme's "
             "seed variance, Welch). Bold: lowest in its column and separated from every other row.", "",
             "| trained \\ scored on | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    for t in trained:
        cells = []
        for scored, table in tables.items():
            v = next(v for v in table.values if v.scheme == t).interval
            cell = f"{v.estimate:.3f} [{v.low:.3f}, {v.high:.3f}]"
            cells.append(f"**{cell}**" if table.best == t else cell)
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", "Each column's own scheme minus every other trained scheme (negative: the scheme is lower on its "
              "own masks), 95% seed-aware interval, Welch degrees of freedom:", "",
              "| scored on | own − other | difference | df | separated |", "|---|---|---:|---:|---|"]
    for scored, table in tables.items():
        for d in table.differences:
            if d.first == scored:
                i = d.interval
                verdict = ("yes" if i.excludes_zero else "no") if d.seed_aware else "no (one seed: text only)"
                lines.append(f"| {scored} | {d.first} − {d.second} | {i.estimate:+.3f} [{i.low:+.3f}, {i.high:+.3f}] "
                             f"| {d.df:.1f} | {verdict} |")
    pairs = sum(t.num_pairs for t in tables.values())
    lines += ["", f"The tables make {pairs} pairwise comparisons ({len(tables)} columns of "
              f"{len(trained) * (len(trained) - 1) // 2}), each at 95% and not corrected for multiplicity.", ""]
    with storage.atomic_file(args.output) as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def _pack(workdirs: list[str], path: str) -> int:
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for workdir in workdirs:  # a state kept for the next part (--keep-newest-state) stays here
            tar.add(workdir, arcname=os.path.basename(workdir), filter=_without_states)
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    return size


def _without_states(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = member.name.split("/")
    return None if len(parts) >= 4 and parts[1] == "checkpoints" and parts[3] == "state" else member


# --------------------------------------------------------------------------------------
# A run in parts: each command trains the steps of one dump part, resuming from the last
# part's newest checkpoint kept (with its state) in --runs on the machine between commands.
# --------------------------------------------------------------------------------------


def steps_to_score(workdir: str, steps: list[int], units: list[str]) -> list[int]:
    """The checkpoint steps some `--unit` has no perplexity result for yet (earlier parts scored the rest)."""
    from pmi_jax import storage
    from pmi_jax.formats import run_dir

    return [s for s in steps if not all(storage.gfile.exists(run_dir.perplexity_result_path(workdir, "validation", s, u))
                                        for u in units)]


def drop_states_but_newest(workdir: str) -> None:
    """Every checkpoint's state deleted except the newest one's, which the next part resumes from."""
    from etils import epath

    from pmi_jax import checkpoints

    for step in checkpoints.step_directories(workdir)[:-1]:
        state = epath.Path(checkpoints.checkpoint_dir(workdir)) / str(step) / "state"
        if state.exists():
            state.rmtree()


def train_part(config, workdir: str, source: ArrayBatches, corpus, part_end: int) -> None:
    """`train.train` up to `part_end`: there the trainer has just saved its checkpoint (part_end is
    a multiple of the checkpoint interval) and asks the source for the next batch, which ends it."""
    from pmi_jax import train

    try:
        train.train(config, workdir, source, corpus)
    except PartEnd as end:
        if end.args[0] != part_end or part_end >= config.train.num_steps:
            raise


def run(args) -> None:
    import jax

    from pmi_jax import checkpoints, storage, train
    from pmi_jax.batches import CorpusInfo
    from pmi_jax.config import apply_overrides, load_config
    from pmi_jax.errors import UserInputError

    npz, info = open_dump(args.batches)
    args.unit = args.unit or [TOKEN, *info["unit_kinds"]]
    for unit in args.unit:
        if unit != TOKEN and unit not in info["unit_kinds"]:
            raise UserInputError(f"--unit {unit}: {args.batches} holds no such unit (choices: "
                                 + ", ".join([TOKEN, *info["unit_kinds"]]) + ")")
    lengths = npz["validation/lengths"]
    validation = np.split(npz["validation/ids"].astype(np.int64), np.cumsum(lengths)[:-1])
    held_out = {unit: validation if unit == TOKEN else list(zip(validation, decode_units(npz, unit, lengths)))
                for unit in args.unit}
    corpus = CorpusInfo(data_dir=info["data_dir"], seq_len=info["seq_len"], vocab_size=info["vocab_size"],
                        vocab_sha256=info["vocab_sha256"], units=tuple(info["units"]))
    first_step = info.get("start_step", 0)
    if first_step and not args.runs:
        raise UserInputError(f"{args.batches} is a part starting at step {first_step}: pass --runs, the directory "
                             "the earlier parts trained in")
    part_end = first_step + min(args.steps or info["steps"], info["steps"])  # the step this command trains to
    steps = args.total_steps or part_end  # the whole run's: its learning-rate schedule ends there
    if part_end > steps or (part_end < steps and part_end % args.eval_every):
        raise UserInputError(f"--total-steps {steps}: this part ends at step {part_end}, which must be at most the "
                             f"total and, before it, a multiple of --eval-every {args.eval_every} (the checkpoint "
                             "the next part resumes from)")
    os.makedirs(args.output, exist_ok=True)
    runs_dir = args.runs or tempfile.mkdtemp(prefix="scheme_compare_")
    summary = {"device": jax.devices()[0].device_kind, "devices": jax.device_count(), "jax": jax.__version__,
               "config": args.config, "steps": steps, "batch": info["batch"], "data_seed": info["seed"],
               "units": args.unit, "positions": args.positions, "overrides": args.set, "runs": {}}
    if args.cross_score and not info["eval_batches"]:
        raise UserInputError(f"--cross-score: {args.batches} holds no validation batches (dump --eval-batches)")
    cross_sets = {s: decode(npz, s + VALIDATION, info["eval_batches"], info["batch"], info["seq_len"],
                            info["special_ids"]) for s in info["schemes"]} if args.cross_score else {}
    for scheme in args.schemes or info["schemes"]:
        arrays = decode(npz, scheme, info["steps"], info["batch"], info["seq_len"], info["special_ids"])
        validation_arrays = (decode(npz, scheme + VALIDATION, info["eval_batches"], info["batch"], info["seq_len"],
                                    info["special_ids"]) if info["eval_batches"] else None)
        in_training = ([f"train.eval_batches={info['eval_batches']}"] if info["eval_batches"]
                       else ["train.eval_every_steps=0"])
        workdirs = []
        for seed in args.seeds:
            workdir = os.path.abspath(os.path.join(runs_dir, f"{scheme}-seed{seed}"))
            config = apply_overrides(load_config(args.config), [
                f"model.vocab_size={info['vocab_size']}", f"data.seq_len={info['seq_len']}", f"data.scheme={scheme}",
                f"data.data_dir={info['data_dir']}", f"train.batch_size={info['batch']}", f"data.seed={info['seed']}",
                f"train.seed={seed}", f"train.num_steps={steps}", f"checkpoint.every_steps={args.eval_every}",
                f"checkpoint.keep={steps // args.eval_every + 1}", *in_training, *args.set])
            started = time.time()
            train_part(config, workdir, ArrayBatches(arrays, validation_arrays, first_step), corpus, part_end)
            trained = time.time() - started
            perplexities, cross = {unit: {} for unit in args.unit}, {}
            saved = checkpoints.Checkpointer(workdir, config.checkpoint, read_only=True).all_steps()
            for step in steps_to_score(workdir, saved, args.unit)[::-1]:
                if cross_sets:
                    cross[step] = cross_scores(os.path.join(checkpoints.checkpoint_dir(workdir), str(step)), config,
                                               cross_sets)
                for r in score_checkpoint(os.path.join(checkpoints.checkpoint_dir(workdir), str(step)), held_out,
                                          info, args):
                    perplexities[r["unit"]][step] = r["perplexity"]
                    print(f"{scheme:<13} seed {seed} step {step:>6} {r['unit']:<8} perplexity {r['perplexity']:9.3f} "
                          f"({r['num_tokens']} tokens)", flush=True)
            if args.keep_newest_state:
                drop_states_but_newest(workdir)
            else:
                checkpoints.drop_states(workdir)
            workdirs.append(workdir)
            size = _pack(workdirs, os.path.join(args.output, f"{scheme}.tar.gz"))
            if size > MAX_OUTPUT_FILE:
                print(f"warning: {scheme}.tar.gz is {size / 2**20:.1f} MiB, over the 16 MiB a file may bring back "
                      "(fewer --positions or --unit kinds make it smaller)", flush=True)
            summary["runs"].setdefault(scheme, {})[str(seed)] = {
                "train_s": round(trained, 1), "score_s": round(time.time() - started - trained, 1),
                "perplexity": perplexities, **({"cross_scores": cross} if cross_sets else {})}
            summary["runs"][scheme]["packed_bytes"] = size
            with storage.atomic_file(os.path.join(args.output, "summary.json")) as f:
                f.write(json.dumps(summary, indent=2) + "\n")
            print(f"{scheme} seed {seed}: trained {steps} steps in {trained:.0f} s; {scheme}.tar.gz "
                  f"{size / 2**10:.0f} KiB", flush=True)


def _positions(value: str) -> int | None:
    return None if value == "all" else int(value)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("dump", help="write each scheme's masked batches and held-out text to one compact .npz")
    p.add_argument("--data", required=True, help="prepared corpus (pmi-jax corpus prepare)")
    p.add_argument("--schemes", nargs="+", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-step", type=int, default=0,
                   help="a dump in parts: the step this part starts at (`run` resumes from the earlier part's "
                        "newest checkpoint; see --keep-newest-state)")
    p.add_argument("--max-eval-sequences", type=int, default=400, help="held-out sequences scored by `run`")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches for the trainer's validation during training (train.eval_batches; 0: none)")
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
    p.add_argument("--seeds", type=int, nargs="+", default=[0],
                   help="train.seed of each run of a scheme (init and dropout; batches and masks are the dump's)")
    p.add_argument("--unit", nargs="+", default=None,
                   help="unit kinds scored, as for pmi-jax eval perplexity --unit (default: token, word and every "
                        "unit set in the file)")
    p.add_argument("--positions", type=_positions, default=8,
                   help="units scored per held-out sequence, drawn from --score-seed alone, or 'all'")
    p.add_argument("--score-seed", type=int, default=0, help="the seed that draws the scored units")
    p.add_argument("--score-batch", type=int, default=64, help="masked copies per scoring forward pass")
    p.add_argument("--spacing", type=int, default=0, help="as for pmi-jax eval perplexity --spacing")
    p.add_argument("--cross-score", action="store_true",
                   help="also score every checkpoint's MLM loss on every dumped scheme's validation batches "
                        "(summary.json: runs.<scheme>.<seed>.cross_scores.<step>.<scheme scored>)")
    p.add_argument("--set", action="append", default=[], help="config override, as for pmi-jax train")
    p.add_argument("--total-steps", type=int, default=None,
                   help="a dump in parts: the step the whole run ends at (train.num_steps: the learning-rate "
                        "schedule's end); default: where this file ends")
    p.add_argument("--keep-newest-state", action="store_true",
                   help="keep the newest checkpoint's state in --runs (never packed) so that the next part "
                        "of the dump resumes from it; leave it out in the last part")
    p.set_defaults(func=run)
    p = commands.add_parser("cross-score", help="score `pmi-jax train` runs on every dumped scheme's validation "
                                                "batches (issue 32: is each scheme best on its own masks?)")
    p.add_argument("runs", nargs="+", help="training --workdirs of one corpus")
    p.add_argument("--batches", required=True, help="a dump of that corpus with --eval-batches")
    p.add_argument("--step", type=int, required=True, help="the checkpoint scored in every run")
    p.add_argument("--output", required=True, help="the markdown table written")
    p.set_defaults(func=cross_score)
    args = parser.parse_args(argv)
    from pmi_jax.errors import UserInputError

    try:
        args.func(args)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
