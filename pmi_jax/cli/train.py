"""`pmi-jax train`: pretrain BERT with a masking scheme on a prepared corpus.

    pmi-jax train --config tiny --data demo/corpus --scheme pmi --workdir runs/tiny-pmi --set train.num_steps=300
    pmi-jax train --config tiny --data demo/corpus --scheme pmi --workdir runs/tiny-pmi-30 --set data.mask_rate=0.3
    pmi-jax train --compile-only --topology v5p-8 --config base --set model.vocab_size=30522
    pmi-jax train --compile-only --topology h100 --config base --set model.vocab_size=30522 --set data.seq_len=512

Run the same command on every host of a TPU pod slice; a run resumes from the latest checkpoint
in --workdir. The masking rate (`data.mask_rate`, schedules) and validation: docs/design.md,
"Masking rate"; a progress line is drawn on a terminal's stderr (--no-progress turns it off).
"""
from __future__ import annotations

import argparse
import logging
import sys

# config_path, load_config: re-exported for importers written before pmi_jax/config.py held them.
from pmi_jax.config import SCHEMES, SYNTHETIC, UNIT_SCHEMES, config_path, load_config  # noqa: F401
from pmi_jax.config import check_resumed_settings
from pmi_jax.cli import io_flags
from pmi_jax.errors import UserInputError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="pretrain BERT (MLM) on a prepared corpus with one masking scheme",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    io_flags.reads(parser.add_argument("--config", required=True,
                        help="experiment config: a name in configs/ (tiny, small, base, large) or a path to a .py "
                             "file whose get_config() returns an ExperimentConfig"))
    io_flags.reads(parser.add_argument("--data", default=None,
                        help="prepared corpus directory (local or gs://) holding metadata.json, vocab.txt and the "
                             f"TFRecords; '{SYNTHETIC}' trains on a built-in topic-model toy corpus (needs "
                             "model.vocab_size and data.seq_len set). Default: the config's data.data_dir"))
    parser.add_argument("--scheme", default=None,
                        help=f"masking scheme: {', '.join(SCHEMES)} ({', '.join(UNIT_SCHEMES)} need that "
                             "masking vocabulary in the corpus, informask the rates of `pmi-jax corpus informask`). "
                             "Default: the config's")
    io_flags.run_directory(parser.add_argument("--workdir", default=None,
                        help="run directory (local or gs://): checkpoints/ and tensorboard/ go here; an existing "
                             "checkpoint of the same model and vocabulary is resumed (the newest one that restores; "
                             "a damaged one is moved to unreadable_checkpoints/). Required unless --compile-only"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a config field, e.g. --set model.num_layers=4 --set train.batch_size=64 "
                             "--set mesh.model=2 (repeatable)")
    parser.add_argument("positional_overrides", nargs="*", metavar="FIELD=VALUE",
                        help="more overrides, same syntax as --set")
    io_flags.reads(parser.add_argument("--init-from", default=None, metavar="DIR",
                        help="start from a Hugging Face transformers BERT checkpoint directory (config.json, "
                             "model.safetensors, vocab.txt; e.g. a downloaded bert-base-uncased or a `pmi-jax export "
                             "hf` output) instead of random weights; the optimizer starts fresh. Its config.json "
                             "decides the model (a --config or --set that contradicts it is an error) and the corpus "
                             "must use its vocabulary (`corpus prepare --wordpiece DIR/vocab.txt`). Ignored when "
                             "--workdir already holds a checkpoint (the run resumes)"))
    parser.add_argument("--allow-changed", action="append", default=[], metavar="SETTING",
                        help="resuming: let this setting differ from the run's checkpoint (repeatable; one of "
                             "data.scheme, data.mask_rate, data.mask_rate_schedule, data.mask_rate_end, "
                             "data.eval_mask_rate, data.seed, data.data_dir, train.seed). Without it a resumed run "
                             "with another value is refused; with it the change and its step are recorded in the "
                             "checkpoints' metadata and `pmi-jax compare` flags it")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress line (step, steps/s, tokens/s, ETA) on stderr; it is drawn only when stderr "
                             "is a terminal anyway. The log lines every train.log_every_steps go on either way")
    parser.add_argument("--peak-flops", type=float, default=None,
                        help="peak FLOP/s of one device for the MFU metric (default: looked up for TPU v4/v5e/v5p/"
                             "v6e, A100, H100, H200; MFU is not reported for other devices)")
    parser.add_argument("--coordinator-address", default=None,
                        help="host:port of process 0, for multi-process runs outside TPU/SLURM environments "
                             "(with --num-processes and --process-id)")
    parser.add_argument("--num-processes", type=int, default=None, help="number of processes in the job")
    parser.add_argument("--process-id", type=int, default=None, help="index of this process, 0-based")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the train step for --topology on this machine (no TPU or GPU needed; libtpu or "
                             "the CUDA plugin is) and "
                             "print the compiler's per-device HBM use against the chip's, whether it fits, its FLOPs "
                             "and step-time estimate; nothing runs and no data is read, so model.vocab_size and "
                             "data.seq_len must be set. Exits 1 when the program does not fit (docs/tpu.md)")
    parser.add_argument("--topology", default=None,
                        help="with --compile-only: the TPU slice as Google names it (v4-32, v5p-8, v5e-16, v6e-8; "
                             "TensorCores for v4/v5p, chips for v5e/v6e), a topology such as v5p:2x2x2, or one GPU: "
                             "h100, h200 (needs JAX's CUDA plugin, no GPU; docs/gpu.md)")
    parser.set_defaults(func=run)


