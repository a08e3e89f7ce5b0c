"""`pmi-jax export`: hand a pretrained checkpoint to other libraries.

    pmi-jax export hf --checkpoint runs/base-pmi --output exported/base-pmi

`hf` writes a Hugging Face transformers BertForMaskedLM directory (config.json,
model.safetensors, the corpus's WordPiece tokenizer, a README.md model card) that
`AutoModelForMaskedLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load with
no other file. docs/huggingface.md lists how every parameter maps.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging

from pmi_jax.errors import UserInputError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("export", help="export a checkpoint for other libraries (Hugging Face)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    formats = parser.add_subparsers(dest="export_format", required=True, metavar="FORMAT")
    p = formats.add_parser(
        "hf", help="a transformers BertForMaskedLM directory: config, safetensors weights, tokenizer, model card",
        description="Write a directory that transformers' AutoModelForMaskedLM and AutoTokenizer load as is "
                    "(PyTorch parameter names and layouts, the corpus's own uncased WordPiece vocabulary).")
    p.add_argument("--checkpoint", required=True,
                   help="a training --workdir (its latest checkpoint, or the one --step names) or one of its "
                        "checkpoints/<step> directories (local or gs://)")
    p.add_argument("--step", type=int, default=None, help="export this step of the run (default: the latest)")
    p.add_argument("--output", required=True, help="directory to write (local or gs://); must not exist")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--vocab", default=None,
                   help="the WordPiece vocab.txt the checkpoint was trained with (default: the one in the "
                        "checkpoint's corpus directory); checked against the checkpoint's hash")
    p.add_argument("--perplexity", default=None, metavar="JSON",
                   help="a result of `pmi-jax eval perplexity --output JSON` for this checkpoint, quoted in the "
                        "model card")
    p.set_defaults(func=run_hf)


def _checkpoint_path(checkpoint: str, step: int | None) -> str:
    """The run directory, or its checkpoints/<step> directory when --step names one (which must exist)."""
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


def run_hf(args: argparse.Namespace) -> int:
    import jax

    from pmi_jax import checkpoints, huggingface, storage
    from pmi_jax.cli import quiet
    from pmi_jax.formats import hf_checkpoint, prepared_corpus, wordpiece_vocab

    inputs = [("--checkpoint", args.checkpoint), ("--vocab", args.vocab), ("--perplexity", args.perplexity)]
    storage.check_new_output(args.output, args.overwrite, directory=True, inputs=inputs)
    quiet.quiet_checkpoint_reads()
    checkpoint = _checkpoint_path(args.checkpoint, args.step)
    config, params, metadata = checkpoints.restore_for_eval(checkpoint)
    storage.check_output_apart(args.output, [("the checkpoint's corpus", metadata.data_dir)])
    vocab_size = int(metadata.vocab_size or config.vocab_size)
    _, tokens = _vocabulary(args.vocab, metadata, checkpoint, vocab_size)
    perplexity = _perplexity(args.perplexity, metadata.step)
    tensors = huggingface.to_transformers(jax.device_get(params), config, vocab_size)
    pad_id = wordpiece_vocab.special_ids(tokens)["pad"]
    corpus = _corpus_metadata(metadata.data_dir)
    corpus_tokenizer = prepared_corpus.read_tokenizer(metadata.data_dir, corpus) if corpus else None
    card = huggingface.model_card(config=config, metadata=metadata, corpus=corpus,
                                  vocab_size=vocab_size, perplexity=perplexity)
    with storage.write_errors(args.output), storage.atomic_directory(args.output, args.overwrite) as tmp:
        hf_checkpoint.write_checkpoint(tmp, huggingface.transformers_config(config, vocab_size, pad_id), tensors,
                                       tokens, config.max_position_embeddings, card, corpus_tokenizer)
    size = sum(t.nbytes for t in tensors.values())
    print(f"exported step {metadata.step} ({len(tensors)} tensors, {size / 2**20:.1f} MiB) to {args.output}")
    return 0
