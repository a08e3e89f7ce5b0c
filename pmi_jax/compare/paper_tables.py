"""The paper's downstream tables, from the runs' `eval finetune` results.

Levine et al. 2021 report fine-tuning in three shapes, each rebuilt here with one row per run:
    Table 2          end of pretraining, sweep protocol: SQuAD 2.0 EM and F1, RACE accuracy, the
                     GLUE average (dev), each as dev/test where a test score exists
    Table 3          released checkpoints (`eval finetune --hf-model`) beside the runs
    Table 8          the GLUE tasks one by one, with the metric of its caption
    Tables 6-7       per-checkpoint protocol: one task's dev score at every pretraining step
A number is shown only at a step every run has a result for. No cell is marked best: these
tables carry no interval, and a gap between two medians of five seeds is not a result on its
own (the seeds' scores are in each run's results.md).
"""
from __future__ import annotations

import dataclasses

from pmi_jax.compare.report import common_steps, labels
from pmi_jax.compare.runs import Run

# Table 8's columns, in its order. WNLI is left out of the dev average, as in Table 8 (its
# caption: "the average score is simply the average of reported scores", eight of them).
GLUE_AVERAGED = ("glue/mnli", "glue/qnli", "glue/qqp", "glue/rte", "glue/sst2", "glue/mrpc", "glue/cola",
                 "glue/stsb")
GLUE_NAMES = {"glue/mnli": "MNLI", "glue/qnli": "QNLI", "glue/qqp": "QQP", "glue/rte": "RTE", "glue/sst2": "SST-2",
              "glue/mrpc": "MRPC", "glue/cola": "CoLA", "glue/stsb": "STS-B", "glue/wnli": "WNLI"}
METRIC_NAMES = {"accuracy": "acc", "matthews_corrcoef": "Matthews corr.", "spearman": "Spearman", "f1": "F1",
                "exact": "EM"}
# Tables 6 and 7 are SQuAD 2.0 and RACE; any other task evaluated per checkpoint gets the same shape.
PER_CHECKPOINT_TABLE = {"squad/v2.0": "Table 6", "race": "Table 7"}


@dataclasses.dataclass
class PaperTable:
    title: str
    note: str
    columns: list[str]
    rows: list[tuple[str, list[str]]]  # (run label, one formatted cell per column)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", self.note, "", "| scheme | " + " | ".join(self.columns) + " |",
                 "|---|" + "---:|" * len(self.columns)]
        lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in self.rows]
        return "\n".join(lines) + "\n"


def _at_last_common_step(runs: list[Run], task: str, protocol: str) -> tuple[int, list[dict]] | None:
    key = (task, protocol)
    if not runs or any(key not in r.finetune for r in runs):
        return None
    steps = common_steps([r.finetune[key] for r in runs])
    return (steps[-1], [r.finetune[key][steps[-1]] for r in runs]) if steps else None


def _dev_test(result: dict, metric: str) -> str:
    """"dev/test" as the paper writes it; "dev/–" without a test score."""
    dev = result["best"]["aggregate"].get(metric)
    test = result["best"].get("test", {}).get(metric)
    return ("–" if dev is None else f"{dev:.1f}") + "/" + ("–" if test is None else f"{test:.1f}")