def _compile_only(args, config) -> int:
    """--compile-only: the compiler's report for the slice; 1 with a one-line reason when it does not fit."""
    from pmi_jax import compile_only

    if not args.topology:
        raise UserInputError("--compile-only needs --topology, e.g. --topology v5p-8")
    if not (config.model.vocab_size and config.data.seq_len):
        raise UserInputError("--compile-only reads no corpus: set model.vocab_size and data.seq_len (via --set)")
    report, _ = compile_only.compile_train_step(config, args.topology)
    print("\n".join(report.lines()), flush=True)
    if not report.fits:
        print(f"pmi-jax train: does not fit: {report.total_bytes / compile_only.GiB:.2f} GiB per device needed, "
              f"{report.hbm_bytes / compile_only.GiB:.0f} GiB on a {report.topology} chip", file=sys.stderr)
        return 1
    return 0


def run(args) -> int:
    for noisy in ("absl", "jax"):  # Orbax's per-save INFO lines and JAX's backend probing drown the metrics
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from pmi_jax import experiment, train

    spec = experiment.RunSpec(config=args.config, overrides=tuple(args.overrides) + tuple(args.positional_overrides),
                              data=args.data, scheme=args.scheme, peak_flops=args.peak_flops,
                              init_from=args.init_from,
                              allow_changed=check_resumed_settings(args.allow_changed))
    if args.compile_only:
        return _compile_only(args, experiment.resolve_config(spec)[0])
    if args.topology:
        raise UserInputError("--topology goes with --compile-only (a real run uses the devices it finds)")
    if not args.workdir:
        raise UserInputError("--workdir is required (the run directory)")
    from pmi_jax import storage

    storage.check_writable_directory(args.workdir)
    distributed = experiment.Distributed(args.coordinator_address, args.num_processes, args.process_id)
    try:
        with storage.write_errors(args.workdir):  # a full disk: one line naming the file
            result = experiment.pretrain(spec, args.workdir, distributed,
                                         progress=not args.no_progress and sys.stderr.isatty())
    except train.NonFiniteLoss as e:
        print(f"pmi-jax train: stopped: {e}", file=sys.stderr)
        return 1
    if result.status in ("preempted", "interrupted"):
        print(f"pmi-jax train: {result.status} at step {result.step}; checkpoint saved, rerun the same command to "
              "resume", file=sys.stderr)
    return 130 if result.status == "interrupted" else 0  # Ctrl-C: the shell's status for an interrupt
