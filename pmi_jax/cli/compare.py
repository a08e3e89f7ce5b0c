"""`pmi-jax compare`: the paper's comparison of masking schemes over finished runs.

    pmi-jax compare runs/tiny-random_token runs/tiny-pmi --output reports/tiny

Reads what `train`, `eval perplexity` and `eval finetune` left in each run directory and
writes REPORT_DIR/report.md (tables at equal pretraining steps, runs that differ in more than
the scheme flagged) and PNG plots beside it. docs/experiments.md walks through a comparison.
"""
from __future__ import annotations

import argparse


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
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="training run directories (`pmi-jax train --workdir`)")
    p.add_argument("--output", required=True, metavar="REPORT_DIR",
                   help="directory to write report.md and the plots to (written whole, then moved into place)")
    p.add_argument("--released", action="append", default=[], metavar="RESULTS_DIR",
                   help="a released model's fine-tuning results (the --output of `eval finetune --hf-model`), "
                        "shown beside the runs as the paper's Table 3 does (repeatable)")
    p.add_argument("--split", default=None,
                   help="which scored split the perplexity tables show (default: validation where every run was "
                        "scored on it); e.g. train for an out-of-domain test corpus scored with `eval perplexity "
                        "--data DIR --split train` (docs/experiments.md, \"Table 4 on an out-of-domain test set\")")
    p.add_argument("--overwrite", action="store_true", help="replace an existing REPORT_DIR")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pmi_jax import storage
    from pmi_jax.compare import paper_tables, perplexity_tables, plots, report
    from pmi_jax.compare.runs import read_finetune_result, read_run
    from pmi_jax.cli import quiet
    from pmi_jax.errors import UserInputError

    quiet.quiet_checkpoint_reads()
    storage.check_new_output(args.output, args.overwrite, directory=True, inputs=[("RUN_DIR", r) for r in args.runs])
    if len(set(r.rstrip("/") for r in args.runs)) != len(args.runs):
        raise UserInputError("RUN_DIR: a run is named twice")
    runs = [read_run(path) for path in args.runs]
    released = [read_finetune_result(path, released=True) for path in args.released]
    perplexity = perplexity_tables.perplexity_tables(runs, args.split)
    tables = [*perplexity, *report.finetune_tables(runs)]
    tables += paper_tables.tables(runs, released)  # the paper's Tables 2, 3, 8 and 6-7, beside the summary above
    with storage.write_errors(args.output), storage.atomic_directory(args.output, overwrite=args.overwrite) as tmp:
        names = [n for n in [plots.mlm_loss(runs, tmp), plots.validation_loss(runs, tmp)] if n]
        names += plots.perplexity(perplexity, tmp)
        names += plots.downstream(runs, tmp)
        with storage.atomic_file(storage.join(tmp, "report.md")) as f:
            f.write(report.markdown(runs, tables, names))
    flagged = report.mismatches(runs)
    print(f"compared {len(runs)} runs ({', '.join(report.labels(runs))}): {storage.join(args.output, 'report.md')}")
    for table in perplexity:
        print(f"  {table.title}: {table.verdict()}")
    for name in names:
        print(f"  plot: {storage.join(args.output, name)}")
    if flagged:
        print(f"  warning: the runs differ in more than the scheme ({len(flagged)} differences; see the report)")
    return 0
