"""`pmi-jax compare`: the paper's comparison of masking schemes over finished runs.

    pmi-jax compare runs/tiny-random_token runs/tiny-pmi --output reports/tiny

Reads what `train`, `eval perplexity` and `eval finetune` left in each run directory and
writes REPORT_DIR/report.md (tables at equal pretraining steps, runs that differ in more than
the scheme flagged) and PNG plots beside it. docs/experiments.md walks through a comparison.
"""
from __future__ import annotations

import argparse

from pmi_jax.cli import io_flags


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="compare masking schemes: report.md and plots from several runs",
        description="Compare training runs that differ in their masking scheme. Reads each RUN_DIR's training "
                    "metrics (tensorboard/metrics.jsonl), `eval perplexity` results (eval/perplexity-*.json) and "
                    "`eval finetune` results (eval/<task>-<protocol>-step<N>/results.json), and writes "
                    "REPORT_DIR/report.md: one perplexity table per unit kind that every run was scored with "
                    "(token, word, a unit set such as pmi), each value with a 95% interval and each difference "
                    "between schemes with a 95% interval paired over the same scored tokens; runs of one scheme "
                    "with different train.seed are grouped and the difference intervals account for the seeds "
                    "(a scheme is in bold only when its difference from every other scheme excludes 0; with one "
                    "seed per scheme the intervals cover the scored text only and no winner is marked); each "
                    "fine-tuning score per scheme at equal pretraining steps with its median and range over "
                    "fine-tuning seeds (overlapping ranges flagged); runs that differ in anything but the scheme "
                    "and seed flagged; the paper's table shapes (Table 2: SQuAD 2.0 EM and F1, RACE, GLUE average, "
                    "dev/test; Table 8: GLUE per task; Tables 6-7: each task per pretraining checkpoint); the masking rate in the run table (runs at other rates flagged); and PNG plots: mlm_loss.png, validation_loss.png (validation during training), perplexity[-<unit>].png, one "
                    "<task>-<protocol>.png per fine-tuning task. docs/experiments.md, \"Intervals\", says how "
                    "the intervals are computed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    io_flags.reads(p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                                  help="training run directories (`pmi-jax train --workdir`)"))
    io_flags.writes(p.add_argument("--output", required=True, metavar="REPORT_DIR",
                   help="directory to write report.md and the plots to (written whole, then moved into place)"), directory=True)
    io_flags.reads(p.add_argument("--released", action="append", default=[], metavar="RESULTS_DIR",
                   help="a released model's fine-tuning results (the --output of `eval finetune --hf-model`), "
                        "shown beside the runs as the paper's Table 3 does (repeatable)"))
    p.add_argument("--split", default=None,
                   help="which scored split the perplexity tables show (default: validation where every run was "
                        "scored on it); e.g. train for an out-of-domain test corpus scored with `eval perplexity "
                        "--data DIR --split train` (docs/experiments.md, \"Table 4 on an out-of-domain test set\")")
    p.add_argument("--overwrite", action="store_true", help="replace an existing REPORT_DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pmi_jax.cli import quiet
    from pmi_jax.compare.write import write_report
    from pmi_jax.errors import UserInputError
    from pmi_jax.formats.prepared_corpus import SPLITS

    if args.split is not None and args.split not in SPLITS:
        raise UserInputError(f"--split {args.split}: a corpus split, one of {', '.join(SPLITS)}")
    quiet.quiet_checkpoint_reads()
    written = write_report(args.runs, args.output, released=args.released, split=args.split,
                           overwrite=args.overwrite)
    print(f"compared {len(written.labels)} runs ({', '.join(written.labels)}): {written.report}")
    for title, verdict in written.verdicts:
        print(f"  {title}: {verdict}")
    for name in written.plots:
        print(f"  plot: {name}")
    if written.mismatches:
        print(f"  warning: the runs differ in more than the scheme ({written.mismatches} differences; see the report)")
    return 0
