"""The report's paper-shaped tables (pmi_jax/compare/paper_tables.py): Table 2's dev/test cells
and GLUE average, Table 8 per task, Tables 6-7 per checkpoint.

Results are written in the shape `eval finetune` writes (results.json), with the paper's own
numbers where it has them: the GLUE averages must come out as Table 2 prints them.
"""
from __future__ import annotations

from pmi_jax.compare import paper_tables
from pmi_jax.compare.runs import Run

# Table 8, 1M steps, dev: MNLI, QNLI, QQP, RTE, SST-2, MRPC, CoLA, STS-B; Table 2 prints their
# means as 83.0 (Random-Span) and 84.1 (PMI).
TABLE_8 = {"random_span": (84.0, 91.4, 90.8, 69.0, 92.8, 88.5, 58.5, 88.9),
           "pmi": (85.2, 91.8, 91.0, 72.2, 92.7, 89.7, 60.6, 89.3)}
METRIC = {"glue/cola": "matthews_corrcoef", "glue/stsb": "spearman"}


def _result(task: str, protocol: str, step: int, aggregate: dict, test: dict | None = None) -> dict:
    settings = {"protocol": protocol, "batch_sizes": [32], "learning_rates": [3e-5], "seeds": 5, "epochs": 4,
                "aggregate": "median" if protocol == "sweep" else "mean of the middle three",
                "selection": "each run's best dev epoch"}
    metric = METRIC.get(task, "f1" if task == "squad/v2.0" else "accuracy")
    best = {"batch_size": 32, "learning_rate": 3e-5, "aggregate": {**aggregate, "score": aggregate[metric]}}
    if test:
        best["test"] = {**test, "score": test[metric]}
    return {"task": task, "metric": metric, "protocol": settings, "step": step, "best": best}


def _run(scheme: str, finetune: dict) -> Run:
    return Run(f"runs/{scheme}", scheme, scheme, {}, 1_000_000, {}, {}, finetune)


def _glue(scheme: str, step: int) -> dict:
    out = {}
    for task, value in zip(paper_tables.GLUE_AVERAGED, TABLE_8[scheme]):
        metric = METRIC.get(task, "accuracy")
        aggregate = {metric: value, **({"accuracy_mismatched": value - 1.0} if task == "glue/mnli" else {})}
        out[(task, "sweep")] = {step: _result(task, "sweep", step, aggregate)}
    return out


def test_glue_average_is_table_2s_mean_of_table_8():
    runs = [_run(s, _glue(s, 1_000_000)) for s in ("random_span", "pmi")]
    step, averages = paper_tables.glue_average(runs)
    assert step == 1_000_000
    assert [f"{a:.1f}" for a in averages] == ["83.0", "84.1"]  # Table 2's GLUE column, 1M steps

    table = paper_tables.glue_table(runs)
    assert table.columns[0] == "MNLI m/mm (acc, step 1000000)"
    assert table.columns[6:] == ["CoLA (Matthews corr., step 1000000)", "STS-B (Spearman, step 1000000)",
                                 "Avg (step 1000000)"]
    assert table.rows[0] == ("random_span", ["84.0/83.0", "91.4", "90.8", "69.0", "92.8", "88.5", "58.5", "88.9",
                                             "83.0"])
    assert "**" not in table.markdown()  # no winner marked without an interval


def test_glue_average_needs_all_eight_tasks_at_one_step():
    finetune = _glue("pmi", 1_000_000)
    finetune[("glue/rte", "sweep")] = {800_000: finetune.pop(("glue/rte", "sweep"))[1_000_000]}
    runs = [_run("pmi", finetune)]
    assert paper_tables.glue_average(runs) is None
    table = paper_tables.end_of_training_table(runs)
    assert table is None or "GLUE avg" not in " ".join(table.columns)
    del finetune[("glue/rte", "sweep")]
    finetune[("squad/v2.0", "sweep")] = {1_000_000: _result("squad/v2.0", "sweep", 1_000_000,
                                                            {"exact": 78.5, "f1": 81.4})}
    table = paper_tables.end_of_training_table([_run("pmi", finetune)])
    assert "No GLUE average: it needs all eight tasks at one step (missing: RTE)." in table.note


