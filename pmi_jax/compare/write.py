"""`pmi-jax compare` as one library call: read the runs, build every table and plot, write the report.

The command only parses and prints; notebooks and scripts call `write_report` directly.
"""
from __future__ import annotations

import dataclasses

from pmi_jax import storage
from pmi_jax.compare import paper_tables, perplexity_tables, plots, report
from pmi_jax.compare.runs import read_finetune_result, read_run
from pmi_jax.errors import UserInputError
from pmi_jax.formats import run_dir


@dataclasses.dataclass(frozen=True)
class Written:
    """What a comparison wrote, for the command to print."""

    report: str
    labels: list[str]
    verdicts: list[tuple[str, str]]  # (perplexity table title, what its intervals separate)
    plots: list[str]
    mismatches: int  # settings in which the runs differ beyond scheme and seeds


def write_report(run_dirs: list[str], output: str, *, released: list[str] = (), split: str | None = None,
                 overwrite: bool = False) -> Written:
    """Compare `run_dirs` into OUTPUT/report.md and its plots (written whole, then renamed)."""
    run_dir.check_new_output(output, overwrite, directory=True, inputs=[("RUN_DIR", r) for r in run_dirs])
    if len(set(r.rstrip("/") for r in run_dirs)) != len(run_dirs):
        raise UserInputError("RUN_DIR: a run is named twice")
    runs = [read_run(path) for path in run_dirs]
    released_results = [read_finetune_result(path, released=True) for path in released]
    scored = sorted({key[0] for run in runs for key in run.perplexity})
    if split is not None and split not in scored:
        raise UserInputError(f"--split {split}: no run was scored on it (`eval perplexity --split {split}`); scored "
                             f"splits: {', '.join(scored) or 'none yet'}")
    perplexity = perplexity_tables.perplexity_tables(runs, split)
    tables = [*perplexity, *report.finetune_tables(runs)]
    tables += paper_tables.tables(runs, released_results)  # the paper's Tables 2, 3, 8 and 6-7
    with storage.write_errors(output), storage.atomic_directory(output, overwrite=overwrite) as tmp:
        names = [n for n in [plots.mlm_loss(runs, tmp), plots.validation_loss(runs, tmp)] if n]
        names += plots.perplexity(perplexity, tmp)
        names += plots.downstream(runs, tmp)
        with storage.atomic_file(storage.join(tmp, "report.md")) as f:
            f.write(report.markdown(runs, tables, names))
    return Written(storage.join(output, "report.md"), report.labels(runs),
                   [(t.title, t.verdict()) for t in perplexity], [storage.join(output, n) for n in names],
                   len(report.mismatches(runs)))
