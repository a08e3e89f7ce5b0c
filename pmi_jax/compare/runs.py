"""What one training run directory holds, read back for comparison.

Nothing here computes: every number was written by an earlier command into the run directory,
whose names and records `pmi_jax.formats.run_dir` owns (docs/experiments.md, "Where results live").
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

from pmi_jax import storage
from pmi_jax.errors import UserInputError
from pmi_jax.formats import perplexity_result, run_dir
from pmi_jax.formats.run_dir import EVAL_DIR, PERPLEXITY_PREFIX

# Training settings that must agree for two runs to be compared: everything that shapes what
# is learned except the masking scheme and the run's seeds (model, corpus, batch, steps,
# schedule). Runs of one scheme that differ in train.seed (parameters, dropout) or data.seed
# (masks, reading order) are that scheme's seeds.
COMPARED_SECTIONS = ("model", "optimizer")
COMPARED_FIELDS = (("data", "data_dir"), ("data", "seq_len"), ("data", "split"),
                   ("data", "mask_rate"), ("data", "mask_rate_schedule"), ("data", "mask_rate_end"),
                   ("data", "eval_mask_rate"), ("train", "batch_size"), ("train", "num_steps"))
# What runs saved before a field existed trained with (the masking rate was always 15%).
FIELD_DEFAULTS = {("data", "mask_rate"): 0.15, ("data", "mask_rate_schedule"): "constant",
                  ("data", "mask_rate_end"): 0.15, ("data", "eval_mask_rate"): 0.15}


@dataclasses.dataclass
class Run:
    path: str
    name: str
    scheme: str
    config: dict  # the ExperimentConfig as saved with the run's latest checkpoint
    last_step: int
    training: dict[int, dict]  # step -> scalars logged at that step (the last write wins)
    perplexity: dict[tuple[str, str], dict[int, dict]]  # (split, unit) -> step -> `eval perplexity` result
    finetune: dict[tuple[str, str], dict[int, dict]]  # (task, protocol) -> step -> `eval finetune` result
    changes: tuple = ()  # settings changed on resuming (`train --allow-changed`), as the metadata records them

    @property
    def train_seed(self):
        return self.config.get("train", {}).get("seed")

    @property
    def seeds(self) -> tuple:
        """(train.seed, data.seed): two runs of one scheme are two seeds when either differs."""
        return self.train_seed, self.config.get("data", {}).get("seed")

    def settings(self) -> dict[str, object]:
        """The compared settings, flattened to dotted names."""
        out = {}
        for section in COMPARED_SECTIONS:
            for key, value in sorted(self.config.get(section, {}).items()):
                out[f"{section}.{key}"] = value
        for section, key in COMPARED_FIELDS:
            out[f"{section}.{key}"] = self.config.get(section, {}).get(key, FIELD_DEFAULTS.get((section, key)))
        return out

    def mask_rate(self) -> str:
        """The training masking rate as the run table shows it: '0.15', or '0.3 → 0.15 linear'."""
        settings = self.settings()
        start, schedule = settings["data.mask_rate"], settings["data.mask_rate_schedule"]
        if schedule == "constant":
            return f"{start:g}"
        return f"{start:g} → {settings['data.mask_rate_end']:g} {schedule}"


def _read_json(path: str):
    try:
        with storage.gfile.GFile(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserInputError(f"{path}: not JSON ({e})") from None


def _latest_metadata(path: str) -> tuple[int, run_dir.CheckpointMetadata]:
    from pmi_jax import checkpoints
    from pmi_jax.config import CheckpointConfig

    if not storage.gfile.isdir(checkpoints.checkpoint_dir(path)):
        raise UserInputError(f"{path}: no checkpoints/ directory: not a pmi-jax training run")
    checkpointer = checkpoints.Checkpointer(path, CheckpointConfig(), read_only=True)
    skipped = []
    try:
        for step in checkpointer.all_steps():  # newest first; a damaged newest one falls back
            try:
                metadata = checkpointer.metadata(step)
            except Exception as e:  # noqa: BLE001 - any damage: try the next older checkpoint
                skipped.append(f"step {step}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                continue
            if skipped:
                logging.warning("%s: skipped the metadata of checkpoint %s; using step %d", path,
                                "; ".join(skipped), step)
            return step, metadata
    finally:
        checkpointer.close()
    if skipped:
        raise UserInputError(f"{path}: no checkpoint's metadata reads ({'; '.join(skipped)})")
    raise UserInputError(f"{path}: holds no complete checkpoint")


def read_run(path: str) -> Run:
    path = path.rstrip("/")
    if not storage.gfile.isdir(path):
        raise UserInputError(f"{path}: no such run directory")
    step, metadata = _latest_metadata(path)
    run = Run(path, os.path.basename(path), metadata.run_scheme, metadata.config, step,
              run_dir.read_metrics_file(run_dir.metrics_path(path)), {}, {}, metadata.changes)
    eval_dir = storage.join(path, EVAL_DIR)
    if not storage.gfile.isdir(eval_dir):
        return run
    for name in sorted(n.rstrip("/") for n in storage.gfile.listdir(eval_dir)):
        entry = storage.join(eval_dir, name)
        if name.startswith(PERPLEXITY_PREFIX) and name.endswith(".json"):
            result = perplexity_result.read(entry)
            run.perplexity.setdefault((result["split"], result["unit"]), {})[int(result["step"])] = result
        elif storage.gfile.exists(storage.join(entry, run_dir.FINETUNE_RESULTS)):
            result = read_finetune_result(entry, released=False)
            run.finetune.setdefault((result["task"], result["protocol"]["protocol"]), {})[int(result["step"])] = result
    return run


def read_finetune_result(directory: str, released: bool) -> dict:
    """DIRECTORY/results.json of `eval finetune`, checked: of a run's checkpoint (with its step),
    or, `released`, of a released model (`--hf-model`, no step)."""
    path = storage.join(directory, run_dir.FINETUNE_RESULTS)
    if not storage.gfile.exists(path):
        raise UserInputError(f"{directory}: no results.json (not an `eval finetune` output directory)")
    result = _read_json(path)
    try:
        result["task"], result["protocol"]["protocol"], result["best"]["aggregate"]["score"]
        if released and not result["hf_model"]:
            raise ValueError
        if not released:
            int(result["step"])
    except (KeyError, TypeError, ValueError):
        needs = "task, hf_model, protocol and best.aggregate" if released else "task, step, protocol and best.aggregate"
        what = "`eval finetune --hf-model` result" if released else "`eval finetune` result of this version"
        raise UserInputError(f"{path}: not an {what} (needs {needs})") from None
    return result


def mismatches(runs: list[Run]) -> list[str]:
    """One line per setting on which some run differs from the first (its scheme aside)."""
    reference = runs[0].settings()
    lines = []
    for run in runs[1:]:
        settings = run.settings()
        for key in sorted(set(reference) | set(settings)):
            if reference.get(key) != settings.get(key):
                lines.append(f"{run.name} ({run.scheme}): {key} = {settings.get(key)!r}, but "
                             f"{runs[0].name} ({runs[0].scheme}) has {reference.get(key)!r}")
    for run in runs:  # a run that changed a setting midway is not one setting throughout
        for change in run.changes:
            lines.append(f"{run.name} ({run.scheme}): {change['setting']} changed from {change['from']!r} to "
                         f"{change['to']!r} at step {change['step']} (resumed with --allow-changed)")
    pairs = [(r.scheme, r.seeds) for r in runs]
    for scheme, seed in sorted({p for p in pairs if pairs.count(p) > 1}, key=str):
        lines.append(f"scheme {scheme} with seed {seed} appears in {pairs.count((scheme, seed))} runs: "
                     + ", ".join(r.name for r in runs if (r.scheme, r.seeds) == (scheme, seed)))
    return lines
