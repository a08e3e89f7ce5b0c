"""The two fine-tuning protocols' presets, per task, as the paper (§4.2, Tables 6-7) and
docs/experiments.md state them.

These pin the settings that `pmi-jax eval finetune` actually runs for each task (the preset,
then the task's defaults where the preset leaves a field at 0), so that a change to a preset or
to a task's defaults shows up here and in the docs' provenance table together.
"""
import dataclasses
import re
from pathlib import Path

import pytest

from pmi_jax.eval import finetune, protocols

CHECKPOINT = protocols.PROTOCOL_DEFAULTS["checkpoint"]
SWEEP = protocols.PROTOCOL_DEFAULTS["sweep"]
# §4.2: 4 epochs for SQuAD 2.0 and RACE, 3 for GLUE but RTE and STS-B (10). The per-checkpoint
# protocol's "4 epochs" (captions of Tables 6-7) are for SQuAD 2.0 and RACE, the same 4.
SWEEP_EPOCHS = {**{name: 3 for name in finetune.TASKS if name.startswith("glue/")},
                "glue/rte": 10, "glue/stsb": 10, "squad/v2.0": 4, "race": 4, "race/high": 4, "race/middle": 4}
SEQ_LEN = {**{name: 128 for name in finetune.TASKS if name.startswith("glue/")},
           "squad/v2.0": 384, "race": 512, "race/high": 512, "race/middle": 512}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "experiments.md"


def test_every_task_has_an_expected_setting():
    assert set(SWEEP_EPOCHS) == set(finetune.TASKS) == set(SEQ_LEN)


@pytest.mark.parametrize("name", sorted(finetune.TASKS))
def test_checkpoint_protocol_is_one_setting_with_the_tasks_epochs(name):
    task = finetune.TASKS[name]
    assert CHECKPOINT.protocol == "checkpoint"
    assert CHECKPOINT.batch_sizes == (32,) and CHECKPOINT.learning_rates == (3e-5,)
    assert CHECKPOINT.epochs_for(task) == SWEEP_EPOCHS[name]
    if not name.startswith("glue/"):
        assert CHECKPOINT.epochs_for(task) == 4  # Tables 6-7: "over 4 epochs without early stopping"
    assert CHECKPOINT.seeds == 5
    assert CHECKPOINT.aggregate.startswith("mean of the middle three")
    assert (CHECKPOINT.max_seq_len or task.max_seq_len) == SEQ_LEN[name]


@pytest.mark.parametrize("name", sorted(finetune.TASKS))
def test_sweep_grid_and_epochs_per_task(name):
    task = finetune.TASKS[name]
    assert SWEEP.protocol == "sweep"
    assert SWEEP.batch_sizes == (16, 32) and SWEEP.learning_rates == (1e-5, 2e-5, 3e-5, 5e-5)
    assert SWEEP.epochs_for(task) == SWEEP_EPOCHS[name]
    assert SWEEP.seeds == 5 and SWEEP.aggregate == "median"
    assert (SWEEP.max_seq_len or task.max_seq_len) == SEQ_LEN[name]


def test_an_explicit_epochs_overrides_every_tasks_default():
    two = dataclasses.replace(SWEEP, epochs=2)
    assert {two.epochs_for(t) for t in finetune.TASKS.values()} == {2}


def test_the_presets_differ_only_where_the_protocols_do():
    differing = {f.name for f in dataclasses.fields(protocols.FinetuneConfig)
                 if getattr(SWEEP, f.name) != getattr(CHECKPOINT, f.name)}
    assert differing == {"protocol", "batch_sizes", "learning_rates"}


def _provenance_rows() -> list[str]:
    text = DOCS.read_text()
    start = text.index("#### Where each fine-tuning setting comes from")
    end = text.index("\n#", start + 1)
    return [line for line in text[start:end].splitlines() if line.startswith("| ") and "---" not in line]


def test_docs_say_where_every_setting_comes_from():
    """Each FinetuneConfig field (but the protocol's name) has a row in the provenance table."""
    documented = {name for row in _provenance_rows() for name in re.findall(r"`(\w+)`", row.split(" | ")[0])}
    fields = {f.name for f in dataclasses.fields(protocols.FinetuneConfig)} - {"protocol"}
    assert fields <= documented, sorted(fields - documented)


# A source cell cites the paper (a section, table, figure or caption) or says the choice is ours.
_CITES_PAPER = re.compile(r"§\d|\bTables? \d|\bFigures? \d|caption")


def test_every_documented_setting_cites_the_paper_or_says_it_is_our_choice():
    rows = _provenance_rows()[1:]  # the header row aside
    assert len(rows) >= 15
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 3, row
        source = cells[2]
        assert _CITES_PAPER.search(source) or source.startswith("our choice"), row
        assert "not checked" not in source and "design brief" not in source, row


def test_the_source_check_fails_on_an_uncited_row():
    assert not _CITES_PAPER.search("design brief; RoBERTa does the same")
    assert _CITES_PAPER.search("§4.2: the grid") and _CITES_PAPER.search("captions of Tables 6-7")