def test_end_of_training_table_has_em_beside_f1_and_test_where_it_exists():
    def results(scheme, em, f1, race_dev, race_test):
        return {("squad/v2.0", "sweep"): {s: _result("squad/v2.0", "sweep", s, {"exact": em - d, "f1": f1 - d})
                                          for s, d in ((200, 5.0), (1000, 0.0))},
                ("race", "sweep"): {1000: _result("race", "sweep", 1000, {"accuracy": race_dev},
                                                  {"accuracy": race_test})},
                **_glue(scheme, 1000)}

    runs = [_run("random_span", results("random_span", 77.1, 80.3, 68.6, 66.9)),
            _run("pmi", results("pmi", 78.5, 81.4, 70.1, 68.4))]
    table = paper_tables.end_of_training_table(runs)
    assert table.columns == ["SQuAD 2.0 EM (step 1000)", "SQuAD 2.0 F1 (step 1000)", "RACE acc. (step 1000)",
                             "GLUE avg (step 1000)"]
    # Table 2's first block, random_span and pmi rows (dev/test; SQuAD's and GLUE's test are not public)
    assert table.rows == [("random_span", ["77.1/–", "80.3/–", "68.6/66.9", "83.0/–"]),
                          ("pmi", ["78.5/–", "81.4/–", "70.1/68.4", "84.1/–"])]
    markdown = table.markdown()
    assert "| pmi | 78.5/– | 81.4/– | 70.1/68.4 | 84.1/– |" in markdown and "**" not in markdown


def test_per_checkpoint_tables_are_tables_6_and_7():
    table_6 = {"random_token": (74.4, 76.7, 77.9, 78.9, 79.3), "pmi": (77.0, 78.8, 80.3, 81.1, 81.3)}
    steps = (200_000, 400_000, 600_000, 800_000, 1_000_000)
    runs = []
    for scheme, scores in table_6.items():
        squad = {s: _result("squad/v2.0", "checkpoint", s, {"exact": v - 3, "f1": v}) for s, v in zip(steps, scores)}
        race = {s: _result("race", "checkpoint", s, {"accuracy": 60.0 + i}) for i, s in enumerate(steps)}
        if scheme == "pmi":
            race[1_200_000] = _result("race", "checkpoint", 1_200_000, {"accuracy": 70.0})  # only one run has it
        runs.append(_run(scheme, {("squad/v2.0", "checkpoint"): squad, ("race", "checkpoint"): race}))
    tables = {t.title: t for t in paper_tables.per_checkpoint_tables(runs)}
    squad = tables["squad/v2.0 per pretraining checkpoint (checkpoint protocol)"]
    assert squad.columns == ["200000", "400000", "600000", "800000", "1000000"]
    assert squad.rows == [("random_token", ["74.4", "76.7", "77.9", "78.9", "79.3"]),
                          ("pmi", ["77.0", "78.8", "80.3", "81.1", "81.3"])]
    assert "The paper's Table 6 shape" in squad.note and "dev F1" in squad.note
    race = tables["race per pretraining checkpoint (checkpoint protocol)"]
    assert race.columns == squad.columns  # 1.2M is not common to both runs
    assert "Table 7" in race.note and "dev acc" in race.note
    assert [t.title for t in paper_tables.tables(runs)][-2:] == [
        "race per pretraining checkpoint (checkpoint protocol)",
        "squad/v2.0 per pretraining checkpoint (checkpoint protocol)"]


def test_released_models_sit_beside_the_runs_as_in_table_3():
    """Table 3: SpanBERT-base's RACE 70.5/68.7 beside PMI-Masking's 72.3/70.9 (2.4M steps)."""
    spanbert = {**_result("race", "sweep", None, {"accuracy": 70.5}, {"accuracy": 68.7}),
                "hf_model": "/models/spanbert-base/"}
    runs = [_run("pmi", {("race", "sweep"): {2_400_000: _result("race", "sweep", 2_400_000, {"accuracy": 72.3},
                                                                {"accuracy": 70.9})}}),
            _run("random_span", {})]
    table = paper_tables.released_table(runs, [spanbert])
    assert table.columns == ["race acc (sweep)"]
    assert table.rows == [("spanbert-base (released)", ["70.5/68.7"]), ("pmi", ["–"]), ("random_span", ["–"])]
    table = paper_tables.released_table(runs[:1], [spanbert])
    assert table.rows[1] == ("pmi", ["72.3/70.9"]) and "race: runs at step 2400000" in table.note
    assert paper_tables.released_table(runs, []) is None
