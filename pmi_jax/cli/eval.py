"""`pmi-jax eval`: score a pretrained checkpoint.

    pmi-jax eval perplexity --checkpoint runs/tiny-pmi --steps all --unit token --unit pmi
    pmi-jax eval finetune --checkpoint runs/tiny-pmi --task glue/rte --data glue_data/RTE

`perplexity` masks one held-out unit at a time (the single-token measure is the paper's Table 4,
§4.2) and reports exp(mean NLL) with a 95% interval; `finetune` runs one of the paper's
protocols (§4.2 `sweep`; Tables 6-7's captions `checkpoint`) on one task, or on a released
transformers BERT with --hf-model (Table 3). Results, what `pmi-jax compare` reads:
    RUN/eval/perplexity-<split>[-<unit>]-step<N>.json       (no -<unit> for --unit token)
    RUN/eval/<task>-<protocol>-step<N>/results.json, results.md  (e.g. glue-rte-checkpoint-step2000)
"""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags, quiet
from pmi_jax.errors import UserInputError
from pmi_jax.eval.protocols import PROTOCOLS

_TASK_NAMES = ("glue/cola, glue/sst2, glue/mrpc, glue/stsb, glue/qqp, glue/mnli, glue/qnli, glue/rte, glue/wnli, "
               "squad/v2.0, race, race/high, race/middle")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: single-token perplexity, fine-tuning",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="eval_command", required=True, metavar="EVALUATION")
    _add_perplexity(commands)
    _add_finetune(commands)


def _add_steps(p) -> None:
    p.add_argument("--steps", default=None,
                   help="evaluate several checkpoints of the run given by --checkpoint: 'all', or comma-separated "
                        "steps (default: the one --checkpoint names, or the run's latest)")


def _add_checkpoint(p, required: bool = True) -> None:
    io_flags.reads(p.add_argument("--checkpoint", required=required,
                   help="a training --workdir (its latest checkpoint) or one of its checkpoints/<step> directories "
                        "(local or gs://)"))


def _add_perplexity(commands) -> None:
    p = commands.add_parser(
        "perplexity", help="perplexity on held-out sequences, one token, word or unit masked at a time",
        description="For each chosen unit of the held-out sequences (a token, a whole word, or a masking unit of "
                    "the corpus), mask that unit's tokens alone (nothing else corrupted) and score them; report "
                    "exp(mean negative log-likelihood over the scored tokens) with a 95% bootstrap interval over "
                    "the scored sequences. Every scored token's NLL is kept in the result, so that `pmi-jax "
                    "compare` can pair runs token by token: the units are drawn from --seed and the sequence "
                    "alone, so every run scored on the same corpus with the same --seed, --positions and --unit is "
                    "scored on the same tokens. One unit per masked copy: the scored units of a sequence never "
                    "overlap and never hide each other's context (docs/experiments.md, \"Unit perplexity\").")
    _add_checkpoint(p)
    io_flags.reads(p.add_argument("--data", default=None,
                                  help="prepared corpus directory (default: the one the checkpoint was trained "
                                       "on); its vocab.txt must be the checkpoint's"))
    p.add_argument("--split", default="validation", help="which split's TFRecords to score (default: validation)")
    p.add_argument("--unit", action="append", default=None, metavar="{token,word,NAME}",
                   help="what is masked at once (repeatable, one result file each; default: token): token = one "
                        "token (the paper's single-token perplexity); word = every WordPiece of one whole word; "
                        "NAME = every token of one unit of the corpus's unit set NAME (`corpus prepare --units "
                        "NAME=...`, e.g. pmi)")
    p.add_argument("--positions", default="all",
                   help="'all' scores every unit of every sequence; a number N scores a random sample of N units "
                        "per sequence, drawn from --seed and the sequence's index (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the unit sample (default: 0)")
    p.add_argument("--spacing", type=int, default=0, metavar="K",
                   help="0 (default): each masked copy masks one unit, the exact measure. K > 0: each copy masks "
                        "every K-th chosen unit of the sequence at once (K-1 chosen units between masked ones), "
                        "K-fold fewer forward passes for large scored sets; every unit is still scored once, but "
                        "about 1/K of the context is masked too, so compare only runs scored with the same K")
    p.add_argument("--max-sequences", type=int, default=None,
                   help="score only the first N sequences of the split (default: all of them)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="masked copies per forward pass (default: 64); changes speed, not the result")
    _add_steps(p)
    io_flags.writes(p.add_argument("--output", default=None, help="also write the result to this JSON file (one checkpoint "
                   "and one --unit only; written whole under a temporary name, then renamed); the result is always "
                   "written to RUN/eval/perplexity-<split>-step<N>.json (token) or "
                   "RUN/eval/perplexity-<split>-<unit>-step<N>.json"))
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--skip-existing", action="store_true",
                   help="skip a checkpoint and unit whose RUN/eval result exists and was scored with the same "
                        "split, unit, seed, positions, spacing and max-sequences (to finish an interrupted "
                        "evaluation); without it, results in RUN/eval are rewritten")
    p.set_defaults(func=run_perplexity)