def end_of_training_table(runs: list[Run], protocol: str = "sweep") -> PaperTable | None:
    """Table 2's shape: SQuAD 2.0 EM and F1, RACE accuracy and the GLUE dev average, dev/test."""
    columns, cells, notes = [], [[] for _ in runs], []
    squad = _at_last_common_step(runs, "squad/v2.0", protocol)
    if squad:
        step, results = squad
        for metric in ("exact", "f1"):
            columns.append(f"SQuAD 2.0 {METRIC_NAMES[metric]} (step {step})")
            for row, result in zip(cells, results):
                row.append(_dev_test(result, metric))
    for task in ("race", "race/high", "race/middle"):
        found = _at_last_common_step(runs, task, protocol)
        if found:
            step, results = found
            columns.append(f"{task.upper() if task == 'race' else task} acc. (step {step})")
            for row, result in zip(cells, results):
                row.append(_dev_test(result, "accuracy"))
    average = glue_average(runs, protocol)
    if average:
        step, values = average
        columns.append(f"GLUE avg (step {step})")
        for row, value in zip(cells, values):
            row.append(f"{value:.1f}/–")
    elif any(_at_last_common_step(runs, t, protocol) for t in GLUE_AVERAGED):
        missing = [GLUE_NAMES[t] for t in GLUE_AVERAGED if not _at_last_common_step(runs, t, protocol)]
        notes.append(f"No GLUE average: it needs all eight tasks at one step (missing: {', '.join(missing)}).")
    if not columns:
        return None
    note = (f"Dev/test ×100 at the last pretraining step every run has, {protocol} protocol; the paper's "
            "Table 2 shape (Table 3 for released checkpoints). SQuAD 2.0: exact match and F1; RACE: accuracy; "
            "GLUE: the mean of the eight tasks' dev scores in Table 8's metrics. \"–\": no test score (GLUE's "
            "and SQuAD's test labels are not public: their predictions go to the leaderboards). No winner "
            "marked: these scores carry no interval. " + " ".join(notes))
    return PaperTable(f"End of pretraining ({protocol} protocol)", note.strip(), columns,
                      list(zip(labels(runs), cells)))


def glue_average(runs: list[Run], protocol: str = "sweep") -> tuple[int, list[float]] | None:
    """(step, per-run mean of the eight GLUE tasks' dev scores) at the last step all of them share."""
    keys = [(task, protocol) for task in GLUE_AVERAGED]
    if not runs or any(key not in r.finetune for r in runs for key in keys):
        return None
    steps = common_steps([r.finetune[key] for r in runs for key in keys])
    if not steps:
        return None
    step = steps[-1]
    return step, [sum(r.finetune[key][step]["best"]["aggregate"]["score"] for key in keys) / len(keys)
                  for r in runs]


def glue_table(runs: list[Run], protocol: str = "sweep") -> PaperTable | None:
    """Table 8's shape: each GLUE task's dev score in its metric (MNLI matched/mismatched), then the average."""
    columns, cells = [], [[] for _ in runs]
    for task in GLUE_AVERAGED + ("glue/wnli",):
        found = _at_last_common_step(runs, task, protocol)
        if not found:
            continue
        step, results = found
        metric = results[0]["metric"]
        name = GLUE_NAMES[task] + (" m/mm" if task == "glue/mnli" else "")
        columns.append(f"{name} ({METRIC_NAMES.get(metric, metric)}, step {step})")
        for row, result in zip(cells, results):
            aggregate = result["best"]["aggregate"]
            value = f"{aggregate['score']:.1f}"
            if task == "glue/mnli":
                mismatched = aggregate.get(f"{metric}_mismatched")
                value += "/" + ("–" if mismatched is None else f"{mismatched:.1f}")
            row.append(value)
    if not columns:
        return None
    average = glue_average(runs, protocol)
    if average:
        columns.append(f"Avg (step {average[0]})")
        for row, value in zip(cells, average[1]):
            row.append(f"{value:.1f}")
    note = (f"Dev ×100 per GLUE task, {protocol} protocol; the paper's Table 8 shape. Metrics as its caption: "
            "accuracy, except Spearman correlation for STS-B and Matthews correlation for CoLA; MNLI matched "
            "(selects) / mismatched. Avg: the mean of the eight tasks without WNLI, at a step all share; the "
            "test average of Table 8 is the GLUE leaderboard's score (submit the `<Task>.tsv` predictions). "
            "No winner marked: these scores carry no interval.")
    return PaperTable(f"GLUE per task ({protocol} protocol)", note, columns, list(zip(labels(runs), cells)))


