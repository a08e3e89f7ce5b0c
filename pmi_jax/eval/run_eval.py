"""Evaluating a training run's checkpoints, one after another: what `pmi-jax eval` calls.

Each function yields one result per checkpoint as it is written (under RUN/eval/, names from
`pmi_jax.formats.run_dir`), so a caller can report progress; no argparse here, so Python code
evaluates a run the same way the command does.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Callable, Iterator, Sequence

from pmi_jax.errors import UserInputError
from pmi_jax.formats import run_dir


def checkpoint_paths(checkpoint: str, steps: Sequence[int] | str | None, option: str = "--steps") -> list[str]:
    """The checkpoint directories `checkpoint` and `steps` name, in step order.

    `steps`: None (just `checkpoint`: a workdir, i.e. its latest checkpoint, or one
    checkpoints/<step> directory), "all", or a list of steps that must exist.
    """
    from pmi_jax import checkpoints, storage

    if steps is None:
        return [checkpoint]
    run = run_dir.run_dir_of(checkpoint)
    folder = checkpoints.checkpoint_dir(run)
    available = checkpoints.step_directories(run)
    if not available:
        raise UserInputError(f"--checkpoint {checkpoint}: no checkpoints/<step> directories in {run}")
    if steps == "all":
        chosen = available
    else:
        chosen = list(steps)
        missing = [str(n) for n in chosen if n not in available]
        if missing:
            raise UserInputError(f"{option} {','.join(map(str, chosen))}: no checkpoint at step {', '.join(missing)} "
                                 f"in {run} (steps there: {', '.join(map(str, available))})")
    return [storage.join(folder, str(n)) for n in sorted(set(chosen))]


@dataclasses.dataclass(frozen=True)
class PerplexityRequest:
    """What `pmi-jax eval perplexity` asks for (its flags, parsed)."""

    data: str | None = None  # default: the corpus the checkpoint was trained on
    split: str = "validation"
    units: tuple[str, ...] = ("token",)  # token, word or a unit set of the corpus; one result each
    positions: int | None = None  # None: every unit
    seed: int = 0
    max_sequences: int | None = None
    batch_size: int = 64
    spacing: int = 0  # 0: one unit per masked copy; K: every K-th unit masked together
    skip_existing: bool = False  # keep a result already scored with these settings
    output: str | None = None  # one more copy of the result (one checkpoint and unit only)

    def settings(self, unit: str) -> dict:
        """The recorded settings that decide which tokens were scored, and how."""
        return {"split": self.split, "unit": unit, "seed": self.seed,
                "positions": "all" if self.positions is None else self.positions, "spacing": self.spacing,
                "max_sequences": self.max_sequences}


def existing_perplexity(path: str, request: PerplexityRequest, unit: str) -> str | None:
    """The RUN/eval result of this checkpoint and unit if it holds per-token scores and was scored
    with the request's settings (a checkpoints/<step> directory's name is its step)."""
    from pmi_jax import storage
    from pmi_jax.formats import perplexity_result

    step = path.rstrip("/").rsplit("/", 1)[-1]
    if not step.isdigit():
        return None  # a run directory: its latest step is known only after restoring
    target = run_dir.perplexity_result_path(run_dir.run_dir_of(path), request.split, int(step), unit)
    if not storage.gfile.exists(target):
        return None
    try:
        found = perplexity_result.read(target)
    except UserInputError:
        return None
    found.setdefault("spacing", 0)
    same = all(found.get(k) == v for k, v in request.settings(unit).items())
    return target if same and found.get("scores") is not None else None


def perplexity_of_checkpoints(paths: list[str], request: PerplexityRequest) -> Iterator[dict]:
    """Perplexity of each checkpoint with each unit kind, all kinds of a checkpoint in one pass;
    yields each report once written, or {"skipped": path of the result} where `skip_existing`
    found it done."""
    from pmi_jax import storage
    from pmi_jax.formats import perplexity_result

    if request.output and (len(paths) > 1 or len(request.units) > 1):
        raise UserInputError("--output names one file: use it with one checkpoint (without --steps, or one step) "
                             "and one --unit")
    for run in sorted({run_dir.run_dir_of(path) for path in paths}):  # the result is always filed there
        folder = run_dir.eval_dir(run)
        storage.check_writable_directory(folder, f"--checkpoint {run}: its results folder")
    for path in paths:
        done = {unit: existing_perplexity(path, request, unit) if request.skip_existing else None
                for unit in request.units}
        todo = tuple(unit for unit in request.units if not done[unit])
        reports = dict(zip(todo, _scored(path, request, todo) if todo else []))
        for unit in request.units:
            if done[unit]:
                yield {"skipped": done[unit]}
                continue
            report = reports[unit]
            run = run_dir.run_dir_of(path)
            storage.gfile.makedirs(run_dir.eval_dir(run))
            for target in [run_dir.perplexity_result_path(run, request.split, report["step"], unit),
                           *([request.output] if request.output else [])]:
                with storage.write_errors(target):
                    perplexity_result.write(target, report)
            yield report


def _scored(path: str, request: PerplexityRequest, units: tuple[str, ...]) -> list[dict]:
    from pmi_jax.eval import perplexity

    return perplexity.evaluate_checkpoint(path, data_dir=request.data, split=request.split, units=units,
                                          positions=request.positions, seed=request.seed,
                                          max_sequences=request.max_sequences, batch_size=request.batch_size,
                                          spacing=request.spacing)


@dataclasses.dataclass(frozen=True)
class FinetuneRequest:
    """What `pmi-jax eval finetune` asks for (its flags, parsed); `settings` is the protocol's
    FinetuneConfig after the flags and --set."""

    task: object  # a task of pmi_jax.eval.finetune.get_task
    settings: object  # FinetuneConfig
    read_examples: Callable[[str], list]  # split ("train" | "dev") -> examples
    data_label: str  # recorded in the result: the --data folder or tfds:NAME
    test_data: str | None = None
    vocab: str | None = None
    output: str | None = None
    overwrite: bool = False
    inputs: tuple = ()  # (option, path) of what the command reads: no output may hold one (storage)
    hf_model: str | None = None  # the one path is a released transformers BERT (`--hf-model`), not a run's


def finetune_output(request: FinetuneRequest, path: str, step, many: bool) -> str:
    """--output (one folder per step under it when there are several), else RUN/eval/..."""
    from pmi_jax import storage

    if request.output:
        return storage.join(request.output, f"step{step}") if many else request.output
    if request.hf_model:
        raise UserInputError("--hf-model: pass --output (a released model has no run directory to write into)")
    return run_dir.finetune_result_dir(run_dir.run_dir_of(path), request.task.name, request.settings.protocol, step)


def finetune_checkpoints(paths: list[str], request: FinetuneRequest) -> Iterator[tuple[dict, str]]:
    """Run the protocol on each checkpoint; yields (result, output directory) once written."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import finetune

    task, settings, many = request.task, request.settings, len(paths) > 1
    if many:  # every output checked before hours of fine-tuning, not after
        for path in paths:
            run_dir.check_new_output(finetune_output(request, path, os.path.basename(path), many), request.overwrite,
                                     directory=True, inputs=request.inputs)
    encoded, examples, wordpiece, max_seq_len = {}, {}, None, None
    for path in paths:
        if request.hf_model:
            config, params, metadata, vocab = _released_model(path, request.vocab)
        else:
            config, params, metadata = checkpoints.restore_for_eval(path)
            vocab = run_dir.vocabulary_for(metadata, path, config.vocab_size, vocab=request.vocab)
        step = metadata.step
        output = finetune_output(request, path, step, many)
        run_dir.check_new_output(output, request.overwrite, directory=True,
                                 inputs=[*request.inputs, ("the checkpoint's corpus", metadata.data_dir)])
        if wordpiece is None:  # every checkpoint of a run shares its vocabulary: encode once
            wordpiece = _text_vocabulary(path, metadata, vocab, request)
            max_seq_len = settings.max_seq_len or min(task.max_seq_len, config.max_position_embeddings)
            if max_seq_len > config.max_position_embeddings:
                raise UserInputError(f"--max-seq-len {max_seq_len}: the model takes at most "
                                     f"{config.max_position_embeddings} tokens")
            for split in ("train", "dev", "test"):
                if split == "test":
                    if not request.test_data:
                        continue
                    examples[split] = task.read(request.test_data, "test")
                else:
                    examples[split] = request.read_examples(split)
                encoded[split] = task.encode(examples[split], wordpiece, max_seq_len)
                logging.info("%s %s: %d examples, %d model inputs", task.name, split, len(examples[split]),
                             len(encoded[split].arrays["input_ids"]))

        result = finetune.evaluate_checkpoint(task, config, params["encoder"], encoded["train"], encoded["dev"],
                                              dataclasses.replace(settings, max_seq_len=max_seq_len),
                                              encoded.get("test"))
        result.update({"checkpoint": path, "step": step, "scheme": metadata.scheme,
                       **({"hf_model": path} if request.hf_model else {}),
                       "data": request.data_label, "test_data": request.test_data, "max_seq_len": max_seq_len})
        test_outputs = result.pop("test_outputs", None)
        title = (f"{task.name} fine-tuning of the released model {path}" if request.hf_model else
                 f"{task.name} fine-tuning of {path} (step {step}, scheme {metadata.scheme})")
        with storage.write_errors(output), storage.atomic_directory(output, overwrite=request.overwrite) as tmp:
            if test_outputs is not None:
                written = task.write_predictions(test_outputs, encoded["test"], examples["test"], tmp)
                result["test_predictions"] = [storage.join(output, os.path.basename(w)) for w in written]
            with storage.gfile.GFile(storage.join(tmp, run_dir.FINETUNE_RESULTS), "w") as f:
                f.write(json.dumps(result, indent=2) + "\n")
            with storage.gfile.GFile(storage.join(tmp, "results.md"), "w") as f:
                f.write(finetune.markdown_report(result, title))
        yield result, output