def _add_finetune(commands) -> None:
    p = commands.add_parser(
        "finetune", help="fine-tune on a GLUE task, SQuAD 2.0 or RACE with one of the paper's protocols",
        description="Fine-tune the pretrained encoder with a task head under one of the paper's protocols. "
                    "sweep: every batch size x learning rate, several seeds each, each run keeps its best dev "
                    "epoch, a configuration scores the median over its seeds, the best median is reported. "
                    "checkpoint: batch size 32, learning rate 3e-5, the task's epochs (4 for SQuAD 2.0 and "
                    "RACE), no early stopping, 5 seeds, mean of the middle three (the paper's §4.2 and Tables "
                    "6-7). The score is the paper's metric per task (accuracy; Spearman for STS-B, Matthews "
                    "correlation for CoLA, F1 for SQuAD 2.0). Writes results.json and results.md per "
                    "checkpoint.")
    model = p.add_mutually_exclusive_group(required=True)
    _add_checkpoint(model, required=False)
    io_flags.reads(model.add_argument("--hf-model", metavar="DIR",
                       help="instead of a pmi-jax run: a released Hugging Face BERT checkpoint saved locally "
                            "(config.json, vocab.txt, model.safetensors; BertModel, BertForMaskedLM or "
                            "BertForPreTraining), fine-tuned with the same protocol, e.g. to set a run beside "
                            "SpanBERT as the paper's Table 3 does; needs --output"))
    _add_steps(p)
    p.add_argument("--task", required=True, help=f"one of: {_TASK_NAMES}")
    source = p.add_mutually_exclusive_group(required=True)
    io_flags.reads(source.add_argument("--data", help="the task's data in its distributed format: a GLUE task folder "
                                       "(train.tsv, dev.tsv), a folder with SQuAD's train-v2.0.json and "
                                       "dev-v2.0.json, or the RACE folder (train/, dev/ with high/ and middle/)"))
    source.add_argument("--tfds", metavar="NAME",
                        help="read the task from TensorFlow Datasets instead (already downloaded and prepared: "
                             "nothing is downloaded), e.g. glue/rte, squad/v2.0, race/high; for RACE the --task "
                             "decides which levels are read")
    io_flags.reads(p.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir (default: TFDS's own)"))
    io_flags.reads(p.add_argument("--test-data", default=None,
                   help="also evaluate the test set with the chosen configuration's runs: the GLUE task folder "
                        "(test.tsv; MNLI test_matched/mismatched.tsv) -> <Task>.tsv predictions for the GLUE "
                        "server; a SQuAD 2.0 JSON file of questions -> predictions.json; the RACE folder "
                        "(test/high, test/middle) -> test accuracy"))
    io_flags.reads(p.add_argument("--vocab", default=None,
                   help="the WordPiece vocab.txt the checkpoint was trained with (default: the one in the "
                        "checkpoint's corpus directory); checked against the checkpoint's hash"))
    p.add_argument("--protocol", default="sweep", choices=PROTOCOLS,
                   help="sweep (default): the grid search of the paper's Tables 2-3 and 8 (§4.2); checkpoint: "
                        "the fixed per-checkpoint setting of its Table 1, Figures 1-2 and Tables 6-7")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a field of the protocol's FinetuneConfig (repeatable), e.g. seeds=3, "
                        "batch_sizes=(16,), epochs=2, warmup_fraction=0.06")
    p.add_argument("--batch-sizes", default=None, help="comma-separated grid (sweep default: 16,32; same as "
                                                       "--set batch_sizes=(...))")
    p.add_argument("--learning-rates", default=None,
                   help="comma-separated grid (sweep default: 1e-5,2e-5,3e-5,5e-5)")
    p.add_argument("--seeds", type=int, default=None, help="runs per configuration, seeds 0..N-1 (default: 5)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per run (default, both protocols: 3; 10 for RTE and STS-B; 4 for SQuAD and "
                        "RACE, as the paper's §4.2; docs/experiments.md says where each setting comes from)")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="tokens per input (default: 128 for GLUE, 384 for SQuAD, 512 for RACE, capped at the "
                        "model's max_position_embeddings)")
    p.add_argument("--eval-batch-size", type=int, default=None, help="examples per dev forward pass (default: 64)")
    p.add_argument("--doc-stride", type=int, default=128, help="SQuAD: tokens between window starts (default: 128)")
    p.add_argument("--max-query-len", type=int, default=64, help="SQuAD: question tokens kept (default: 64)")
    p.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                   help="SQuAD: answer \"\" when the null score beats the best span by more than this (default: 0)")
    io_flags.writes(p.add_argument("--output", default=None,
                   help="directory for results.json and results.md, written together under a temporary name "
                        "and renamed (default: RUN/eval/<task>-<protocol>-step<N> of the checkpoint's training "
                        "run; with several --steps, one step<N>/ folder each)"), directory=True)
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=run_finetune)


