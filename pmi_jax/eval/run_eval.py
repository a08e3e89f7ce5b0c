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
    positions: int | None = None  # None: every non-special token
    positions_text: str = "all"  # as given, recorded in the result
    seed: int = 0
    max_sequences: int | None = None
    batch_size: int = 64
    output: str | None = None  # one more copy of the result (one checkpoint only)


def perplexity_of_checkpoints(paths: list[str], request: PerplexityRequest) -> Iterator[dict]:
    """Single-token perplexity of each checkpoint; yields each report once written."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import perplexity
    from pmi_jax.model import BertForMaskedLM

    if request.output and len(paths) > 1:
        raise UserInputError("--output names one file: use it with one checkpoint (without --steps, or one step)")
    for run in sorted({run_dir.run_dir_of(path) for path in paths}):  # the result is always filed there
        folder = run_dir.eval_dir(run)
        storage.check_writable_directory(folder, f"--checkpoint {run}: its results folder {folder}")
    for path in paths:
        config, params, metadata = checkpoints.restore_for_eval(path)
        data_dir = request.data or metadata.data_dir
        if not data_dir:
            raise UserInputError(f"checkpoint {path} records no corpus; pass --data")
        corpus = perplexity.open_corpus_for(data_dir, config, metadata, path)
        seq_len, special = corpus.seq_len, corpus.special_ids
        result = perplexity.single_token_perplexity(
            BertForMaskedLM(config), params, perplexity.read_sequences(data_dir, request.split, request.max_sequences),
            seq_len=seq_len, special_ids=list(special.values()), mask_id=special["mask"], pad_id=special["pad"],
            positions=request.positions, seed=request.seed, batch_size=request.batch_size)
        report = {"checkpoint": path, "step": metadata.step, "scheme": metadata.scheme,
                  "data": data_dir, "split": request.split, "positions": request.positions_text, "seed": request.seed,
                  "max_sequences": request.max_sequences, "perplexity": result.perplexity,
                  "mean_nll": result.mean_nll, "num_tokens": result.num_tokens, "num_sequences": result.num_sequences}
        text = json.dumps(report, indent=2) + "\n"
        run = run_dir.run_dir_of(path)
        storage.gfile.makedirs(run_dir.eval_dir(run))
        for target in [run_dir.perplexity_result_path(run, request.split, metadata.step),
                       *([request.output] if request.output else [])]:
            with storage.write_errors(target), storage.atomic_file(target) as f:
                f.write(text)
        yield report


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


def finetune_output(request: FinetuneRequest, path: str, step, many: bool) -> str:
    """--output (one folder per step under it when there are several), else RUN/eval/..."""
    from pmi_jax import storage

    if request.output:
        return storage.join(request.output, f"step{step}") if many else request.output
    return run_dir.finetune_result_dir(run_dir.run_dir_of(path), request.task.name, request.settings.protocol, step)


def finetune_checkpoints(paths: list[str], request: FinetuneRequest) -> Iterator[tuple[dict, str]]:
    """Run the protocol on each checkpoint; yields (result, output directory) once written."""
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import finetune
    from pmi_jax.vocabularies import WordPieceVocabulary

    task, settings, many = request.task, request.settings, len(paths) > 1
    if many:  # every output checked before hours of fine-tuning, not after
        for path in paths:
            storage.check_new_output(finetune_output(request, path, os.path.basename(path), many), request.overwrite,
                                     directory=True, inputs=request.inputs)
    encoded, examples, wordpiece, max_seq_len = {}, {}, None, None
    for path in paths:
        config, params, metadata = checkpoints.restore_for_eval(path)
        step = metadata.step
        output = finetune_output(request, path, step, many)
        storage.check_new_output(output, request.overwrite, directory=True,
                                 inputs=[*request.inputs, ("the checkpoint's corpus", metadata.data_dir)])
        vocab = run_dir.vocabulary_for(metadata, path, config.vocab_size, vocab=request.vocab)
        if wordpiece is None:  # every checkpoint of a run shares its vocabulary: encode once
            wordpiece = WordPieceVocabulary(vocab)
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
                       "data": request.data_label, "test_data": request.test_data, "max_seq_len": max_seq_len})
        test_outputs = result.pop("test_outputs", None)
        title = f"{task.name} fine-tuning of {path} (step {step}, scheme {metadata.scheme})"
        with storage.write_errors(output), storage.atomic_directory(output, overwrite=request.overwrite) as tmp:
            if test_outputs is not None:
                written = task.write_predictions(test_outputs, encoded["test"], examples["test"], tmp)
                result["test_predictions"] = [storage.join(output, os.path.basename(w)) for w in written]
            with storage.gfile.GFile(storage.join(tmp, run_dir.FINETUNE_RESULTS), "w") as f:
                f.write(json.dumps(result, indent=2) + "\n")
            with storage.gfile.GFile(storage.join(tmp, "results.md"), "w") as f:
                f.write(finetune.markdown_report(result, title))
        yield result, output
