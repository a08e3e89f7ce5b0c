"""`pmi-jax export hf` as one library call: a checkpoint of a run as a transformers BertForMaskedLM directory.

Which checkpoint, its own vocabulary (hash-checked), its corpus's tokenizer and a model card;
the parameter mapping is `pmi_jax.huggingface`, the files `pmi_jax.formats.hf_checkpoint`.
"""
from __future__ import annotations

import dataclasses
import logging

from pmi_jax.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class Exported:
    step: int
    tensors: int
    mebibytes: float


def checkpoint_path(checkpoint: str, step: int | None) -> str:
    """The run directory, or its checkpoints/<step> directory when `step` names one (which must exist)."""
    from pmi_jax import checkpoints, storage

    if step is None:
        return checkpoint
    root = checkpoints.checkpoint_dir(checkpoint)
    if not storage.gfile.isdir(root):
        raise UserInputError(f"--checkpoint {checkpoint}: no {checkpoints.CHECKPOINT_DIR}/ directory: not a "
                             "pmi-jax training workdir")
    steps = checkpoints.step_directories(checkpoint)
    if step not in steps:
        raise UserInputError(f"--step {step}: {checkpoint} has no checkpoint at that step "
                             f"(steps: {', '.join(map(str, steps)) or 'none'})")
    return storage.join(root, str(step))


def _vocabulary(vocab: str | None, metadata, checkpoint: str, vocab_size: int) -> tuple[str, list[str]]:
    """The checkpoint's own vocab.txt and its tokens (run_dir.vocabulary_for checks the hash)."""
    from pmi_jax.formats import run_dir, wordpiece_vocab

    if not vocab and not metadata.vocab_sha256:  # synthetic batches: no corpus vocabulary to export
        metadata = dataclasses.replace(metadata, data_dir=None)
    path = run_dir.vocabulary_for(metadata, checkpoint, vocab_size, vocab=vocab, flag="--vocab VOCAB_TXT")
    tokens = wordpiece_vocab.read_vocab(path)
    wordpiece_vocab.special_ids(tokens, f"--vocab {path}" if vocab else path)
    return path, tokens


def _corpus_metadata(data_dir: str | None) -> dict | None:
    """The prepared corpus's metadata for the model card, or None where the corpus is not reachable."""
    from pmi_jax.formats import prepared_corpus

    if not data_dir:
        return None
    try:
        return prepared_corpus.read_metadata(data_dir)
    except UserInputError as e:
        logging.warning("model card without corpus details: %s", e)
        return None


def _perplexity(path: str | None, step) -> dict | None:
    from pmi_jax.formats import perplexity_result

    if path is None:
        return None
    result = perplexity_result.read(path, "--perplexity")
    if result.get("step") != step:
        raise UserInputError(f"--perplexity {path}: evaluates step {result.get('step')}, the export is step {step}")
    return result


def export_hf(checkpoint: str, output: str, *, step: int | None = None, vocab: str | None = None,
              perplexity: str | None = None, overwrite: bool = False) -> Exported:
    """Write `output` (whole, then renamed) from the run or checkpoint directory `checkpoint`."""
    import jax

    from pmi_jax import checkpoints, huggingface, storage
    from pmi_jax.formats import hf_checkpoint, prepared_corpus, run_dir, wordpiece_vocab

    inputs = [("--checkpoint", checkpoint), ("--vocab", vocab), ("--perplexity", perplexity)]
    run_dir.check_new_output(output, overwrite, directory=True, inputs=inputs)
    path = checkpoint_path(checkpoint, step)
    config, params, metadata = checkpoints.restore_for_eval(path)
    run_dir.check_output_apart(output, [("the checkpoint's corpus", metadata.data_dir)])
    vocab_size = int(metadata.vocab_size or config.vocab_size)
    _, tokens = _vocabulary(vocab, metadata, path, vocab_size)
    quoted = _perplexity(perplexity, metadata.step)
    tensors = huggingface.to_transformers(jax.device_get(params), config, vocab_size)
    pad_id = wordpiece_vocab.special_ids(tokens)["pad"]
    corpus = _corpus_metadata(metadata.data_dir)
    corpus_tokenizer = prepared_corpus.read_tokenizer(metadata.data_dir, corpus) if corpus else None
    card = huggingface.model_card(config=config, metadata=metadata, corpus=corpus,
                                  vocab_size=vocab_size, perplexity=quoted)
    weights = sum(t.nbytes for t in tensors.values())  # what a full disk's message says the export needs
    with storage.write_errors(output), storage.needs_space(weights), storage.atomic_directory(output, overwrite) as tmp:
        hf_checkpoint.write_checkpoint(tmp, huggingface.transformers_config(config, vocab_size, pad_id), tensors,
                                       tokens, config.max_position_embeddings, card, corpus_tokenizer)
    return Exported(metadata.step, len(tensors), weights / 2**20)
