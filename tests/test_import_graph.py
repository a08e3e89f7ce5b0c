"""The project's imports run one way (docs/design.md, "Layers"):

    pmi_jax/cli/*                  the commands: may import anything
    pmi_jax/* (the library)        may import pmi_jax, never preprocess/
    preprocess/*                   may import the bottom layer of pmi_jax only
    pmi_jax/errors, storage, formats/*   the bottom layer: imports nothing else of the project

Inside preprocess/, the shared readers (preprocess/text) import no stage, the two stages
(preprocess/vocab, preprocess/corpus) do not import each other, and only the Beam runners
(preprocess/beam) import preprocess/beam. preprocess/ installs as PREPROCESS (setup.py).

Read from the source with `ast` (nothing is imported), including imports inside functions, so
a lazy import cannot hide an edge. A failure names every offending edge as file:line.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PREPROCESS = "pmi_jax.preprocess"  # the module name of the folder preprocess/ (setup.py's package_dir)
PACKAGES = {"pmi_jax": "pmi_jax", PREPROCESS: "preprocess"}  # module name -> folder
BOTTOM = ("pmi_jax.errors", "pmi_jax.storage", "pmi_jax.formats")
STAGES = (f"{PREPROCESS}.vocab", f"{PREPROCESS}.corpus")


def _module_name(path: pathlib.Path, package: str, folder: str) -> str:
    parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p, package, folder): p for package, folder in PACKAGES.items()
            for p in sorted((ROOT / folder).rglob("*.py"))}


MODULES = _modules()


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _resolve(module: str, node: ast.ImportFrom, path: pathlib.Path) -> str:
    """The absolute module an `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def project_imports(module: str) -> list[tuple[int, str]]:
    """(line, imported project module) for every import statement of `module`.

    `from a import b` counts as importing a.b where that is a module, else as importing a.
    """
    path = MODULES[module]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node, path)
            targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        edges.extend((node.lineno, t) for t in targets if any(_within(t, p) for p in PACKAGES))
    return edges


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _violations(modules, allowed) -> list[str]:
    return [f"{_shown(MODULES[m])}:{line} imports {target}"
            for m in modules for line, target in project_imports(m) if not allowed(m, target)]


def test_the_graph_is_read():
    """The parser sees known edges, so an empty violation list means something."""
    assert "pmi_jax.storage" in {t for _, t in project_imports("pmi_jax.formats.prepared_corpus")}
    assert "pmi_jax.errors" in {t for _, t in project_imports(f"{PREPROCESS}.vocab.build_vocab")}
    assert any(_within(t, PREPROCESS) for m in MODULES if _within(m, "pmi_jax.cli") for _, t in project_imports(m))
    assert len([m for m in MODULES if _within(m, PREPROCESS)]) > 10
    for module in ("pmi_jax.formats.run_dir", "pmi_jax.batches", "pmi_jax.mlm_loss", "pmi_jax.experiment",
                   "pmi_jax.eval.run_eval", f"{PREPROCESS}.corpus.output_state", f"{PREPROCESS}.vocab.build_vocab",
                   f"{PREPROCESS}.text.documents", f"{PREPROCESS}.beam.beam_prepare",
                   f"{PREPROCESS}.text.hf_tokenizer"):
        assert module in MODULES, module
    assert "pmi_jax.formats.run_dir" in {t for _, t in project_imports("pmi_jax.train")}
    assert f"{PREPROCESS}.text.hf_tokenizer" in {t for _, t in project_imports(f"{PREPROCESS}.corpus.prepare")}
    assert f"{PREPROCESS}.text.mix64" in {t for _, t in project_imports(f"{PREPROCESS}.vocab.partitioned_counts")}


def _library(module: str) -> bool:
    """A module of pmi_jax's library: not a command, not preprocess/ (which installs inside pmi_jax)."""
    return _within(module, "pmi_jax") and not _within(module, "pmi_jax.cli") and not _within(module, PREPROCESS)


def test_no_library_module_of_pmi_jax_imports_preprocess():
    library = [m for m in MODULES if _library(m)]
    bad = _violations(library, lambda m, target: not _within(target, PREPROCESS))
    assert not bad, "pmi_jax library modules must not import preprocess/ (only pmi_jax/cli may):\n" + "\n".join(bad)


def test_preprocess_builds_on_the_bottom_layer_only():
    stages = [m for m in MODULES if _within(m, PREPROCESS)]
    bad = _violations(stages, lambda m, target: not _within(target, "pmi_jax") or _within(target, PREPROCESS)
                      or target == "pmi_jax"
                      or any(_within(target, b) for b in BOTTOM))
    assert not bad, f"preprocess/ may import only {', '.join(BOTTOM)} of pmi_jax:\n" + "\n".join(bad)


def test_the_shared_text_readers_import_no_stage():
    readers = [m for m in MODULES if _within(m, f"{PREPROCESS}.text")]
    assert readers
    bad = _violations(readers, lambda m, target: not _within(target, PREPROCESS)
                      or _within(target, f"{PREPROCESS}.text") or target == PREPROCESS)
    assert not bad, "preprocess/text is shared by the stages and imports none of them:\n" + "\n".join(bad)


@pytest.mark.parametrize("stage", STAGES)
def test_the_two_stages_do_not_import_each_other(stage):
    """What both need (word streams, the unit-list check, the 64-bit mixer) lives in preprocess/text."""
    (other,) = set(STAGES) - {stage}
    bad = _violations([m for m in MODULES if _within(m, stage)], lambda m, target: not _within(target, other))
    assert not bad, f"{stage} imports {other}:\n" + "\n".join(bad)


def test_only_the_beam_runners_import_beam():
    others = [m for m in MODULES if not _within(m, f"{PREPROCESS}.beam") and not _within(m, "pmi_jax.cli")]
    bad = _violations(others, lambda m, target: not _within(target, f"{PREPROCESS}.beam"))
    assert not bad, "preprocess/beam is imported only by the commands:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", BOTTOM)
def test_the_bottom_layer_imports_nothing_else_of_the_project(layer):
    modules = [m for m in MODULES if _within(m, layer)]
    assert modules, layer
    bad = _violations(modules, lambda m, target: target == "pmi_jax" or any(_within(target, b) for b in BOTTOM))
    assert not bad, f"{layer} is the bottom layer; it may import only {', '.join(BOTTOM)}:\n" + "\n".join(bad)


def test_a_violation_is_reported_with_its_line(tmp_path, monkeypatch):
    """The checks fail, naming the edge, on a module that breaks the rule."""
    bad = tmp_path / "bad.py"
    bad.write_text(f"import os\n\n\ndef f():\n    from {PREPROCESS}.vocab.build_vocab import VocabOptions\n")
    monkeypatch.setitem(MODULES, "pmi_jax.bad", bad)
    assert _violations(["pmi_jax.bad"], lambda m, t: not _within(t, PREPROCESS)) == [
        f"bad.py:5 imports {PREPROCESS}.vocab.build_vocab"]


def string_literals(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module, docstrings left out (they may cite a flag)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree) if isinstance(node, documented) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


FLAG = re.compile(r"(?<![\w-])--[a-z]")  # a command-line flag, as in "--output DIR"


def flag_wording(modules) -> list[str]:
    return [f"{_shown(MODULES[m])}:{line} {text!r}" for m in modules for line, text in string_literals(MODULES[m])
            if FLAG.search(text)]


def test_storage_has_no_command_line_wording():
    """storage.py, the bottom floor, raises PathError (the path, what is wrong); the command that took
    the path names its flag (pmi_jax/cli/io_flags.py, `worded`)."""
    bad = flag_wording(["pmi_jax.storage"])
    assert not bad, "pmi_jax/storage.py words a flag; raise errors.PathError and let the command word it:\n" + \
        "\n".join(bad)


def test_flag_wording_is_found(tmp_path, monkeypatch):
    wordy = tmp_path / "wordy.py"
    wordy.write_text('"""Pass --overwrite."""\n\n\ndef f(x):\n    """--output, in a docstring."""\n'
                     '    return f"--output {x}: exists", "a -- b", "x--y"\n')
    monkeypatch.setitem(MODULES, "pmi_jax.wordy", wordy)
    assert flag_wording(["pmi_jax.wordy"]) == ["wordy.py:6 '--output '"]


RUN_NAMES = ("checkpoints", "tensorboard", "metrics.jsonl")  # what `train` writes in a run directory


def test_the_run_directory_layout_is_named_in_formats_run_dir_only():
    """The library and preprocess/ spell a run's folders and files only in formats/run_dir.py; everyone
    else (storage's output checks included) asks it (`run_dir.is_run`, `check_output_apart`)."""
    assert {text for _, text in string_literals(MODULES["pmi_jax.formats.run_dir"])} >= set(RUN_NAMES)
    others = [m for m in MODULES if not _within(m, "pmi_jax.cli") and m != "pmi_jax.formats.run_dir"]
    bad = [f"{_shown(MODULES[m])}:{line} {text!r}" for m in others for line, text in string_literals(MODULES[m])
           if text in RUN_NAMES]
    assert not bad, "a run directory's names outside pmi_jax/formats/run_dir.py:\n" + "\n".join(bad)


def test_statistics_live_in_one_module_that_eval_and_compare_share():
    """Intervals are computed in pmi_jax/intervals.py only (numpy and scipy, nothing of the project)."""
    assert project_imports("pmi_jax.intervals") == []
    users = {m for m in MODULES if any(t == "pmi_jax.intervals" for _, t in project_imports(m))}
    assert {"pmi_jax.eval.perplexity", "pmi_jax.compare.perplexity_tables"} <= users, users


def test_the_progress_line_imports_nothing_of_the_project():
    """pmi_jax/progress.py draws a line from numbers it is given: the trainer uses it, it uses nothing."""
    assert "pmi_jax.progress" in {t for _, t in project_imports("pmi_jax.train")}
    bad = _violations(["pmi_jax.progress"], lambda m, target: False)
    assert not bad, "pmi_jax/progress.py imports project modules:\n" + "\n".join(bad)


DOCSTRING_LINES = 12  # a module docstring says what and why; history: docs/design.md, "Module notes"


def long_docstrings(modules, limit: int = DOCSTRING_LINES) -> list[str]:
    """`path: N lines` for each module whose docstring runs past `limit` lines."""
    long = []
    for module in modules:
        path = MODULES[module]
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if doc and len(doc.splitlines()) > limit:
            long.append(f"{_shown(path)}: {len(doc.splitlines())} lines")
    return long


def test_module_docstrings_are_short():
    """Every module of pmi_jax/ and preprocess/ has a docstring of at most DOCSTRING_LINES lines:
    measurements go to benchmarks/README.md, design history to docs/design.md."""
    long = long_docstrings(MODULES)
    assert not long, f"module docstrings over {DOCSTRING_LINES} lines:\n" + "\n".join(long)


def test_a_long_docstring_is_reported(tmp_path, monkeypatch):
    wordy = tmp_path / "wordy.py"
    wordy.write_text('"""' + "\n".join(f"line {i}" for i in range(DOCSTRING_LINES + 1)) + '"""\nX = 1\n')
    short = tmp_path / "short.py"
    short.write_text('"""' + "\n".join(f"line {i}" for i in range(DOCSTRING_LINES)) + '"""\n')
    monkeypatch.setitem(MODULES, "pmi_jax.wordy", wordy)
    monkeypatch.setitem(MODULES, "pmi_jax.short", short)
    assert long_docstrings(["pmi_jax.wordy", "pmi_jax.short"]) == [f"wordy.py: {DOCSTRING_LINES + 1} lines"]
