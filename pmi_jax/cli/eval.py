"""`pmi-jax eval`: score a pretrained checkpoint.

    pmi-jax eval perplexity --checkpoint runs/tiny-pmi
    pmi-jax eval finetune --checkpoint runs/tiny-pmi --task glue/rte --data glue_data/RTE

`perplexity` masks one held-out token at a time (no other corruption) and reports
exp(mean negative log-likelihood); `finetune` runs the paper's protocol on one task: every
batch size × learning rate, several seeds each, best dev epoch per run, median over seeds,
best median reported, written to results.json and results.md.
"""
from __future__ import annotations

import argparse
import json
import logging

from pmi_jax.errors import UserInputError

_TASK_NAMES = ("glue/cola, glue/sst2, glue/mrpc, glue/stsb, glue/qqp, glue/mnli, glue/qnli, glue/rte, glue/wnli, "
               "squad/v2.0, race, race/high, race/middle")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: single-token perplexity, fine-tuning",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="eval_command", required=True, metavar="EVALUATION")
    _add_perplexity(commands)
    _add_finetune(commands)


def _add_checkpoint(p) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="a training --workdir (its latest checkpoint) or one of its checkpoints/<step> directories "
                        "(local or gs://)")


def _add_perplexity(commands) -> None:
    p = commands.add_parser(
        "perplexity", help="single-token perplexity on held-out sequences",
        description="For each chosen non-special token of the held-out sequences, mask that token alone and score "
                    "it; report exp(mean negative log-likelihood) and the number of tokens scored.")
    _add_checkpoint(p)
    p.add_argument("--data", default=None,
                   help="prepared corpus directory (default: the one the checkpoint was trained on); its vocab.txt "
                        "must be the checkpoint's")
    p.add_argument("--split", default="validation", help="which split's TFRecords to score (default: validation)")
    p.add_argument("--positions", default="all",
                   help="'all' scores every non-special token; a number N scores a random sample of N tokens per "
                        "sequence (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the position sample (default: 0)")
    p.add_argument("--max-sequences", type=int, default=None, help="score only the first N sequences")
    p.add_argument("--batch-size", type=int, default=64,
                   help="masked copies per forward pass (default: 64); changes speed, not the result")
    p.add_argument("--output", default=None, help="also write the result to this JSON file (written whole under a "
                   "temporary name, then renamed; its directory must exist)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.set_defaults(func=run_perplexity)


def _add_finetune(commands) -> None:
    p = commands.add_parser(
        "finetune", help="fine-tune on a GLUE task, SQuAD 2.0 or RACE with the paper's protocol",
        description="Fine-tune the pretrained encoder with a task head for every batch size x learning rate, "
                    "several seeds each; each run keeps its best dev epoch, a configuration scores the median over "
                    "its seeds, and the best median is reported. Writes results.json and results.md.")
    _add_checkpoint(p)
    p.add_argument("--task", required=True, help=f"one of: {_TASK_NAMES}")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="the task's data in its distributed format: a GLUE task folder "
                                       "(train.tsv, dev.tsv), a folder with SQuAD's train-v2.0.json and "
                                       "dev-v2.0.json, or the RACE folder (train/, dev/ with high/ and middle/)")
    source.add_argument("--tfds", metavar="NAME",
                        help="read the task from TensorFlow Datasets instead (already downloaded and prepared: "
                             "nothing is downloaded), e.g. glue/rte, squad/v2.0, race/high; for RACE the --task "
                             "decides which levels are read")
    p.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir (default: TFDS's own)")
    p.add_argument("--vocab", default=None,
                   help="the WordPiece vocab.txt the checkpoint was trained with (default: the one in the "
                        "checkpoint's corpus directory); checked against the checkpoint's hash")
    p.add_argument("--batch-sizes", default="16,32", help="comma-separated grid (default: 16,32)")
    p.add_argument("--learning-rates", default="1e-5,2e-5,3e-5,5e-5",
                   help="comma-separated grid (default: 1e-5,2e-5,3e-5,5e-5)")
    p.add_argument("--seeds", type=int, default=5, help="runs per configuration, seeds 0..N-1 (default: 5)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per run (default: the paper's: 3; 10 for RTE and STS-B; 4 for SQuAD and RACE)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="tokens per input (default: 128 for GLUE, 384 for SQuAD, 512 for RACE, capped at the "
                        "model's max_position_embeddings)")
    p.add_argument("--eval-batch-size", type=int, default=64, help="examples per dev forward pass (default: 64)")
    p.add_argument("--doc-stride", type=int, default=128, help="SQuAD: tokens between window starts (default: 128)")
    p.add_argument("--max-query-len", type=int, default=64, help="SQuAD: question tokens kept (default: 64)")
    p.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                   help="SQuAD: answer \"\" when the null score beats the best span by more than this (default: 0)")
    p.add_argument("--output", default=None,
                   help="directory for results.json and results.md, written together under a temporary name "
                        "and renamed (default: WORKDIR/eval/<task>-step<step> of the checkpoint's training "
                        "workdir)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=run_finetune)


def _parse_list(text: str, kind, option: str) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(v <= 0 for v in values):
        raise UserInputError(f"{option} {text!r}: expected positive numbers")
    return values


def _parse_positions(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise UserInputError(f"--positions {text!r}: expected 'all' or a positive number of tokens per sequence")
    return int(text)


def _quiet_checkpoint_logs() -> None:
    """Orbax narrates every read-only restore through absl (INFO and WARNING); keep our output readable."""
    logging.getLogger("absl").setLevel(logging.ERROR)


def _positive(value, option: str) -> None:
    if value is not None and value <= 0:
        raise UserInputError(f"{option} {value}: must be positive")


def _read_examples(task, args: argparse.Namespace, split: str) -> list:
    if args.data:
        return task.read(args.data, split)
    try:
        return task.read_tfds(args.tfds, split, args.tfds_data_dir)
    except (ValueError, AssertionError) as e:  # TFDS: no such dataset, or not downloaded and prepared
        raise UserInputError(f"--tfds {args.tfds}: {str(e).splitlines()[0]}") from None


def _absolute_paths(args: argparse.Namespace) -> None:
    """Resolve the local paths against the directory the command runs in (paths.absolute)."""
    from pmi_jax import paths

    for name in ("checkpoint", "data", "output", "vocab", "tfds_data_dir"):
        if getattr(args, name, None):
            setattr(args, name, paths.absolute(getattr(args, name)))


def _check_output(path: str, overwrite: bool, *, directory: bool = False) -> None:
    from pmi_jax import paths, storage

    storage.check_new_output(path, overwrite)
    paths.check_output_location(path, directory=directory)


def _run_dir(checkpoint: str) -> str:
    """The training workdir of a workdir or of one of its checkpoints/<step> directories."""
    parts = checkpoint.rstrip("/").rsplit("/", 2)
    if len(parts) == 3 and parts[1] == "checkpoints" and parts[2].isdigit():
        return parts[0]
    return checkpoint.rstrip("/")


def run_perplexity(args: argparse.Namespace) -> int:
    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import perplexity
    from pmi_jax.storage import file_sha256
    from pmi_jax.model import BertForMaskedLM
    from pmi_jax.formats import prepared_corpus

    positions = None if args.positions == "all" else _parse_positions(args.positions)
    _positive(args.batch_size, "--batch-size")
    _positive(args.max_sequences, "--max-sequences")
    _absolute_paths(args)
    if args.output:
        _check_output(args.output, args.overwrite)
    _quiet_checkpoint_logs()
    config, params, metadata = checkpoints.restore_for_eval(args.checkpoint)
    data_dir = args.data or metadata.get("data_dir")
    if not data_dir:
        raise UserInputError(f"checkpoint {args.checkpoint} records no corpus; pass --data")
    corpus = prepared_corpus.read_metadata(data_dir)
    vocab = prepared_corpus.vocab_path(data_dir)
    if metadata.get("vocab_sha256") and file_sha256(vocab) != metadata["vocab_sha256"]:
        raise UserInputError(f"--data {data_dir}: its vocab.txt is not the vocabulary checkpoint {args.checkpoint} "
                             "was trained with (sha256 differs)")
    with storage.gfile.GFile(vocab, "rb") as f:
        vocab_size = len(f.read().decode("utf-8").splitlines())
    if vocab_size != config.vocab_size:
        raise UserInputError(f"--data {data_dir}: vocab.txt has {vocab_size} tokens, checkpoint {args.checkpoint} "
                             f"has vocab_size {config.vocab_size}")
    seq_len = int(corpus["seq_len"])
    if seq_len > config.max_position_embeddings:
        raise UserInputError(f"--data {data_dir}: sequences of {seq_len} tokens, the model takes at most "
                             f"{config.max_position_embeddings}")
    special = corpus["special_ids"]
    result = perplexity.single_token_perplexity(
        BertForMaskedLM(config), params, perplexity.read_sequences(data_dir, args.split, args.max_sequences),
        seq_len=seq_len, special_ids=list(special.values()), mask_id=special["mask"], pad_id=special["pad"],
        positions=positions, seed=args.seed, batch_size=args.batch_size)
    report = {"checkpoint": args.checkpoint, "step": metadata.get("step"), "scheme": metadata.get("scheme"),
              "data": data_dir, "split": args.split, "positions": args.positions, "seed": args.seed,
              "perplexity": result.perplexity, "mean_nll": result.mean_nll, "num_tokens": result.num_tokens,
              "num_sequences": result.num_sequences}
    if args.output:
        with storage.atomic_file(args.output) as f:
            f.write(json.dumps(report, indent=2) + "\n")
    print(f"single-token perplexity {result.perplexity:.3f} (mean NLL {result.mean_nll:.4f} nats) over "
          f"{result.num_tokens} tokens of {result.num_sequences} {args.split} sequences, checkpoint step "
          f"{metadata.get('step')}, scheme {metadata.get('scheme')}")
    return 0


def run_finetune(args: argparse.Namespace) -> int:
    import dataclasses

    from pmi_jax import checkpoints, storage
    from pmi_jax.eval import finetune
    from pmi_jax.eval.wordpiece import WordPiece, check_vocabulary

    task = finetune.get_task(args.task)
    batch_sizes = _parse_list(args.batch_sizes, int, "--batch-sizes")
    learning_rates = _parse_list(args.learning_rates, float, "--learning-rates")
    for value, option in ((args.seeds, "--seeds"), (args.epochs, "--epochs"), (args.max_seq_len, "--max-seq-len"),
                          (args.eval_batch_size, "--eval-batch-size"), (args.doc_stride, "--doc-stride"),
                          (args.max_query_len, "--max-query-len")):
        _positive(value, option)
    if task.kind == "span":
        task = dataclasses.replace(task, doc_stride=args.doc_stride, max_query_len=args.max_query_len,
                                   null_score_diff_threshold=args.null_score_diff_threshold)
    _absolute_paths(args)

    _quiet_checkpoint_logs()
    config, params, metadata = checkpoints.restore_for_eval(args.checkpoint)
    output = args.output or storage.join(_run_dir(args.checkpoint), "eval",
                                         f"{task.name.replace('/', '-')}-step{metadata.get('step')}")
    _check_output(output, args.overwrite, directory=True)  # before hours of fine-tuning, not after
    vocab = args.vocab or (storage.join(metadata["data_dir"], "vocab.txt") if metadata.get("data_dir") else None)
    if not vocab:
        raise UserInputError(f"checkpoint {args.checkpoint} records no corpus; pass --vocab")
    wordpiece = WordPiece(vocab)
    check_vocabulary(wordpiece, metadata, config.vocab_size, args.checkpoint)
    max_seq_len = args.max_seq_len or min(task.max_seq_len, config.max_position_embeddings)
    if max_seq_len > config.max_position_embeddings:
        raise UserInputError(f"--max-seq-len {max_seq_len}: the model takes at most "
                             f"{config.max_position_embeddings} tokens")

    encoded = {}
    for split in ("train", "dev"):
        examples = _read_examples(task, args, split)
        encoded[split] = task.encode(examples, wordpiece, max_seq_len)
        logging.info("%s %s: %d examples, %d model inputs", task.name, split, len(examples),
                     len(encoded[split].arrays["input_ids"]))

    result = finetune.sweep(task, config, params["encoder"], encoded["train"], encoded["dev"],
                            batch_sizes=batch_sizes, learning_rates=learning_rates, seeds=args.seeds,
                            epochs=args.epochs or task.epochs, eval_batch_size=args.eval_batch_size)
    result.update({"checkpoint": args.checkpoint, "step": metadata.get("step"), "scheme": metadata.get("scheme"),
                   "data": args.data or f"tfds:{args.tfds}", "max_seq_len": max_seq_len})
    title = (f"{task.name} fine-tuning of {args.checkpoint} "
             f"(step {metadata.get('step')}, scheme {metadata.get('scheme')})")
    with storage.atomic_directory(output, overwrite=args.overwrite) as tmp:  # both files or neither
        with storage.gfile.GFile(storage.join(tmp, "results.json"), "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
        with storage.gfile.GFile(storage.join(tmp, "results.md"), "w") as f:
            f.write(finetune.markdown_report(result, title))
    best = result["best"]
    print(f"{task.name}: best median dev score {best['median']['score']:.2f} (batch size {best['batch_size']}, "
          f"learning rate {best['learning_rate']:g}); results in {output}/results.md")
    return 0
