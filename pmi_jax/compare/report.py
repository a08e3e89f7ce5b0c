"""The comparison report: the paper's tables at equal pretraining steps, as report.md.

Levine et al. 2021 compare schemes at equal pretraining steps: single-token perplexity per
scheme (its Table 4) and each downstream task's dev score per scheme (its Table 2, which also
names the protocol behind each number). Here a column exists for a step only where every run
has a result at that step, so no number is compared with one taken at another point of
training; the best value of each column is in bold (lowest perplexity, highest score).
"""
from __future__ import annotations

import dataclasses

from pmi_jax.compare.runs import Run, mismatches


@dataclasses.dataclass
class Table:
    title: str
    note: str
    columns: list[str]
    rows: list[tuple[str, list[float | None]]]  # (run label, one value per column)
    lower_is_better: bool

    def markdown(self) -> str:
        best = []
        for j in range(len(self.columns)):
            values = [v[j] for _, v in self.rows if v[j] is not None]
            best.append((min if self.lower_is_better else max)(values) if values else None)
        lines = [f"### {self.title}", "", self.note, "", "| scheme | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        for label, values in self.rows:
            cells = ["–" if v is None else (f"**{v:.2f}**" if v == best[j] else f"{v:.2f}")
                     for j, v in enumerate(values)]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
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


def perplexity_split(runs: list[Run]) -> str | None:
    """The split every run has perplexity results on, validation first."""
    shared = set.intersection(*(set(r.perplexity) for r in runs)) if runs else set()
    return "validation" if "validation" in shared else (sorted(shared)[0] if shared else None)


def perplexity_table(runs: list[Run]) -> Table | None:
    split = perplexity_split(runs)
    if split is None:
        return None
    steps = common_steps([r.perplexity[split] for r in runs])
    if not steps:
        return None
    rows = [(label, [r.perplexity[split][s]["perplexity"] for s in steps]) for label, r in zip(labels(runs), runs)]
    first = runs[0].perplexity[split][steps[-1]]
    note = (f"Single-token perplexity on the {split} split (each scored token masked alone, nothing else "
            f"corrupted; positions {first.get('positions')}, seed {first.get('seed')}, "
            f"{first.get('num_tokens')} tokens at the last step), per pretraining step; lower is better. "
            "The paper's Table 4 shape.")
    return Table("Single-token perplexity", note, [f"step {s}" for s in steps], rows, lower_is_better=True)


def finetune_tables(runs: list[Run]) -> list[Table]:
    """One table per protocol: a column per task at the last step every run was evaluated at."""
    keys = set.intersection(*(set(r.finetune) for r in runs)) if runs else set()
    tables = []
    for protocol in ("checkpoint", "sweep"):
        columns, values, notes = [], [[] for _ in runs], []
        for task, p in sorted(k for k in keys if k[1] == protocol):
            steps = common_steps([r.finetune[(task, p)] for r in runs])
            if not steps:
                continue
            step = steps[-1]
            first = runs[0].finetune[(task, p)][step]
            columns.append(f"{task} ({first['metric']}, step {step})")
            for i, r in enumerate(runs):
                values[i].append(r.finetune[(task, p)][step]["best"]["aggregate"]["score"])
            settings = first["protocol"]
            notes.append(f"{task}: {settings['aggregate']} over {settings['seeds']} seeds of "
                         f"{settings['selection']}, {settings['epochs']} epochs, batch sizes "
                         f"{settings['batch_sizes']}, learning rates {settings['learning_rates']}")
        if columns:
            note = (f"Dev score ×100 with the paper's metric per task, {protocol} protocol; higher is better. "
                    "The paper's Table 2 shape. " + "; ".join(notes) + ".")
            tables.append(Table(f"Fine-tuning ({protocol} protocol)", note, columns,
                                list(zip(labels(runs), values)), lower_is_better=False))
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


def markdown(runs: list[Run], tables: list[Table], plots: list[str]) -> str:
    flagged = mismatches(runs)
    lines = ["# Masking schemes compared", "",
             f"{len(runs)} runs: " + ", ".join(labels(runs)) + ". Each table compares the runs at equal "
             "pretraining steps (a step appears only where every run has a result).", ""]
    if flagged:
        lines += ["## ⚠ These runs differ in more than the masking scheme", "",
                  "Differences below can explain a gap as well as the scheme can; compare with care.", ""]
        lines += [f"- {line}" for line in flagged] + [""]
    else:
        lines += ["The runs differ only in their masking scheme (model, corpus, batch, steps, schedule and "
                  "seeds agree).", ""]
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