def per_checkpoint_tables(runs: list[Run], protocol: str = "checkpoint") -> list[PaperTable]:
    """Tables 6-7's shape: per task, the dev score of every run at every common pretraining step."""
    tasks = sorted({task for task, p in set.intersection(*(set(r.finetune) for r in runs)) if p == protocol}
                   if runs else set())
    tables = []
    for task in tasks:
        per_run = [r.finetune[(task, protocol)] for r in runs]
        steps = common_steps(per_run)
        if not steps:
            continue
        first = per_run[0][steps[0]]
        metric = METRIC_NAMES.get(first["metric"], first["metric"])
        settings = first["protocol"]
        shape = PER_CHECKPOINT_TABLE.get(task)
        note = (f"{task} dev {metric} ×100 at each pretraining step, {protocol} protocol: {settings['aggregate']} "
                f"over {settings['seeds']} seeds of {settings['selection']}, {settings['epochs']} epochs, batch "
                f"sizes {settings['batch_sizes']}, learning rates {settings['learning_rates']}. "
                + (f"The paper's {shape} shape (plotted in its Figures 1-2). " if shape else "")
                + "No winner marked: these scores carry no interval.")
        rows = [(label, [f"{results[s]['best']['aggregate']['score']:.1f}" for s in steps])
                for label, results in zip(labels(runs), per_run)]
        tables.append(PaperTable(f"{task} per pretraining checkpoint ({protocol} protocol)", note,
                                 [f"{s}" for s in steps], rows))
    return tables


def released_table(runs: list[Run], released: list[dict]) -> PaperTable | None:
    """Table 3's shape: released models (`eval finetune --hf-model` results) beside the runs, a
    column per task and protocol a released model was evaluated on, dev/test; runs at their last
    step every run has for that task ("–" where a run has none)."""
    if not released:
        return None
    keys = sorted({(r["task"], r["protocol"]["protocol"]) for r in released})
    columns, notes = [], []
    rows = [(f"{r['hf_model'].rstrip('/').rsplit('/', 1)[-1]} (released)", ["–"] * len(keys)) for r in released]
    for j, (task, protocol) in enumerate(keys):
        metric = next(r["metric"] for r in released if (r["task"], r["protocol"]["protocol"]) == (task, protocol))
        columns.append(f"{task} {METRIC_NAMES.get(metric, metric)} ({protocol})")
        for (_, cells), result in zip(rows, released):
            if (result["task"], result["protocol"]["protocol"]) == (task, protocol):
                cells[j] = _dev_test(result, "score")
    run_rows = [(label, ["–"] * len(keys)) for label in labels(runs)]
    for j, (task, protocol) in enumerate(keys):
        found = _at_last_common_step(runs, task, protocol)
        if found:
            step, results = found
            notes.append(f"{task}: runs at step {step}")
            for (_, cells), result in zip(run_rows, results):
                cells[j] = _dev_test(result, "score")
    note = ("Released checkpoints fine-tuned with the same protocol (`eval finetune --hf-model`) beside the runs, "
            "dev/test ×100 in each task's metric; the paper's Table 3 shape. "
            + ("; ".join(notes) + ". " if notes else "")
            + "No winner marked: these scores carry no interval.")
    return PaperTable("Released checkpoints beside the runs", note, columns, rows + run_rows)


def tables(runs: list[Run], released: list[dict] = ()) -> list[PaperTable]:
    """Every shape the results allow, in the paper's order: Table 2, Table 3, Table 8, Tables 6-7."""
    found = []
    for protocol in ("sweep", "checkpoint"):
        found += [t for t in (end_of_training_table(runs, protocol),) if t]
    found += [t for t in (released_table(runs, list(released)),) if t]
    for protocol in ("sweep", "checkpoint"):
        found += [t for t in (glue_table(runs, protocol),) if t]
    return found + per_checkpoint_tables(runs)
