"""The comparison report: the paper's tables at equal pretraining steps, as report.md.

Levine et al. 2021 compare schemes at equal pretraining steps: single-token perplexity per
scheme (its Table 4) and each downstream task's dev score per scheme (its Table 2, which also
names the protocol behind each number). Here a column exists for a step only where every run
has a result at that step, so no number is compared with one taken at another point of
training. Perplexity tables, with intervals and seed-aware winner marking, are in
`perplexity_tables.py`. A fine-tuning cell shows the protocol's score, the median and the range
over its fine-tuning seeds; the best of a column is in bold only when its seed range overlaps no
other row's, and overlapping ranges are flagged.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pmi_jax.compare.runs import Run, mismatches


@dataclasses.dataclass
class Table:
    title: str
    note: str
    columns: list[str]
    rows: list[tuple[str, list[float | None]]]  # (run label, one value per column)
    lower_is_better: bool
    # (run label, per column the scores over fine-tuning seeds, or None): median, range, overlap flags
    seed_scores: list[tuple[str, list[list[float] | None]]] | None = None

    def markdown(self) -> str:
        best, overlapping = [], []
        for j in range(len(self.columns)):
            values = [v[j] for _, v in self.rows if v[j] is not None]
            top = (min if self.lower_is_better else max)(values) if values else None
            ranges = [(min(x[j]), max(x[j])) for _, x in self.seed_scores or [] if x[j]]
            top_index = next((i for i, (_, v) in enumerate(self.rows) if v[j] == top), None)
            overlap, known = False, bool(self.seed_scores) and len(ranges) == len(values)
            if known and top_index is not None:
                lo, hi = min(self.seed_scores[top_index][1][j]), max(self.seed_scores[top_index][1][j])
                overlap = sum(1 for a, b in ranges if a <= hi and lo <= b) > 1
            overlapping.append(overlap)
            best.append(top if known and not overlap and len(values) > 1 else None)
        lines = [f"### {self.title}", "", self.note, "", "| scheme | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        for i, (label, values) in enumerate(self.rows):
            cells = []
            for j, v in enumerate(values):
                text = "–" if v is None else f"{v:.2f}"
                seeds = self.seed_scores[i][1][j] if self.seed_scores else None
                if v is not None and seeds:
                    text += f" (median {np.median(seeds):.2f}, {min(seeds):.2f}–{max(seeds):.2f}, {len(seeds)} seeds)"
                cells.append(f"**{text}**" if v is not None and v == best[j] else text)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        flagged = [c for c, o in zip(self.columns, overlapping) if o]
        if flagged:
            lines += ["", "⚠ The best score's range over fine-tuning seeds overlaps another scheme's in: "
                      + "; ".join(flagged) + ". These columns mark no best: the seeds do not separate the schemes."]
        return "\n".join(lines) + "\n"


def labels(runs: list[Run]) -> list[str]:
    """Each run's name in tables and legends: its scheme, with the run's name when schemes repeat."""
    schemes = [r.scheme for r in runs]
    return [r.scheme if schemes.count(r.scheme) == 1 else f"{r.scheme} ({r.name})" for r in runs]


def common_steps(per_run: list[dict[int, dict]]) -> list[int]:
    steps = set(per_run[0]) if per_run else set()
    for results in per_run[1:]:
        steps &= set(results)
    return sorted(steps)


def finetune_tables(runs: list[Run]) -> list[Table]:
    """One table per protocol: a column per task at the last step every run was evaluated at."""
    keys = set.intersection(*(set(r.finetune) for r in runs)) if runs else set()
    tables = []
    for protocol in ("checkpoint", "sweep"):
        columns, values, notes, seeds = [], [[] for _ in runs], [], [[] for _ in runs]
        for task, p in sorted(k for k in keys if k[1] == protocol):
            steps = common_steps([r.finetune[(task, p)] for r in runs])
            if not steps:
                continue
            step = steps[-1]
            first = runs[0].finetune[(task, p)][step]
            columns.append(f"{task} ({first['metric']}, step {step})")
            for i, r in enumerate(runs):
                values[i].append(r.finetune[(task, p)][step]["best"]["aggregate"]["score"])
                seeds[i].append(r.finetune[(task, p)][step]["best"].get("seed_scores"))
            settings = first["protocol"]
            notes.append(f"{task}: {settings['aggregate']} over {settings['seeds']} seeds of "
                         f"{settings['selection']}, {settings['epochs']} epochs, batch sizes "
                         f"{settings['batch_sizes']}, learning rates {settings['learning_rates']}")
        if columns:
            note = (f"Dev score ×100 with the paper's metric per task, {protocol} protocol; higher is better. "
                    "The paper's Table 2 shape. Beside each score: the median and the range over the fine-tuning "
                    "seeds of the chosen configuration. " + "; ".join(notes) + ".")
            tables.append(Table(f"Fine-tuning ({protocol} protocol)", note, columns,
                                list(zip(labels(runs), values)), lower_is_better=False,
                                seed_scores=list(zip(labels(runs), seeds))))
    return tables


def _setting_lines(runs: list[Run]) -> list[str]:
    lines = ["| run | scheme | mask rate | directory | last step | corpus | model | batch | steps | seeds (train, data) |",
             "|---|---|---|---|---:|---|---|---:|---:|---|"]
    for r in runs:
        model, data, train = (r.config.get(k, {}) for k in ("model", "data", "train"))
        size = (f"{model.get('num_layers')}L/{model.get('hidden_size')}H/{model.get('num_heads')}A"
                if model else "?")
        lines.append(f"| {r.name} | {r.scheme} | {r.mask_rate()} | `{r.path}` | {r.last_step} | `{data.get('data_dir')}` | {size} | "
                     f"{train.get('batch_size')} | {train.get('num_steps')} | {train.get('seed')}, {data.get('seed')} |")
    return lines


def _seed_line(runs: list[Run]) -> str:
    from pmi_jax.compare.perplexity_tables import scheme_order

    schemes = scheme_order(runs)
    both = len({r.seeds[1] for r in runs}) > 1  # data seeds vary: name runs by (train, data) seed
    name = (lambda r: f"{r.seeds[0]}/{r.seeds[1]}") if both else (lambda r: str(r.train_seed))
    counts = {s: sorted((name(r) for r in runs if r.scheme == s), key=str) for s in schemes}
    text = "; ".join(f"{s}: {len(v)} ({', '.join(map(str, v))})" for s, v in counts.items())
    if all(len(v) == 1 for v in counts.values()):
        return (f"Training seeds per scheme: {text}. With one training seed per scheme, every interval below "
                "covers the scored text only, not the training seed: it cannot show that a gap comes from the "
                "scheme rather than from the seed, so no perplexity winner is marked.")
    line = (f"Training seeds per scheme{' (train.seed/data.seed)' if both else ''}: {text}. Runs of one scheme "
            "with different seeds are grouped; "
            "difference intervals account for the seed-to-seed spread (docs/experiments.md, \"Intervals\").")
    if not both:
        line += (f" Every run has data.seed {runs[0].seeds[1]}: the runs of a scheme saw the same data order and "
                 "masks, so the seed spread covers initialisation and dropout only, not the masks and the data "
                 "order (a data.seed per run would cover them).")
    return line


def markdown(runs: list[Run], tables: list, plots: list[str]) -> str:
    flagged = mismatches(runs)
    lines = ["# Masking schemes compared", "",
             f"{len(runs)} runs: " + ", ".join(labels(runs)) + ". Each table compares the runs at equal "
             "pretraining steps (a step appears only where every run has a result).", "", _seed_line(runs), ""]
    if flagged:
        lines += ["## ⚠ These runs differ in more than the masking scheme", "",
                  "Differences below can explain a gap as well as the scheme can; compare with care.", ""]
        lines += [f"- {line}" for line in flagged] + [""]
    else:
        lines += ["The runs differ only in their masking scheme and seeds (model, corpus, batch, steps and "
                  "schedule agree).", ""]
    lines += ["## Results", ""]
    if tables:
        for table in tables:
            lines += [table.markdown()]
    else:
        lines += ["No evaluation result is shared by every run at a common step yet: run `pmi-jax eval "
                  "perplexity --steps all` (and `eval finetune`) on each run first.", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({name})" for name in plots] + [""]
    lines += ["## Runs", ""] + _setting_lines(runs) + [""]
    return "\n".join(lines)