def _text_vocabulary(path: str, metadata, vocab: str, request: FinetuneRequest):
    """What encodes the task text: the model's own tokenizer (its corpus's tokenizer.json where it
    was prepared with `--tokenizer`, a released model's own where it is not uncased BERT), else
    BERT's uncased WordPiece over vocab.txt."""
    from pmi_jax import vocabularies
    from pmi_jax.formats import hf_checkpoint, prepared_corpus

    if request.hf_model:
        text = hf_checkpoint.own_tokenizer(path)
        source = f"--hf-model {path}: its {hf_checkpoint.TOKENIZER_FILE}"
    else:
        text = run_dir.corpus_tokenizer_for(metadata)
        source = f"{prepared_corpus.tokenizer_path(metadata.data_dir or '')}"
    return vocabularies.model_vocabulary(vocab, text, source)


def _released_model(directory: str, vocab: str | None):
    """(config, params, metadata, vocab.txt) of a released transformers BERT, as a checkpoint's
    would be: no step, no scheme; its own vocab.txt unless --vocab names the same file."""
    from pmi_jax import huggingface, storage
    from pmi_jax.formats import wordpiece_vocab

    config, params, own_vocab = huggingface.released_encoder(directory)
    metadata = run_dir.CheckpointMetadata(step=None, vocab_sha256=storage.file_sha256(own_vocab),
                                          vocab_size=config.vocab_size)
    if vocab:
        wordpiece_vocab.check_matches_checkpoint(f"--vocab {vocab}", sha256=storage.file_sha256(vocab),
                                                 size=len(wordpiece_vocab.read_vocab(vocab)),
                                                 expected_sha256=metadata.vocab_sha256, vocab_size=config.vocab_size,
                                                 checkpoint=directory)
    return config, params, metadata, vocab or own_vocab