def _parse_list(text: str, kind, option: str) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserInputError(f"{option} {text!r}: expected comma-separated numbers") from None
    if not values or any(not v > 0 or v == float("inf") for v in values):
        raise UserInputError(f"{option} {text!r}: expected positive numbers")
    return values


def _parse_positions(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise UserInputError(f"--positions {text!r}: expected 'all' or a positive number of tokens per sequence")
    return int(text)


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
    from pmi_jax import paths

    paths.make_absolute(args, "checkpoint", "hf_model", "data", "output", "vocab", "test_data", "tfds_data_dir")


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(option, path) of every input the command reads: no output may hold one."""
    return [(f"--{name.replace('_', '-')}", getattr(args, name, None))
            for name in ("checkpoint", "data", "vocab", "test_data", "tfds_data_dir")]


def _checkpoints(checkpoint: str, steps: str | None) -> list[str]:
    """The checkpoint directories --checkpoint and --steps name, in step order."""
    from pmi_jax.eval.run_eval import checkpoint_paths

    chosen = steps if steps in (None, "all") else _parse_list(steps, int, "--steps")
    return checkpoint_paths(checkpoint, chosen)


def run_perplexity(args: argparse.Namespace) -> int:
    from pmi_jax.eval.run_eval import PerplexityRequest, perplexity_of_checkpoints

    positions = None if args.positions == "all" else _parse_positions(args.positions)
    _positive(args.batch_size, "--batch-size")
    _positive(args.max_sequences, "--max-sequences")
    if args.spacing < 0:
        raise UserInputError(f"--spacing {args.spacing}: must be 0 (one unit per copy) or positive")
    _absolute_paths(args)
    if args.output:
        from pmi_jax.formats import run_dir

        run_dir.check_new_output(args.output, args.overwrite, inputs=_inputs(args))
    quiet.quiet_checkpoint_reads()
    request = PerplexityRequest(data=args.data, split=args.split, units=tuple(dict.fromkeys(args.unit or ["token"])),
                                positions=positions, seed=args.seed, max_sequences=args.max_sequences,
                                batch_size=args.batch_size, spacing=args.spacing, skip_existing=args.skip_existing,
                                output=args.output)
    for report in perplexity_of_checkpoints(_checkpoints(args.checkpoint, args.steps), request):
        if "skipped" in report:
            print(f"{report['skipped']}: already scored with these settings; skipped")
            continue
        low, high = report["interval"]["perplexity"]
        multi = report.get("multi_token")
        extra = f"; units of 2+ tokens: {multi['perplexity']:.3f} over {multi['num_tokens']} tokens" if multi else ""
        what = "single-token" if report["unit"] == "token" else f"{report['unit']}-unit"
        print(f"{what} perplexity {report['perplexity']:.3f} [95% {low:.3f}, {high:.3f} over the scored sequences] "
              f"(mean NLL {report['mean_nll']:.4f} nats) over {report['num_tokens']} tokens in "
              f"{report['num_units']} units of {report['num_sequences']} {args.split} sequences{extra}; "
              f"checkpoint step {report['step']}, scheme {report['scheme']}")
    return 0


def _finetune_config(args: argparse.Namespace):
    """The flags parsed and checked, merged by `protocols.finetune_settings`."""
    from pmi_jax.eval.protocols import finetune_settings

    flags = {"batch_sizes": args.batch_sizes and tuple(_parse_list(args.batch_sizes, int, "--batch-sizes")),
             "learning_rates": args.learning_rates and tuple(_parse_list(args.learning_rates, float,
                                                                        "--learning-rates")),
             "seeds": args.seeds, "epochs": args.epochs, "max_seq_len": args.max_seq_len,
             "eval_batch_size": args.eval_batch_size}
    for name, option in (("seeds", "--seeds"), ("epochs", "--epochs"), ("max_seq_len", "--max-seq-len"),
                         ("eval_batch_size", "--eval-batch-size")):
        _positive(flags[name], option)
    return finetune_settings(args.protocol, flags, args.set)


def run_finetune(args: argparse.Namespace) -> int:
    import dataclasses

    from pmi_jax.eval import finetune
    from pmi_jax.eval.run_eval import FinetuneRequest, finetune_checkpoints

    task = finetune.get_task(args.task)
    settings = _finetune_config(args)
    for value, option in ((args.doc_stride, "--doc-stride"), (args.max_query_len, "--max-query-len")):
        _positive(value, option)
    if task.kind == "span":
        task = dataclasses.replace(task, doc_stride=args.doc_stride, max_query_len=args.max_query_len,
                                   null_score_diff_threshold=args.null_score_diff_threshold)
    _absolute_paths(args)

    quiet.quiet_checkpoint_reads()
    if args.hf_model:
        if args.steps is not None:
            raise UserInputError("--steps: a --hf-model has one set of weights; use --steps with --checkpoint")
        if not args.output:
            raise UserInputError("--hf-model: pass --output (a released model has no run directory to write into)")
    request = FinetuneRequest(task=task, settings=settings, read_examples=lambda split: _read_examples(task, args, split),
                              data_label=args.data or f"tfds:{args.tfds}", test_data=args.test_data, vocab=args.vocab,
                              output=args.output, overwrite=args.overwrite, hf_model=args.hf_model,
                              inputs=tuple(_inputs(args)))
    paths = [args.hf_model] if args.hf_model else _checkpoints(args.checkpoint, args.steps)
    for result, output in finetune_checkpoints(paths, request):
        best = result["best"]
        test = f"; test {best['test']['score']:.2f}" if "test" in best else ""
        where = f"of {result['hf_model']}" if args.hf_model else f"step {result['step']}"
        print(f"{task.name} {where} ({settings.protocol} protocol): dev {result['metric']} "
              f"{best['aggregate']['score']:.2f} (batch size {best['batch_size']}, learning rate "
              f"{best['learning_rate']:g}){test}; results in {output}/results.md")
    return 0
